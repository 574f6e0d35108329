"""Samplers for Slice and Pad (see `verify.draw`), whose shape-like inputs interact, for
Concat and Split (its projections `Split#K` too), and for Gather.

Under `keep_type` (a `same-type` guard) they are drawn so that the output keeps the input's
shape, which includes the cases that are *not* no-ops: a Slice over a whole axis with step -1
reverses it, and Pad with pads (1, -1) shifts it. A rule that treats "same type" as "no-op"
is caught by exactly these examples.
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from verify import hints as H
from verify.node import sampler
from verify.values import BOOLS, ints
from vocab.ops import VARIADIC_SLOTS

BIG = 2**31 - 1  # an end past any axis (Slice clamps it), in int32 too


@sampler("Slice")
def _slice(ctx) -> None:
    x = ctx.put(0, ctx.gen.nonscalar_shape())
    if not any(ctx.free(i) for i in (1, 2, 3, 4)):
        return
    r = x.rank
    if not r:
        return  # a scalar drawn below (a DequantizeLinear's) has nothing to slice: rejected
    # a slot drawn before (a capture shared with another Slice) fixes how many axes are
    # sliced and, for axes and steps, which and how
    known = {i: ctx.value(i) for i in (1, 2, 3, 4) if ctx.present(i) and not ctx.free(i)}
    sizes = {int(np.asarray(v).size) for v in known.values() if v is not None}
    if len(sizes) > 1 or (sizes and not 1 <= min(sizes) <= r):
        return  # the drawn example is not a valid Slice: it is rejected
    if sizes:
        k = sizes.pop()
    elif ctx.wants(1, H.OneElement):  # `slices-meet`, `slice-takes-part`: one axis
        k = 1
    else:
        k = ctx.draw(ints(1, r), "sliced axes" if ctx.present(3) else "k")
    if known.get(3) is not None:
        axes = [int(a) % r for a in np.asarray(known[3]).ravel()]
    elif ctx.present(3):
        axes = ctx.draw(st.permutations(range(r)), "axes")[:k]
    else:
        axes = list(range(k))
    if known.get(4) is not None:
        steps = [int(t) for t in np.asarray(known[4]).ravel()]
    else:
        steps = [_step(ctx) if ctx.present(4) else 1 for _ in axes]
    part = _concat_part(ctx, axes) if ctx.wants(1, H.PartOfConcat) else None
    if part is not None:
        bounds = [part]
    else:
        bounds = [_bounds(ctx, x.shape[a], t) for a, t in zip(axes, steps)]
    ctx.put(1, (k,), [b[0] for b in bounds])
    ctx.put(2, (k,), [b[1] for b in bounds])
    ctx.put(3, (k,), [a - r if ctx.draw(BOOLS, "negative axis") else a for a in axes])
    ctx.put(4, (k,), steps)


def _concat_part(ctx, axes: list[int]) -> tuple[int, int] | None:
    """(start, end) of one input's part of the Concat whose output this Slice slices, along
    the Concat's axis (`slice-takes-part`); None when the input is not a drawn Concat's output
    or the sliced axis is another one."""
    node = next((n for n in ctx.gen.nodes if n.output == ctx.names[0]), None)
    if node is None or node.op != "Concat" or len(axes) != 1:
        return None
    rank = len(node.type.shape)
    axis = int(dict(node.attrs)["axis"]) % rank
    if axes[0] != axis:
        return None
    lengths = [int(ctx.gen.types[i].shape[axis]) for i in node.inputs if i]
    k = ctx.draw(ints(0, len(lengths) - 1), "part")
    start = sum(lengths[:k])
    return start, start + lengths[k]


def _step(ctx) -> int:
    if ctx.filled(4) is not None:
        return int(ctx.filled(4))
    choices = [1, -1] if ctx.keep_type else [1, -1, 2, -2, 3]
    return ctx.pick(choices, "step")


def _bounds(ctx, d: int, step: int) -> tuple[int, int]:
    """(start, end) on an axis of length d: the whole axis under keep_type, else any."""
    if ctx.keep_type:
        if step > 0:
            return ctx.pick([0, -d, -BIG]), ctx.pick([d, BIG])
        return ctx.pick([-1, d - 1, BIG]), ctx.pick([-d - 1, -BIG])
    return ctx.draw(ints(-d - 1, d + 1), "start"), ctx.draw(ints(-d - 1, d + 1), "end")


@sampler("Pad")
def _pad(ctx) -> None:
    # "wrap" (Pad-19) is left out: onnxruntime 1.31 fails on it ("Unexpected mode of 3")
    modes = ["constant", "edge", "reflect"]
    mode = ctx.attr("mode", lambda: ctx.pick(modes, "mode"))
    x = ctx.put(0, ctx.gen.nonscalar_shape())
    r = x.rank
    if not r:
        return  # a scalar drawn below has nothing to pad: rejected
    axes = list(range(r))
    if ctx.free(3) and ctx.gen.opset >= 18:  # Pad-13 has no axes input
        axes = ctx.draw(st.permutations(range(r)), "axes")[: ctx.draw(ints(1, r), "k")]
        ctx.put(
            3,
            (len(axes),),
            [a - r if ctx.draw(BOOLS, "negative axis") else a for a in axes],
        )
    if ctx.free(1):
        spatial = ctx.wants(1, H.SpatialPads)  # `spatial-pads`: what a Conv pads
        begins, ends = zip(
            *((0, 0) if spatial and a < 2 else _pads(ctx, x.shape[a], mode, spatial) for a in axes)
        )
        if spatial and len(axes) > 2 and not any(begins[2:] + ends[2:]):
            begins = begins[:2] + (1,) + begins[3:]  # padding nothing is not padding
        ctx.put(1, (2 * len(axes),), list(begins) + list(ends))
    ctx.put(2, ())


def _pads(ctx, d: int, mode: str, non_negative: bool = False) -> tuple[int, int]:
    """(begin, end) pads of an axis of length d, valid for `mode` (and >= 0 if asked)."""
    if non_negative:
        return ctx.draw(ints(0, 1), "begin"), ctx.draw(ints(0, 1), "end")
    if ctx.keep_type:
        p = ctx.draw(ints(0, min(d, 2)), "shift")
        return (p, -p) if ctx.draw(BOOLS, "direction") else (-p, p)
    if mode == "constant":  # negative pads crop, but never below an empty axis
        lo = -min(d, 2)
        begin = ctx.draw(ints(lo, 2), "begin")
        return begin, ctx.draw(ints(max(lo, -d - begin), 2), "end")
    hi = max(0, min(2, d - 1 if mode == "reflect" else d))
    return ctx.draw(ints(0, hi), "begin"), ctx.draw(ints(0, hi), "end")


@sampler("Gather")
def _gather(ctx) -> None:
    """Data of rank >= 1 whose gathered axis has at least 2 entries, and indices of rank 0 to
    2, drawn in [-2, 1] (`verify.values.VALUE_DOMAINS`: valid on such an axis, negative
    indices included)."""
    shape = list(ctx.gen.nonscalar_shape())
    rank = len(shape)
    axis = ctx.attr("axis", lambda: ctx.draw(ints(-rank, rank - 1), "axis"))
    if not -rank <= axis < rank:
        return  # the drawn example is not a valid Gather: it is rejected
    shape[axis % rank] = max(shape[axis % rank], 2)
    x = ctx.put(0, tuple(shape))  # the guards' requests may change it (a `rank`)
    if x is None or x.shape is None or not -x.rank <= axis < x.rank or x.shape[axis] < 2:
        return  # indices in [-2, 1] are out of range: the example is rejected
    ctx.put(1, tuple(ctx.gen.dim() for _ in range(ctx.draw(ints(0, 2), "index rank"))))


@sampler("Concat")
def _concat(ctx) -> None:
    """Inputs of one rank, equal but on the concatenated axis (ONNX Concat)."""
    slots = range(len(ctx.names))
    known = next((s for s in map(ctx.shape, slots) if s is not None), None)
    base = known if known is not None else (ctx.gen.nonscalar_shape())
    rank = len(base)
    if not rank:  # a scalar drawn below cannot be concatenated: rejected
        ctx.attr("axis", 0)
        return
    axis = ctx.attr("axis", lambda: ctx.draw(ints(-rank, rank - 1), "axis"))
    equal = ctx.draw(BOOLS, "equal parts")  # equal parts let `same-type` hold
    for i in slots:
        if ctx.free(i):
            shape = list(base)
            if not equal:
                shape[axis % rank] = ctx.gen.dim()
            ctx.put(i, tuple(shape))


@sampler("TopK", "TopK#1")
def _topk(ctx) -> None:
    """The k largest (or smallest) along one axis of a tensor of rank >= 1, k a constant
    [1] in [0, the axis' size] (ONNX TopK-11), sorted (unsorted, their order is the
    runtime's: the executors would disagree)."""
    x = ctx.put(0, ctx.gen.nonscalar_shape())
    axis = ctx.attr("axis", lambda: ctx.draw(ints(-x.rank, x.rank - 1), "axis"))
    if not -x.rank <= axis < x.rank:
        return  # a pattern's axis beyond the input's rank: the example is rejected
    d = x.shape[axis % x.rank]
    if ctx.free(1):
        ctx.put(1, (1,), [ctx.draw(ints(min(1, d), d), "k")])
    ctx.attr("largest", lambda: ctx.pick([1, 0], "largest"))
    ctx.attr("sorted", 1)


@sampler("Split", *(f"Split#{k}" for k in range(1, VARIADIC_SLOTS)))
def _split(ctx) -> None:
    """A split into more outputs than the projection's index, by `num_outputs` (equal
    chunks, the last one smaller: ONNX Split-18) or by a `split` input of sizes."""
    least = ctx.spec.output + 1
    shape = list(ctx.gen.nonscalar_shape())
    axis = ctx.attr("axis", lambda: ctx.draw(ints(-len(shape), len(shape) - 1), "axis"))
    if -len(shape) <= axis < len(shape):  # room for the output the projection reads
        shape[axis] = max(shape[axis], least)
    x = ctx.put(0, tuple(shape))
    rank = x.rank
    if not -rank <= axis < rank:
        return  # a pattern's axis beyond the input's rank: the example is rejected
    d = x.shape[axis % rank]
    if ctx.present(1):
        if ctx.free(1):
            n = ctx.draw(ints(least, max(least, d)), "outputs")
            cuts = sorted(ctx.draw(st.lists(ints(0, d), min_size=n - 1, max_size=n - 1)))
            sizes = [b - a for a, b in zip([0, *cuts], [*cuts, d])]
            ctx.put(1, (n,), sizes)
        ctx.attr("num_outputs", None)
    else:
        ctx.attr("num_outputs", lambda: ctx.draw(ints(least, max(least, d)), "outputs"))
