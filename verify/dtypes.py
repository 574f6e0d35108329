"""Element types for generated examples, derived from the ONNX operator schemas.

Every input and output slot of a pattern gets a *dtype variable*. Slots that ONNX ties to
one type parameter (`T` of Add's A, B and output), a child's output and the parent slot it
feeds, and every use of one capture share a variable (union-find). Each variable's allowed
set is the intersection of what the schemas allow at its slots (`onnx.defs`, at the
example's opset) with `CANDIDATES`, minus (op, dtype) pairs onnxruntime has no kernel for
(`verify.execute.NO_KERNEL`). Guard hints (`verify.hints`) unify more variables, restrict
them, or make one depend on another (`cast-lossless`).

`Cast.to` is the one attribute that names a dtype: it is the Cast's output variable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

import numpy as np
import onnx.defs
from onnx import TensorProto as TP

from dsl.ir import Capture, Literal, OpNode, Term
from vocab.declared import type_signature
from vocab.ops import OPS

# The dtypes examples are drawn from, in shrinking order: float32 first.
CANDIDATES = (TP.FLOAT, TP.FLOAT16, TP.INT64, TP.BOOL, TP.DOUBLE, TP.INT32, TP.INT8, TP.UINT8)
FLOATS = frozenset({TP.FLOAT, TP.FLOAT16, TP.DOUBLE})
# drawn only by the `every 4-bit value` check (`verify.sweep`): onnxruntime's Python API takes
# no int4 input, so only onnx.reference runs their examples
FOUR_BIT = (TP.INT4, TP.UINT4)
_FOUR_BIT_BOUNDS = {TP.INT4: (-8, 7), TP.UINT4: (0, 15)}
NAMES = {
    TP.FLOAT: "float32",
    TP.FLOAT16: "float16",
    TP.DOUBLE: "float64",
    TP.INT64: "int64",
    TP.INT32: "int32",
    TP.INT8: "int8",
    TP.UINT8: "uint8",
    TP.BOOL: "bool",
    TP.INT4: "int4",
    TP.UINT4: "uint4",
}
_BY_TYPE_STR = {
    f"tensor({n})": code for code, n in {**NAMES, TP.FLOAT: "float", TP.DOUBLE: "double"}.items()
}
DTYPE_ATTRS = {("Cast", "to")}  # attributes whose value is the node's output dtype
# (op, type param) -> the dtypes drawn, where the schema allows more than anyone can check:
# onnxruntime has no integer Gemm, and onnx.reference computes one in float64 (alpha and beta
# are floats), rounding products above 2**53; neither gives integer Gemm a meaning to test.
# Softsign: onnxruntime 1.32 has a float32 kernel only, and onnx.reference fails on a 0-d
# input (TypeError), so float32 is the one dtype some executor runs at every rank.
LIMITS = {("Gemm", "T"): FLOATS, ("Softsign", "T"): frozenset({TP.FLOAT})}


def dtype_name(elem_type: int) -> str:
    """`float32`, `int64`, ... for an ONNX element type (the TensorProto name otherwise)."""
    return NAMES.get(elem_type) or TP.DataType.Name(elem_type).lower()


@cache
def slot_types(op: str, opset: int) -> tuple[tuple, tuple]:
    """((param or None, allowed frozenset) per input slot, same for output 0) of `op`'s
        schema in force at `opset` (`vocab.declared.type_signature`: onnxruntime's for its contrib
    ops, the body's for an op a rule file declares).
        `param` names the schema's type parameter (`T`), so slots with the same param share a
        dtype. Raises onnx.defs.SchemaError for an unknown op."""
    spec = OPS.get(op)
    k = spec.output if spec else 0
    formal, outputs, params = type_signature(op, opset)

    def one(type_str: str):
        allowed = params.get(type_str, [type_str])
        codes = frozenset(_BY_TYPE_STR[s] for s in allowed if s in _BY_TYPE_STR)
        return (type_str if type_str in params else None, codes)

    formal = list(formal)
    if spec is not None and spec.variadic:  # the variadic input's slots share its type
        formal += [formal[-1]] * (spec.arity - len(formal))
    ins = tuple(one(t) for t in formal)
    # a projection Op#K has output K's type (a variadic output: its one formal parameter)
    return ins, one(outputs[min(k, len(outputs) - 1)])


@dataclass
class DtypePlan:
    """Dtype variables of one pattern at one opset (see module doc).

    slot_var: (node id, slot) -> variable, slot -1 being the output. capture_var: capture
    name -> variable (term captures, and `Cast.to` attribute captures).
    """

    opset: int
    parent: list[int] = field(default_factory=list)
    allowed: list[frozenset] = field(default_factory=list)
    slot_var: dict[tuple[int, int], int] = field(default_factory=dict)
    capture_var: dict[str, int] = field(default_factory=dict)
    depends: dict[int, tuple[int, Callable[[int], frozenset]]] = field(default_factory=dict)
    ops_of: dict[int, set[tuple[str, str]]] = field(default_factory=dict)

    def new(self, allowed: frozenset, key: tuple[str, str] | None = None) -> int:
        """A new variable; `key` is the (op, schema type param) it stands for, if any."""
        self.parent.append(len(self.parent))
        self.allowed.append(frozenset(allowed))
        self.ops_of[len(self.parent) - 1] = {key} if key else set()
        return len(self.parent) - 1

    def find(self, v: int) -> int:
        """The root of variable `v`'s class (union-find with path halving)."""
        while self.parent[v] != v:
            self.parent[v] = self.parent[self.parent[v]]
            v = self.parent[v]
        return v

    def union(self, a: int, b: int) -> int:
        """Merge the classes of `a` and `b` (allowed dtypes intersected, ops joined); returns the
        new root."""
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[b] = a
            self.allowed[a] = self.allowed[a] & self.allowed[b]
            self.ops_of[a] |= self.ops_of[b]
        return a

    def restrict(self, v: int, allowed) -> None:
        """Narrow the dtypes `v`'s class allows to those also in `allowed`."""
        v = self.find(v)
        self.allowed[v] = self.allowed[v] & frozenset(allowed)

    def var_of(self, name: str) -> int | None:
        """The variable of a capture (None for an attribute capture that is not a dtype)."""
        v = self.capture_var.get(name)
        return None if v is None else self.find(v)

    def roots(self) -> list[int]:
        """Variables in drawing order: a variable that depends on another comes after it."""
        roots = sorted({self.find(v) for v in range(len(self.parent))})
        late = {self.find(v) for v in self.depends}
        return [r for r in roots if r not in late] + [r for r in roots if r in late]

    def choices(self, v: int, chosen: dict[int, int], no_kernel) -> list[int]:
        """The dtypes variable `v` may take given the variables already `chosen`, in
        `CANDIDATES` order (then `FOUR_BIT`), without (op, type param, dtype) triples in
        `no_kernel`."""
        v = self.find(v)
        allowed = set(self.allowed[v])
        for dep, (src, fn) in self.depends.items():
            if self.find(dep) == v and self.find(src) in chosen:
                allowed &= fn(chosen[self.find(src)])
        ops = self.ops_of[v]
        return [
            d
            for d in CANDIDATES + FOUR_BIT
            if d in allowed and not any((*k, d) in no_kernel for k in ops)
        ]


def plan_dtypes(
    lhs: Term, opset: int, roots: tuple[Term, ...] = ()
) -> tuple[DtypePlan, dict[int, OpNode]]:
    """The dtype variables of pattern `lhs` (and a multi-root rule's other `roots`, sharing
    its captures) at `opset`, and node id -> OpNode (ids are `id()` of the IR nodes, in the
    order the walk met them). Raises onnx.defs.SchemaError if an op has no schema at
    `opset`."""
    plan = DtypePlan(opset)
    nodes: dict[int, OpNode] = {}
    for t in (lhs, *roots):
        _walk(t, plan, nodes)
    return plan, nodes


def _walk(t: Term, plan: DtypePlan, nodes: dict) -> int | None:
    if not isinstance(t, OpNode):
        return None
    nodes[id(t)] = t
    ins, (out_param, out_allowed) = slot_types(t.op, plan.opset)
    by_param: dict[str, int] = {}

    def var(param, allowed):
        if param is None:
            return plan.new(allowed)
        if param not in by_param:
            by_param[param] = plan.new(allowed & LIMITS.get((t.op, param), allowed), (t.op, param))
        return by_param[param]

    for i, a in enumerate(t.args):
        param, allowed = ins[min(i, len(ins) - 1)]
        v = var(param, allowed)
        plan.slot_var[(id(t), i)] = v
        child = _walk(a, plan, nodes)
        if child is not None:
            plan.union(v, child)
        elif isinstance(a, Capture):
            old = plan.capture_var.setdefault(a.name, v)
            plan.union(old, v)
    out = var(out_param, out_allowed)
    plan.slot_var[(id(t), -1)] = out
    if t.bind:
        plan.capture_var[t.bind] = out
    for name, value in t.attrs:
        if (t.op, name) in DTYPE_ATTRS:
            if isinstance(value, Literal) and value.value is not None:
                plan.restrict(out, {value.value})
            elif isinstance(value, Capture):
                old = plan.capture_var.setdefault(value.name, out)
                plan.union(old, out)
    return out


def np_type(elem_type: int) -> np.dtype:
    """numpy dtype of one of the `CANDIDATES` or `FOUR_BIT` (ml_dtypes' int4 and uint4)."""
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def int_bounds(elem_type: int) -> tuple[int, int]:
    """(lowest, highest) value of an integer element type, 4-bit ones included (numpy's iinfo
    does not know ml_dtypes' int4)."""
    if elem_type in _FOUR_BIT_BOUNDS:
        return _FOUR_BIT_BOUNDS[elem_type]
    info = np.iinfo(np_type(elem_type))
    return int(info.min), int(info.max)


def int_bounds_of(dtype: np.dtype) -> tuple[int, int] | None:
    """`int_bounds` of a numpy dtype, None for one that is not an integer type."""
    code = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    if code in _FOUR_BIT_BOUNDS:
        return _FOUR_BIT_BOUNDS[code]
    return int_bounds(code) if np.dtype(dtype).kind in "iu" else None
