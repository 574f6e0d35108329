"""The shape-rule registry: what an op's rules see of a node (`Call`) and how they register.

An op has up to three rules, each a plain module-level function registered with a decorator
(the rules themselves are in `vocab.elementwise_rules` and `vocab.movement_rules`; consumers look
them up through `vocab.shape_rules`):

- `@shape_rule(...)`: the output shapes as symbolic dimensions (`vocab.symbolic`) from the
  inputs' shapes, small values and the attributes;
- `@value_rule(...)`: the value of a small integer tensor the op computes (shape arithmetic),
  its elements symbolic too;
- `@type_rule(...)`: the output `TensorType` (dtype and shape) straight from the input types.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import numpy as np
import onnx

from vocab.graph import ABSENT, Node
from vocab.symbolic import Shape, SymValue
from vocab.types import TensorType

_INT_DTYPES = frozenset(
    (
        onnx.TensorProto.INT64,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.BOOL,
    )
)


@dataclass(frozen=True)
class Call:
    """One application of an op, as its rules see it.

    node: the node (`node.op` is `Op#K` for output K of a matchable multi-output term).
    inputs: its input value ids up to the last present one (`present_inputs`), ABSENT for a
        skipped optional input.
    attrs: its attributes by name (a tensor attribute as a numpy array).
    dtypes: the ONNX element type of each of `inputs` (0 when unknown or absent).
    shapes, values: what the analysis knows so far, by value id.
    """

    node: Node
    inputs: tuple[int, ...]
    attrs: dict
    dtypes: tuple[int, ...]
    shapes: Mapping[int, Shape | None]
    values: Mapping[int, SymValue]

    @property
    def op(self) -> str:
        """The node's op."""
        return self.node.op

    def has(self, i: int) -> bool:
        """True if input `i` is present."""
        return i < len(self.inputs) and self.inputs[i] != ABSENT

    def shape(self, i: int) -> Shape | None:
        """The symbolic shape of input `i` (None: absent, or rank unknown)."""
        return self.shapes.get(self.inputs[i]) if self.has(i) else None

    def value(self, i: int) -> SymValue | None:
        """The symbolic value of input `i`, if the analysis follows it."""
        return self.values.get(self.inputs[i]) if self.has(i) else None

    def array(self, i: int) -> np.ndarray | None:
        """The symbolic value of input `i` as an object array (None elements unknown)."""
        v = self.value(i)
        return None if v is None else v.array()

    def ints(self, i: int) -> list[int] | None:
        """The elements of input `i` in row-major order, when every one is a known number."""
        v = self.value(i)
        return None if v is None or not v.known else [int(e) for e in v.elems]


ShapeFn = Callable[[Call], "Shape | list[Shape] | None"]
ValueFn = Callable[[Call, "Shape | None"], "np.ndarray | None"]
TypeFn = Callable[[dict, tuple], TensorType]


@dataclass(frozen=True)
class ShapeRule:
    """The rules of one op (see the module docstring); None where it has none.

    shape: Call -> the first output's shape, or a list with one shape per output (Split), or
        None when unknown. value: (Call, first output's shape) -> its value as an object array
        of sympy expressions (None elements unknown), or None. type: (attrs, input types, None
        for an absent input) -> the first output's TensorType.
    since: the first opset of the form the shape rule reads (older forms differ in inputs or
        attributes, so the analysis leaves them alone). projections: the rule is also that of
        the op's other outputs `Op#K`.
    """

    op: str
    shape: ShapeFn | None = None
    value: ValueFn | None = None
    type: TypeFn | None = None
    since: int = 0
    projections: bool = False


RULES: dict[str, ShapeRule] = {}


def _register(ops: tuple[str, ...], part: str, fn, **extra) -> None:
    for op in ops:
        rule = RULES.get(op) or ShapeRule(op)
        if getattr(rule, part) is not None:
            raise ValueError(f"two {part} rules for {op}")
        RULES[op] = replace(rule, **{part: fn}, **extra)


def shape_rule(*ops: str, since: int = 0, projections: bool = False):
    """Register the decorated `Call -> Shape | list[Shape] | None` as the symbolic shape rule
    of `ops` (`ShapeRule.shape`; `since`, `projections` as there). Raises ValueError if an op
    already has one."""

    def deco(fn):
        _register(ops, "shape", fn, since=since, projections=projections)
        return fn

    return deco


def value_rule(*ops: str):
    """Register the decorated `(Call, Shape | None) -> np.ndarray | None` as the value rule of
    `ops` (`ShapeRule.value`). Raises ValueError if an op already has one."""

    def deco(fn):
        _register(ops, "value", fn)
        return fn

    return deco


def type_rule(*ops: str):
    """Register the decorated `(attrs, input types) -> TensorType` as the type rule of `ops`
    (`ShapeRule.type`). Raises ValueError if an op already has one."""

    def deco(fn):
        _register(ops, "type", fn)
        return fn

    return deco


def present_inputs(n: Node) -> tuple[int, ...]:
    """`n`'s inputs without the trailing absent slots (a matchable node has one slot per
    op-table input, a variadic op `VARIADIC_SLOTS` of them; an opaque node has its own)."""
    ins = n.inputs
    end = len(ins)
    while end and ins[end - 1] == ABSENT:
        end -= 1
    return ins[:end]


def is_int_dtype(dtype: int) -> bool:
    """True for the ONNX integer and bool element types whose values the rules compute on."""
    return dtype in _INT_DTYPES
