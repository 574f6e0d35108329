"""Symbolic shape analysis and shape folding over a TermGraph.

Every dimension is a sympy integer expression: a number, or a symbol (an input's `dim_param`,
or a fresh symbol `_uN` per dimension nothing knows), or an expression over symbols
(`2*seq`, `floor(seq/2)`). Symbols are positive integers, so `seq - seq` is 0 and
`Equal(seq, -1)` is false. Two dimensions are the same exactly when their expressions are,
which is what lets a rule see that a reshape target copies its input's own dimensions.

Besides shapes, the analysis propagates the *values* of small integer tensors (at most
`MAX_VALUE_ELEMENTS` elements) through the ops that compute on shapes: Shape, Size, Gather,
Slice, Concat, Unsqueeze, Squeeze, Reshape, Flatten, Transpose, Cast, Identity, Add, Sub, Mul,
Div, Mod, Max, Min, Neg, Abs, Equal, Less, Greater, Not, And, Or, Where, Range, Expand,
ConstantOfShape, ReduceProd, ReduceSum, ReduceMax, ReduceMin. The semantics are the ONNX
operator specification's (integer Div truncates, Mod with fmod=0 takes the divisor's sign, Slice
and Shape clamp like Python slices).

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

import functools
import itertools
import re
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
import sympy
from onnx import helper, numpy_helper
from sympy.parsing.sympy_parser import parse_expr

from vocab.graph import ABSENT, Node, TermGraph, Value, prune
from vocab.ops import OPS, TensorValue
from vocab.types import TensorType, np_dtype

MAX_VALUE_ELEMENTS = 64  # integer tensors up to this size have their values tracked
_BIG = 2**31  # a Slice end at or past this is "to the end"

Expr = sympy.Expr
Shape = tuple  # tuple[Expr, ...]


@dataclass(frozen=True)
class SymValue:
    """The value of a small tensor (at most MAX_VALUE_ELEMENTS elements): its shape and its
    elements in row-major order, each a sympy expression or None when unknown."""

    shape: tuple[int, ...]
    elems: tuple

    def array(self) -> np.ndarray:
        """The value as a numpy object array of its elements."""
        return _obj(list(self.elems)).reshape(self.shape)

    @property
    def known(self) -> bool:
        """True when every element is a number (the value can become a constant)."""
        return all(e is not None and e.is_number for e in self.elems)


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


def symbol(name: str) -> sympy.Symbol:
    """The positive-integer symbol of a dimension name."""
    return sympy.Symbol(name, integer=True, positive=True)


def to_dim(e: Expr):
    """A dimension as TensorType stores it: an int, or the expression's text."""
    if e is None:
        return None
    if e.is_Integer:
        return int(e)
    return str(e)


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


_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_EXPR_TEXT = re.compile(r"[A-Za-z_0-9*+\-/() ]+")


@functools.lru_cache(maxsize=4096)
def parse_dim(text: str) -> Expr:
    """The expression a dimension string stands for: `to_dim`'s text read back.

    "batch" is the symbol `batch`; "batch*seq" (how the analysis writes a product) is the
    product of the symbols `batch` and `seq`, so a dimension written by one analysis run
    means the same in the next. A string that is not such an expression (a `dim_param` may
    be any text) is one symbol of that name."""
    if _IDENT.fullmatch(text) or not _EXPR_TEXT.fullmatch(text):
        return symbol(text)
    names = {n: symbol(n) for n in _IDENT.findall(text) if n != "floor"}
    try:
        e = parse_expr(
            text,
            local_dict=names,
            global_dict={"Integer": sympy.Integer, "floor": sympy.floor, "Symbol": sympy.Symbol},
        )
    except (SyntaxError, TypeError, ValueError, AttributeError, sympy.SympifyError):
        return symbol(text)
    return e if isinstance(e, sympy.Expr) and str(e) == text else symbol(text)


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
        v = _value_of_array(arr)
        if v is not None:
            a.values[vid] = v
    for n in g.nodes:
        try:
            if not old_form(n, g.opset):
                _visit(n, g, a)
        except (ValueError, TypeError, IndexError, KeyError, ZeroDivisionError, OverflowError):
            pass  # what the rule could not follow stays unknown
        for o in n.outputs:
            if o not in a.shapes:
                a.shapes[o] = from_type(o)
    return a


# The first opset of the form (inputs and attributes) this module's rules are written for, for
# the ops whose older forms differ: Reshape-1 had a `shape` attribute, Slice-1 `starts`/`ends`
# attributes, Pad-2 a `pads` attribute, Split-1 an optional `split` input besides the
# attribute, Concat-1 an optional axis. A node of an older form is unknown to the analysis
# (its output keeps the type ONNX shape inference gave it) and is never folded or dropped here.
_FORM_SINCE = {"Reshape": 5, "Slice": 10, "Pad": 11, "Split": 2, "Concat": 4}


def old_form(n: Node, opset: int) -> bool:
    """True if default-domain node `n` at `opset` is in an older form than the one the shape
    rules read (see `_FORM_SINCE`)."""
    return n.domain in ("", "ai.onnx") and opset < _FORM_SINCE.get(n.op, 0)


def _value_of_array(arr) -> SymValue | None:
    arr = np.asarray(arr)
    if arr.size > MAX_VALUE_ELEMENTS or arr.dtype.kind not in "iub":
        return None
    return SymValue(arr.shape, tuple(sympy.Integer(int(x)) for x in arr.reshape(-1)))


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


def _ints(a: ShapeAnalysis, vid: int) -> list[int] | None:
    v = a.values.get(vid)
    if v is None or not v.known:
        return None
    return [int(e) for e in v.elems]


def _is_int_dtype(g: TermGraph, vid: int) -> bool:
    dt = g.values[vid].type.dtype
    return dt in (
        onnx.TensorProto.INT64,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.BOOL,
    )


_SAME = set(
    "Relu Neg Sqrt Erf Tanh Sigmoid Exp Log Abs Reciprocal Floor Ceil Sin Cos Sign Identity "
    "Dropout LeakyRelu HardSigmoid Gelu Softmax LogSoftmax Not Cast CastLike Clip Elu Selu "
    "Softplus Softsign HardSwish Mish Round IsNaN IsInf LayerNormalization "
    "BatchNormalization InstanceNormalization RMSNormalization SimplifiedLayerNormalization "
    "LpNormalization".split()
)
_BROADCAST = set(
    "Add Sub Mul Div Pow Mod Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Where "
    "Max Min PRelu BitShift Sum Mean".split()
)
_ARITH = {"Add", "Sub", "Mul", "Div", "Mod", "Max", "Min", "Sum"}
_COMPARE = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or"}


def broadcast(shapes: list[Shape]) -> Shape | None:
    """Multidirectional (numpy) broadcasting of symbolic shapes (ONNX docs/Broadcasting.md).

    A dimension of 1 takes the other; equal expressions stay; a symbol against a number > 1 is
    that number (the model is valid, so the symbol must be 1 or equal). Two different symbols
    give None for that dimension (either may be 1). Returns None if a rank is unknown."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        rest = []
        for d in dims:
            if d == 1 or any(d == r for r in rest):
                continue
            rest.append(d)
        if not rest:
            out.append(sympy.Integer(1))
        elif len(rest) == 1:
            out.append(rest[0])
        else:
            nums = [d for d in rest if d.is_number]
            out.append(nums[0] if nums else None)
    return tuple(out)


# the ops whose shapes (and small integer values) the analysis computes itself: the list in
# the module docstring; `rewrite ops` shows it per op
SYMBOLIC_OPS = frozenset(
    "Shape Size Gather Slice Concat Unsqueeze Squeeze Reshape Flatten Transpose Cast Identity "
    "Add Sub Mul Div Mod Max Min Neg Abs Equal Less Greater LessOrEqual Not And Or Where Range "
    "Expand ConstantOfShape ReduceProd ReduceSum ReduceMax ReduceMin MatMul Gemm Pad Split "
    "Sum".split()
)


def present_inputs(n: Node) -> tuple[int, ...]:
    """`n`'s inputs without the trailing absent slots (a matchable node has one slot per
    op-table input, a variadic op `VARIADIC_SLOTS` of them; an opaque node has its own)."""
    ins = n.inputs
    end = len(ins)
    while end and ins[end - 1] == ABSENT:
        end -= 1
    return ins[:end]


def _visit(n: Node, g: TermGraph, a: ShapeAnalysis) -> None:
    op = n.op if n.domain in ("", "ai.onnx") else None
    if op is None or not n.outputs:
        return
    ins = list(present_inputs(n))
    s_in = [a.shapes.get(i) if i != ABSENT else None for i in ins]
    out = n.outputs[0]
    at = _attrs(n)
    shp = None
    if op in _SAME:
        shp = s_in[0]
    elif op in _BROADCAST:
        shp = broadcast([s for i, s in zip(ins, s_in) if i != ABSENT])
        if shp is not None and None in shp:
            shp = None
    elif op == "MatMul":
        shp = _matmul(s_in[0], s_in[1])
    elif op == "Gemm":
        x, w = s_in[0], s_in[1]
        if x is not None and w is not None:
            m = x[1] if at.get("transA") else x[0]
            k = w[0] if at.get("transB") else w[1]
            shp = (m, k)
    elif op == "Transpose":
        x = s_in[0]
        if x is not None:
            perm = at.get("perm") or tuple(range(len(x) - 1, -1, -1))
            shp = tuple(x[p] for p in perm)
    elif op == "Reshape":
        shp = _reshape(s_in[0], a.values.get(ins[1]), at.get("allowzero", 0))
    elif op in ("Unsqueeze", "Squeeze"):
        axes = _ints(a, ins[1]) if len(ins) > 1 and ins[1] != ABSENT else at.get("axes")
        shp = _unsqueeze(s_in[0], axes) if op == "Unsqueeze" else _squeeze(s_in[0], axes)
    elif op == "Flatten" and s_in[0] is not None:
        x, ax = s_in[0], at.get("axis", 1)
        ax = ax + len(x) if ax < 0 else ax
        shp = (sympy.Mul(*x[:ax]), sympy.Mul(*x[ax:]))
    elif op == "Concat" and all(s is not None for s in s_in):
        axis = at["axis"]
        rank = len(s_in[0])
        axis = axis + rank if axis < 0 else axis
        shp = tuple(
            sympy.Add(*[s[axis] for s in s_in]) if k == axis else s_in[0][k] for k in range(rank)
        )
    elif op == "Gather" and s_in[0] is not None and s_in[1] is not None:
        axis = at.get("axis", 0)
        axis = axis + len(s_in[0]) if axis < 0 else axis
        shp = s_in[0][:axis] + s_in[1] + s_in[0][axis + 1 :]
    elif op == "Shape" and s_in[0] is not None:
        shp = (sympy.Integer(len(range(len(s_in[0]))[slice(at.get("start", 0), at.get("end"))])),)
    elif op == "Size":
        shp = ()
    elif op == "Expand":
        t = a.values.get(ins[1])
        if t is not None and s_in[0] is not None and None not in t.elems:
            shp = broadcast([s_in[0], t.elems])
            shp = None if shp is None or None in shp else shp
    elif op == "ConstantOfShape":
        t = a.values.get(ins[0])
        if t is not None and None not in t.elems:
            shp = tuple(t.elems)
    elif op == "Slice":
        shp = _slice_shape(
            s_in[0],
            [a.values.get(i) if i != ABSENT else None for i in ins[1:]] + [None] * (5 - len(ins)),
        )
    elif op.startswith("Reduce") and s_in[0] is not None:
        axes = _ints(a, ins[1]) if len(ins) > 1 and ins[1] != ABSENT else at.get("axes")
        shp = _reduce(s_in[0], axes, at.get("keepdims", 1), at.get("noop_with_empty_axes", 0))
    elif op == "Range":
        vals = [a.values.get(i) for i in ins]
        if all(v is not None and v.known for v in vals):
            start, limit, delta = (float(v.elems[0]) for v in vals)
            shp = (sympy.Integer(max(int(np.ceil((limit - start) / delta)), 0)),)
        elif all(v is not None and v.elems[0] is not None for v in vals) and vals[2].elems[0] == 1:
            shp = (sympy.Max(vals[1].elems[0] - vals[0].elems[0], 0),)
    elif op == "Pad" and s_in[0] is not None:
        pads = a.values.get(ins[1])
        axes = _ints(a, ins[3]) if len(ins) > 3 and ins[3] != ABSENT else list(range(len(s_in[0])))
        if (
            pads is not None
            and None not in pads.elems
            and axes is not None
            and len(pads.elems) == 2 * len(axes)
        ):
            x, k = list(s_in[0]), len(axes)
            for j, ax in enumerate(axes):
                x[ax] = x[ax] + pads.elems[j] + pads.elems[j + k]
            shp = tuple(x)
    elif op.partition("#")[0] == "Split" and s_in[0] is not None:
        _split(n, g, a, s_in[0], at)
    if shp is not None:
        a.shapes[out] = tuple(sympy.Integer(d) if isinstance(d, int) else d for d in shp)
    _value(n, op, ins, at, g, a)


def _matmul(x: Shape | None, w: Shape | None) -> Shape | None:
    if x is None or w is None or not x or not w:
        return None
    x2 = x if len(x) > 1 else (sympy.Integer(1),) + x
    w2 = w if len(w) > 1 else w + (sympy.Integer(1),)
    batch = broadcast([x2[:-2], w2[:-2]])
    if batch is None or None in batch:
        return None
    out = batch + (x2[-2], w2[-1])
    if len(x) == 1:
        out = out[:-2] + out[-1:]
    if len(w) == 1:
        out = out[:-1]
    return out


def _reshape(x: Shape | None, target: SymValue | None, allowzero: int) -> Shape | None:
    if target is None or None in target.elems:
        return None
    out, infer = [], None
    for i, e in enumerate(target.elems):
        if e == 0 and not allowzero:
            if x is None or i >= len(x):
                return None
            out.append(x[i])
        elif e == -1:
            infer = i
            out.append(None)
        else:
            out.append(e)
    if infer is not None:
        if x is None:
            return None
        rest = sympy.Mul(*[d for d in out if d is not None])
        out[infer] = _simplify(sympy.Mul(*x) / rest)
        if not out[infer].is_integer:
            return None
    return tuple(out)


def _unsqueeze(x: Shape | None, axes) -> Shape | None:
    if x is None or axes is None:
        return None
    rank = len(x) + len(axes)
    axes = sorted(a + rank if a < 0 else a for a in axes)
    out, it = [], iter(x)
    for k in range(rank):
        out.append(sympy.Integer(1) if k in axes else next(it))
    return tuple(out)


def _squeeze(x: Shape | None, axes) -> Shape | None:
    if x is None:
        return None
    if axes is None:
        if not all(d.is_number for d in x):
            return None
        return tuple(d for d in x if d != 1)
    axes = {a + len(x) if a < 0 else a for a in axes}
    return tuple(d for k, d in enumerate(x) if k not in axes)


def _reduce(x: Shape, axes, keepdims: int, noop: int) -> Shape | None:
    if axes is None or len(axes) == 0:
        if noop:
            return x
        axes = range(len(x))
    axes = {a + len(x) if a < 0 else a for a in axes}
    if keepdims:
        return tuple(sympy.Integer(1) if k in axes else d for k, d in enumerate(x))
    return tuple(d for k, d in enumerate(x) if k not in axes)


def _slice_shape(x: Shape | None, parts) -> Shape | None:
    starts, ends, axes, steps = parts[:4]
    if x is None or starts is None or ends is None:
        return None
    if None in starts.elems or None in ends.elems:
        return None
    n = len(starts.elems)
    ax = (
        [int(e) for e in axes.elems]
        if axes is not None and axes.known
        else (None if axes else list(range(n)))
    )
    st = (
        [int(e) for e in steps.elems]
        if steps is not None and steps.known
        else (None if steps else [1] * n)
    )
    if ax is None or st is None:
        return None
    out = list(x)
    for s, e, k, step in zip(starts.elems, ends.elems, ax, st):
        k = k + len(x) if k < 0 else k
        out[k] = _slice_len(x[k], s, e, step)
        if out[k] is None:
            return None
    return tuple(out)


def _slice_len(dim: Expr, s: Expr, e: Expr, step: int) -> Expr | None:
    if dim.is_number and s.is_number and e.is_number:
        return sympy.Integer(len(range(int(dim))[slice(int(s), int(e), step)]))
    if step != 1:
        return None

    def clamp(v):
        if v.is_number:
            v = int(v)
            if v >= _BIG:
                return dim
            if v < 0:
                return sympy.Max(dim + v, 0)
            return sympy.Min(v, dim)
        return sympy.Min(v, dim) if v.is_nonnegative else None

    s2, e2 = clamp(s), clamp(e)
    if s2 is None or e2 is None:
        return None
    return sympy.Max(e2 - s2, 0)


def _split_sizes(n: Node, a: ShapeAnalysis, at: dict) -> list[int] | None:
    """The sizes a Split node's `split` input (or Split-11's attribute) gives, if known."""
    if len(n.inputs) > 1 and n.inputs[1] != ABSENT:
        return _ints(a, n.inputs[1])
    return at.get("split")


def _split_count(n: Node, a: ShapeAnalysis, at: dict) -> int | None:
    """How many outputs a Split node has: its split sizes, its `num_outputs`, or (an imported
    node) its ONNX proto's outputs; a matchable Split term is one of them, so `n.outputs`
    does not say."""
    sizes = _split_sizes(n, a, at)
    if sizes is not None:
        return len(sizes)
    if at.get("num_outputs"):
        return at["num_outputs"]
    return len(n.payload.output) if isinstance(n.payload, onnx.NodeProto) else None


def _split(n: Node, g: TermGraph, a: ShapeAnalysis, x: Shape, at: dict) -> None:
    axis = at.get("axis", 0)
    axis = axis + len(x) if axis < 0 else axis
    sizes = _split_sizes(n, a, at)
    if not n.opaque:  # a term of one output: Split (output 0) or its projection Split#K
        k = int(n.op.partition("#")[2] or 0)
        count = at.get("num_outputs")
        if sizes is None and count and x[axis].is_number:  # equal chunks, the last smaller
            d = int(x[axis])
            chunk = -(-d // count)
            sizes = [min(chunk, max(d - i * chunk, 0)) for i in range(count)]
        if sizes is None or k >= len(sizes):
            return
        a.shapes[n.outputs[0]] = x[:axis] + (sympy.Integer(sizes[k]),) + x[axis + 1 :]
        return
    if sizes is None or len(sizes) != len(n.outputs):
        return
    for o, size in zip(n.outputs, sizes):
        a.shapes[o] = x[:axis] + (sympy.Integer(size),) + x[axis + 1 :]


# ---- values of small integer tensors --------------------------------------------------------


def _value(n: Node, op: str, ins: list[int], at: dict, g: TermGraph, a: ShapeAnalysis) -> None:
    """Propagate the value of a small tensor through `n` (numpy object arrays of sympy
    expressions, None for an unknown element)."""
    out = n.outputs[0]
    arr = None

    def val(i):
        v = a.values.get(i) if i != ABSENT else None
        return None if v is None else v.array()

    def ints(i):
        return _ints(a, i) if i != ABSENT else None

    x = val(ins[0]) if ins else None
    if op == "Shape":
        s = a.shapes.get(ins[0])
        if s is not None:
            arr = _obj(list(s[slice(at.get("start", 0), at.get("end"))]))
    elif op == "Size":
        s = a.shapes.get(ins[0])
        if s is not None:
            arr = _obj(sympy.Mul(*s))
    elif op in ("Identity", "Cast") and x is not None:
        arr = x if op == "Identity" or _cast_keeps(x, at.get("to")) else None
    elif op == "Gather" and x is not None and ints(ins[1]) is not None:
        idx = np.array(ints(ins[1]), dtype=np.int64).reshape(a.values[ins[1]].shape)
        arr = np.take(x, idx, axis=at.get("axis", 0))
    elif op == "Concat" and all(val(i) is not None for i in ins):
        arr = np.concatenate([val(i) for i in ins], axis=at["axis"])
    elif op in ("Unsqueeze", "Squeeze", "Reshape", "Flatten") and x is not None:
        s = a.shapes.get(out)
        if s is not None and all(d.is_number for d in s):
            arr = x.reshape(tuple(int(d) for d in s))
    elif op == "Transpose" and x is not None:
        arr = x.transpose(at.get("perm") or None)
    elif op == "Slice" and x is not None:
        starts, ends = ints(ins[1]), ints(ins[2])
        axes = ints(ins[3]) if len(ins) > 3 and ins[3] != ABSENT else list(range(len(starts or ())))
        steps = ints(ins[4]) if len(ins) > 4 and ins[4] != ABSENT else [1] * len(starts or ())
        if None not in (starts, ends, axes, steps):
            sl = [slice(None)] * x.ndim
            for st, en, ax, sp in zip(starts, ends, axes, steps):
                sl[ax] = slice(st, en, sp)
            arr = x[tuple(sl)]
    elif op in _ARITH or op in _COMPARE or op == "Where":
        vs = [val(i) for i in ins]
        if all(v is not None for v in vs):
            arr = _elementwise(op, vs, at, _is_int_dtype(g, ins[-1]))
    elif op in ("Neg", "Abs", "Not") and x is not None:
        f = {
            "Neg": lambda e: -e,
            "Abs": sympy.Abs,
            "Not": lambda e: sympy.Integer(1 - int(e)) if e.is_number else None,
        }[op]
        arr = _map(lambda e: None if e is None else f(e), x)
    elif op == "Range":
        r = [ints(i) for i in ins]
        if all(v is not None for v in r) and _is_int_dtype(g, ins[0]):
            rng = range(r[0][0], r[1][0], r[2][0])
            if len(rng) <= MAX_VALUE_ELEMENTS:
                arr = _obj([sympy.Integer(v) for v in rng])
    elif op in ("ConstantOfShape", "Expand"):
        s = a.shapes.get(out)
        fill = None
        if op == "ConstantOfShape":
            t = at.get("value")
            t = np.zeros(1, np.float32) if t is None else np.asarray(t)
            if t.dtype.kind in "iub":
                fill = _obj(sympy.Integer(int(t.reshape(-1)[0])))
        else:
            fill = x
        if fill is not None and s is not None and all(d.is_number for d in s):
            shape = tuple(int(d) for d in s)
            if int(np.prod(shape)) <= MAX_VALUE_ELEMENTS:
                arr = np.broadcast_to(fill, shape).copy()
    elif op in ("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin") and x is not None:
        s = a.shapes.get(out)
        if x.ndim == 1 and x.size and None not in x.tolist() and s is not None and len(s) <= 1:
            f = {
                "ReduceProd": sympy.Mul,
                "ReduceSum": sympy.Add,
                "ReduceMax": sympy.Max,
                "ReduceMin": sympy.Min,
            }[op]
            arr = _obj(f(*x.tolist())).reshape(tuple(int(d) for d in s))
    if arr is not None and not isinstance(arr, np.ndarray):
        arr = _obj(arr)  # numpy gives an element, not a 0-d array, for a scalar index
    if arr is not None and not _fits(arr, g.values[out].type.dtype):
        arr = None  # the ONNX op would wrap around: the mathematical value is not its value
    if arr is not None and arr.size <= MAX_VALUE_ELEMENTS:
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


def _obj(x) -> np.ndarray:
    """A numpy object array holding sympy expressions (a list gives a 1-D array)."""
    if isinstance(x, list):
        out = np.empty(len(x), dtype=object)
        out[:] = x
        return out
    out = np.empty((), dtype=object)
    out[()] = x
    return out


def _map(f, arr: np.ndarray) -> np.ndarray:
    flat = [f(e) for e in arr.reshape(-1).tolist()]
    return _obj(flat).reshape(arr.shape)


def _cast_keeps(v: np.ndarray, to) -> bool:
    """True if casting integer elements to `to` keeps them as they are (an integer type wide
    enough for the known numbers, or any type for symbolic dims, which fit in int32)."""
    if to not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
        return False
    return all(e is None or not e.is_number or abs(int(e)) < 2**31 for e in v.reshape(-1).tolist())


def _elementwise(op: str, vs: list[np.ndarray], at: dict, integer: bool) -> np.ndarray | None:
    try:
        cols = np.broadcast_arrays(*vs)
    except ValueError:
        return None
    flat = [c.reshape(-1).tolist() for c in cols]
    out = [None if None in args else _apply(op, args, at, integer) for args in zip(*flat)]
    return _obj(out).reshape(cols[0].shape)


def _apply(op: str, args, at: dict, integer: bool) -> Expr | None:
    if op == "Where":
        c, x, y = args
        return (x if int(c) else y) if c.is_number else None
    x, y = args
    if op == "Add" or op == "Sum":
        return x + y
    if op == "Sub":
        return x - y
    if op == "Mul":
        return x * y
    if op == "Max":
        return sympy.Max(x, y)
    if op == "Min":
        return sympy.Min(x, y)
    if op == "Div":
        if not integer:
            return None
        if x.is_number and y.is_number:
            return sympy.Integer(
                int(x) // int(y) if (int(x) >= 0) == (int(y) > 0) else -(abs(int(x)) // abs(int(y)))
            )
        if x.is_nonnegative and y.is_positive:
            return sympy.floor(x / y)
        return None
    if op == "Mod":
        if not integer or at.get("fmod"):
            return None
        if x.is_number and y.is_number:
            return sympy.Integer(int(x) % int(y))
        if x.is_nonnegative and y.is_positive:
            return sympy.Mod(x, y)
        return None
    truth = _compare(op, x, y)
    return None if truth is None else sympy.Integer(int(truth))


def _simplify(e: Expr) -> Expr:
    """`sympy.simplify(e)`, skipped when `e` is already simplest: an atom (a number or a
    symbol), a monomial (`197*batch`, `batch*sequence**2`) or a monomial plus an integer
    (`batch + 1`), which `simplify` returns as they are. Most shape arithmetic is of these
    forms, and the first `simplify` call of a process imports `sympy.physics.units` (2-3 s)."""
    return (
        e
        if _monomial(e)
        or (
            e.is_Add
            and len(e.args) == 2
            and any(a.is_Integer for a in e.args)
            and all(_monomial(a) for a in e.args)
        )
        else sympy.simplify(e)
    )


def _monomial(e: Expr) -> bool:
    """An atom, a positive integer power of a symbol, or a product of those."""
    if e.is_Atom:
        return True
    if e.is_Pow:
        return bool(e.base.is_Symbol and e.exp.is_Integer and e.exp > 0)
    return bool(e.is_Mul) and all(a.is_Atom or (a.is_Pow and _monomial(a)) for a in e.args)


def _compare(op: str, x: Expr, y: Expr) -> bool | None:
    if op in ("And", "Or"):
        if not (x.is_number and y.is_number):
            return None
        return bool(int(x)) and bool(int(y)) if op == "And" else bool(int(x)) or bool(int(y))
    d = _simplify(x - y)
    if op == "Equal":
        return d.is_zero
    if op == "Less":
        return d.is_negative
    if op == "Greater":
        return d.is_positive
    if op == "LessOrEqual":
        return d.is_nonpositive
    return d.is_nonnegative


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
            same = _noop_input(n, a, consts)
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


def _noop_input(n: Node, a: ShapeAnalysis, consts: dict) -> int | None:
    """The input of an Expand, Reshape or Slice whose output has exactly the input's shape, of
    a Pad by all zeros, or of a Concat of one input or a Split into one output (both copy
    their input: ONNX operator spec, Concat and Split)."""
    if n.op == "Concat":
        return n.inputs[0] if len(present_inputs(n)) == 1 else None
    if n.op == "Split":  # into one output: the node has one (the caller's condition) and
        # `num_outputs` or the `split` input says one (a matchable Split is its first output)
        return n.inputs[0] if _split_count(n, a, _attrs(n)) == 1 else None
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
    if target is None or None in target.elems or target.known or target.shape == ():
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
