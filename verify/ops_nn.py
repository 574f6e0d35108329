"""Samplers for the network ops: MatMul, Gemm, Conv, BatchNormalization, reductions,
LayerNormalization, pools and global pools (see `verify.draw`). Shapes follow the ONNX operator
specification; sizes stay small so that reference convolutions are fast.
"""

from __future__ import annotations

from hypothesis import assume
from hypothesis import strategies as st

from verify.node import sampler
from verify.values import BOOLS, ints

_FACTORS = st.sampled_from([1.0, 0.5, 2.0, -1.0, 0.0, 1.5])


@sampler("MatMul")
def _matmul(ctx) -> None:
    g = ctx.gen
    a = ctx.shape(0)
    if a is None:
        base = g.sub_shape()
        a = ctx.put(0, base if base else (g.dim(),)).shape
    assume(len(a) >= 1)  # an input drawn before (a declared op's output) may be a scalar
    if ctx.free(1):
        if len(a) == 1 or ctx.draw(ints(0, 4), "b rank") == 0:
            b = (a[-1],) if len(a) >= 1 else ()
        else:
            batch = g.sub_shape(tuple(a[:-2])) if len(a) > 2 else ()
            b = batch + (a[-1], g.dim())
        ctx.put(1, b)


@sampler("Gemm")
def _gemm(ctx) -> None:
    g = ctx.gen
    ta = ctx.attr("transA", lambda: ctx.pick([0, 1], "transA"))
    tb = ctx.attr("transB", lambda: ctx.pick([0, 1], "transB"))
    a = ctx.shape(0)
    if a is None:
        a = ctx.put(0, (g.dim(), g.dim())).shape
    assume(len(a) == 2)  # an input drawn before (a declared op's output) may be of any rank
    m, k = (a[1], a[0]) if ta and len(a) == 2 else (a[0], a[-1])
    b = ctx.shape(1)
    if b is None:
        n = g.dim()
        b = ctx.put(1, (n, k) if tb else (k, n)).shape
    # likewise B: a declared op's output (a weight's mark) drawn before, of any shape
    assume(len(b) == 2 and (b[1] if tb else b[0]) == k)
    n = b[0] if tb else b[-1]
    ctx.put(2, g.sub_shape((m, n)))
    for name in ("alpha", "beta"):
        ctx.attr(name, lambda name=name: ctx.draw(_FACTORS, name))


@sampler("Conv")
def _conv(ctx) -> None:
    x0, w0 = ctx.shape(0), ctx.shape(1)
    s = len(x0) - 2 if x0 else len(w0) - 2 if w0 else ctx.pick([2, 1, 3], "spatial rank")
    # a group divides the input's channels when they are known (1 // 2 would give w no input
    # channel: an invalid Conv, drawn again)
    groups = [g for g in (1, 2) if not x0 or len(x0) < 2 or x0[1] % g == 0] or [1]
    group = ctx.attr("group", lambda: ctx.pick(groups, "group"))
    modes = ["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]
    auto = ctx.attr("auto_pad", lambda: ctx.pick(modes, "auto_pad"))
    ones_twos = st.none() | st.tuples(*[st.sampled_from([1, 2])] * s)
    # onnxruntime has no dilated convolution with SAME_UPPER / SAME_LOWER padding
    dil = ctx.attr(
        "dilations", lambda: None if auto.startswith("SAME") else ctx.draw(ones_twos, "dilations")
    )
    ctx.attr("strides", lambda: ctx.draw(ones_twos, "strides"))
    pads = st.none() | st.tuples(*[ints(0, 1)] * (2 * s)) if auto == "NOTSET" else st.none()
    pad = ctx.attr("pads", lambda: ctx.draw(pads, "pads"))
    kernel = tuple(w0[2:]) if w0 else tuple(ctx.draw(ints(1, 3), "kernel") for _ in range(s))
    cg = x0[1] // max(group, 1) if x0 and len(x0) > 1 else ctx.draw(ints(1, 2), "c/g")
    w = ctx.put(1, (group * ctx.draw(ints(1, 2), "m/g"), cg) + kernel).shape
    if x0 is None:
        sizes = []
        for i, k in enumerate(kernel):
            reach = (dil[i] if dil else 1) * (k - 1) + 1 - (pad[i] + pad[i + s] if pad else 0)
            sizes.append(max(1, reach) + ctx.draw(ints(0, 2), "extra"))
        ctx.put(0, (ctx.draw(ints(1, 2), "batch"), group * cg) + tuple(sizes))
    ctx.put(2, (w[0],))
    ctx.attr("kernel_shape", lambda: ctx.pick([None, kernel], "kernel_shape"))


@sampler("AveragePool", "MaxPool")
def _pool(ctx) -> None:
    """Attributes of a pool over (N, C, spatial...) that onnxruntime accepts: each pad
    smaller than the kernel along its axis (pool_attributes.h), no dilations (AveragePool
    has them from opset 19 only)."""
    x0 = ctx.shape(0)
    s = len(x0) - 2 if x0 and len(x0) > 2 else ctx.pick([2, 1], "spatial rank")
    kernel = ctx.attr(
        "kernel_shape", lambda: tuple(ctx.draw(ints(1, 3), "kernel") for _ in range(s))
    )
    ctx.attr("auto_pad", "NOTSET")
    ctx.attr(
        "strides",
        lambda: ctx.draw(st.none() | st.tuples(*[st.sampled_from([1, 2])] * s), "strides"),
    )
    pads = st.tuples(*[ints(0, k - 1) for k in kernel * 2]) if kernel else st.none()
    pad = ctx.attr("pads", lambda: ctx.draw(st.none() | pads, "pads"))
    ctx.attr("ceil_mode", lambda: ctx.pick([0, 1], "ceil_mode"))
    if "count_include_pad" in ctx.spec.attr_index:
        ctx.attr("count_include_pad", lambda: ctx.pick([0, 1], "count_include_pad"))
    if x0 is None and kernel:
        sizes = tuple(
            max(1, k - (pad[i] + pad[i + s] if pad else 0)) + ctx.draw(ints(0, 2), "extra")
            for i, k in enumerate(kernel)
        )
        ctx.put(0, (ctx.draw(ints(1, 2), "batch"), ctx.draw(ints(1, 3), "c")) + sizes)


@sampler("BatchNormalization")
def _batchnorm(ctx) -> None:
    g = ctx.gen
    x = ctx.shape(0) or ctx.put(0, (g.dim(), g.dim()) + g.sub_shape()[:2]).shape
    for i in range(1, 5):
        ctx.put(i, (x[1] if len(x) > 1 else 1,))
    ctx.attr("epsilon", lambda: ctx.pick([1e-5, 1e-3, 0.1, 1.0], "epsilon"))
    ctx.attr("momentum", lambda: ctx.pick([0.9, 0.1], "momentum"))


@sampler("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2")
def _reduce(ctx) -> None:
    x = ctx.put(0, ctx.gen.sub_shape())
    r = x.rank
    if ctx.free(1):
        axes = (
            ctx.draw(st.lists(ints(0, max(r - 1, 0)), max_size=r, unique=True), "axes") if r else []
        )
        ctx.put(
            1,
            (len(axes),),
            [a - r if ctx.draw(BOOLS, "negative axis") else a for a in axes],
        )
    ctx.attr("keepdims", lambda: ctx.pick([1, 0], "keepdims"))
    ctx.attr("noop_with_empty_axes", lambda: ctx.pick([0, 1], "noop_with_empty_axes"))


@sampler("LayerNormalization")
def _layernorm(ctx) -> None:
    x = ctx.put(0, ctx.gen.nonscalar_shape())
    r = x.rank
    axis = ctx.attr("axis", lambda: ctx.draw(ints(-r, r - 1), "axis"))
    norm = tuple(x.shape[axis % r :]) if isinstance(axis, int) and -r <= axis < r else ()
    ctx.put(1, norm)
    ctx.put(2, norm)
    ctx.attr("epsilon", lambda: ctx.pick([1e-5, 1e-3, 0.1], "epsilon"))
    ctx.attr("stash_type", 1)


@sampler("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(ctx) -> None:
    g = ctx.gen
    ctx.put(
        0,
        (g.dim(), g.dim()) + tuple(g.dim() for _ in range(ctx.draw(ints(1, 2), "spatial"))),
    )
