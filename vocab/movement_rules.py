"""Shape rules of the ops that compute on shapes, move data or contract dimensions.

Symbolic shapes (`shape_rule`) and small integer values (`value_rule`) of Shape, Size,
ConstantOfShape, Range, Expand, Gather, Concat, the views (Reshape, Flatten, Squeeze,
Unsqueeze), Transpose, Slice, Pad, Split, MatMul, Gemm and the reductions: the ops a model's
shape arithmetic is made of. Sources: the ONNX operator specification of each op
(https://onnx.ai/onnx/operators/), the form named in each rule; Slice and Shape clamp like
Python slices. A rule with `since` reads the form of that opset on; older forms are left to
ONNX shape inference.
"""

from __future__ import annotations

import numpy as np
import onnx
import sympy

from vocab.ops import FAMILIES
from vocab.shape_registry import Call, is_int_dtype, shape_rule, value_rule
from vocab.symbolic import (
    MAX_VALUE_ELEMENTS,
    Expr,
    Shape,
    any_unknown,
    broadcast,
    obj_array,
    simplify,
)

_BIG = 2**31  # a Slice end at or past this is "to the end"


@shape_rule("Shape")
def shape(c: Call) -> Shape | None:
    """(the number of dims in [start, end), clamped like a Python slice) (ONNX spec,
    Shape-15)."""
    x = c.shape(0)
    if x is None:
        return None
    return (sympy.Integer(len(range(len(x))[slice(c.attrs.get("start", 0), c.attrs.get("end"))])),)


@value_rule("Shape")
def shape_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """The input's dims in [start, end) (ONNX spec, Shape-15)."""
    s = c.shape(0)
    if s is None:
        return None
    return obj_array(list(s[slice(c.attrs.get("start", 0), c.attrs.get("end"))]))


@shape_rule("Size")
def size(c: Call) -> Shape | None:
    """A scalar (ONNX spec, Size)."""
    return ()


@value_rule("Size")
def size_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """The product of the input's dims (ONNX spec, Size)."""
    s = c.shape(0)
    return None if s is None else obj_array(sympy.Mul(*s))


@shape_rule("ConstantOfShape")
def constant_of_shape(c: Call) -> Shape | None:
    """The `input` input's elements (ONNX spec, ConstantOfShape)."""
    t = c.value(0)
    return None if t is None or any_unknown(t.elems) else tuple(t.elems)


@value_rule("ConstantOfShape")
def constant_of_shape_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """The `value` attribute's element (float 0 by default) in the output's shape, for an
    integer fill (ONNX spec, ConstantOfShape)."""
    t = c.attrs.get("value")
    t = np.zeros(1, np.float32) if t is None else np.asarray(t)
    if t.dtype.kind not in "iub":
        return None
    return _filled(obj_array(sympy.Integer(int(t.reshape(-1)[0]))), out)


@shape_rule("Range")
def range_(c: Call) -> Shape | None:
    """(max(ceil((limit - start) / delta), 0)) (ONNX spec, Range); with symbolic bounds, only
    for delta 1."""
    vals = [c.value(i) for i in range(len(c.inputs))]
    if all(v is not None and v.known for v in vals):
        start, limit, delta = (float(v.elems[0]) for v in vals)
        return (sympy.Integer(max(int(np.ceil((limit - start) / delta)), 0)),)
    if all(v is not None and v.elems[0] is not None for v in vals) and vals[2].elems[0] == 1:
        return (sympy.Max(vals[1].elems[0] - vals[0].elems[0], 0),)
    return None


@value_rule("Range")
def range_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """start, start + delta, ... before limit, of integers (ONNX spec, Range), up to
    MAX_VALUE_ELEMENTS of them."""
    r = [c.ints(i) for i in range(len(c.inputs))]
    if not all(v is not None for v in r) or not is_int_dtype(c.dtypes[0]):
        return None
    rng = range(r[0][0], r[1][0], r[2][0])
    return obj_array([sympy.Integer(v) for v in rng]) if len(rng) <= MAX_VALUE_ELEMENTS else None


@shape_rule("Expand")
def expand(c: Call) -> Shape | None:
    """The input's shape and the `shape` input's elements broadcast (ONNX spec, Expand)."""
    x, t = c.shape(0), c.value(1)
    if t is None or x is None or any_unknown(t.elems):
        return None
    shp = broadcast([x, t.elems])
    return None if shp is None or any_unknown(shp) else shp


@value_rule("Expand")
def expand_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """The input broadcast to the output's shape (ONNX spec, Expand)."""
    return _filled(c.array(0), out)


def _filled(fill: np.ndarray | None, out: Shape | None) -> np.ndarray | None:
    """`fill` broadcast to static shape `out` of at most MAX_VALUE_ELEMENTS elements."""
    if fill is None or out is None or not all(d.is_number for d in out):
        return None
    shape = tuple(int(d) for d in out)
    if int(np.prod(shape)) > MAX_VALUE_ELEMENTS:
        return None
    return np.broadcast_to(fill, shape).copy()


@shape_rule("Gather")
def gather(c: Call) -> Shape | None:
    """data's dims with the one at `axis` replaced by the indices' dims (ONNX spec, Gather)."""
    x, idx = c.shape(0), c.shape(1)
    if x is None or idx is None:
        return None
    axis = c.attrs.get("axis", 0)
    axis = axis + len(x) if axis < 0 else axis
    return x[:axis] + idx + x[axis + 1 :]


@shape_rule("GatherElements")
def gather_elements(c: Call) -> Shape | None:
    """The indices' dims (ONNX spec, GatherElements: the output has the shape of indices)."""
    return c.shape(1)


@shape_rule("ScatterElements", "ScatterND")
def scatter(c: Call) -> Shape | None:
    """The data's dims (ONNX spec, ScatterElements and ScatterND: the output is a copy of
    data with some elements replaced)."""
    return c.shape(0)


@value_rule("Gather")
def gather_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """numpy.take of the data at the indices along `axis` (ONNX spec, Gather)."""
    x, idx = c.array(0), c.ints(1)
    if x is None or idx is None:
        return None
    idx = np.array(idx, dtype=np.int64).reshape(c.value(1).shape)
    return np.take(x, idx, axis=c.attrs.get("axis", 0))


@shape_rule("Concat", since=4)
def concat(c: Call) -> Shape | None:
    """The first input's dims, the sum of the inputs' along `axis` (ONNX spec, Concat-4)."""
    s_in = [c.shape(i) for i in range(len(c.inputs))]
    if not all(s is not None for s in s_in):
        return None
    axis = c.attrs["axis"]
    rank = len(s_in[0])
    axis = axis + rank if axis < 0 else axis
    return tuple(
        sympy.Add(*[s[axis] for s in s_in]) if k == axis else s_in[0][k] for k in range(rank)
    )


@value_rule("Concat")
def concat_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """The inputs concatenated along `axis` (ONNX spec, Concat)."""
    vals = [c.array(i) for i in range(len(c.inputs))]
    if not all(v is not None for v in vals):
        return None
    return np.concatenate(vals, axis=c.attrs["axis"])


@shape_rule("Reshape", since=5)
def reshape(c: Call) -> Shape | None:
    """The target's elements, 0 copying the input's dim there (allowzero=0), -1 the input's
    size over the rest's (ONNX spec, Reshape-14)."""
    x, target = c.shape(0), c.value(1)
    if target is None or any_unknown(target.elems):
        return None
    out, infer = [], None
    for i, e in enumerate(target.elems):
        if e == 0 and not c.attrs.get("allowzero", 0):
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
        out[infer] = simplify(sympy.Mul(*x) / rest)
        if not out[infer].is_integer:
            return None
    return tuple(out)


def _axes(c: Call) -> list[int] | None:
    """The `axes` input (opset 13 on), else the attribute (older forms)."""
    return c.ints(1) if c.has(1) else c.attrs.get("axes")


@shape_rule("Unsqueeze")
def unsqueeze(c: Call) -> Shape | None:
    """The input's dims with a 1 inserted at each of `axes` of the output (ONNX spec,
    Unsqueeze-13)."""
    x, axes = c.shape(0), _axes(c)
    if x is None or axes is None:
        return None
    rank = len(x) + len(axes)
    axes = sorted(a + rank if a < 0 else a for a in axes)
    out, it = [], iter(x)
    for k in range(rank):
        out.append(sympy.Integer(1) if k in axes else next(it))
    return tuple(out)


@shape_rule("Squeeze")
def squeeze(c: Call) -> Shape | None:
    """The input's dims without `axes`, or without every 1 when there are no axes (then only
    when every dim is a number) (ONNX spec, Squeeze-13)."""
    x, axes = c.shape(0), _axes(c)
    if x is None:
        return None
    if axes is None:
        if not all(d.is_number for d in x):
            return None
        return tuple(d for d in x if d != 1)
    axes = {a + len(x) if a < 0 else a for a in axes}
    return tuple(d for k, d in enumerate(x) if k not in axes)


@shape_rule("Flatten")
def flatten(c: Call) -> Shape | None:
    """(product of the dims before `axis`, product of the rest) (ONNX spec, Flatten)."""
    x = c.shape(0)
    if x is None:
        return None
    ax = c.attrs.get("axis", 1)
    ax = ax + len(x) if ax < 0 else ax
    return (sympy.Mul(*x[:ax]), sympy.Mul(*x[ax:]))


# Identity's own rule keeps its input's value whatever its shape is known to be
@value_rule(*(op for op in FAMILIES["VIEW"] if op != "Identity"))
def view_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """The input's elements in the output's shape, when that is static (ONNX spec, Reshape,
    Flatten, Squeeze, Unsqueeze: the elements keep their row-major order)."""
    x = c.array(0)
    if x is None or out is None or not all(d.is_number for d in out):
        return None
    return x.reshape(tuple(int(d) for d in out))


@shape_rule("Transpose")
def transpose(c: Call) -> Shape | None:
    """The input's dims in `perm` order, reversed without it (ONNX spec, Transpose)."""
    x = c.shape(0)
    if x is None:
        return None
    perm = c.attrs.get("perm") or tuple(range(len(x) - 1, -1, -1))
    return tuple(x[p] for p in perm)


@value_rule("Transpose")
def transpose_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """numpy.transpose by `perm` (ONNX spec, Transpose)."""
    x = c.array(0)
    return None if x is None else x.transpose(c.attrs.get("perm") or None)


@shape_rule("Slice", since=10)
def slice_(c: Call) -> Shape | None:
    """The input's dims, each sliced one as long as Python's slice of a range of its length
    (ONNX spec, Slice-13: starts and ends clamp); a symbolic dim only with step 1."""
    x, starts, ends, axes, steps = c.shape(0), *(c.value(i) for i in range(1, 5))
    if x is None or starts is None or ends is None:
        return None
    if any_unknown(starts.elems) or any_unknown(ends.elems):
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


@value_rule("Slice")
def slice_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """The input indexed by Python slices from starts, ends, axes and steps (ONNX spec,
    Slice-13)."""
    x = c.array(0)
    if x is None:
        return None
    starts, ends = c.ints(1), c.ints(2)
    axes = c.ints(3) if c.has(3) else list(range(len(starts or ())))
    steps = c.ints(4) if c.has(4) else [1] * len(starts or ())
    if None in (starts, ends, axes, steps):
        return None
    sl = [slice(None)] * x.ndim
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        sl[ax] = slice(st, en, sp)
    return x[tuple(sl)]


@shape_rule("Pad", since=11)
def pad(c: Call) -> Shape | None:
    """Each padded dim plus its begin and end pads (ONNX spec, Pad-18: `pads` is all begins,
    then all ends, over `axes`, every axis by default)."""
    x = c.shape(0)
    if x is None:
        return None
    pads = c.value(1)
    axes = c.ints(3) if c.has(3) else list(range(len(x)))
    if pads is None or any_unknown(pads.elems) or axes is None or len(pads.elems) != 2 * len(axes):
        return None
    out, k = list(x), len(axes)
    for j, ax in enumerate(axes):
        out[ax] = out[ax] + pads.elems[j] + pads.elems[j + k]
    return tuple(out)


def split_sizes(c: Call) -> list[int] | None:
    """The sizes a Split node's `split` input (or Split-11's attribute) gives, if known."""
    return c.ints(1) if c.has(1) else c.attrs.get("split")


def split_count(c: Call) -> int | None:
    """How many outputs a Split node has: its split sizes, its `num_outputs`, or (an imported
    node) its ONNX proto's outputs; a matchable Split term is one of them, so `node.outputs`
    does not say."""
    sizes = split_sizes(c)
    if sizes is not None:
        return len(sizes)
    if c.attrs.get("num_outputs"):
        return c.attrs["num_outputs"]
    return len(c.node.payload.output) if isinstance(c.node.payload, onnx.NodeProto) else None


@shape_rule("Split", since=2, projections=True)
def split(c: Call) -> Shape | list[Shape] | None:
    """The input's dims with the one at `axis` the output's part: `split`'s sizes, or
    `num_outputs` equal chunks, the last smaller (ONNX spec, Split-18). A matchable term is
    one output (`Split#K`: output K), an opaque node gets one shape per output."""
    x = c.shape(0)
    if x is None:
        return None
    axis = c.attrs.get("axis", 0)
    axis = axis + len(x) if axis < 0 else axis
    sizes = split_sizes(c)
    if not c.node.opaque:
        k = int(c.op.partition("#")[2] or 0)
        count = c.attrs.get("num_outputs")
        if sizes is None and count and x[axis].is_number:
            d = int(x[axis])
            chunk = -(-d // count)
            sizes = [min(chunk, max(d - i * chunk, 0)) for i in range(count)]
        if sizes is None or k >= len(sizes):
            return None
        return x[:axis] + (sympy.Integer(sizes[k]),) + x[axis + 1 :]
    if sizes is None or len(sizes) != len(c.node.outputs):
        return None
    return [x[:axis] + (sympy.Integer(size),) + x[axis + 1 :] for size in sizes]


@shape_rule("MatMul")
def matmul(c: Call) -> Shape | None:
    """numpy.matmul's shape (ONNX spec, MatMul): batch dims broadcast, a 1-D operand gets a
    dimension for the product and loses it after."""
    x, w = c.shape(0), c.shape(1)
    if x is None or w is None or not x or not w:
        return None
    x2 = x if len(x) > 1 else (sympy.Integer(1),) + x
    w2 = w if len(w) > 1 else w + (sympy.Integer(1),)
    batch = broadcast([x2[:-2], w2[:-2]])
    if batch is None or any_unknown(batch):
        return None
    out = batch + (x2[-2], w2[-1])
    if len(x) == 1:
        out = out[:-2] + out[-1:]
    if len(w) == 1:
        out = out[:-1]
    return out


@shape_rule("Gemm")
def gemm(c: Call) -> Shape | None:
    """(M, N) of A (M, K) or A' and B (K, N) or B' (ONNX spec, Gemm)."""
    x, w = c.shape(0), c.shape(1)
    if x is None or w is None:
        return None
    m = x[1] if c.attrs.get("transA") else x[0]
    n = w[0] if c.attrs.get("transB") else w[1]
    return (m, n)


@shape_rule(*FAMILIES["REDUCTION"])
def reduce(c: Call) -> Shape | None:
    """The input's dims, those of `axes` (input from opset 18, attribute before; all when
    empty, none with noop_with_empty_axes) made 1 (keepdims) or dropped (ONNX spec,
    ReduceSum-13 and the other reductions)."""
    x, axes = c.shape(0), _axes(c)
    if x is None:
        return None
    if axes is None or len(axes) == 0:
        if c.attrs.get("noop_with_empty_axes", 0):
            return x
        axes = range(len(x))
    axes = {a + len(x) if a < 0 else a for a in axes}
    if c.attrs.get("keepdims", 1):
        return tuple(sympy.Integer(1) if k in axes else d for k, d in enumerate(x))
    return tuple(d for k, d in enumerate(x) if k not in axes)


_REDUCE = {
    "ReduceProd": sympy.Mul,
    "ReduceSum": sympy.Add,
    "ReduceMax": sympy.Max,
    "ReduceMin": sympy.Min,
}


@value_rule(*_REDUCE)
def reduce_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """The product, sum, max or min of a known 1-D input (ONNX spec, ReduceProd, ReduceSum,
    ReduceMax, ReduceMin), in the output's shape (a scalar or one element)."""
    x = c.array(0)
    if x is None or x.ndim != 1 or not x.size or any_unknown(x.tolist()):
        return None
    if out is None or len(out) > 1:
        return None
    return obj_array(_REDUCE[c.op](*x.tolist())).reshape(tuple(int(d) for d in out))
