"""Symbolic shape analysis and shape folding over a TermGraph.

`analyze` gives every value a symbolic shape, each dimension a sympy integer expression
(`vocab.symbolic`: a number, a symbol such as an input's `dim_param`, or an expression such as
`2*seq`), and follows the *values* of small integer tensors (at most `MAX_VALUE_ELEMENTS`
elements) through the ops that compute on shapes. Each node's outputs come from its op's rules
in `vocab.shape_rules` (the shape rule, then the value rule); an op without a rule keeps the type
already in the graph (ONNX shape inference at import), a fresh symbol for each unknown
dimension. Two dimensions are the same exactly when their expressions are, which is what lets a
rule see that a reshape target copies its input's own dimensions.

`fold_shapes` then rewrites the graph where the analysis knows enough:

- a value whose every element is a number becomes a constant, and the nodes that computed it go;
- a `Reshape` whose target is known symbolically gets a constant target, with `0` where an
  element is the input's own dimension at that index (allowzero=0 only) and `-1` for the one
  element left unknown;
- an `Expand`, `Reshape` or `Slice` whose output has its input's shape, symbolically, is its
  input (when the shape is static, the rule library's `noop-*` rules do this, by name).

Symbols never stand for a particular size, so the folded graph computes the same at every
input size the original accepts. Dimensions are written back into the TermGraph's types as
ints or as the expression's text, so equal dimensions share one string everywhere (guards such
as `broadcasts-into` compare those strings).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
import sympy
from onnx import helper, numpy_helper

from vocab.declared import AttrRef, Declaration, declaration
from vocab.graph import ABSENT, Node, TermGraph, Value, prune
from vocab.movement_rules import split_count
from vocab.ops import OPS, TensorValue
from vocab.shape_registry import Call, present_inputs
from vocab.shape_rules import old_form, rule_of
from vocab.symbolic import (
    MAX_VALUE_ELEMENTS,
    Expr,
    Shape,
    SymValue,
    any_unknown,
    obj_array,
    parse_dim,
    symbol,
    to_dim,
    value_of_array,
)
from vocab.types import UNKNOWN, TensorType, np_dtype


@dataclass
class ShapeAnalysis:
    """Result of `analyze`: per value id, its symbolic shape (None: rank unknown) and, for
    small tensors the analysis could follow, its symbolic value."""

    shapes: dict[int, Shape | None] = field(default_factory=dict)
    values: dict[int, SymValue] = field(default_factory=dict)

    def dim_text(self, vid: int) -> tuple | None:
        """The shape of `vid` as TensorType dims: ints, or the expression's text."""
        s = self.shapes.get(vid)
        return None if s is None else tuple(to_dim(d) for d in s)


@dataclass(frozen=True)
class FoldStats:
    """What `fold_shapes` did: values turned into constants, Reshape targets made constant,
    no-op nodes removed, and nodes left after pruning."""

    constants: int = 0
    reshape_targets: int = 0
    noops: int = 0
    nodes_before: int = 0
    nodes_after: int = 0


class _Fresh:
    def __init__(self):
        self.n = itertools.count()

    def __call__(self) -> sympy.Symbol:
        return symbol(f"_u{next(self.n)}")


def _from_dim(d, fresh) -> Expr:
    if isinstance(d, int):
        return sympy.Integer(d)
    if isinstance(d, str) and d:
        return parse_dim(d)
    return fresh()


def analyze(g: TermGraph) -> ShapeAnalysis:
    """Symbolic shapes and small values of every value of `g`, in one pass in node order.

    Shapes of graph inputs come from their types (`dim_param` names become symbols); an op the
    analysis has no rule for takes the type already in the graph (ONNX shape inference at
    import), with a fresh symbol for each unknown dimension. Never raises on odd nodes: what it
    cannot follow stays unknown.
    """
    a = ShapeAnalysis()
    fresh = _Fresh()

    def from_type(vid: int) -> Shape | None:
        t = g.values[vid].type
        return None if t.shape is None else tuple(_from_dim(d, fresh) for d in t.shape)

    for vid in g.inputs:
        a.shapes[vid] = from_type(vid)
    for vid, arr in g.constants.items():
        a.shapes[vid] = tuple(sympy.Integer(int(d)) for d in np.shape(arr))
        v = value_of_array(arr)
        if v is not None:
            a.values[vid] = v

    def fill(vid: int, shape: tuple) -> Shape:
        """`shape` with each dimension a rule left None (two different symbols broadcast)
        taken from the type already in the graph at that index, or a fresh symbol."""
        t = from_type(vid)
        same = t is not None and len(t) == len(shape)
        return tuple(d if d is not None else t[i] if same else fresh() for i, d in enumerate(shape))

    for n in g.nodes:
        try:
            if not old_form(n, g.opset):
                _visit(n, g, a, fill)
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError):
            pass  # what the rule could not follow stays unknown
        for o in n.outputs:
            if o not in a.shapes:
                a.shapes[o] = from_type(o)
    return a


def _attrs(n: Node) -> dict:
    """A node's attributes: canonical ones, or read from its ONNX proto when opaque."""
    if not n.opaque:  # a tensor attribute (ConstantOfShape's value) as an array, as below
        return {k: v.array() if isinstance(v, TensorValue) else v for k, v in n.attrs}
    if isinstance(n.payload, onnx.NodeProto):
        out = {x.name: helper.get_attribute_value(x) for x in n.payload.attribute}
        return {
            k: numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v
            for k, v in out.items()
        }
    return {}


def _call(n: Node, g: TermGraph, a: ShapeAnalysis) -> Call:
    """Node `n` of `g` as its shape rules see it, with what `a` knows so far."""
    ins = present_inputs(n)
    dtypes = tuple(g.values[i].type.dtype if i != ABSENT else 0 for i in ins)
    return Call(n, ins, _attrs(n), dtypes, a.shapes, a.values)


def _visit(n: Node, g: TermGraph, a: ShapeAnalysis, fill) -> None:
    """The shapes of `n`'s outputs and the value of its first output, by its op's rules (a
    declared op's by its body's, `_visit_declared`); `fill(vid, shape)` gives the dimensions
    a shape rule leaves None."""
    d = declaration(n.op)  # a declared op's node (its op is `domain.Name`)
    if d is not None and len(n.outputs) == 1:
        _visit_declared(n, d, g, a, fill)
        return
    rule = rule_of(n.op) if n.domain in ("", "ai.onnx") and n.outputs else None
    if rule is None:
        return
    c = _call(n, g, a)
    if rule.shape is not None:
        shapes = rule.shape(c)
        for o, s in zip(n.outputs, shapes if isinstance(shapes, list) else [shapes]):
            if s is not None:
                s = tuple(sympy.Integer(d) if isinstance(d, int) else d for d in s)
                a.shapes[o] = fill(o, s) if any_unknown(s) else s
    if rule.value is not None:
        out = n.outputs[0]
        _store_value(a, out, rule.value(c, a.shapes.get(out)), g.values[out].type.dtype)


def _visit_declared(n: Node, d: Declaration, g: TermGraph, a: ShapeAnalysis, fill) -> None:
    """The shape and value of declared op `n`'s output (`vocab.declared`): its body's nodes
    visited in order on a graph of their own, whose inputs have the shapes and values `a`
    knows for `n`'s, each body attribute that refers to one of the op's taken from `n` (or
    the declaration's default). A mark such as rewrite.Smooth (body: Identity) keeps its
    input's symbolic shape, where the type ONNX inference gives it has fresh dimensions."""
    taken = _attrs(n)
    defaults = {s.name: s.default for s in d.spec.attrs}
    values = [Value(name, UNKNOWN) for name in d.spec.inputs]
    index = {name: i for i, name in enumerate(d.spec.inputs)}
    sub = ShapeAnalysis()
    for i, vid in enumerate(n.inputs[: len(values)]):
        if vid == ABSENT:
            continue
        values[i] = replace(values[i], type=g.values[vid].type)
        if vid in a.shapes:
            sub.shapes[i] = a.shapes[vid]
        if vid in a.values:
            sub.values[i] = a.values[vid]
    nodes = []
    for b in d.body:
        index[b.output] = len(values)
        values.append(Value(b.output, UNKNOWN))
        attrs = tuple(
            (k, taken.get(v.name, defaults.get(v.name)) if isinstance(v, AttrRef) else v)
            for k, v in b.attrs
        )
        ins = tuple(index[i] if i else ABSENT for i in b.inputs)
        nodes.append(Node(b.op, ins, (index[b.output],), attrs))
    body = TermGraph(tuple(values), tuple(nodes), (), (), {}, d.opset)
    for b in nodes:
        _visit(b, body, sub, lambda vid, shape: fill(n.outputs[0], shape))
    last = nodes[-1].outputs[0] if nodes else None
    if sub.shapes.get(last) is not None:
        a.shapes[n.outputs[0]] = sub.shapes[last]
    if last in sub.values:
        a.values[n.outputs[0]] = sub.values[last]


def _store_value(a: ShapeAnalysis, out: int, arr, dtype: int) -> None:
    """Record value `arr` (an object array, or one element) of `out`, of ONNX type `dtype`,
    when it is small and the op computes it without wrapping around."""
    if arr is None:
        return
    if not isinstance(arr, np.ndarray):
        arr = obj_array(arr)  # numpy gives an element, not a 0-d array, for a scalar index
    if not _fits(arr, dtype):
        return  # the ONNX op would wrap around: the mathematical value is not its value
    if arr.size <= MAX_VALUE_ELEMENTS:
        a.values[out] = SymValue(arr.shape, tuple(arr.reshape(-1).tolist()))
        if a.shapes.get(out) is None:
            a.shapes[out] = tuple(sympy.Integer(d) for d in arr.shape)


def _fits(arr: np.ndarray, dtype: int) -> bool:
    """True when every numeric element is within the range of ONNX integer type `dtype`
    (any value passes for other or unknown types: they are never folded)."""
    try:
        info = np.iinfo(np_dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return True
    return all(
        e is None or not e.is_number or info.min <= int(e) <= info.max
        for e in arr.reshape(-1).tolist()
    )


# ---- rewriting the graph ----------------------------------------------------------------------


def fold_shapes(
    g: TermGraph, analysis: ShapeAnalysis | None = None, provenance: bool = False
) -> tuple[TermGraph, FoldStats]:
    """Fold what the shape analysis knows into `g` (see the module doc) and drop dead nodes.

    provenance: record what the folding did in the `engine.provenance` format (`_record`):
    each constant it made, and each kept node whose inputs or output name it changed, gets a
    tree with rule `fold:OP` (OP: the op of the node whose value was folded or bypassed) whose
    `replaces` names the nodes it removed for that.

    Returns the new TermGraph (types refined with the analysis's symbolic shapes) and
    FoldStats. `g` itself is not changed. Raises nothing on graphs it cannot follow.
    """
    a = analysis or analyze(g)
    values = [
        replace(v, type=TensorType(v.type.dtype, a.dim_text(vid)))
        if a.shapes.get(vid) is not None
        else v
        for vid, v in enumerate(g.values)
    ]
    consts = dict(g.constants)
    n_const = n_target = n_noop = 0
    alias: dict[int, int] = {}
    nodes: list[Node] = []
    index: list[int] = []  # parallel to nodes: the node's index in g.nodes
    targets: dict[int, int] = {}  # new Reshape target constant -> the target value it replaces
    taken = {v.name for v in g.values}

    def new_constant(base: str, arr: np.ndarray) -> int:
        name = base
        for k in itertools.count(1):
            if name not in taken:
                break
            name = f"{base}_{k}"
        taken.add(name)
        values.append(
            Value(name, TensorType(helper.np_dtype_to_tensor_dtype(arr.dtype), arr.shape))
        )
        consts[len(values) - 1] = arr
        return len(values) - 1

    for i, n in enumerate(g.nodes):
        n = _renamed(n, alias)
        outs = [o for o in n.outputs]
        if outs and not _effectful(n) and all(_foldable_value(a, g, o) for o in outs):
            for o in outs:
                consts[o] = _array(a.values[o], g.values[o].type)
                values[o] = Value(
                    values[o].name, TensorType(g.values[o].type.dtype, consts[o].shape)
                )
            n_const += 1
            continue
        if n.domain in ("", "ai.onnx") and len(n.outputs) == 1 and not old_form(n, g.opset):
            same = _noop_input(n, g, a, consts)
            if same is not None and g.values[same].type.dtype == g.values[n.outputs[0]].type.dtype:
                alias[n.outputs[0]] = same
                n_noop += 1
                continue
            if n.op == "Reshape" and n.inputs[1] not in consts:
                found = _reshape_target(a, n)
                if found is not None and (not found[1] or not n.opaque):
                    target, switch = found
                    vid = new_constant(f"{g.values[n.outputs[0]].name}_shape", target)
                    targets[vid] = n.inputs[1]
                    n = replace(n, inputs=(n.inputs[0], vid))
                    if switch:  # written from its attributes, not its proto (allowzero=1)
                        attrs = tuple((k, 0 if k == "allowzero" else v) for k, v in n.attrs)
                        n = replace(n, attrs=attrs, payload=None)
                    n_target += 1
        nodes.append(n)
        index.append(i)
    outputs = tuple(alias.get(o, o) for o in g.outputs)
    for o, t in zip(g.outputs, outputs):
        # a graph output that became the value its no-op read takes the output's name, so the
        # exporter needs no Identity to keep the name (unless that value is an input, a
        # constant or another output, which keep theirs)
        if (
            t != o
            and t not in g.inputs
            and t not in consts
            and outputs.count(t) == 1
            and t not in g.outputs
        ):
            values[t] = Value(g.values[o].name, values[t].type)
    out = prune(TermGraph(tuple(values), tuple(nodes), g.inputs, outputs, consts, g.opset, g.meta))
    if provenance:
        out = _record(g, out, dict(zip(map(id, nodes), index)), targets)
    stats = FoldStats(n_const, n_target, n_noop, len(g.nodes), len(out.nodes))
    return out, stats


AT = "engine/shapes.py"


def _record(g: TermGraph, out: TermGraph, index: dict[int, int], targets: dict) -> TermGraph:
    """`out` (what `fold_shapes` made of `g`) with provenance trees on what the folding made.

    index: id of each node of `out` -> its index in `g.nodes`. targets: each new Reshape
    target constant -> the value of `g` it replaces. A new constant's `replaces` is the nodes
    of `g` that computed it and are gone; a kept node whose input became another value (a
    bypassed no-op, a constant Reshape target) or whose output took a graph output's name
    gets the gone nodes behind each input it lost. The rule is `fold:OP`, OP the op of the
    node that computed the folded or bypassed value."""
    kept = {index[id(n)] for n in out.nodes}
    producer = {o: i for i, n in enumerate(g.nodes) for o in n.outputs}

    def gone(vids) -> list[int]:  # nodes of g behind vids that out no longer has
        seen: set[int] = set()
        stack = [v for v in vids if v != ABSENT]
        while stack:
            p = producer.get(stack.pop())
            if p is None or p in kept or p in seen:
                continue
            seen.add(p)
            stack.extend(v for v in (*g.nodes[p].inputs, *g.nodes[p].implicit) if v != ABSENT)
        return sorted(seen)

    def name(i: int) -> str:
        n = g.nodes[i]
        return n.name or g.values[n.outputs[0]].name

    def tree(lost: int, op: str | None = None) -> dict | None:
        nodes = gone([lost])
        if not nodes and lost not in producer:
            return None
        folded = g.nodes[producer[lost]].op if lost in producer else g.nodes[nodes[-1]].op
        return {
            "rule": f"fold:{folded}",
            "at": AT,
            "op": op or folded,
            "replaces": [name(i) for i in nodes],
            "after": [],
        }

    values = list(out.values)
    for vid in out.constants:
        lost = targets.get(vid, vid)
        if vid < len(g.values) and vid in g.constants or values[vid].provenance is not None:
            continue
        t = tree(lost)
        if t is not None:
            values[vid] = replace(values[vid], provenance=t)
    renamed = {}  # value of out -> the graph output of g whose name it took
    for o, t in zip(g.outputs, out.outputs):
        if t != o and values[t].name == g.values[o].name:
            renamed[t] = o
    nodes = []
    for n in out.nodes:
        before = g.nodes[index[id(n)]]
        lost = [a for a, b in zip(before.inputs, n.inputs) if a != b]
        lost += [a for a, b in zip(before.implicit, n.implicit) if a != b]
        lost += [renamed[o] for o in n.outputs if o in renamed]
        trees = [t for t in (tree(v, n.op) for v in lost) if t is not None]
        if trees and n.provenance is not None:
            trees.append(n.provenance)  # the import's
        if trees:
            top = trees[0]
            top["after"] = trees[1:]
            n = replace(n, provenance=top)
        nodes.append(n)
    return replace(out, values=tuple(values), nodes=tuple(nodes))


def _renamed(n: Node, alias: dict[int, int]) -> Node:
    if not alias:
        return n
    ins = tuple(alias.get(i, i) for i in n.inputs)
    imp = tuple(alias.get(i, i) for i in n.implicit)
    if ins == n.inputs and imp == n.implicit:
        return n
    return replace(n, inputs=ins, implicit=imp)


def _effectful(n: Node) -> bool:
    spec = OPS.get(n.op)
    if n.op in ("If", "Loop", "Scan") or n.domain not in ("", "ai.onnx"):
        return True
    return spec is not None and (spec.random or spec.effectful)


def _foldable_value(a: ShapeAnalysis, g: TermGraph, vid: int) -> bool:
    v = a.values.get(vid)
    if v is None or not v.known or vid in g.constants:
        return False
    dt = g.values[vid].type.dtype
    try:
        np_dtype(dt)
    except (KeyError, TypeError, ValueError):
        return False
    return dt != 0 and dt != onnx.TensorProto.STRING


def _array(v: SymValue, t: TensorType) -> np.ndarray:
    return np.array([int(e) for e in v.elems], dtype=np_dtype(t.dtype)).reshape(v.shape)


def _noop_input(n: Node, g: TermGraph, a: ShapeAnalysis, consts: dict) -> int | None:
    """The input of an Expand, Reshape or Slice whose output has exactly the input's shape, of
    a Pad by all zeros, or of a Concat of one input or a Split into one output (both copy
    their input: ONNX operator spec, Concat and Split)."""
    if n.op == "Concat":
        return n.inputs[0] if len(present_inputs(n)) == 1 else None
    if n.op == "Split":  # into one output: the node has one (the caller's condition) and
        # `num_outputs` or the `split` input says one (a matchable Split is its first output)
        return n.inputs[0] if split_count(_call(n, g, a)) == 1 else None
    if n.op == "Pad":
        pads, x = a.values.get(n.inputs[1]), a.shapes.get(n.inputs[0])
        if x is not None and all(d.is_number for d in x) and n.inputs[1] in consts:
            return None  # static with constant pads: the rule library's pad-zero sees it
        return n.inputs[0] if pads is not None and pads.known and not any(pads.elems) else None
    if n.op not in ("Expand", "Reshape", "Slice"):
        return None
    x, y = a.shapes.get(n.inputs[0]), a.shapes.get(n.outputs[0])
    if x is None or y is None or len(x) != len(y) or any(p != q for p, q in zip(x, y)):
        return None
    if all(d.is_number for d in x):
        return None  # static: the rule library's noop-* rules see it (and are named in reports)
    if n.op == "Slice" and len(n.inputs) > 4 and n.inputs[4] != ABSENT:
        steps = a.values.get(n.inputs[4])  # a slice that keeps every index in order is x;
        if steps is None or not steps.known or any(int(e) <= 0 for e in steps.elems):
            return None  # a reversing one keeps the shape but not the order
    return n.inputs[0]


def _reshape_target(a: ShapeAnalysis, n: Node) -> tuple[np.ndarray, bool] | None:
    """A constant Reshape target equivalent to the symbolic one, and whether the node must
    switch to allowzero=0: known numbers as they are, `0` for an element equal to the input's
    own dimension at that index, `-1` for at most one element left over. None when that is
    not possible.

    A `0` copies the input's dimension only with allowzero=0 (ONNX Reshape-14). A node with
    allowzero=1 (the dynamo exporter's) whose target has no literal 0 means the same with
    allowzero=0, so it switches, and then may use copying zeros too."""
    target = a.values.get(n.inputs[1])
    x = a.shapes.get(n.inputs[0])
    if target is None or any_unknown(target.elems) or target.known or target.shape == ():
        return None
    allowzero = _attrs(n).get("allowzero", 0)
    switch = bool(allowzero) and not any(e.is_number and int(e) == 0 for e in target.elems)
    copying = not allowzero or switch
    out, unknown = [], 0
    for i, e in enumerate(target.elems):
        if e.is_number:
            unknown += int(e) == -1
            out.append(int(e))
        elif copying and x is not None and i < len(x) and x[i] == e:
            out.append(0)
        else:
            out.append(-1)
            unknown += 1
    if unknown > 1:
        return None
    return np.array(out, dtype=np.int64), switch and 0 in out
