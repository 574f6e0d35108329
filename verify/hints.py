"""Generation hints: what a guard asks of the examples drawn for a rule.

A rule's guards are exact predicates, evaluated on every drawn example exactly as the engine
evaluates them (`hypothesis.assume` drops the examples they reject). Drawing blindly and
filtering would reject almost everything (`all-equal @z 0` on random floats), so each guard
of the registry may have a *hint*, keyed by the guard's name: a function from the guard's
arguments to `Request`s that steer the drawing towards examples the guard accepts, and
optionally a second one, its *violation*, that steers towards examples it rejects (for the
negative companion check, where exactly one guard must fail):

    @hint("all-equal")
    def _all_equal(x: Arg, v: Arg) -> list[Request]:
        return [Const(x.name), Fill(x.name, v.value)]

    @violation("broadcasts-into")
    def _grows(z: Arg, x: Arg) -> list[Request]:
        return [Beyond(z.name, x.name)]

Arguments are `Arg`s: a capture name (`Arg.name`) or a literal value (`Arg.value`). Requests
are declarative; `verify.draw` applies them when it draws the captures they name (a request
that names a capture drawn before the other one it relates to is applied to whichever is drawn
second). A hint is only a bias: the guard itself still decides. A guard without a hint works,
with a higher rejection rate. A negated guard `(not (g ...))` is satisfied by g's violation
and violated by g's hint.

Requests:

| request                  | effect                                                        |
|--------------------------|---------------------------------------------------------------|
| `Const(x)` / `Input(x)`  | x is an initializer / a graph input                           |
| `Fill(x, v)`             | x is a constant whose every element is v                      |
| `Positive(x)`            | x's elements are drawn > 0 (a scale: a 0 would be refused)    |
| `Wide(x)`                | x's elements are drawn up to 2^9 in magnitude (a bias)        |
| `DeadChannel(w)`         | half the draws: one channel of w (axis 0) scaled by 2^-24     |
| `OneElement(x)`          | x is a constant of shape (1, ..., 1) or ()                    |
| `Many(x)`                | x has more than one element                                   |
| `Within(z, x)`           | z's shape broadcasts into x's (`broadcasts-into z x`)         |
| `Beyond(z, x)`           | z's shape broadcasts with x's into a bigger shape than x's    |
| `CopyValues(b, a)`       | b is a constant equal to a (`same-values`)                    |
| `NoZero(s)` / `Zero(s)`  | a Reshape target shape without / with a 0 entry               |
| `Rank(x, n)`             | x has rank n                                                  |
| `RankAtLeast(x, n)`      | x has rank n or more                                          |
| `ChannelOf(b, y)`        | b is a per-channel constant for the (N, C, ...) tensor y       |
| `KeepType(y, x)`         | y (an op's output) has x's type: the op is drawn as a no-op    |
| `SameDtype(a, b)`        | a and b have one dtype                                         |
| `DtypeIn(x, dtypes)`     | x's dtype is one of `dtypes`                                   |
| `DtypeFrom(x, y, f)`     | x's dtype is in `f(dtype of y)`                                |
| `IdentityPerm(p)`        | attribute p is the identity permutation of its length          |
| `SpatialPads(p)`         | Pad's pads p are non-negative and 0 on the first two axes      |
| `DimMultiple(x, a, m)`   | x's dimension a is a positive multiple of m                    |
| `PartOfConcat(s)`        | a Slice's starts s (and ends) take one input's part of the    |
|                          | Concat it slices                                              |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dsl.ir import Capture, Guard, ListCapture, Literal
from verify.dtypes import CANDIDATES, FLOATS
from vocab.registry import GUARDS
from vocab.types import ClassInfo, TensorType


@dataclass(frozen=True)
class Arg:
    """A guard argument: a capture (`name`) or a literal (`value`)."""

    name: str | None = None
    value: Any = None


@dataclass(frozen=True)
class Request:
    """Base of the requests a hint makes; `name` is the capture it steers."""

    name: str


@dataclass(frozen=True)
class Const(Request):
    """`name` is an initializer (a constant), not a graph input."""


@dataclass(frozen=True)
class Fill(Request):
    """`name` is a constant whose every element is `value`."""

    value: Any = 0


@dataclass(frozen=True)
class Input(Request):
    """`name` is a graph input (not a constant)."""


@dataclass(frozen=True)
class OneElement(Request):
    """`name` is a constant of one element: shape () or (1, ..., 1)."""


@dataclass(frozen=True)
class Many(Request):
    """`name` has more than one element."""


@dataclass(frozen=True)
class Beyond(Request):
    """`name`'s shape broadcasts with `big`'s into a shape bigger than `big`'s."""

    big: str = ""


@dataclass(frozen=True)
class Zero(Request):
    """`name`, a Reshape target shape, has a 0 entry."""


@dataclass(frozen=True)
class Within(Request):
    """`name`'s shape broadcasts into `big`'s (`broadcasts-into`)."""

    big: str = ""


@dataclass(frozen=True)
class CopyValues(Request):
    """`name` is a constant equal to `source` (`same-values`)."""

    source: str = ""


@dataclass(frozen=True)
class Positive(Request):
    """`name`'s elements are drawn non-negative (a quantization scale)."""


@dataclass(frozen=True)
class Wide(Request):
    """`name`'s elements are drawn over a wider range than the others', up to 2^9 in
    magnitude: a bias that outweighs the products it is added to, so that an error in the
    bias (wrong units) stands out of the products' rounding bound."""


@dataclass(frozen=True)
class DeadChannel(Request):
    """`name`, a Conv weight [C_out, ...], has in half the draws one output channel (drawn)
    scaled by 2^-24: a BatchNormalization channel with gamma near 0 folded into the Conv,
    whose bias then outweighs its weights' steps."""


@dataclass(frozen=True)
class NoZero(Request):
    """`name`, a Reshape target shape, has no 0 entry."""


@dataclass(frozen=True)
class Rank(Request):
    """`name` has rank `n`."""

    n: int = 0


@dataclass(frozen=True)
class RankAtLeast(Request):
    """`name` has rank `n` or more."""

    n: int = 0


@dataclass(frozen=True)
class ChannelOf(Request):
    """`name` is a per-channel constant for the (N, C, ...) tensor `of`."""

    of: str = ""


@dataclass(frozen=True)
class KeepType(Request):
    """`name`, an op's output, has the type of input `inp`: the op is drawn as a no-op."""

    inp: str = ""


@dataclass(frozen=True)
class SameDtype(Request):
    """`name` and `other` have one dtype."""

    other: str = ""


@dataclass(frozen=True)
class DtypeIn(Request):
    """`name`'s dtype (ONNX element type) is one of `dtypes`."""

    dtypes: frozenset = frozenset()


@dataclass(frozen=True)
class DtypeFrom(Request):
    """`name`'s dtype is in `fn(dtype of source)`."""

    source: str = ""
    fn: Callable[[int], frozenset] = frozenset


@dataclass(frozen=True)
class IdentityPerm(Request):
    """Attribute capture `name` is the identity permutation of its length."""


@dataclass(frozen=True)
class PartOfConcat(Request):
    """`name`, a Slice's starts, and its ends take exactly one input's part of the Concat
    the Slice slices (`slice-takes-part`)."""


@dataclass(frozen=True)
class SpatialPads(Request):
    """Attribute capture `name` (Pad's pads) is non-negative and 0 on the first two axes."""


@dataclass(frozen=True)
class DimMultiple(Request):
    """Dimension `axis` of `name` is a positive multiple of `m` (`whole-blocks`)."""

    axis: int = 0
    m: int = 1


HINTS: dict[str, Callable[..., list[Request]]] = {}
VIOLATIONS: dict[str, Callable[..., list[Request]]] = {}


def hint(guard_name: str):
    """Register the hint of guard `guard_name`: requests that make it hold."""

    def deco(fn):
        HINTS[guard_name] = fn
        return fn

    return deco


def violation(guard_name: str):
    """Register the violation of guard `guard_name`: requests that make it fail."""

    def deco(fn):
        VIOLATIONS[guard_name] = fn
        return fn

    return deco


def requests(guards: tuple[Guard, ...], violate: int | None = None) -> list[Request]:
    """The requests that make every guard hold, except guard number `violate`, which is
    steered to fail."""
    out: list[Request] = []
    for i, g in enumerate(guards):
        holds = (i != violate) != g.negate  # a negated guard holds when g fails
        fn = (HINTS if holds else VIOLATIONS).get(g.fn)
        args = [
            Arg(a.name) if isinstance(a, Capture | ListCapture) else Arg(None, _lit(a))
            for a in g.args
        ]
        if fn is not None and all(a.name is not None or a.value is not None for a in args):
            out += fn(*args)
    return out


def _lit(a):
    return a.value if isinstance(a, Literal) else None


# ---- the hints of the registry's guards ----------------------------------------------------


@hint("identity-perm")
def _identity_perm(p: Arg) -> list[Request]:
    return [IdentityPerm(p.name)] if p.name else []


@hint("is-constant")
def _is_constant(x: Arg) -> list[Request]:
    return [Const(x.name)]


@hint("all-equal")
def _all_equal(x: Arg, v: Arg) -> list[Request]:
    return [Const(x.name), Fill(x.name, v.value)]


@hint("negative-zeros")
def _negative_zeros(x: Arg) -> list[Request]:
    return [Const(x.name), Fill(x.name, -0.0)]


@hint("positive-zeros")
def _positive_zeros(x: Arg) -> list[Request]:
    return [Const(x.name), Fill(x.name, 0.0)]


@hint("one-element")
def _one_element(x: Arg) -> list[Request]:
    return [Const(x.name), OneElement(x.name)]


@hint("same-values")
def _same_values(a: Arg, b: Arg) -> list[Request]:
    return [Const(a.name), Const(b.name), CopyValues(b.name, a.name), CopyValues(a.name, b.name)]


@hint("normal-product")
@hint("finite-sum")
def _merged_constant(a: Arg, b: Arg) -> list[Request]:
    # most drawn values are moderate: the merged constant is then finite and normal
    return [Const(a.name), Const(b.name), SameDtype(a.name, b.name)]


@hint("no-zero-dims")
def _no_zero_dims(s: Arg) -> list[Request]:
    return [Const(s.name), NoZero(s.name)]


@hint("rank")
def _rank(x: Arg, n: Arg) -> list[Request]:
    return [Rank(x.name, int(n.value))] if n.value is not None else []


@hint("accumulates-in-int32")
@hint("accumulates-in-int32-transposed")
def _accumulates_in_int32(w: Arg) -> list[Request]:
    return []  # drawn weights have a few rows: K * 255 * 127 is far below 2^31 for all of them


@hint("exact-scale")
def _exact_scale(s: Arg) -> list[Request]:
    # float32 (element type 1); drawn values are mostly in [-8, 8], a 0 is rejected
    return [Const(s.name), OneElement(s.name), DtypeIn(s.name, frozenset({1}))]


@hint("per-tensor")
def _per_tensor(x: Arg) -> list[Request]:
    return [Const(x.name), OneElement(x.name), Rank(x.name, 0)]


@hint("positive-scale")
def _positive_scale(s: Arg) -> list[Request]:
    # float32, drawn in [0, 8] (a zero is refused by the guard)
    return [
        Const(s.name),
        OneElement(s.name),
        Rank(s.name, 0),
        DtypeIn(s.name, frozenset({1})),
        Positive(s.name),
    ]


@hint("smoothing-factors")
def _smoothing_factors(s: Arg) -> list[Request]:
    # float32, drawn in [0, 8]: a 0 (or a value below 2^-16) is refused by the guard
    return [Const(s.name), Rank(s.name, 1), DtypeIn(s.name, frozenset({1})), Positive(s.name)]


@hint("eight-bit")
def _eight_bit(x: Arg) -> list[Request]:
    return [DtypeIn(x.name, frozenset({2, 3}))]


@hint("zero-point-at-min")
def _zero_point_at_min(z: Arg) -> list[Request]:
    return [Const(z.name), Rank(z.name, 0), DtypeIn(z.name, frozenset({2})), Fill(z.name, 0)]


def _float_scalar(v: Arg, value: float) -> list[Request]:
    """`v` is a float32 scalar constant equal to `value` (a Clip bound)."""
    return [Const(v.name), Rank(v.name, 0), DtypeIn(v.name, frozenset({1})), Fill(v.name, value)]


@hint("quantize-saturates")
def _quantize_saturates(s: Arg, z: Arg, lo: Arg, hi: Arg) -> list[Request]:
    # ReLU6 quantized over [0, 6]: s = 6 / 256, zp = 0 (uint8), so Q(0) = 0 and Q(6) = 255
    return [
        *_zero_point_at_min(z),
        *_positive_scale(s),
        Fill(s.name, 6.0 / 256),
        *_float_scalar(lo, 0.0),
        *_float_scalar(hi, 6.0),
    ]


@hint("scale-multiple")
def _scale_multiple(a: Arg, b: Arg) -> list[Request]:
    # a = 2 b: every value dequantized with a lies on b's grid (drawn zero points then
    # saturate some of them and not others)
    return [*_positive_scale(a), *_positive_scale(b), Fill(a.name, 0.5), Fill(b.name, 0.25)]


@hint("dequantized-within")
def _dequantized_within(x: Arg, s: Arg, z: Arg, lo: Arg, hi: Arg) -> list[Request]:
    # drawn scales are <= 8 and |q - zp| <= 255: every dequantized value is within +-2040
    return [
        *_eight_bit(x),
        *_positive_scale(s),
        *_per_tensor(z),
        *_float_scalar(lo, -2040.0),
        *_float_scalar(hi, 2040.0),
    ]


@hint("integer-matmul-exact")
def _integer_matmul_exact(a: Arg, b: Arg) -> list[Request]:
    # one 8-bit dtype for both (a uint8 a by an int8 b is exact only for small constant b's)
    return [
        DtypeIn(a.name, frozenset({2, 3})),
        SameDtype(a.name, b.name),
        RankAtLeast(a.name, 2),
        RankAtLeast(b.name, 2),
    ]


@hint("integer-conv-exact")
def _integer_conv_exact(x: Arg, w: Arg) -> list[Request]:
    return [DtypeIn(x.name, frozenset({2, 3})), SameDtype(x.name, w.name)]


@hint("integer-matmul-requantizes")
@hint("integer-conv-requantizes")
def _requantizes(w: Arg, sa: Arg, sb: Arg, sy: Arg) -> list[Request]:
    # an output scale of at least the input scales' product (drawn scales are <= 8)
    return [Fill(sy.name, 8.0)]


@hint("channel-scales")
def _channel_scales(w: Arg, sw: Arg, zw: Arg, axis: Arg) -> list[Request]:
    # one scale and zero point (the per-channel form is drawn where the Q/DQ samplers draw it)
    return [*_positive_scale(sw), *_per_tensor(zw)]


@hint("bias-scales")
def _bias_scales(b: Arg, sb: Arg, axis: Arg, sx: Arg, sw: Arg, w: Arg) -> list[Request]:
    # scales whose product is exact: sb = sx * sw = 0.5 * 0.25
    fills = ((sb, 0.125), (sx, 0.5), (sw, 0.25))
    return [Const(b.name), Rank(b.name, 1), *(Fill(a.name, v) for a, v in fills)]


@hint("bias-fits-int24")
@hint("bias-fits-int24-full-range")
def _bias_fits(b: Arg, sx: Arg, w: Arg) -> list[Request]:
    # wide biases: with the ordinary |b| <= 8 against products of up to K * 2040 * 8, a bias
    # in the wrong units hid inside the weights' rounding bound
    return [Const(b.name), Wide(b.name)]


@hint("bias-fits-int24-bias-floored")
@hint("bias-fits-int24-full-range-bias-floored")
def _bias_fits_raised(b: Arg, sx: Arg, w: Arg) -> list[Request]:
    # wide biases, and in half the draws a weight channel of tiny values beside its bias, whose
    # step the rule raises
    return [Const(b.name), Wide(b.name), Const(w.name), DeadChannel(w.name)]


@hint("nonempty")
@hint("conv-accumulates-in-int32")
@hint("requantizes-in-range")
@hint("requantizes-in-range-full-range")
@hint("requantizes-in-range-bias-floored")
@hint("requantizes-in-range-full-range-bias-floored")
@hint("static-matmul-requantizes")
@hint("static-matmul-requantizes-full-range")
@hint("scale-ratio")
@hint("pool-sums-in-range")
def _holds_for_drawn_sizes(*args: Arg) -> list[Request]:
    return []  # drawn tensors are small and their values moderate: these hold for most draws


@hint("whole-blocks")
def _whole_blocks(x: Arg, w: Arg, block: Arg) -> list[Request]:
    m = int(block.value) if block.value is not None else 1
    return [Rank(w.name, 2), DimMultiple(x.name, -1, m), DimMultiple(w.name, 0, m)]


@hint("rank-at-least")
def _rank_at_least(x: Arg, n: Arg) -> list[Request]:
    return [RankAtLeast(x.name, int(n.value))] if n.value is not None else []


@hint("same-type")
def _same_type(a: Arg, b: Arg) -> list[Request]:
    return [SameDtype(a.name, b.name), KeepType(a.name, b.name)]


@hint("same-dtype")
def _same_dtype(a: Arg, b: Arg) -> list[Request]:
    return [SameDtype(a.name, b.name)]


@hint("has-dtype")
def _has_dtype(x: Arg, t: Arg) -> list[Request]:
    if t.name is not None:  # an attribute capture: a Cast's `to`
        return [SameDtype(x.name, t.name)]
    return [DtypeIn(x.name, frozenset({int(t.value)}))]


@hint("is-float")
def _is_float(x: Arg) -> list[Request]:
    return [DtypeIn(x.name, FLOATS)]


def _lossless(d: int) -> frozenset:
    """The dtypes a value of dtype `d` casts to without loss, by the guard itself."""
    guard = GUARDS["cast-lossless"].fn
    return frozenset(t for t in CANDIDATES if guard(ClassInfo(TensorType(d, ())), t))


@hint("cast-lossless")
def _cast_lossless(x: Arg, to: Arg) -> list[Request]:
    if to.name is None:
        return [DtypeIn(x.name, frozenset(d for d in CANDIDATES if int(to.value) in _lossless(d)))]
    return [DtypeFrom(to.name, x.name, _lossless)]


@hint("broadcasts-into")
def _broadcasts_into(z: Arg, x: Arg) -> list[Request]:
    return [Within(z.name, x.name)]


@hint("channel-bias")
def _channel_bias(b: Arg, y: Arg) -> list[Request]:
    return [Const(b.name), ChannelOf(b.name, y.name)]


@hint("all-equal-into")
def _all_equal_into(c: Arg, v: Arg, x: Arg) -> list[Request]:
    return [Const(c.name), Fill(c.name, v.value), Within(c.name, x.name)]


@hint("last-axis")
def _last_axis(axes: Arg, x: Arg) -> list[Request]:
    return [Const(axes.name), OneElement(axes.name), Fill(axes.name, -1)]


@hint("spatial-pads")
def _spatial_pads(pads: Arg, x: Arg) -> list[Request]:
    return [RankAtLeast(x.name, 3), Const(pads.name), SpatialPads(pads.name)]


@hint("static-nonempty-features")
def _static_nonempty_features(x: Arg) -> list[Request]:
    return [RankAtLeast(x.name, 3)]  # drawn shapes are static; a 0 is rare and then rejected


@hint("last-dim-vector")
def _last_dim_vector(w: Arg, x: Arg) -> list[Request]:
    return [Rank(w.name, 1), Within(w.name, x.name), Many(w.name)]


# ---- violations ------------------------------------------------------------------------------


@violation("is-constant")
def _not_constant(x: Arg) -> list[Request]:
    return [Input(x.name)]


@violation("one-element")
def _not_one_element(x: Arg) -> list[Request]:
    return [Const(x.name), Many(x.name)]


@violation("no-zero-dims")
def _zero_dims(s: Arg) -> list[Request]:
    return [Const(s.name), Zero(s.name)]


@violation("rank")
def _other_rank(x: Arg, n: Arg) -> list[Request]:
    return [Rank(x.name, int(n.value) + 1)] if n.value is not None else []


@violation("rank-at-least")
def _lower_rank(x: Arg, n: Arg) -> list[Request]:
    return [Rank(x.name, int(n.value) - 1)] if n.value is not None and n.value > 0 else []


@violation("has-dtype")
def _other_dtype(x: Arg, t: Arg) -> list[Request]:
    if t.name is not None:
        return [DtypeFrom(t.name, x.name, lambda d: frozenset(CANDIDATES) - {d})]
    return [DtypeIn(x.name, frozenset(CANDIDATES) - {int(t.value)})]


@violation("is-float")
def _not_float(x: Arg) -> list[Request]:
    return [DtypeIn(x.name, frozenset(CANDIDATES) - FLOATS)]


@violation("cast-lossless")
def _lossy(x: Arg, to: Arg) -> list[Request]:
    if to.name is None:
        return [
            DtypeIn(x.name, frozenset(d for d in CANDIDATES if int(to.value) not in _lossless(d)))
        ]
    return [DtypeFrom(to.name, x.name, lambda d: frozenset(CANDIDATES) - _lossless(d))]


@violation("broadcasts-into")
def _grows(z: Arg, x: Arg) -> list[Request]:
    return [Beyond(z.name, x.name)]


@violation("channel-bias")
def _not_channel(b: Arg, y: Arg) -> list[Request]:
    return [Const(b.name)]


@violation("all-equal-into")
def _not_all_equal_into(c: Arg, v: Arg, x: Arg) -> list[Request]:
    other = v.value + 1 if isinstance(v.value, int | float) else v.value
    return [Const(c.name), Fill(c.name, other), Within(c.name, x.name)]


@hint("slices-meet")
def _slices_meet(x: Arg, s: Arg, m: Arg, e: Arg, axes: Arg, steps: Arg, axis: Arg) -> list[Request]:
    return [OneElement(s.name), Fill(steps.name, 1)] if s.name and steps.name else []


@hint("slice-takes-part")
def _slice_takes_part(
    s: Arg, e: Arg, axes: Arg, steps: Arg, before: Arg, y: Arg, after: Arg, axis: Arg
) -> list[Request]:
    if not (s.name and steps.name):
        return []
    return [OneElement(s.name), PartOfConcat(s.name), Fill(steps.name, 1)]
