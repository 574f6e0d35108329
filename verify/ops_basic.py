"""Samplers for elementwise, broadcasting, view and movement ops (see `verify.draw`).

A sampler knows one op (or family) from the ONNX operator specification: which inputs must
agree in shape, which are shape-like constants and what values make them valid, and the
domains of the attributes. It honours `NodeCtx.keep_type` (a `same-type` guard asks for the
op drawn as a no-op) where the op can be one.
"""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from verify import hints as H
from verify.dtypes import FLOATS
from verify.node import sampler
from verify.values import BOOLS, ints
from vocab.ops import FAMILIES

# the samplers' ops, from the op table's families (vocab.ops.FAMILIES) and the few others
# these samplers draw: shape-preserving unary ops, and multidirectional broadcasting ones
_UNARY = [
    *FAMILIES["UNARY_ELEMENTWISE"],
    "Identity",
    "LeakyRelu",
    "HardSigmoid",
    "Gelu",
    "Cast",
    "Elu",
    "Selu",
    "Celu",
    "ThresholdedRelu",
    "IsNaN",
]
_BROADCAST = [op for op in FAMILIES["BROADCASTING"] if op not in FAMILIES["VARIADIC_ELEMENTWISE"]]
_SMALL_FLOATS = st.sampled_from([0.01, 0.2, 0.5, -0.5, 2.0, 1.0 / 6.0]) | st.floats(-3, 3, width=32)


def _attr_strategy(ctx, name: str, rank: int):
    """Strategy for a free attribute of a unary op."""
    table = {
        ("LeakyRelu", "alpha"): _SMALL_FLOATS,
        ("HardSigmoid", "alpha"): _SMALL_FLOATS,
        ("HardSigmoid", "beta"): _SMALL_FLOATS,
        ("Gelu", "approximate"): st.sampled_from(["none", "tanh"]),
        ("Elu", "alpha"): _SMALL_FLOATS,
        ("Selu", "alpha"): _SMALL_FLOATS,
        ("Selu", "gamma"): _SMALL_FLOATS,
        ("Celu", "alpha"): _SMALL_FLOATS.filter(lambda a: a != 0),  # it divides by alpha
        ("ThresholdedRelu", "alpha"): _SMALL_FLOATS,
        ("Cast", "to"): st.just(ctx.out_dtype),
        # saturate only applies to float8 targets, which are never drawn; onnxruntime rejects
        # it on any other cast
        ("Cast", "saturate"): st.just(1),
        ("Softmax", "axis"): ints(-rank, rank - 1),
        ("LogSoftmax", "axis"): ints(-rank, rank - 1),
        ("Hardmax", "axis"): ints(-rank, rank - 1),
    }
    if (ctx.op, name) not in table:
        return _declared_attr(ctx, name)
    return table[(ctx.op, name)]


def _declared_attr(ctx, name: str):
    """An attribute no table names: a float one of an op a rule file declares is drawn (its
    default first, which shrinking returns to; a rule writing a constant where it captured
    the attribute passed on the default alone), any other its default (an attribute the
    registry added, like Cast-25's round_mode: nothing else is drawn)."""
    a = ctx.spec.attr_index[name]
    if ctx.spec.declared and a.kind == "float" and isinstance(a.default, float):
        return st.just(a.default) | _SMALL_FLOATS
    return st.just(a.default)


# onnxruntime's contrib elementwise ops of one input are drawn like the standard ones, and
# run on onnxruntime, their only executor
@sampler(*_UNARY, *FAMILIES["CONTRIB_UNARY_ELEMENTWISE"], fallback="unary")
def _unary(ctx) -> None:
    x = ctx.put(0, ctx.gen.sub_shape())
    for a in ctx.spec.attrs:
        ctx.attr(a.name, lambda a=a: ctx.draw(_attr_strategy(ctx, a.name, x.rank), a.name))


@sampler("Softmax", "LogSoftmax", "Hardmax")
def _softmax(ctx) -> None:
    x = ctx.put(0, ctx.gen.nonscalar_shape())
    ctx.attr("axis", lambda: ctx.draw(_attr_strategy(ctx, "axis", max(x.rank, 1)), "axis"))


@sampler("ArgMax", "ArgMin")
def _arg_extreme(ctx) -> None:
    # one axis of a tensor of rank >= 1 (ONNX ArgMax: axis in [-r, r-1]), kept or not, ties
    # to the first or the last index
    x = ctx.put(0, ctx.gen.nonscalar_shape())
    assume(x.rank >= 1)  # an input drawn before (Identity's output) may be a scalar
    ctx.attr("axis", lambda: ctx.draw(ints(-x.rank, x.rank - 1), "axis"))
    ctx.attr("keepdims", lambda: ctx.pick([1, 0], "keepdims"))
    ctx.attr("select_last_index", lambda: ctx.pick([0, 1], "select_last_index"))


@sampler("CumSum")
def _cumsum(ctx) -> None:
    # a tensor of rank >= 1 and one axis of it, a constant scalar (ONNX CumSum: axis in
    # [-r, r-1]), exclusive or not, from either end
    x = ctx.put(0, ctx.gen.nonscalar_shape())
    assume(x.rank >= 1)  # as in _arg_extreme
    if ctx.free(1):
        ctx.put(1, (), ctx.draw(ints(-x.rank, x.rank - 1), "axis"))
    ctx.attr("exclusive", lambda: ctx.pick([0, 1], "exclusive"))
    ctx.attr("reverse", lambda: ctx.pick([0, 1], "reverse"))


@sampler(*_BROADCAST, *FAMILIES["VARIADIC_ELEMENTWISE"], fallback="broadcast")
def _broadcast(ctx) -> None:
    n = len(ctx.names)
    for i in range(n):
        known = [s for s in map(ctx.shape, range(n)) if s is not None]
        ctx.put(i, ctx.gen.compatible(known))
    if ctx.op == "BitShift":
        ctx.attr("direction", lambda: ctx.pick(["LEFT", "RIGHT"], "direction"))
    if ctx.op == "Mod":  # fmod=0 is integer modulus; floats need fmod=1
        ctx.attr("fmod", lambda: 1 if ctx.dtype(0) in FLOATS else ctx.pick([0, 1], "fmod"))
    if ctx.spec.declared:
        for a in ctx.spec.attrs:
            ctx.attr(a.name, lambda a=a: ctx.draw(_declared_attr(ctx, a.name), a.name))


@sampler("Clip")
def _clip(ctx) -> None:
    ctx.put(0, ctx.gen.sub_shape())
    for i in (1, 2):  # min and max are scalars (ONNX Clip-13)
        ctx.put(i, ())


@sampler("Dropout")
def _dropout(ctx) -> None:
    ctx.put(0, ctx.gen.sub_shape())
    ctx.put(1, (), ctx.pick([0.5, 0.0, 0.1, 0.9], "ratio"))
    ctx.put(2, (), ctx.draw(BOOLS, "training_mode"))
    ctx.attr("seed", lambda: ctx.draw(st.none() | ints(0, 100), "seed"))


@sampler("CastLike")
def _castlike(ctx) -> None:
    ctx.put(0, ctx.gen.sub_shape())
    ctx.put(1, ctx.gen.sub_shape())
    ctx.attr("saturate", 1)


@sampler("Transpose")
def _transpose(ctx) -> None:
    fixed = ctx.attr("perm") if ctx.is_fixed("perm") else None
    shape = ctx.gen.sub_shape()
    if fixed is not None:
        shape = ctx.gen._with_rank(shape, len(fixed))
    x = ctx.put(0, shape)
    r = x.rank
    if ctx.keep_type:
        ctx.attr("perm", tuple(range(r)))
    # every permutation equally likely (Hypothesis's permutations favour the identity)
    ctx.attr("perm", lambda: ctx.pick(list(itertools.permutations(range(r))), "perm"))


@sampler("Reshape")
def _reshape(ctx) -> None:
    allowzero = ctx.attr("allowzero", lambda: ctx.pick([0, 1], "allowzero"))
    shape = ctx.gen.sub_shape()
    if allowzero and ctx.wants(1, H.Zero) and 0 not in shape:  # a real 0 needs 0 elements
        shape = (0,) + shape[1:]
    x = ctx.put(0, shape)
    if not ctx.free(1):
        return
    src = tuple(x.shape)
    target = list(src) if ctx.keep_type else _regroup(ctx, src)
    if ctx.wants(1, H.Zero) and not allowzero and src and src[0] and target[:1] != [src[0]]:
        target = [src[0]] + _regroup(ctx, src[1:])  # a 0 needs an axis to copy
    n = int(np.prod(src))
    zero_ok = allowzero == 0 and not ctx.wants(1, H.NoZero)
    copies = [i for i in range(min(len(target), len(src))) if target[i] == src[i]]
    for i in copies:
        if zero_ok and ctx.draw(ints(0, 2), "copy dim") == 2:
            target[i] = 0  # 0 copies the input's dimension i (allowzero=0)
    if zero_ok and copies and ctx.wants(1, H.Zero) and 0 not in target:
        target[ctx.pick(copies, "copy dim")] = 0
    if n > 0 and target and ctx.draw(BOOLS, "infer a dim"):
        target[ctx.draw(ints(0, len(target) - 1), "which")] = -1
    ctx.put(1, (len(target),), target)


def _regroup(ctx, src: tuple[int, ...]) -> list[int]:
    """A shape with `src`'s element count: a prefix of `src` kept (as exporters write
    Reshape(x, (0, 0, -1))), the rest of the count split into new factors."""
    n = int(np.prod(src))
    if n == 0:
        return list(src)
    keep = ctx.draw(ints(0, len(src)), "kept axes")
    out, rest = list(src[:keep]), int(np.prod(src[keep:]))
    k = ctx.draw(ints(0 if out else 1, 3), "new axes")
    for _ in range(k - 1 if k else 0):
        divisors = [d for d in range(1, min(rest, 6) + 1) if rest % d == 0]
        d = ctx.pick(divisors, "factor")
        out.append(d)
        rest //= d
    if k:
        out.append(rest)
    elif rest != 1:
        out[-1] *= rest
    return out


@sampler("Flatten")
def _flatten(ctx) -> None:
    if ctx.keep_type:
        x = ctx.put(0, (ctx.gen.dim(), ctx.gen.dim()))
        ctx.attr("axis", lambda: ctx.pick([1, -1], "axis"))
        return
    x = ctx.put(0, ctx.gen.sub_shape())
    ctx.attr("axis", lambda: ctx.draw(ints(-x.rank, x.rank), "axis"))


@sampler("Squeeze")
def _squeeze(ctx) -> None:
    shape = list(ctx.gen.sub_shape())
    if ctx.present(1) and 1 not in shape and len(shape) < 5:
        shape.insert(ctx.draw(ints(0, len(shape)), "where"), 1)
    x = ctx.put(0, shape)
    if not ctx.free(1):
        return
    ones = [i for i, d in enumerate(x.shape) if d == 1] or [0]
    axes = ctx.draw(st.lists(st.sampled_from(ones), min_size=1, unique=True), "axes")
    ctx.put(1, (len(axes),), _signed_axes(ctx, axes, x.rank))


@sampler("Unsqueeze")
def _unsqueeze(ctx) -> None:
    base = ctx.gen.sub_shape()
    x = ctx.put(0, base[max(0, len(base) - 4) :])
    if not ctx.free(1):
        return
    k = ctx.draw(ints(1, max(1, 5 - x.rank)), "new axes")
    axes = ctx.draw(st.lists(ints(0, x.rank + k - 1), min_size=k, max_size=k, unique=True), "axes")
    ctx.put(1, (k,), _signed_axes(ctx, axes, x.rank + k))


def _signed_axes(ctx, axes: list[int], rank: int) -> list[int]:
    """`axes`, each possibly written negative (counted from the end of `rank`)."""
    return [a - rank if ctx.draw(BOOLS, "negative axis") else a for a in axes]


@sampler("Expand")
def _expand(ctx) -> None:
    x = ctx.put(0, ctx.gen.sub_shape())
    if ctx.free(1):
        target = ctx.gen.sub_shape(x.shape) if ctx.keep_type else ctx.gen.compatible([x.shape])
        ctx.put(1, (len(target),), list(target))


@sampler("Tile")
def _tile(ctx) -> None:
    x = ctx.put(0, ctx.gen.sub_shape())
    if ctx.free(1):
        reps = (
            [1] * x.rank if ctx.keep_type else [ctx.pick([1, 2, 0, 3], "repeat") for _ in x.shape]
        )
        ctx.put(1, (x.rank,), reps)


@sampler("DequantizeLinear", "QuantizeLinear")
def _affine_quantization(ctx) -> None:
    """x of any shape, one scale and one zero point (per-tensor quantization: scalars); the
    dtypes are the op's type constraints' (x and zero point one 8-bit type)."""
    ctx.put(0, ctx.gen.sub_shape())
    ctx.put(1, ())
    ctx.put(2, ())


@sampler("Shape", "Size")
def _shape(ctx) -> None:
    x = ctx.put(0, ctx.gen.sub_shape())
    for name in ("start", "end") if ctx.op == "Shape" else ():
        bounds = st.none() | ints(-x.rank - 1, x.rank + 1)
        ctx.attr(name, lambda name=name, bounds=bounds: ctx.draw(bounds, name))
    if ctx.op == "Shape" and ctx.attrs["start"] is None:
        ctx.attrs["start"] = 0
