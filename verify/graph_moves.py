"""The moves of `verify.graphs`: each appends one op of the op table, or a motif of a few
nodes in the shape a shipped rule matches, over values drawn from the pool; it returns False
when the pool has nothing it can use."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from onnx import helper

from verify.graph_builder import (
    BOOL,
    DIMS,
    DOUBLE,
    FLOAT,
    HALF,
    INT32,
    INT64,
    INT_MAX,
    Builder,
    Val,
)

UNARY_FLOAT = (
    "Relu",
    "Neg",
    "Abs",
    "Sigmoid",
    "Tanh",
    "Exp",
    "Sqrt",
    "Log",
    "Reciprocal",
    "Floor",
    "Ceil",
    "Erf",
    "Sign",
    "Sin",
    "Cos",
    "Identity",
)
UNARY_HALF = ("Relu", "Neg", "Abs", "Sigmoid", "Tanh", "Identity", "Sqrt")
UNARY_INT = ("Neg", "Abs", "Identity", "Sign")
BINARY_FLOAT = ("Add", "Sub", "Mul", "Div", "Pow")
BINARY_INT = ("Add", "Sub", "Mul")
COMPARE = ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")


def _f32(v: Val) -> bool:
    return v.dtype == FLOAT


def unary(b: Builder) -> bool:
    """A unary elementwise op of the value's dtype class (sometimes the op that made it again:
    Relu(Relu(x)), Neg(Neg(x)) for the idempotent and involutive rules)."""
    x = b.pick(lambda v: v.dtype != BOOL)
    if x is None:
        return False
    ops = (
        UNARY_FLOAT if x.dtype in (FLOAT, DOUBLE) else UNARY_HALF if x.dtype == HALF else UNARY_INT
    )
    op = b.draw(st.sampled_from(ops))
    if b.draw(st.integers(0, 3)) == 0 and x.op in ops and x.op != "Identity":
        op = x.op  # Relu(Relu(x)), Neg(Neg(x)), Floor(Floor(x)): idempotent and involutive rules
    b.add(op, [x], x.dtype, x.shape)
    return True


def activation(b: Builder) -> bool:
    """A float32 activation: LeakyRelu, HardSigmoid, Clip (constant or absent bounds),
    Softmax/LogSoftmax on a drawn axis, Gelu (opset >= 20) or Dropout."""
    x = b.pick(_f32)
    if x is None:
        return False
    kind = b.draw(
        st.sampled_from(("LeakyRelu", "HardSigmoid", "Clip", "Softmax", "Gelu", "Dropout"))
    )
    if kind == "Clip":
        lo = b.const(np.float32(b.draw(st.sampled_from((-1.0, 0.0, -np.inf)))))
        hi = b.const(np.float32(b.draw(st.sampled_from((1.0, 6.0, np.inf)))))
        args = b.draw(st.sampled_from(([x, lo, hi], [x], [x, None, hi], [x, lo])))
        b.add("Clip", args, FLOAT, x.shape)
    elif kind == "Softmax" and x.rank:
        axis = b.draw(st.integers(-x.rank, x.rank - 1))
        b.add(b.draw(st.sampled_from(("Softmax", "LogSoftmax"))), [x], FLOAT, x.shape, axis=axis)
    elif kind == "Gelu" and b.opset >= 20:
        b.add("Gelu", [x], FLOAT, x.shape, approximate=b.draw(st.sampled_from(("none", "tanh"))))
    elif kind == "Dropout":
        b.add("Dropout", [x], FLOAT, x.shape)
    elif kind == "LeakyRelu":
        b.add("LeakyRelu", [x], FLOAT, x.shape, alpha=b.draw(st.sampled_from((0.01, 0.2))))
    else:
        b.add("HardSigmoid", [x], FLOAT, x.shape)
    return True


def binary(b: Builder) -> bool:
    """A binary arithmetic op (Pow only by 1, 2 or 0.5) with another pool value of a
    broadcastable shape or a constant (add-zero, mul-one, constant folds, scale rules)."""
    a = b.pick(lambda v: v.dtype != BOOL)
    if a is None:
        return False
    ops = (
        BINARY_FLOAT
        if a.dtype in (FLOAT, DOUBLE)
        else ("Add", "Sub", "Mul", "Div")
        if a.dtype == HALF
        else BINARY_INT
    )
    op = b.draw(st.sampled_from(ops))
    shape = b.broadcastable(a.shape)
    other = b.pick(lambda v: v.dtype == a.dtype and v.shape == shape and v is not a)
    if op == "Pow":
        exponent = b.draw(st.sampled_from((1.0, 2.0, 0.5)))
        other = b.const(np.full(shape, exponent, helper.tensor_dtype_to_np_dtype(a.dtype)))
    elif other is None or op == "Div" or b.draw(st.booleans()):
        # a constant: what add-zero, mul-one, the constant folds and the scale rules match
        other = b.const(b.tensor(a.dtype, shape), node=b.draw(st.booleans()))
    args = [a, other] if b.draw(st.booleans()) or op in ("Div", "Pow", "Sub") else [other, a]
    b.add(op, args, a.dtype, _broadcast(args[0].shape, args[1].shape))
    return True


def compare(b: Builder) -> bool:
    """A comparison with a constant, whose bool result feeds a `logic` move."""
    a = b.pick(lambda v: v.dtype in (FLOAT, INT64, INT32))
    if a is None:
        return False
    c = b.const(b.tensor(a.dtype, b.broadcastable(a.shape)))
    args = [a, c] if b.draw(st.booleans()) else [c, a]
    cond = b.add(
        b.draw(st.sampled_from(COMPARE)), args, BOOL, _broadcast(args[0].shape, args[1].shape)
    )
    logic(b, cond)
    return True


def logic(b: Builder, x: Val | None = None) -> bool:
    """Not, And, Or, Where over a bool value (de Morgan, where-not, where-same-branches)."""
    x = x or b.pick(lambda v: v.dtype == BOOL)
    if x is None:
        return False
    move = b.draw(st.sampled_from(("Not", "And", "Or", "Where", "Where")))
    if move == "Not":
        b.add("Not", [x], BOOL, x.shape)
    elif move in ("And", "Or"):
        y = b.pick(lambda v: v.dtype == BOOL and v.shape == x.shape) or b.const(
            b.tensor(BOOL, x.shape)
        )
        n = b.add("Not", [x], BOOL, x.shape) if b.draw(st.booleans()) else x
        out = b.add(move, [n, y], BOOL, x.shape)
        if b.draw(st.booleans()):
            b.add("Not", [out], BOOL, x.shape)
    else:
        t = b.pick(lambda v: v.dtype in (FLOAT, INT64) and _fits(v.shape, x.shape))
        if t is None:
            return True
        e = t if b.draw(st.booleans()) else b.const(b.tensor(t.dtype, b.broadcastable(t.shape)))
        cond = b.add("Not", [x], BOOL, x.shape) if b.draw(st.booleans()) else x
        b.add("Where", [cond, t, e], t.dtype, _broadcast(_broadcast(x.shape, t.shape), e.shape))
    return True


def cast(b: Builder) -> bool:
    """Cast to another dtype (sometimes cast back: cast-of-widening-cast)."""
    x = b.pick(lambda v: v.dtype in (FLOAT, INT32, INT64, BOOL, HALF))
    if x is None:
        return False
    targets = {
        FLOAT: (DOUBLE, HALF, FLOAT),
        INT32: (INT64, FLOAT, INT32),
        INT64: (INT64, FLOAT),
        BOOL: (FLOAT, INT64, INT32),
        HALF: (FLOAT, DOUBLE),
    }[x.dtype]
    to = b.draw(st.sampled_from(targets))
    y = b.add("Cast", [x], to, x.shape, to=to)
    if b.draw(st.booleans()):  # cast-of-widening-cast
        back = b.draw(st.sampled_from((x.dtype, FLOAT)))
        if back != BOOL:
            b.add("Cast", [y], back, x.shape, to=back)
    return True


def matmul(b: Builder) -> bool:
    """MatMul by a constant (sometimes scaled first, then + bias: scale-into-matmul, Gemm)."""
    x = b.pick(lambda v: _f32(v) and v.rank >= 1 and isinstance(v.shape[-1], int))
    if x is None:
        return False
    if b.draw(st.booleans()):
        x = b.add("Mul", [x, b.const(b.tensor(FLOAT, ()))], FLOAT, x.shape)
    k, n = x.shape[-1], b.draw(st.sampled_from(DIMS))
    w = b.const(b.tensor(FLOAT, (k, n)))
    if b.draw(st.integers(0, 3)) == 0:  # matmul-transpose-b
        wt = b.const(b.tensor(FLOAT, (n, k)))
        w = b.add("Transpose", [wt], FLOAT, (k, n), perm=[1, 0])
    shape = (*x.shape[:-1], n) if x.rank > 1 else (n,)
    y = b.add("MatMul", [x, w], FLOAT, shape)
    if b.draw(st.booleans()):
        bias = b.const(
            b.tensor(FLOAT, b.draw(st.sampled_from(((n,), (1, n) if len(shape) > 1 else (n,)))))
        )
        b.add("Add", [y, bias] if b.draw(st.booleans()) else [bias, y], FLOAT, shape)
    return True


def gemm(b: Builder) -> bool:
    """Gemm of a static float32 matrix by a constant, with drawn transA/transB, optional
    bias C and alpha/beta."""
    x = b.pick(lambda v: _f32(v) and v.rank == 2 and v.static)
    if x is None:
        return False
    ta = b.draw(st.integers(0, 1))
    m, k = x.shape[::-1] if ta else x.shape
    n, tb = b.draw(st.sampled_from(DIMS)), b.draw(st.integers(0, 1))
    w = b.const(b.tensor(FLOAT, (n, k) if tb else (k, n)))
    c = b.const(b.tensor(FLOAT, b.broadcastable((m, n)))) if b.draw(st.booleans()) else None
    attrs = {"transA": ta, "transB": tb}
    if b.draw(st.booleans()):
        attrs.update(
            alpha=b.draw(st.sampled_from((1.0, 0.5))), beta=b.draw(st.sampled_from((1.0, 2.0)))
        )
    b.add("Gemm", [x, w] + ([c] if c is not None else []), FLOAT, (m, n), **attrs)
    return True


def transpose(b: Builder) -> bool:
    """Transpose by a drawn permutation, or the inverse of the Transpose that made the value
    (transpose-transpose)."""
    x = b.pick(lambda v: v.rank >= 2 and v.dtype != BOOL)
    if x is None:
        return False
    if x.op == "Transpose" and b.draw(st.booleans()):
        perm = list(np.argsort(x.attrs["perm"]))  # undo it: transpose-transpose
    else:
        perm = b.draw(st.permutations(range(x.rank)))
    b.add("Transpose", [x], x.dtype, tuple(x.shape[p] for p in perm), perm=[int(p) for p in perm])
    return True


def reshape(b: Builder) -> bool:
    """Reshape to a new factorization of the value's shape (with 0 and -1 entries), back to
    the shape before a Reshape/Flatten (reshape-of-reshape), or Flatten on a drawn axis."""
    x = b.pick(lambda v: v.dtype != BOOL and all(isinstance(d, int) for d in v.shape[1:]))
    if x is None:
        return False
    if x.op in ("Reshape", "Flatten") and x.args[0].static and x.static and b.draw(st.booleans()):
        target = x.args[0].shape  # back to where it came from: reshape-of-reshape
    elif b.draw(st.integers(0, 3)) == 0 and x.static:
        b.add(
            "Flatten",
            [x],
            x.dtype,
            _flatten(x.shape, axis := b.draw(st.integers(0, x.rank))),
            axis=axis,
        )
        return True
    else:
        target = _factor(b, x)
    spec = [0 if not isinstance(d, int) else d for d in target]
    if b.draw(st.booleans()) and any(isinstance(d, int) for d in target):
        spec[max(i for i, d in enumerate(target) if isinstance(d, int))] = -1
    b.add("Reshape", [x, b.const(np.array(spec, np.int64))], x.dtype, target)
    return True


def squeeze(b: Builder) -> bool:
    """Squeeze of some size-1 axes, or Unsqueeze of one axis (sometimes squeezed again:
    squeeze-unsqueeze)."""
    x = b.pick(lambda v: v.dtype != BOOL and v.rank <= 4)
    if x is None:
        return False
    ones = [i for i, d in enumerate(x.shape) if d == 1]
    if ones and b.draw(st.booleans()):
        axes = sorted(b.draw(st.sets(st.sampled_from(ones), min_size=1)))
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        b.add("Squeeze", [x, b.const(np.array(axes, np.int64))], x.dtype, shape)
    else:
        axis = b.draw(st.integers(0, x.rank))
        shape = (*x.shape[:axis], 1, *x.shape[axis:])
        y = b.add("Unsqueeze", [x, b.const(np.array([axis], np.int64))], x.dtype, shape)
        if b.draw(st.booleans()):  # squeeze-unsqueeze
            b.add("Squeeze", [y, b.const(np.array([axis], np.int64))], x.dtype, x.shape)
    return True


def expand(b: Builder) -> bool:
    """Expand to a shape with size-1 axes widened and maybe one leading axis (sometimes followed
    by Add/Mul with a scalar: {op}-of-expand)."""
    x = b.pick(lambda v: v.dtype != BOOL and v.rank <= 3)
    if x is None:
        return False
    extra = b.draw(st.integers(0, 1))
    target = [b.draw(st.sampled_from(DIMS)) for _ in range(extra)]
    target += [
        b.draw(st.sampled_from((2, 3))) if d == 1 and b.draw(st.booleans()) else d for d in x.shape
    ]
    spec = [1 if not isinstance(d, int) else d for d in target]
    y = b.add("Expand", [x, b.const(np.array(spec, np.int64))], x.dtype, tuple(target))
    if b.draw(st.booleans()) and x.dtype == FLOAT:  # an elementwise op on it: {op}-of-expand
        b.add(
            b.draw(st.sampled_from(("Add", "Mul"))),
            [y, b.const(b.tensor(FLOAT, ()))],
            FLOAT,
            y.shape,
        )
    return True


def slice_(b: Builder) -> bool:
    """Slice of one static axis with constant starts/ends/axes (steps 1 or 2; sometimes the
    whole axis, end n, INT_MAX or -1)."""
    x = b.pick(
        lambda v: v.dtype != BOOL and v.rank >= 1 and any(isinstance(d, int) for d in v.shape)
    )
    if x is None:
        return False
    axes = [i for i, d in enumerate(x.shape) if isinstance(d, int)]
    axis = b.draw(st.sampled_from(axes))
    n = x.shape[axis]
    if b.draw(st.booleans()):
        start, end, step = 0, b.draw(st.sampled_from((n, INT_MAX, -1 if n > 1 else n))), 1
    else:
        start = b.draw(st.integers(0, max(n - 1, 0)))
        end, step = (
            b.draw(st.integers(start + 1, n)) if n else 0,
            b.draw(st.sampled_from((1, 1, 2))),
        )
    size = len(range(*slice(start, end if end != INT_MAX else n, step).indices(n)))
    args = [
        x,
        b.const(np.array([start], np.int64)),
        b.const(np.array([end], np.int64)),
        b.const(np.array([axis], np.int64)),
    ]
    if step != 1 or b.draw(st.booleans()):
        args.append(b.const(np.array([step], np.int64)))
    b.add("Slice", args, x.dtype, tuple(size if i == axis else d for i, d in enumerate(x.shape)))
    return True


def reduce(b: Builder) -> bool:
    """ReduceSum/Mean/Max/Min over drawn constant axes with drawn keepdims (ReduceSum instead of
    ReduceMean for int64)."""
    x = b.pick(lambda v: v.dtype in (FLOAT, INT64) and v.rank >= 1)
    if x is None:
        return False
    op = b.draw(st.sampled_from(("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin")))
    if x.dtype == INT64 and op == "ReduceMean":
        op = "ReduceSum"
    axes = sorted(b.draw(st.sets(st.integers(0, x.rank - 1), min_size=1)))
    keep = b.draw(st.integers(0, 1))
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape) if keep or i not in axes)
    b.add(op, [x, b.const(np.array(axes, np.int64))], x.dtype, shape, keepdims=keep)
    return True


def concat(b: Builder) -> bool:
    """Concat is not in the op table: an opaque node the rules must match around."""
    x = b.pick(lambda v: v.rank >= 1 and v.dtype != BOOL)
    if x is None:
        return False
    axis = b.draw(st.integers(0, x.rank - 1))
    if not isinstance(x.shape[axis], int):
        return False
    y = b.pick(
        lambda v: (
            v.dtype == x.dtype
            and v.rank == x.rank
            and all(d == e for i, (d, e) in enumerate(zip(v.shape, x.shape)) if i != axis)
            and isinstance(v.shape[axis], int)
        )
    )
    b.add(
        "Concat",
        [x, y],
        x.dtype,
        tuple(d + y.shape[axis] if i == axis else d for i, d in enumerate(x.shape)),
        axis=axis,
    )
    return True


def conv(b: Builder) -> bool:
    """Conv (sometimes padded by a Pad first), then BatchNormalization, a bias Add or a channel
    scale: the folds of `patterns/fusion/conv.rules`."""
    x = b.pick(
        lambda v: (
            _f32(v)
            and v.rank == 4
            and all(isinstance(d, int) for d in v.shape[1:])
            and min(v.shape[2:]) >= 3
        )
    )
    if x is None:
        return False
    c, h, w = x.shape[1:]
    if b.draw(st.integers(0, 2)) == 0:
        p = b.draw(st.integers(0, 1))
        pads = b.const(np.array([0, 0, p, p, 0, 0, p, p], np.int64))
        x = b.add("Pad", [x, pads], FLOAT, (x.shape[0], c, h + 2 * p, w + 2 * p))
        c, h, w = x.shape[1:]
    group = b.draw(st.sampled_from((1, c)))  # plain or depthwise
    m = c * b.draw(st.sampled_from((1, 2))) if group > 1 else b.draw(st.sampled_from((2, 4, c)))
    k = b.draw(st.sampled_from((1, 3)))
    stride, pad = b.draw(st.sampled_from((1, 1, 2))), b.draw(st.sampled_from((0, 0, 1)))
    args = [x, b.const(b.tensor(FLOAT, (m, c // group, k, k)))]
    if b.draw(st.booleans()):
        args.append(b.const(b.tensor(FLOAT, (m,))))
    oh, ow = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    attrs = {"kernel_shape": [k, k]}
    if stride != 1:
        attrs["strides"] = [stride, stride]
    if pad:
        attrs["pads"] = [pad] * 4
    if group != 1:
        attrs["group"] = group
    y = b.add("Conv", args, FLOAT, (x.shape[0], m, oh, ow), **attrs)
    after = b.draw(st.sampled_from(("bn", "bias", "scale", "none")))
    if after == "bn":
        batchnorm(b, y)
    elif after in ("bias", "scale"):
        cst = b.const(b.tensor(FLOAT, (m, 1, 1) if b.draw(st.booleans()) else (1, m, 1, 1)))
        b.add("Add" if after == "bias" else "Mul", [y, cst], FLOAT, y.shape)
    return True


def batchnorm(b: Builder, x: Val | None = None) -> bool:
    """BatchNormalization (inference) of `x` or a float32 pool value of rank >= 2 with a static
    channel axis, random scale/bias/mean and variance in [0.5, 2]."""
    x = x or b.pick(lambda v: _f32(v) and v.rank >= 2 and isinstance(v.shape[1], int))
    if x is None:
        return False
    c = x.shape[1]
    rng = np.random.default_rng(b.draw(st.integers(0, 2**16)))
    params = [
        rng.standard_normal(c),
        rng.standard_normal(c),
        rng.standard_normal(c),
        rng.uniform(0.5, 2, c),
    ]
    args = [x, *(b.const(p.astype(np.float32)) for p in params)]
    b.add("BatchNormalization", args, FLOAT, x.shape, epsilon=b.draw(st.sampled_from((1e-5, 1e-3))))
    return True


def layernorm(b: Builder) -> bool:
    """LayerNormalization, or its decomposition as torch exports it (layernorm-div)."""
    x = b.pick(lambda v: _f32(v) and v.rank >= 1 and isinstance(v.shape[-1], int))
    if x is None:
        return False
    d = x.shape[-1]
    scale, bias = b.const(b.tensor(FLOAT, (d,))), b.const(b.tensor(FLOAT, (d,)))
    if b.draw(st.booleans()):
        b.add("LayerNormalization", [x, scale, bias], FLOAT, x.shape, axis=-1)
        return True
    axes = b.const(np.array([-1], np.int64))
    kept = (*x.shape[:-1], 1)
    mean = b.add("ReduceMean", [x, axes], FLOAT, kept)
    dev = b.add("Sub", [x, mean], FLOAT, x.shape)
    sq = b.add("Pow", [dev, b.const(np.float32(2.0))], FLOAT, x.shape)
    var = b.add("ReduceMean", [sq, axes], FLOAT, kept)
    std = b.add("Sqrt", [b.add("Add", [var, b.const(np.float32(1e-5))], FLOAT, kept)], FLOAT, kept)
    y = b.add("Mul", [b.add("Div", [dev, std], FLOAT, x.shape), scale], FLOAT, x.shape)
    if b.draw(st.booleans()):
        b.add("Add", [y, bias], FLOAT, x.shape)
    return True


def gelu(b: Builder) -> bool:
    """x * (0.5 * (erf(x / sqrt 2) + 1)), as the dynamo exporter writes Gelu (or its
    TorchScript order)."""
    x = b.pick(_f32)
    if x is None:
        return False
    c = lambda v: b.const(np.float32(v))  # noqa: E731
    e = b.add(
        "Add",
        [
            b.add("Erf", [b.add("Div", [x, c(math.sqrt(2.0))], FLOAT, x.shape)], FLOAT, x.shape),
            c(1.0),
        ],
        FLOAT,
        x.shape,
    )
    if b.draw(st.booleans()):
        b.add("Mul", [x, b.add("Mul", [e, c(0.5)], FLOAT, x.shape)], FLOAT, x.shape)
    else:
        b.add("Mul", [b.add("Mul", [x, e], FLOAT, x.shape), c(0.5)], FLOAT, x.shape)
    return True


def shape_reshape(b: Builder) -> bool:
    """Reshape(f(x), Shape(x)): a shape computed in the graph (shape folding, reshape rules)."""
    x = b.pick(lambda v: v.rank >= 2 and v.dtype == FLOAT and v.static)
    if x is None:
        return False
    flat = b.add("Reshape", [x, b.const(np.array([-1], np.int64))], FLOAT, (x.numel,))
    y = b.add("Relu", [flat], FLOAT, flat.shape) if b.draw(st.booleans()) else flat
    shape = b.add("Shape", [x], INT64, (x.rank,))
    b.add("Reshape", [y, shape], FLOAT, x.shape)
    return True


MOVES = (
    unary,
    unary,
    binary,
    binary,
    binary,
    activation,
    compare,
    logic,
    cast,
    matmul,
    gemm,
    transpose,
    transpose,
    reshape,
    reshape,
    squeeze,
    expand,
    slice_,
    reduce,
    concat,
    conv,
    batchnorm,
    layernorm,
    gelu,
    shape_reshape,
)


def _broadcast(a: tuple, b: tuple) -> tuple:
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
    return tuple(y if x == 1 else x for x, y in zip(a, b))


def _fits(small: tuple, big: tuple) -> bool:
    """True if `small` and `big` broadcast together to `big`'s shape or a bigger one without
    conflicting dims."""
    for x, y in zip(reversed(small), reversed(big)):
        if x != y and x != 1 and y != 1:
            return False
    return True


def _flatten(shape: tuple, axis: int) -> tuple:
    return (int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64)))


def _factor(b: Builder, x: Val) -> tuple:
    """A new shape for x's elements: its symbolic first dim kept, the static rest split anew."""
    lead = x.shape[:1] if x.rank and not isinstance(x.shape[0], int) else ()
    n = int(np.prod(x.shape[len(lead) :], dtype=np.int64))
    dims = []
    while n > 1 and len(dims) < 3:
        f = b.draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
        dims.append(f)
        n //= f
    if n > 1 or not dims:
        dims.append(n)
    return (*lead, *dims)
