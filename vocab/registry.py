"""Guards and builders: the named host functions that rules may call.

A guard is a predicate used in `(if ...)`; a builder computes an attribute value used in a
rule's result. Both are plain module-level functions registered by name with the kinds of
their parameters:

- `term`: a captured tensor value; the function receives a `ClassInfo` (type and, for an
  imported constant, its value),
- `attr`: an attribute value (a capture bound to an attribute, or a literal in the rule); the
  function receives the Python value (int, float, str, tuple), None when absent,
- `list`: a list capture (`@xs...`); the function receives a list of `ClassInfo`.

A guard that cannot decide (an unknown shape, a non-constant) returns False: a rule never fires
on a fact the engine does not know. Under `(not GUARD)` that False would read as a known
fact, so only a guard registered `negatable=True` may be negated (`dsl.host.lower_guard`
refuses the others): such a guard returns None when it cannot decide, and None fails the
guard written either way (`engine.apply`); `zero-point-at-min` says why it returns False.
Builders return None when they cannot build; the match is then skipped.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from vocab.types import ClassInfo, TensorType

TERM, ATTR, LIST = "term", "attr", "list"


@dataclass(frozen=True)
class HostFn:
    """A registered guard or builder: `name` as written in rules, its parameter kinds."""

    name: str
    fn: Callable[..., Any]
    params: tuple[str, ...]
    kind: str  # "guard" or "builder"
    negatable: bool = False  # a guard returning None when it cannot decide (module docstring)

    def literal(self, i: int) -> type | None:
        """The Python type a literal argument `i` must have (int, float or str), from the
        function's annotation of that parameter; None when it says none of those."""
        params = list(inspect.signature(self.fn).parameters.values())
        note = params[i].annotation if i < len(params) else None
        return {"int": int, "float": float, "str": str}.get(str(note).removesuffix(" | None"))

    @property
    def doc(self) -> str:
        """The first line of the function's docstring (empty if it has none), for listings."""
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""


GUARDS: dict[str, HostFn] = {}
BUILDERS: dict[str, HostFn] = {}
# error bounds of `quant` rules: `(bound NAME ARG...)`; a bound takes the numpy values of its
# captures (float arrays, as `verify` draws them) and returns the largest |lhs - rhs| allowed
# per element of the rule's output (an array that broadcasts to it)
BOUNDS: dict[str, HostFn] = {}


def guard(name: str, *params: str, negatable: bool = False):
    """Register a guard under `name` with parameter kinds `params` (TERM or ATTR).
    negatable: the guard returns None, not False, when it cannot decide, so that rules may
    write `(not (name ...))` (module docstring)."""

    def deco(fn):
        GUARDS[name] = HostFn(name, fn, params, "guard", negatable)
        return fn

    return deco


def builder(name: str, *params: str):
    """Register a builder under `name` with parameter kinds `params` (TERM or ATTR)."""

    def deco(fn):
        BUILDERS[name] = HostFn(name, fn, params, "builder")
        return fn

    return deco


def bound(name: str, *params: str):
    """Register an error bound under `name` with parameter kinds `params` (TERM: the
    capture's value as a numpy array)."""

    def deco(fn):
        BOUNDS[name] = HostFn(name, fn, params, "bound")
        return fn

    return deco


# ---- permutations ----------------------------------------------------------------------------


@guard("identity-perm", ATTR, negatable=True)
def identity_perm(perm: tuple[int, ...] | None) -> bool | None:
    """True if `perm` is (0, 1, ..., n-1). An absent perm (reverse) is identity only for n<=1,
    which needs the rank: None (undecided)."""
    return None if perm is None else tuple(perm) == tuple(range(len(perm)))


@builder("compose-perm", ATTR, ATTR)
def compose_perm(p: tuple[int, ...] | None, q: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Perm of Transpose(Transpose(x, p), q) as one Transpose: r[i] = p[q[i]].

    ONNX Transpose: output axis i is input axis perm[i] (ONNX operator spec, Transpose).
    """
    if p is None or q is None or len(p) != len(q):
        return None
    return tuple(p[i] for i in q)


# ---- constants -------------------------------------------------------------------------------


@guard("is-constant", TERM, negatable=True)
def is_constant(x: ClassInfo) -> bool:
    """True if the value is an imported constant (initializer or Constant node)."""
    return x.is_constant


@guard("all-equal", TERM, ATTR, negatable=True)
def all_equal(x: ClassInfo, v: Any) -> bool | None:
    """True if `x` is a constant whose every element equals `v` (NaN never equals); None
    (undecided) when `x` is not a constant."""
    if x.value is None:
        return None
    return x.value.size > 0 and bool(np.all(x.value == v))


@guard("negative-zeros", TERM)
def negative_zeros(x: ClassInfo) -> bool:
    """True if `x` is a constant of zeros that are all -0.0 (or of an integer type, whose zero
    has no sign): the zero `y + z == y` holds for exactly, -0.0 included (IEEE 754: -0.0 + -0.0
    is -0.0, but -0.0 + +0.0 is +0.0)."""
    v = x.value
    if v is None or v.size == 0 or not bool(np.all(v == 0)):
        return False
    return not np.issubdtype(v.dtype, np.floating) or bool(np.all(np.signbit(v)))


@guard("positive-zeros", TERM)
def positive_zeros(x: ClassInfo) -> bool:
    """True if `x` is a constant of zeros that are all +0.0 (or of an integer type): the zero
    `y - z == y` holds for exactly, -0.0 included (-0.0 - +0.0 is -0.0, -0.0 - -0.0 is +0.0)."""
    v = x.value
    if v is None or v.size == 0 or not bool(np.all(v == 0)):
        return False
    return not np.issubdtype(v.dtype, np.floating) or not bool(np.any(np.signbit(v)))


@guard("one-element", TERM)
def one_element(x: ClassInfo) -> bool:
    """True if `x` is a constant holding exactly one element (a scalar or shape (1, ..., 1))."""
    return x.value is not None and x.value.size == 1


@guard("same-values", TERM, TERM)
def same_values(a: ClassInfo, b: ClassInfo) -> bool:
    """True if `a` and `b` are constants with equal shapes and elements."""
    return (
        a.value is not None
        and b.value is not None
        and a.value.shape == b.value.shape
        and bool(np.array_equal(a.value, b.value))
    )


def _merged_constant_ok(a: ClassInfo, b: ClassInfo, merge, ok) -> bool:
    """Shared body of `normal-product` and `finite-sum`: False unless `a` and `b` are
    constants of one dtype whose shapes broadcast; True for integer dtypes (wrapping
    arithmetic); else `ok(merge(a, b) as float64, info)` with ml_dtypes' finfo of the float
    dtype (it also knows bfloat16), computed with numpy's floating-point warnings off."""
    import ml_dtypes

    if a.value is None or b.value is None or a.value.dtype != b.value.dtype:
        return False
    try:
        info = ml_dtypes.finfo(a.value.dtype)
    except ValueError:  # not a float dtype
        info = None
    with np.errstate(all="ignore"):
        try:
            merged = merge(a.value, b.value)
        except ValueError:  # shapes do not broadcast
            return False
        if info is None:
            return not np.issubdtype(a.value.dtype, np.inexact)
        return bool(ok(np.abs(merged.astype(np.float64)), info, a.value, b.value))


@guard("normal-product", TERM, TERM)
def normal_product(a: ClassInfo, b: ClassInfo) -> bool:
    """True if `a` and `b` are constants whose elementwise product, computed in their dtype,
    is finite and is a normal number wherever neither factor is zero. For integer constants
    (wrapping arithmetic) it always holds.

    A chain rule that merges `(x * c1) * c2` or `(x / c1) / c2` into one constant needs
    this: a product that underflows to 0 or to a subnormal turns `0 / (c1*c2)` into NaN and
    loses the relative precision that the two-step form kept; one that overflows turns the
    result into 0 or inf (found by the verifier on `div-div-constants`: c1 = c2 = 2e-36).
    """
    return _merged_constant_ok(
        a,
        b,
        np.multiply,
        lambda mag, info, x, y: (
            np.all(np.isfinite(mag)) and np.all((x == 0) | (y == 0) | (mag >= float(info.tiny)))
        ),
    )


@guard("finite-sum", TERM, TERM)
def finite_sum(a: ClassInfo, b: ClassInfo) -> bool:
    """True if `a` and `b` are constants for which `|a| + |b|`, elementwise in their dtype,
    is finite, so their sum and their difference cannot overflow. For integer constants
    (wrapping arithmetic) it always holds. Guards the chain rules that merge
    `(x + c1) - c2` and its kind into one constant."""
    return _merged_constant_ok(
        a,
        b,
        lambda x, y: np.add(np.abs(x), np.abs(y)),
        lambda mag, info, x, y: np.all(np.isfinite(mag)),
    )


@guard("no-zero-dims", TERM)
def no_zero_dims(s: ClassInfo) -> bool:
    """True if `s` is a constant Reshape shape with no 0 entry (0 copies an input dim)."""
    return s.value is not None and bool(np.all(s.value != 0))


# ---- shapes and dtypes -----------------------------------------------------------------------


@guard("rank", TERM, ATTR, negatable=True)
def rank(x: ClassInfo, n: int) -> bool | None:
    """True if `x` has rank `n`; None (undecided) when its rank is unknown."""
    return None if x.type.rank is None else x.type.rank == n


@guard("rank-at-least", TERM, ATTR)
def rank_at_least(x: ClassInfo, n: int) -> bool:
    """True if `x`'s rank is known and at least `n`."""
    return x.type.rank is not None and x.type.rank >= n


@builder("shape-of", TERM)
def shape_of(x: ClassInfo) -> tuple[int, ...] | None:
    """`x`'s static shape, as a Reshape target; None when not static or when a dim is 0
    (Reshape would read a 0 as "copy this dimension")."""
    if not x.type.static or 0 in x.type.shape:
        return None
    return tuple(x.type.shape)


@builder("rows-2d", TERM)
def rows_2d(x: ClassInfo) -> tuple[int, ...] | None:
    """Reshape target (-1, K) that flattens `x`'s leading axes into rows, K its last dim
    (static and non-zero), for feeding a batched operand to Gemm."""
    if x.type.shape is None or not x.type.shape or not isinstance(x.type.shape[-1], int):
        return None
    k = x.type.shape[-1]
    return None if k == 0 else (-1, k)


@guard("same-type", TERM, TERM)
def same_type(a: ClassInfo, b: ClassInfo) -> bool:
    """True if `a` and `b` have the same dtype and the same shape, dimension by dimension:
    equal ints, or the same symbol (see `same_dim`); an unknown dimension is never equal."""
    sa, sb = a.type.shape, b.type.shape
    return (
        bool(a.type.dtype)
        and a.type.dtype == b.type.dtype
        and sa is not None
        and sb is not None
        and len(sa) == len(sb)
        and all(same_dim(x, y) for x, y in zip(sa, sb))
    )


@guard("has-dtype", TERM, ATTR, negatable=True)
def has_dtype(x: ClassInfo, elem_type: int) -> bool | None:
    """True if `x`'s ONNX element type is `elem_type` (e.g. a Cast's `to`); None (undecided)
    when `x`'s element type is unknown."""
    return x.type.dtype == elem_type if x.type.dtype else None


def same_dim(a, b) -> bool:
    """True if dimensions `a` and `b` are known to be equal: equal ints, or the same symbol.

    A symbol is a `dim_param` string: in ONNX a dimension variable names one size wherever it
    appears in a graph (ONNX IR spec, "Tensor shapes"; the engine's shape analysis gives
    dimensions it proves equal one string). None (unknown) equals nothing, not even None.
    """
    if a is None or b is None:
        return False
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    return int(a) == int(b)


def _static_one(d) -> bool:
    return d is not None and not isinstance(d, str) and int(d) == 1


@guard("broadcasts-into", TERM, TERM)
def broadcasts_into(z: ClassInfo, x: ClassInfo) -> bool:
    """True if broadcasting `z` against `x` gives exactly `x`'s shape (numpy/ONNX
    multidirectional broadcasting, ONNX docs/Broadcasting.md), so `x op z` is `x`-shaped.

    Decided per dimension, right-aligned: `z` has at most `x`'s rank, and each of its
    dimensions is a static 1 (which broadcasts into any size, 0 included) or the same
    dimension as `x`'s (`same_dim`: equal ints or the same symbol). So a bias (D,) broadcasts
    into ("batch", "seq", D). A symbol against anything else, or an unknown dimension, may
    grow `x` at run time: False. A scalar (rank 0) broadcasts into every shape, also one
    whose rank is unknown.
    """
    zs, xs = z.type.shape, x.type.shape
    if zs == ():
        return True
    if zs is None or xs is None or len(zs) > len(xs):
        return False
    return all(_static_one(zd) or same_dim(zd, xd) for zd, xd in zip(zs, xs[len(xs) - len(zs) :]))


_LOSSLESS = {  # ONNX elem type -> types that hold every value of it exactly
    1: {1, 11},  # float -> float, double
    10: {10, 1, 11},  # float16 -> float16, float, double
    16: {16, 1, 11},  # bfloat16 -> bfloat16, float, double
    11: {11},
    9: {9, 2, 3, 4, 5, 6, 7, 12, 13, 1, 10, 11, 16},  # bool -> any numeric
    2: {2, 4, 6, 7, 12, 13, 5, 1, 11, 10, 16},  # uint8
    3: {3, 5, 6, 7, 1, 11, 10},  # int8
    4: {4, 6, 7, 12, 13, 1, 11},  # uint16
    5: {5, 6, 7, 1, 11},  # int16
    6: {6, 7, 11},  # int32
    12: {12, 7, 13, 11},  # uint32
    7: {7},  # int64
    13: {13},  # uint64
}


@guard("same-dtype", TERM, TERM)
def same_dtype(a: ClassInfo, b: ClassInfo) -> bool:
    """True if `a` and `b` have the same known element type (shapes may differ)."""
    return bool(a.type.dtype) and a.type.dtype == b.type.dtype


_FLOATS = {1, 10, 11, 16}  # float, float16, double, bfloat16


@guard("is-float", TERM, negatable=True)
def is_float(x: ClassInfo) -> bool | None:
    """True if `x`'s element type is a floating-point type; None (undecided) when it is
    unknown (an op outside the op table's output, whose dtype no rule infers)."""
    return x.type.dtype in _FLOATS if x.type.dtype else None


@builder("dtype-of", TERM)
def dtype_of(x: ClassInfo) -> int | None:
    """`x`'s ONNX element type, e.g. for `(Cast ... :to (dtype-of @v))`; None if unknown."""
    return x.type.dtype or None


@guard("cast-lossless", TERM, ATTR)
def cast_lossless(x: ClassInfo, to: int) -> bool:
    """True if casting `x`'s dtype to `to` keeps every value exactly (a widening cast), so a
    following cast sees the original values."""
    return x.type.dtype in _LOSSLESS and to in _LOSSLESS[x.type.dtype]


@builder("bn-shape", TERM)
def bn_shape(w: ClassInfo) -> tuple[int, ...] | None:
    """Shape (-1, 1, ..., 1) that lines a per-output-channel vector up with Conv weight `w`
    (rank r: r-1 ones), used to fold BatchNormalization's scale into the weight."""
    r = w.type.rank
    return None if r is None else (-1,) + (1,) * (r - 1)


@builder("zero-pads", TERM)
def zero_pads(w: ClassInfo) -> tuple[int, ...] | None:
    """Conv `pads` of zeros for weight `w` (rank r: 2 * (r - 2) zeros, a begin and an end per
    spatial axis): what `auto_pad` VALID means (ONNX operator spec, Conv: "VALID mean no
    padding")."""
    r = w.type.rank
    return None if r is None or r < 3 else (0,) * (2 * (r - 2))


@guard("channel-bias", TERM, TERM)
def channel_bias(b: ClassInfo, y: ClassInfo) -> bool:
    """True if constant `b` added to Conv output `y` (N, C, spatial...) is a per-channel
    bias: its shape, right-aligned against `y`, is (C, 1, ..., 1) possibly with leading 1s.
    Only `y`'s rank and its channel count C (a static int) are needed: batch and spatial
    dimensions may be symbolic (ONNX Conv: Y has shape (N, M, ...), M the output channels)."""
    ys = y.type.shape
    if b.value is None or ys is None or len(ys) < 3 or not isinstance(ys[1], int):
        return False
    shape, r = b.value.shape, len(ys)
    if len(shape) != r and len(shape) != r - 1:
        return False
    if len(shape) == r and shape[0] != 1:
        return False
    tail = shape[-(r - 1) :]
    return tail[0] == ys[1] and all(d == 1 for d in tail[1:])


# ---- constants with a known value --------------------------------------------------------------


@guard("all-equal-into", TERM, ATTR, TERM)
def all_equal_into(c: ClassInfo, v: Any, x: ClassInfo) -> bool:
    """True if `c` is a constant whose every element equals `v` (`all-equal`) and that
    broadcasts into `x` (`broadcasts-into`): an operand that a fused op leaves out without
    changing the output's shape, like GELU's 0.5 and 1.0.

    `v` is rounded to `c`'s dtype before comparing (numpy's NEP 50 rule for a Python scalar
    against an array), so `(all-equal-into @s 1.4142135623730951 @x)` accepts sqrt(2) as a
    float32, float16 or double constant, each rounded once from the exact value.
    """
    return bool(all_equal(c, v)) and broadcasts_into(c, x)


@builder("scalar-of", TERM)
def scalar_of(c: ClassInfo) -> float | None:
    """The value of a one-element floating-point constant `c` as a Python float, for a float
    attribute such as LayerNormalization's `epsilon`. ONNX float attributes are float32, so
    None when the value is not exactly a float32 (a double 1e-5 is not), and when `c` is not
    a one-element float constant."""
    if c.value is None or c.value.size != 1 or not np.issubdtype(c.value.dtype, np.floating):
        return None
    v = float(c.value.reshape(()))
    return v if float(np.float32(v)) == v or np.isnan(v) else None


# ---- normalizations ------------------------------------------------------------------------------


@guard("last-axis", TERM, TERM)
def last_axis(axes: ClassInfo, x: ClassInfo) -> bool:
    """True if `axes` is a constant naming exactly one axis, `x`'s last: -1, or rank - 1 (a
    reduction over the normalized axis of LayerNormalization/RMSNormalization with
    axis=-1, ONNX operator spec)."""
    r = x.type.rank
    if axes.value is None or axes.value.size != 1 or r is None or r == 0:
        return False
    a = int(axes.value.reshape(()))
    return a in (-1, r - 1)


@guard("last-dim-vector", TERM, TERM)
def last_dim_vector(w: ClassInfo, x: ClassInfo) -> bool:
    """True if `w` is 1-D with `x`'s last dimension as its length (the same int or symbol):
    the Scale and B inputs of LayerNormalization (and Scale of RMSNormalization) with
    axis=-1, which onnxruntime requires to have the normalized shape exactly."""
    ws, xs = w.type.shape, x.type.shape
    return (
        ws is not None
        and xs is not None
        and len(ws) == 1
        and len(xs) >= 1
        and (same_dim(ws[0], xs[-1]))
    )


# ---- padding -------------------------------------------------------------------------------------


def _pad_pairs(pads: ClassInfo, x: ClassInfo) -> list[tuple[int, int]] | None:
    """Pad's `pads` input (x1_begin, x2_begin, ..., x1_end, x2_end, ...) as (begin, end) per
    axis of `x`, or None when not a constant of length 2 * rank(x)."""
    r = x.type.rank
    if pads.value is None or r is None or pads.value.shape != (2 * r,):
        return None
    p = [int(v) for v in pads.value]
    return list(zip(p[:r], p[r:]))


@guard("spatial-pads", TERM, TERM)
def spatial_pads(pads: ClassInfo, x: ClassInfo) -> bool:
    """True if `pads`, the pads input of Pad over `x` (N, C, spatial...), is a constant that
    pads only the spatial axes, by non-negative amounts, and pads something: the padding a
    Conv adds itself (its `pads` attribute covers the spatial axes only, begins then ends,
    and must be non-negative; ONNX operator spec, Conv). All-zero pads are a no-op Pad,
    removed as such (cleanup/identity.rules)."""
    pairs = _pad_pairs(pads, x)
    return (
        pairs is not None
        and len(pairs) >= 3
        and pairs[0] == (0, 0)
        and pairs[1] == (0, 0)
        and all(b >= 0 and e >= 0 for b, e in pairs)
        and any(b or e for b, e in pairs)
    )


@builder("merge-pads", TERM, ATTR, TERM)
def merge_pads(pads: ClassInfo, p: tuple[int, ...] | None, x: ClassInfo) -> tuple[int, ...] | None:
    """The `pads` attribute of a Conv whose input `x` was first padded by Pad input
    `pads` (see `spatial-pads`): the existing attribute `p` (absent or () means zeros) plus
    the Pad's spatial pads, begins then ends. None if `spatial-pads` does not hold or `p`
    has another length."""
    if not spatial_pads(pads, x):
        return None
    spatial = _pad_pairs(pads, x)[2:]
    s = len(spatial)
    old = tuple(p) if p else (0,) * (2 * s)
    if len(old) != 2 * s:
        return None
    return tuple(old[i] + spatial[i][0] for i in range(s)) + tuple(
        old[s + i] + spatial[i][1] for i in range(s)
    )


@builder("conv2d-kernel-of-1d", ATTR, TERM)
def conv2d_kernel_of_1d(k: tuple[int, ...] | None, w: ClassInfo) -> tuple[int, ...] | None:
    """The kernel_shape of a 1-D Conv as the 2-D Conv over (1, L) it equals: (1, k), k the
    attribute's or, absent, the weight's last dimension (ONNX Conv infers it so). None when
    neither says a kernel of one axis."""
    if k:
        return (1, int(k[0])) if len(k) == 1 else None
    ws = w.type.shape
    if ws is None or len(ws) != 3 or not isinstance(ws[2], int):
        return None
    return (1, ws[2])


@builder("conv2d-ints-of-1d", ATTR)
def conv2d_ints_of_1d(v: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """A 1-D Conv's strides or dilations for the 2-D Conv over (1, L): (1, v), 1 for absent
    (ONNX Conv's default). None when `v` is not of one axis."""
    if not v:
        return (1, 1)
    return (1, int(v[0])) if len(v) == 1 else None


@builder("conv2d-pads-of-1d", ATTR)
def conv2d_pads_of_1d(p: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """A 1-D Conv's pads (begin, end) for the 2-D Conv over (1, L): (0, begin, 0, end), zeros
    for absent. None when `p` is not of one axis."""
    if not p:
        return (0, 0, 0, 0)
    return (0, int(p[0]), 0, int(p[1])) if len(p) == 2 else None


@guard("nonempty", TERM)
def nonempty(x: ClassInfo) -> bool:
    """True if `x` has a static shape with every dimension >= 1 (an op over it, a TopK along
    any axis say, has an element to take)."""
    xs = x.type.shape
    return xs is not None and all(isinstance(d, int) and d >= 1 for d in xs)


@guard("static-nonempty-features", TERM)
def static_nonempty_features(x: ClassInfo) -> bool:
    """True if `x` (N, C, spatial...) has a static size >= 1 on every axis but the batch
    axis: onnxruntime's pools refuse an input with an empty channel or spatial axis ("Only N
    can be zero", pool_attributes.h), which a Pad in front of the pool would have made
    non-empty."""
    xs = x.type.shape
    return xs is not None and len(xs) >= 3 and all(isinstance(d, int) and d >= 1 for d in xs[1:])


@builder("merge-pool-pads", TERM, ATTR, TERM, ATTR)
def merge_pool_pads(
    pads: ClassInfo, p: tuple[int, ...] | None, x: ClassInfo, kernel: tuple[int, ...] | None
) -> tuple[int, ...] | None:
    """`merge-pads` for a pool with kernel shape `kernel`, or None when a merged pad is not
    smaller than the kernel along its axis: onnxruntime rejects such a pool ("Pad should be
    smaller than kernel", pool_attributes.h), although the ONNX spec allows it."""
    merged = merge_pads(pads, p, x)
    if merged is None or not kernel or 2 * len(kernel) != len(merged):
        return None
    s = len(kernel)
    if any(merged[i] >= kernel[i % s] for i in range(2 * s)):
        return None
    return merged


# ---- view ops: axes and shapes -------------------------------------------------------------------


def _axes(a: ClassInfo, rank: int) -> list[int] | None:
    """Constant axes `a` normalized into [0, rank), or None (not a constant 1-D tensor, out
    of range, or repeated)."""
    if a.value is None or a.value.ndim != 1:
        return None
    out = [int(v) + rank if int(v) < 0 else int(v) for v in a.value]
    if any(not 0 <= v < rank for v in out) or len(set(out)) != len(out):
        return None
    return out


@builder("merge-unsqueeze-axes", TERM, TERM, TERM)
def merge_unsqueeze_axes(a: ClassInfo, b: ClassInfo, x: ClassInfo) -> tuple[int, ...] | None:
    """Axes of one Unsqueeze equal to Unsqueeze(Unsqueeze(x, a), b), sorted, non-negative.

    ONNX Unsqueeze: `axes` are positions in the output (negative ones count from the end of
    the output's rank). The outer Unsqueeze puts b at their final positions; every other
    final position holds, in order, an axis of the inner output, where a is. None unless
    `x`'s rank is known and both axes are valid constants.
    """
    r = x.type.rank
    if r is None or a.value is None or b.value is None:
        return None
    inner = _axes(a, r + a.value.size)
    total = r + a.value.size + b.value.size
    outer = _axes(b, total)
    if inner is None or outer is None:
        return None
    rest = [i for i in range(total) if i not in outer]
    return tuple(sorted(outer + [rest[i] for i in inner]))


@builder("merge-squeeze-axes", TERM, TERM, TERM)
def merge_squeeze_axes(a: ClassInfo, b: ClassInfo, x: ClassInfo) -> tuple[int, ...] | None:
    """Axes of one Squeeze equal to Squeeze(Squeeze(x, a), b), sorted, non-negative.

    ONNX Squeeze: `axes` are positions in the input (negative ones count from the end of the
    input's rank). The outer axes b index the inner output, whose axes are x's axes without
    a, in order. None unless `x`'s rank is known and both axes are valid constants.
    """
    r = x.type.rank
    if r is None or a.value is None or b.value is None:
        return None
    inner = _axes(a, r)
    outer = _axes(b, r - a.value.size)
    if inner is None or outer is None:
        return None
    rest = [i for i in range(r) if i not in inner]
    return tuple(sorted(inner + [rest[i] for i in outer]))


@builder("unsqueeze-shape", TERM, TERM)
def unsqueeze_shape(s: ClassInfo, a: ClassInfo) -> tuple[int, ...] | None:
    """Reshape target equal to Unsqueeze(Reshape(_, s), a): `s` with a 1 inserted at each
    output position in `a` (ONNX Unsqueeze). None unless both are constants and `s` has no
    0 (which would copy the input dimension at its index, and the indices move)."""
    if s.value is None or a.value is None or s.value.ndim != 1 or np.any(s.value == 0):
        return None
    rank = s.value.size + a.value.size
    axes = _axes(a, rank)
    if axes is None:
        return None
    rest = iter(int(v) for v in s.value)
    return tuple(1 if i in axes else next(rest) for i in range(rank))


@builder("squeeze-shape", TERM, TERM)
def squeeze_shape(s: ClassInfo, a: ClassInfo) -> tuple[int, ...] | None:
    """Reshape target equal to Squeeze(Reshape(_, s), a): `s` without the entries at `a`,
    each of which must be a literal 1 (a -1 or 0 entry says nothing about its size). None
    unless both are constants and `s` has no 0 (see `unsqueeze-shape`)."""
    if s.value is None or a.value is None or s.value.ndim != 1 or np.any(s.value == 0):
        return None
    axes = _axes(a, s.value.size)
    if axes is None or any(int(s.value[i]) != 1 for i in axes):
        return None
    return tuple(int(v) for i, v in enumerate(s.value) if i not in axes)


# ---- Slice of Slice ------------------------------------------------------------------------------

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _slice_spec(x_rank: int, starts, ends, axes, steps) -> dict[int, tuple[int, int, int]] | None:
    """One Slice's constant inputs as {axis: (start, end, step)}, axes normalized; None if
    an input is not a constant, or the axes are invalid, or a step is 0."""
    if starts.value is None or ends.value is None or axes.value is None or steps.value is None:
        return None
    k = starts.value.size
    if not (ends.value.size == axes.value.size == steps.value.size == k) or starts.value.ndim != 1:
        return None
    ax = _axes(axes, x_rank)
    if ax is None or any(int(v) == 0 for v in steps.value):
        return None
    return {
        a: (int(s), int(e), int(t)) for a, s, e, t in zip(ax, starts.value, ends.value, steps.value)
    }


def _compose_axis(d, first, second) -> tuple[int, int, int] | None:
    """One Slice (start, end, step) on an axis of length `d` (an int, or None/str when not
    static) equal to slicing with `first` and then with `second` (ONNX Slice: a negative
    start or end counts from the end, then both are clamped; numpy's rule)."""
    if isinstance(d, int) and not isinstance(d, bool):
        r = range(d)[slice(*first)][slice(*second)]
        if len(r) == 0:
            return (0, 0, 1)
        end = r.stop if r.stop >= 0 else _INT64_MIN  # a negative end counts from the end
        return (r.start, end, r.step)
    (s1, e1, t1), (s2, e2, t2) = first, second
    if t1 != 1 or t2 != 1 or min(s1, e1, s2, e2) < 0:
        return None  # without the axis length, only non-negative unit-step slices compose
    return (min(s1 + s2, _INT64_MAX), min(e1, s1 + e2, _INT64_MAX), 1)


@builder("slice-merge", ATTR, TERM, TERM, TERM, TERM, TERM, TERM, TERM, TERM, TERM)
def slice_merge(part: str, x, s1, e1, a1, t1, s2, e2, a2, t2) -> tuple[int, ...] | None:
    """Input `part` ("starts", "ends", "axes" or "steps") of one Slice equal to
    Slice(Slice(x, s1, e1, a1, t1), s2, e2, a2, t2), every input a constant.

    Axes sliced by one of the two keep their (start, end, step); an axis sliced by both is
    composed (`_compose_axis`): exactly, through the index range, when its length in `x` is
    a static int, else only for non-negative starts and ends with step 1, where
    x[s1:e1][s2:e2] is x[s1 + s2 : min(e1, s1 + e2)] whatever the length (both sides clamp
    to it the same way). None when a slice cannot be composed.
    """
    shape = x.type.shape
    if shape is None:
        return None
    first = _slice_spec(len(shape), s1, e1, a1, t1)
    second = _slice_spec(len(shape), s2, e2, a2, t2)
    if first is None or second is None:
        return None
    merged = dict(first)
    for axis, spec in second.items():
        if axis in first:
            spec = _compose_axis(shape[axis], first[axis], spec)
            if spec is None:
                return None
        merged[axis] = spec
    axes = sorted(merged)
    i = ("starts", "ends", "axes", "steps").index(part)
    return tuple(axis if i == 2 else merged[axis][min(i, 2)] for axis in axes)


# ---- lists (`@xs...`) --------------------------------------------------------------------------


@guard("length", LIST, ATTR)
def length(xs: list[ClassInfo], n: int) -> bool:
    """True if list `xs` has exactly `n` items."""
    return len(xs) == n


@guard("all-constant", LIST)
def all_constant(xs: list[ClassInfo]) -> bool:
    """True if every item of `xs` is an imported constant (true of an empty list)."""
    return all(x.is_constant for x in xs)


@guard("all-same-type", LIST)
def all_same_type(xs: list[ClassInfo]) -> bool:
    """True if the items of `xs` have one dtype and one shape (`same-type` of each with the
    first; true of a list of zero or one item whose type is known)."""
    return all(same_type(xs[0], x) for x in xs) if xs else True


def _axis_length(x: ClassInfo, axis: int) -> int | None:
    """The static length of `x` along `axis` (negative counts from the end), or None."""
    shape = x.type.shape
    if shape is None or not -len(shape) <= axis < len(shape):
        return None
    d = shape[axis]
    return d if isinstance(d, int) and not isinstance(d, bool) else None


def _unit_slice(x: ClassInfo, starts, ends, axes, steps, axis: int) -> range | None:
    """The indices that Slice(x, starts, ends, axes, steps) takes along `axis` when it slices
    that one axis with step 1 (ONNX Slice: negative starts and ends count from the end, then
    both are clamped, numpy's rule) and x's length there is static; else None."""
    shape = x.type.shape
    d = _axis_length(x, axis)
    if shape is None or d is None:
        return None
    spec = _slice_spec(len(shape), starts, ends, axes, steps)
    if spec is None or list(spec) != [axis % len(shape)] or spec[axis % len(shape)][2] != 1:
        return None
    s, e, _ = spec[axis % len(shape)]
    return range(d)[slice(s, e)]


@guard("slices-meet", TERM, TERM, TERM, TERM, TERM, TERM, ATTR)
def slices_meet(x, s, m, e, axes, steps, axis: int) -> bool:
    """True if Slice(x, s, m, axes, steps) and Slice(x, m, e, axes, steps), concatenated along
    `axis`, are Slice(x, s, e, axes, steps): both slice only `axis`, with step 1, and the
    second starts where the first ends (x's length along `axis` is static, so the clamping
    of ONNX Slice is computed exactly)."""
    first = _unit_slice(x, s, m, axes, steps, axis)
    second = _unit_slice(x, m, e, axes, steps, axis)
    whole = _unit_slice(x, s, e, axes, steps, axis)
    if first is None or second is None or whole is None:
        return False
    return list(first) + list(second) == list(whole)


@guard("slice-takes-part", TERM, TERM, TERM, TERM, LIST, TERM, LIST, ATTR)
def slice_takes_part(s, e, axes, steps, before: list, y: ClassInfo, after: list, axis: int):
    """True if Slice(Concat(before..., y, after..., axis), s, e, axes, steps) is exactly y:
    the slice is along `axis` only, with step 1, and takes the indices of y's part (every
    part's length along `axis` is static)."""
    lengths = [_axis_length(p, axis) for p in [*before, y, *after]]
    if y.type.shape is None or any(n is None for n in lengths):
        return False
    whole = ClassInfo(TensorType(y.type.dtype, _with_dim(y.type.shape, axis, sum(lengths))))
    taken = _unit_slice(whole, s, e, axes, steps, axis)
    start = sum(lengths[: len(before)])
    return taken is not None and taken == range(start, start + lengths[len(before)])


def _with_dim(shape: tuple, axis: int, d: int) -> tuple:
    out = list(shape)
    out[axis] = d
    return tuple(out)


# ---- affine quantization ---------------------------------------------------------------------
# ONNX operator spec: QuantizeLinear y = saturate(round(x / s) + zp), rounding half to even;
# DynamicQuantizeLinear (uint8) s = (max(x, 0) - min(x, 0)) / 255, zp = saturate(round(-min / s)).
# A weight quantized symmetrically by round-to-nearest to 2L + 1 levels has s_w = max|w| / L and
# |w - s_w * q(w)| <= s_w / 2; a dynamically quantized activation is within one step s_x of x
# (half a step of rounding, and half a step where the rounded zero point saturates at 255).
# onnxruntime's uint8-by-int8 kernels on x86 CPUs without VNNI add each pair of neighbouring
# products along K in int16, which saturates at 2 * 255 * 127 > 32767 (its quantizer's remedy is
# `reduce_range`, 7-bit weights); `verify` caught full-range int8 weights off by 22.2 there. The
# quantization rules use the full int8 range with a step for pairs, s_w = max_k (|w_k|,
# |w_k + w_k+1|) / 127 (`pair_steps`), so every |q_k| <= 127 and |q_k + q_k+1| <= 128: only
# neighbours of one sign can add up (opposite signs partly cancel). For QLinearConv, K runs
# over kernel positions and, fastest, input channels (onnxruntime's NHWC im2col;
# `conv_pair_steps`).

INT32_MAX = 2**31 - 1
U8_TIMES_S8 = 255 * 127  # the largest |(x_q - zp_x) * w_q| of a uint8 by int8 product term


@guard("accumulates-in-int32", TERM)
def accumulates_in_int32(w: ClassInfo) -> bool:
    """True if a MatMulInteger of uint8 activations by this int8 weight (rank 2, [K, N]) sums
    its K products in int32 without overflow: 1 <= K and K * 255 * 127 <= 2^31 - 1
    (K <= 66,311; a weight of no rows has no product to quantize, nor a scale)."""
    shape = w.type.shape
    if shape is None or len(shape) != 2 or not isinstance(shape[0], int):
        return False
    return 1 <= shape[0] and shape[0] * U8_TIMES_S8 <= INT32_MAX


@guard("accumulates-in-int32-transposed", TERM)
def accumulates_in_int32_transposed(w: ClassInfo) -> bool:
    """`accumulates-in-int32` for a weight stored transposed, [N, K] (Gemm's transB = 1): K is
    its second dimension."""
    shape = w.type.shape
    if shape is None or len(shape) != 2 or not isinstance(shape[1], int):
        return False
    return 1 <= shape[1] and shape[1] * U8_TIMES_S8 <= INT32_MAX


def _matmul_int8_bound(
    x: np.ndarray,
    w: np.ndarray,
    w_step: np.ndarray,
    bias: np.ndarray | None = None,
    orig: np.ndarray | None = None,
) -> np.ndarray:
    """|x @ w - dq(x) @ dq(w)| per output element, for weight steps `w_step` (a scalar, or one
    per output column): sum_k |x_k| s_w / 2 (the weight's rounding) + s_x sum_k |w_k| + s_w / 2
    (the activation's step times the dequantized weight) + the float32 rounding of both sides,
    (K + 8) 2^-23 (|x| + s_x) @ (|w| + s_w / 2). Shapes: x [..., K], w [K, N].

    bias: Gemm's c ([N] or broadcasting to the output): the float32 rounding of adding it on
    each side, 2^-22 (|c| + (|x| + 1) @ (|w| + s_w)), is added. orig: the weight `w` stands in
    for (a calibrated rounding of it, patterns/quant/dynamic.rules' `rewrite.Rounded`): the
    bound is then on |x @ orig - dq(x) @ dq(w)|, with the weight's move sum_k |x_k| |w_k -
    orig_k| and the float32 rounding of x @ orig, (K + 8) 2^-23 |x| @ |orig|, added.

    Every term that sums over K is one product |x| @ M (the terms' [K, N] matrices added
    first, `_weight_terms`; equal in real arithmetic to a product per term): the budget search
    evaluates this per site and calibration input, and three float64 products were most of
    its estimates' time (DistilBERT, `--rounding gptq`)."""
    w_step = np.asarray(w_step, np.float64)
    m, aw_sums, w_sums = _weight_terms(w, w_step, bias is not None, orig)
    x = x.astype(np.float64)
    x_step = (max(float(x.max(initial=0.0)), 0.0) - min(float(x.min(initial=0.0)), 0.0)) / 255
    ax = np.abs(x)
    f32 = (w.shape[0] + 8) * 2.0**-23
    x_sums = ax.sum(axis=-1, keepdims=True)
    rounding = x_sums * (w_step / 2)
    # the activation's step, and the float32 rounding's s_x part: s_x sum_k (|w_k| + s_w / 2)
    bound = (1 + f32) * x_step * aw_sums + rounding
    if bias is not None:
        # (|x| + 1) @ (|w| + s_w)
        #   = |x| @ (|w| + s_w / 2) + sum_k |x_k| s_w / 2 + sum_k (|w_k| + s_w)
        big = x_sums * (w_step / 2) + w_sums
        bound = bound + 2.0**-22 * (np.abs(np.asarray(bias, np.float64)) + big)
    k = w.shape[0]
    return bound + ax @ m + _underflow(k, np.float64(255 * PAIR_LEVELS * k))


# the last weight's terms (`_weight_terms`): key -> (weakref to w, to orig or None, terms)
_WEIGHT_TERMS: dict[tuple, tuple] = {}


def _weight_terms(
    w: np.ndarray, w_step: np.ndarray, with_bias: bool, orig: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The weight's side of `_matmul_int8_bound`, in float64: M [K, N] (the float32
    rounding's (K + 8) 2^-23 (|w| + s_w / 2), with a bias 2^-22 (|w| + s_w / 2) more, with
    `orig` |w - orig| + (K + 8) 2^-23 |orig| more), sum_k (|w_k| + s_w / 2) [N], and with a bias
    sum_k (|w_k| + s_w) [N] (else None). Remembered for the last weight asked, while it lives
    (by identity, as `_weight_steps`): the budget search's estimates ask once per calibration
    input for the same site, and converting and combining the weight was half of each call
    (BERT-size products)."""
    key = (id(w), None if orig is None else id(orig), with_bias, w_step.tobytes())
    hit = _WEIGHT_TERMS.get(key)
    if hit is not None and hit[0]() is w and (orig is None or hit[1]() is orig):
        return hit[2]
    w64 = w.astype(np.float64)
    f32 = (w.shape[0] + 8) * 2.0**-23
    aw = np.abs(w64) + w_step / 2
    m = f32 * aw
    w_sums = None
    if with_bias:
        m = m + 2.0**-22 * aw
        w_sums = (np.abs(w64) + w_step).sum(axis=0)
    if orig is not None:
        orig64 = orig.astype(np.float64)
        m = m + np.abs(w64 - orig64) + f32 * np.abs(orig64)
    terms = (m, aw.sum(axis=0), w_sums)
    _WEIGHT_TERMS.clear()
    _WEIGHT_TERMS[key] = (weakref.ref(w), None if orig is None else weakref.ref(orig), terms)
    return terms


PAIR_LEVELS = 127  # the pair-stepped rules' bound on |q_k| and |q_k + q_k+1| before rounding

# x86 CPU flags with which onnxruntime's uint8-by-int8 kernels (MLAS) sum products in int32
# (vpdpbusd); without them (AVX2, AVX512BW) they add neighbouring pairs in int16 first
# (vpmaddubsw), which saturates beyond 32767 (tests/test_quantize.py shows both)
VNNI_FLAGS = ("avx512_vnni", "avx_vnni")


@functools.cache
def int8_sums_in_int32(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether onnxruntime's uint8-by-int8 kernels on this CPU sum products in int32: an x86
    CPU whose `cpuinfo` flags list AVX512-VNNI or AVX-VNNI. False where they add neighbouring
    pairs in int16 first (older x86), and where it cannot be told (no such file): full-range
    int8 weights are then not known to be exact (patterns/quant/dynamic.rules, `:sums int32`)."""
    try:
        with open(cpuinfo) as f:
            flags = {w for line in f if line.startswith("flags") for w in line.split()}
    except OSError:
        return False
    return any(v in flags for v in VNNI_FLAGS)


def pair_steps(w: np.ndarray, per_column: bool = False) -> np.ndarray:
    """The weight step of the dynamic rules and the static MatMul/Gemm rules for a [K, N]
    weight: the largest of |w_k| and |w_k + w_k+1| over k (neighbours along K, the pairs an
    int16 kernel adds), / 127, over the whole weight (a scalar) or per output column ([N]; a
    column of zeros gets the step 1, as the rule's scale). In float32, as the rule computes it.
    Shapes: w [K, N], K >= 1.

    After rounding, |q_k| <= 127 and |q_k + q_k+1| <= 128. The kernel adds x_k q_k + x_k+1
    q_k+1 with uint8 x in int16: for neighbours of one sign that is at most 255 * 128 = 32640
    in magnitude; for neighbours of opposite signs the two products have opposite signs and
    the sum is at most 255 * 127 whatever their sizes, so only same-sign neighbours constrain
    the step (|w_k + w_k+1| is |w_k| + |w_k+1| for them and smaller otherwise)."""
    w32 = w.astype(np.float32)
    a, sums = np.abs(w32), np.abs(w32[:-1] + w32[1:])
    pairs = np.maximum(a, np.concatenate([sums, np.zeros_like(a[:1])], axis=0))
    if not per_column:
        return np.float32(pairs.max(initial=0.0)) / np.float32(PAIR_LEVELS)
    return _column_steps(pairs.max(axis=0, initial=0.0))


def _column_steps(m: np.ndarray) -> np.ndarray:
    """Steps m / 127 of column maxima `m` (float32 [N]), 1 for a column of zeros (any step
    quantizes zeros exactly, and no scale may be 0)."""
    return np.where(m == 0, np.float32(1.0), m / np.float32(PAIR_LEVELS)).astype(np.float32)


def full_range_steps(w: np.ndarray) -> np.ndarray:
    """The weight steps of the `:sums int32` dynamic rules for a [K, N] weight: max_k |w_k| /
    127 per output column ([N]; a column of zeros gets the step 1), in float32 as the rule
    computes it: every weight rounds into [-127, 127], its full range. Exact only where the
    runtime sums the uint8-by-int8 products in int32 (`pair_steps` is for runtimes that add
    neighbouring pairs in int16 first). Shapes: w [K, N], K >= 1."""
    return _column_steps(np.abs(w.astype(np.float32)).max(axis=0, initial=0.0))


def _finite_positive(steps: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(steps)) and np.all(steps > 0))


def conv_pair_steps(w: np.ndarray) -> np.ndarray:
    """The static Conv rule's weight steps, one per output channel, for a weight [C_out,
    C_in / group, k...]: `pair_steps` per column of its products in QLinearConv's K order,
    kernel positions and, fastest, input channels (onnxruntime's NHWC im2col: with C_in = 3
    and a 3x3 kernel it adds channel 2 of one position to channel 0 of the next in int16;
    `tests/test_quantize.py` pins this down). Neighbours across kernel positions are
    included, so either alignment of the pairs is covered. Shape [C_out], float32."""
    rows = np.moveaxis(w, 1, -1).reshape(w.shape[0], -1)
    return pair_steps(rows.T, per_column=True)


def conv_full_range_steps(w: np.ndarray) -> np.ndarray:
    """The `:sums int32` static Conv rule's weight steps, one per output channel, for a weight
    [C_out, C_in / group, k...]: max |w_c| / 127 over the channel's weights (`full_range_steps`
    of its rows; 1 for a channel of zeros), so that each channel spans [-127, 127]. Exact only
    where the runtime sums uint8-by-int8 products in int32 (`conv_pair_steps` is for int16
    pairs). Shape [C_out], float32."""
    return full_range_steps(w.reshape(w.shape[0], -1).T)


BIAS_UNITS = 2**24  # the largest |bias| in units of s_x * s_w (exact in float32 before the cast)
BIAS_FLOOR_UNITS = 2**23  # a raised channel's |bias| in units of s_x * s_w (half of 2^24)


def bias_floored_steps(steps: np.ndarray, b: np.ndarray, sx: float) -> np.ndarray:
    """Per-channel weight `steps` ([C_out], float32) raised where the bias `b` ([C_out]) would
    count more than 2^24 (`BIAS_UNITS`) units of s_x * s_w[c]: to |b[c]| / (s_x 2^23), rounded
    up to float32, so that it counts 2^23, with room for the float32 rounding of s_x * s_w
    and of the division. A channel whose weights are tiny beside its bias (a dead
    BatchNormalization channel, gamma near 0, folded into the Conv) then has a coarser step,
    and its weights round to few levels or to 0; onnxruntime's quantizer raises such a
    channel's weight scale too (its bias is otherwise out of int32). Channels whose bias fits
    keep their steps, so a Conv whose every bias fits keeps `steps` exactly. Shape [C_out],
    float32."""
    b64 = np.abs(b.astype(np.float64))
    units = _bias_units(sx, steps)
    with np.errstate(divide="ignore", invalid="ignore"):
        over = ~(b64 / units <= BIAS_UNITS)  # as `bias-fits-int24` counts (NaN counts over)
    # (and at least a normal float32 unit: a subnormal s_x * s_w, which the rule's float32
    # Mul makes of weights of 1e-38, rounds the bias's units, or makes them 0)
    over |= ~(units >= FLOAT32_TINY)
    floor = np.maximum(b64 / (np.float64(sx) * BIAS_FLOOR_UNITS), 2 * FLOAT32_TINY / sx)
    up = floor.astype(np.float32)
    up = np.where(up.astype(np.float64) < floor, np.nextafter(up, np.float32(np.inf)), up)
    return np.where(over, np.maximum(steps, up), steps).astype(np.float32)


FLOAT32_TINY = float(np.finfo(np.float32).tiny)  # the smallest normal float32, 2^-126


def _bias_units(sx: float, steps: np.ndarray) -> np.ndarray:
    """s_x * s_w[c] as the static Conv rules compute it, a float32 Mul (`Mul @sx @sw`), in
    float64 ([C_out]): a product under 2^-126 is subnormal there, or 0."""
    return (np.float32(sx) * steps.astype(np.float32)).astype(np.float64)


_STEPS: dict[tuple, tuple] = {}  # (id(weight), how) -> (weakref to it, steps)


def _weight_steps(v: np.ndarray, how: tuple) -> np.ndarray:
    """The steps of the constant `v` (`how`: ("conv",) for `conv_pair_steps`, ("conv-full",)
    for `conv_full_range_steps`, ("full", axis) for `full_range_steps`, or (axis, per_column)
    for `pair_steps`, with K on `axis`; ("list", *how): those steps as a builder's float list,
    None when one is not finite and positive), remembered while `v` lives: the engine
    asks a rule's builders again on every match of every saturation iteration (a BERT-base
    run asked 798 times for its 72 weights)."""
    key = (id(v), how)
    hit = _STEPS.get(key)
    if hit is not None and hit[0]() is v:
        return hit[1]
    if how[0] == "list":
        steps = _weight_steps(v, how[1:])
        steps = tuple(steps.astype(float).tolist()) if _finite_positive(steps) else None
    elif how == ("conv",):
        steps = conv_pair_steps(v)
    elif how == ("conv-full",):
        steps = conv_full_range_steps(v)
    elif how[0] == "full":
        steps = full_range_steps(v if how[1] == 0 else v.T)
    else:
        axis, per_column = how
        steps = pair_steps(v if axis == 0 else v.T, per_column=per_column)
    _STEPS[key] = (weakref.ref(v, lambda _, k=key: _STEPS.pop(k, None)), steps)
    return steps


@builder("pair-step", TERM, ATTR)
def pair_step(w: ClassInfo, axis: int) -> float | None:
    """The weight step of the pair-stepped rules, one for the whole tensor (`pair_steps`), of a
    constant rank-2 float weight whose K (the pairs' axis) is `axis`: 0 for [K, N], 1 for
    [N, K] (Gemm's transB = 1). A float32 attribute value; None when `w` is not such a
    constant, is all zeros, or is not finite."""
    v = w.value
    if v is None or v.ndim != 2 or axis not in (0, 1) or v.size == 0:
        return None
    step = _weight_steps(v, (axis, False))
    return float(step) if _finite_positive(step) else None


@builder("pair-steps", TERM, ATTR)
def pair_steps_per_column(w: ClassInfo, axis: int) -> tuple[float, ...] | None:
    """One step per output column (`pair_steps(..., per_column=True)`) of a constant rank-2
    float weight whose K (the pairs' axis) is `axis`: 0 for [K, N], 1 for [N, K] (Gemm's
    transB = 1). A float32 list of N, for QuantizeLinear's per-axis scale; None when `w` is
    not such a constant, or a step is not finite."""
    return _column_steps_value(w, axis, (axis, True))


def _column_steps_value(w: ClassInfo, axis: int, how: tuple) -> tuple[float, ...] | None:
    """The per-column steps `how` (`_weight_steps`) of a constant rank-2 weight with K on
    `axis` (0 or 1), as a builder's float list; None when `w` is not such a constant (or has
    no products) or a step is not finite."""
    v = w.value
    if v is None or v.ndim != 2 or axis not in (0, 1) or v.shape[axis] == 0 or v.size == 0:
        return None
    return _weight_steps(v, ("list", *how))


@builder("full-range-steps", TERM, ATTR)
def full_range_steps_builder(w: ClassInfo, axis: int) -> tuple[float, ...] | None:
    """One step per output column (`full_range_steps`) of a constant rank-2 float weight whose
    K is `axis`: 0 for [K, N], 1 for [N, K] (Gemm's transB = 1). A float32 list of N, for
    QuantizeLinear's per-axis scale; None when `w` is not such a constant, or a step is not
    finite."""
    return _column_steps_value(w, axis, ("full", axis))


@builder("conv-pair-steps", TERM)
def conv_pair_steps_builder(w: ClassInfo) -> tuple[float, ...] | None:
    """One step per output channel (`conv_pair_steps`) of a constant float Conv weight
    [C_out, C_in / group, k...] (rank >= 3): a float32 list of C_out, for QuantizeLinear's
    per-axis scale; None when `w` is not such a constant, or a step is not finite."""
    return _conv_steps_value(w, ("conv",))


@builder("conv-full-range-steps", TERM)
def conv_full_range_steps_builder(w: ClassInfo) -> tuple[float, ...] | None:
    """One step per output channel (`conv_full_range_steps`) of a constant float Conv weight
    [C_out, C_in / group, k...] (rank >= 3), as `conv-pair-steps`."""
    return _conv_steps_value(w, ("conv-full",))


@builder("conv-bias-floored-steps", TERM, TERM, TERM)
def conv_bias_floored_steps_builder(
    w: ClassInfo, b: ClassInfo, sx: ClassInfo
) -> tuple[float, ...] | None:
    """`conv-pair-steps` of a constant Conv weight, each raised to fit the constant bias `b`
    ([C_out]) in units of s_x * s_w (`bias_floored_steps`; `sx` the one-element input
    scale): a float32 list of C_out; None when the weight, bias or scale is not such a
    constant or a step is not finite and positive."""
    return _floored_steps_value(w, b, sx, ("conv",))


@builder("conv-full-range-bias-floored-steps", TERM, TERM, TERM)
def conv_full_range_bias_floored_steps_builder(
    w: ClassInfo, b: ClassInfo, sx: ClassInfo
) -> tuple[float, ...] | None:
    """`conv-full-range-steps`, each raised to fit the bias, as `conv-bias-floored-steps`."""
    return _floored_steps_value(w, b, sx, ("conv-full",))


def _floored_steps(w, b, sx, how: tuple) -> np.ndarray | None:
    """`bias_floored_steps` of the steps `how` (`_weight_steps`) of the Conv weight `w` for the
    bias `b` and input scale `sx` (numpy arrays, or None): None unless w has rank >= 3 and
    channels, b is one value per channel and sx one positive finite value."""
    if w is None or b is None or sx is None or w.ndim < 3 or w.size == 0 or sx.size != 1:
        return None
    if b.ndim != 1 or b.shape[0] != w.shape[0]:
        return None
    scale = float(sx.reshape(()))
    if not (np.isfinite(scale) and scale > 0) or not np.all(np.isfinite(b)):
        return None
    return bias_floored_steps(_weight_steps(w, how), b, scale)


def _floored_steps_value(w: ClassInfo, b: ClassInfo, sx: ClassInfo, how: tuple):
    steps = _floored_steps(w.value, b.value, sx.value, how)
    if steps is None or not _finite_positive(steps):
        return None
    return tuple(steps.astype(float).tolist())


def _conv_steps_value(w: ClassInfo, how: tuple) -> tuple[float, ...] | None:
    """The per-channel steps `how` (`_weight_steps`) of a constant Conv weight (rank >= 3) as
    a builder's float list; None when `w` is not such a constant or a step is not finite."""
    v = w.value
    if v is None or v.ndim < 3 or v.size == 0:
        return None
    return _weight_steps(v, ("list", *how))


@bound("matmul-dynamic-8bit", TERM, TERM)
def matmul_dynamic_8bit(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The error of MatMul(x, w) computed as dynamically quantized uint8 x by int8 w in
    [-127, 127] with one step for pairs, `pair_steps(w)` (see `_matmul_int8_bound`)."""
    return _matmul_int8_bound(x, w, _weight_steps(w, (0, False)).astype(np.float64))


@bound("gemm-dynamic-8bit", TERM, TERM, TERM)
def gemm_dynamic_8bit(x: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The error of Gemm(x, w, c) = x @ w + c with x @ w quantized as in `matmul-dynamic-8bit`
    (see `_matmul_int8_bound`'s `bias`)."""
    return _matmul_int8_bound(x, w, _weight_steps(w, (0, False)).astype(np.float64), bias=c)


@bound("gemm-dynamic-8bit-transposed", TERM, TERM, TERM)
def gemm_dynamic_8bit_transposed(x: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """`gemm-dynamic-8bit` for Gemm(x, w, c) with transB = 1: x @ w^T + c, w stored [N, K]."""
    return gemm_dynamic_8bit(x, np.swapaxes(w, 0, 1), c)


@bound("gemm-dynamic-8bit-per-column", TERM, TERM, TERM)
def gemm_dynamic_8bit_per_column(x: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The same with one weight step per output column, `pair_steps(w, per_column=True)`."""
    return _matmul_int8_bound(x, w, _weight_steps(w, (0, True)).astype(np.float64), bias=c)


@bound("gemm-dynamic-8bit-transposed-per-column", TERM, TERM, TERM)
def gemm_dynamic_8bit_transposed_per_column(
    x: np.ndarray, w: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """`gemm-dynamic-8bit-per-column` for Gemm with transB = 1 (w stored [N, K])."""
    return gemm_dynamic_8bit_per_column(x, np.swapaxes(w, 0, 1), c)


@bound("matmul-dynamic-8bit-per-column", TERM, TERM)
def matmul_dynamic_8bit_per_column(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The same with one weight step per output column, `pair_steps(w, per_column=True)`."""
    return _matmul_int8_bound(x, w, _weight_steps(w, (0, True)).astype(np.float64))


@bound("matmul-dynamic-8bit-full-range", TERM, TERM)
def matmul_dynamic_8bit_full_range(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """`matmul-dynamic-8bit-per-column` with full-range steps, `full_range_steps(w)` (the
    int32 sums exact: `:sums int32`)."""
    return _matmul_int8_bound(x, w, _weight_steps(w, ("full", 0)).astype(np.float64))


@bound("gemm-dynamic-8bit-full-range", TERM, TERM, TERM)
def gemm_dynamic_8bit_full_range(x: np.ndarray, w: np.ndarray, c: np.ndarray) -> np.ndarray:
    """`gemm-dynamic-8bit-per-column` with full-range steps, `full_range_steps(w)`."""
    return _matmul_int8_bound(x, w, _weight_steps(w, ("full", 0)).astype(np.float64), bias=c)


@bound("gemm-dynamic-8bit-transposed-full-range", TERM, TERM, TERM)
def gemm_dynamic_8bit_transposed_full_range(
    x: np.ndarray, w: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """`gemm-dynamic-8bit-full-range` for Gemm with transB = 1 (w stored [N, K])."""
    return gemm_dynamic_8bit_full_range(x, np.swapaxes(w, 0, 1), c)


@bound("matmul-dynamic-8bit-per-column-rounded", TERM, TERM, TERM)
def matmul_dynamic_8bit_per_column_rounded(x, w, orig) -> np.ndarray:
    """The error of MatMul(x, orig) computed as `matmul-dynamic-8bit-per-column` of x by w, a
    rounding of orig: that bound plus the weight's move (`_matmul_int8_bound`'s `orig`)."""
    return _matmul_int8_bound(x, w, _weight_steps(w, (0, True)).astype(np.float64), orig=orig)


@bound("gemm-dynamic-8bit-per-column-rounded", TERM, TERM, TERM, TERM)
def gemm_dynamic_8bit_per_column_rounded(x, w, c, orig) -> np.ndarray:
    """`gemm-dynamic-8bit-per-column` of Gemm(x, w, c) standing in for Gemm(x, orig, c), plus
    the weight's move (`_matmul_int8_bound`'s `orig`)."""
    steps = _weight_steps(w, (0, True)).astype(np.float64)
    return _matmul_int8_bound(x, w, steps, bias=c, orig=orig)


@bound("gemm-dynamic-8bit-transposed-per-column-rounded", TERM, TERM, TERM, TERM)
def gemm_dynamic_8bit_transposed_per_column_rounded(x, w, c, orig) -> np.ndarray:
    """The same for Gemm with transB = 1 (w and orig stored [N, K])."""
    return gemm_dynamic_8bit_per_column_rounded(x, np.swapaxes(w, 0, 1), c, np.swapaxes(orig, 0, 1))


@bound("matmul-dynamic-8bit-full-range-rounded", TERM, TERM, TERM)
def matmul_dynamic_8bit_full_range_rounded(x, w, orig) -> np.ndarray:
    """`matmul-dynamic-8bit-full-range` of x by w, a rounding of orig, plus the weight's move."""
    return _matmul_int8_bound(x, w, _weight_steps(w, ("full", 0)).astype(np.float64), orig=orig)


@bound("gemm-dynamic-8bit-full-range-rounded", TERM, TERM, TERM, TERM)
def gemm_dynamic_8bit_full_range_rounded(x, w, c, orig) -> np.ndarray:
    """`gemm-dynamic-8bit-full-range` of Gemm(x, w, c), w a rounding of orig, plus its move."""
    return _matmul_int8_bound(
        x, w, _weight_steps(w, ("full", 0)).astype(np.float64), bias=c, orig=orig
    )


@bound("gemm-dynamic-8bit-transposed-full-range-rounded", TERM, TERM, TERM, TERM)
def gemm_dynamic_8bit_transposed_full_range_rounded(x, w, c, orig) -> np.ndarray:
    """The same for Gemm with transB = 1 (w and orig stored [N, K])."""
    return gemm_dynamic_8bit_full_range_rounded(x, np.swapaxes(w, 0, 1), c, np.swapaxes(orig, 0, 1))


@bound("gather-8bit-per-row", TERM, TERM)
def gather_8bit_per_row(w: np.ndarray, i: np.ndarray) -> np.ndarray:
    """The error of Gather(w, i) (axis 0) from w stored as int8 with one scale per row,
    s_v = max_d |w_vd| / 127: half a step per element, plus the float32 rounding of the
    rescale (2^-23 of |w| + s / 2). Shape: i's shape + (D,)."""
    w, i = w.astype(np.float64), np.asarray(i, dtype=np.int64)
    if w.shape[0] == 0:  # no row to gather: only an empty Gather is valid
        return np.zeros(i.shape + w.shape[1:])
    rows = np.take(w, i % w.shape[0], axis=0)  # ONNX counts negative indices from the end
    step = np.abs(rows).max(axis=-1, keepdims=True, initial=0.0) / 127
    return step / 2 + 2.0**-23 * (np.abs(rows) + step / 2)


@guard("exact-scale", TERM)
def exact_scale(s: ClassInfo) -> bool:
    """True if `s` is a one-element float32 constant whose magnitude lies in [2^-100, 2^100]:
    a quantization scale with which (x - zp) * s / s rounds back to x - zp for every 8-bit
    x - zp (|x - zp| <= 255: the product and quotient stay normal float32, within a few ulps
    of exact, far from the 0.5 a rounding error would need)."""
    if s.value is None or s.value.size != 1 or s.value.dtype != np.float32:
        return False
    v = abs(float(s.value.reshape(())))
    return 2.0**-100 <= v <= 2.0**100


# ---- weight-only quantization (onnxruntime's MatMulNBits) ---------------------------------------
# com.microsoft.MatMulNBits (onnxruntime contrib op spec): B holds the weight transposed, [N, K],
# in blocks of `block_size` along K, each block q * scale with q in [0, 2^bits) and the zero
# point 2^(bits - 1) when none is given; the product runs in float32 (accuracy_level 0). A block
# quantized symmetrically to 4 bits by round-to-nearest has scale max|w_block| / 7 and each
# weight within half a scale.


@guard("whole-blocks", TERM, TERM, ATTR)
def whole_blocks(x: ClassInfo, w: ClassInfo, block: int) -> bool:
    """True if `w` is a rank-2 [K, N] weight whose K (static) is a positive multiple of
    `block`, so its columns split into whole blocks along K; `x` is the activation it
    multiplies (its last dimension is K, or MatMul(x, w) would not type-check)."""
    shape = w.type.shape
    if shape is None or len(shape) != 2 or not all(isinstance(d, int) for d in shape):
        return False
    return shape[0] >= block > 0 and shape[0] % block == 0 and shape[1] > 0


@builder("dim", TERM, ATTR)
def dim(x: ClassInfo, axis: int) -> int | None:
    """Dimension `axis` of `x` when it is a static int (an attribute such as MatMulNBits' K and
    N), else None."""
    shape = x.type.shape
    if shape is None or not -len(shape) <= axis < len(shape):
        return None
    d = shape[axis]
    return d if isinstance(d, int) else None


WEIGHT_ONLY_BLOCK = (
    32  # the weight-only rules' block length along K (patterns/quant/weight_only.rules)
)


def block_steps(w: np.ndarray, half: int) -> np.ndarray:
    """The weight-only rules' scales of a [K, N] weight (K a multiple of WEIGHT_ONLY_BLOCK), one
    per block of 32 along K and column, [K / 32, N] float32, as the rules compute them: m / -half,
    m the block's weight of the largest magnitude with its sign (its max, or its min where that
    is larger in magnitude), 1 for a block of zeros. Signed: m itself is the level -half, and
    the levels [-half, half - 1] all lie within |m| of 0 (onnxruntime's symmetric blocks)."""
    w32 = w.astype(np.float32)
    k, n = w32.shape
    blocks = w32.reshape(k // WEIGHT_ONLY_BLOCK, WEIGHT_ONLY_BLOCK, n)
    hi, lo = blocks.max(axis=1, initial=-np.inf), blocks.min(axis=1, initial=np.inf)
    m = np.where(hi >= -lo, hi, lo)
    return np.where(m == 0, np.float32(1.0), m / np.float32(-half)).astype(np.float32)


def _blockwise_bound(
    x: np.ndarray, w: np.ndarray, half: int, orig: np.ndarray | None = None
) -> np.ndarray:
    """|x @ w - x @ dq(w)| per output element for w quantized to the 2 `half` values
    [-half, half - 1] in blocks of 32 along K, one scale per block and column s = m / -half
    (`block_steps`; so m itself is -half exactly, and every level is used: onnxruntime's own
    symmetric blocks). A weight w = t s rounds to within s / 2, but where t > half - 1/2 (only
    -m's neighbourhood) it saturates at half - 1, within (t - half + 1) |s| <= |s|. Plus the
    float32 rounding of both sides' sums ((K + 8) 2^-23 of |x| @ (|w| + |s|)). orig: the weight
    `w` stands in for (a rounding of it, GPTQ's): the bound is then on |x @ orig - x @ dq(w)|,
    with the weight's move sum_k |x_k| |w_k - orig_k| and the float32 rounding of x @ orig,
    (K + 8) 2^-23 |x| @ |orig|, added."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    k = w.shape[0]
    signed = np.repeat(block_steps(w, half).astype(np.float64), WEIGHT_ONLY_BLOCK, axis=0)
    scale, t = np.abs(signed), w / signed  # [K, N]
    err = np.where(t > half - 0.5, (t - half + 1) * scale, scale / 2)
    ax = np.abs(x)
    out = ax @ err + (k + 8) * 2.0**-23 * (ax @ (np.abs(w) + scale))
    if orig is not None:
        orig = orig.astype(np.float64)
        out += ax @ np.abs(w - orig) + (k + 8) * 2.0**-23 * (ax @ np.abs(orig))
    return out


@bound("matmul-weight-4bit-block32", TERM, TERM)
def matmul_weight_4bit_block32(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The error of MatMul(x, w) computed with w in 4 bits (q - 8 in [-8, 7]), blocks of 32
    along K (`_blockwise_bound`)."""
    return _blockwise_bound(x, w, 8)


@bound("matmul-weight-4bit-block32-asym", TERM, TERM)
def matmul_weight_4bit_block32_asym(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The error of MatMul(x, w) computed with w in 4 bits with a zero point per block of 32
    along K (patterns/quant/weight_only.rules' quantize-matmul-weight-4bit-asym: the block's
    range [lo, hi] = [min(its min, 0), max(its max, 0)] in 16 levels, s = (hi - lo) / 15,
    z = round(-lo / s)). A weight's level before rounding, t = w / s + z, lies in
    [lo / s + z, hi / s + z] = [-1/2, 15 + 1/2] up to z's rounding (lo / s + z in
    [-1/2, 1/2], hi / s = lo / s + 15), so rounding and clipping to [0, 15] move it by at
    most 1/2: each weight within s / 2 (and s 2^-20 for the float32 steps), sum_k abs(x_k)
    s_kn / 2, plus the float32 rounding of both sides' sums ((K + 8) 2^-23 of
    abs(x) @ (abs(w) + s))."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    k, n = w.shape
    blocks = w.reshape(k // WEIGHT_ONLY_BLOCK, WEIGHT_ONLY_BLOCK, n)
    lo = np.minimum(blocks.min(axis=1, initial=np.inf), 0.0)
    hi = np.maximum(blocks.max(axis=1, initial=-np.inf), 0.0)
    steps = np.where(hi > lo, (hi - lo) / 15.0, 1.0)
    scale = np.repeat(steps, WEIGHT_ONLY_BLOCK, axis=0)  # [K, N]
    ax = np.abs(x)
    return ax @ (scale * (0.5 + 2.0**-20)) + (k + 8) * 2.0**-23 * (ax @ (np.abs(w) + scale))


@bound("matmul-weight-8bit-block32", TERM, TERM)
def matmul_weight_8bit_block32(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The same with w in 8 bits (q - 128 in [-128, 127])."""
    return _blockwise_bound(x, w, 128)


@bound("matmul-weight-4bit-block32-rounded", TERM, TERM, TERM)
def matmul_weight_4bit_block32_rounded(x, w, orig) -> np.ndarray:
    """The error of MatMul(x, orig) computed as `matmul-weight-4bit-block32` of x by w, a
    rounding of orig: that bound plus the weight's move (`_blockwise_bound`'s `orig`)."""
    return _blockwise_bound(x, w, 8, orig=orig)


@bound("matmul-weight-8bit-block32-rounded", TERM, TERM, TERM)
def matmul_weight_8bit_block32_rounded(x, w, orig) -> np.ndarray:
    """The same in 8 bits (`matmul-weight-8bit-block32` plus the weight's move)."""
    return _blockwise_bound(x, w, 128, orig=orig)


# ---- static quantization (patterns/quant/static.rules) ------------------------------------------
# QuantizeLinear (ONNX operator spec): q = saturate(round(x / s) + zp), rounding half to even,
# saturating to the zero point's type; DequantizeLinear: (q - zp) * s. Activations carry a scale
# and zero point from calibration; weights get one step per output channel, stepped for the
# kernels' int16 pairs (`pair_steps`, `conv_pair_steps`); QLinearConv adds an int32 bias in
# units of s_x * s_w[c] to its integer sums and requantizes the total to the output's scale.

_EIGHT_BIT = {2: np.uint8, 3: np.int8}  # ONNX element types uint8, int8


@guard("eight-bit", TERM)
def eight_bit(x: ClassInfo) -> bool:
    """True if `x`'s element type is uint8 or int8 (what QLinearConv and QLinearAdd take)."""
    return x.type.dtype in _EIGHT_BIT


@guard("per-tensor", TERM)
def per_tensor(x: ClassInfo) -> bool:
    """True if `x` is a constant scalar or one-element vector: the only shapes QuantizeLinear
    and the QLinear ops read as one scale or zero point for the whole tensor (a [1, 1, 1, 1]
    one is per axis to onnxruntime, and refused)."""
    return x.value is not None and x.value.size == 1 and x.value.ndim <= 1


@guard("positive-scale", TERM)
def positive_scale(s: ClassInfo) -> bool:
    """True if `s` is a `per-tensor` float32 constant in [2^-24, 2^24]: a scale with which
    QuantizeLinear is non-decreasing and (x - zp) * s / s rounds back (see `exact-scale`), and
    x / s stays within int32 for |x| < 128, where onnx.reference's QuantizeLinear does not
    overflow (`verify` found it wrapping 1 / 10^-15 to int8's lowest). Calibrated scales are
    far inside: an activation's range over 255 levels."""
    if not per_tensor(s) or s.value.dtype != np.float32:
        return False
    return 2.0**-24 <= float(s.value.reshape(())) <= 2.0**24


SMOOTHING_RANGE = (2.0**-16, 2.0**16)  # the smoothing factors `rewrite quantize --smooth` writes


@guard("smoothing-factors", TERM)
def smoothing_factors(s: ClassInfo) -> bool:
    """True if `s` is a 1-D float32 constant whose every element lies in SMOOTHING_RANGE: a
    SmoothQuant factor per channel (patterns/quant/smooth.rules), positive, so that x / s and
    w * s stay finite and normal for finite, normal x and w of moderate size, and the
    migration x W = (x / s)(s W) holds in real arithmetic (Xiao et al. 2023, eq. 3)."""
    v = s.value
    if v is None or v.ndim != 1 or v.dtype != np.float32 or v.size == 0:
        return False
    lo, hi = SMOOTHING_RANGE
    return bool(np.all((v >= lo) & (v <= hi)))


SCALE_RATIO = 2.0**14  # the largest ratio of an input's scale to the output's, or its inverse


@guard("scale-ratio", TERM, TERM)
def scale_ratio(a: ClassInfo, b: ClassInfo) -> bool:
    """True if positive scales `a` and `b` are within a factor 2^14 of each other: an integer
    kernel that rescales 8-bit values by a / b (onnxruntime's QLinearAdd) stays far from
    int32's range (`verify` found QLinearAdd wrong at a ratio of 10^15)."""
    if not (positive_scale(a) and positive_scale(b)):
        return False
    r = float(a.value.reshape(())) / float(b.value.reshape(()))
    return 1 / SCALE_RATIO <= r <= SCALE_RATIO


@guard("zero-point-at-min", TERM, negatable=True)
def zero_point_at_min(z: ClassInfo) -> bool | None:
    """True if `z` is a one-element 8-bit constant equal to its type's lowest value (uint8 0,
    int8 -128): QuantizeLinear with a positive scale then maps every x <= 0 to it. False, not
    None, for a `z` that is not a constant, although it cannot be decided there: the one rule
    that negates it, `quantize-of-relu-as-max`, is exact for any zero point and negates it only
    to leave a zero point known to be at its lowest to `quantize-of-relu`, so "not known to
    be at the lowest" is the negation it means (None dropped that rule where the zero point is
    computed: the twenty-fifth session's review)."""
    v = z.value
    if v is None or v.size != 1 or z.type.dtype not in _EIGHT_BIT:
        return False
    return int(v.reshape(())) == np.iinfo(_EIGHT_BIT[z.type.dtype]).min


def _level(s: float, z: int, v: float) -> float:
    """v / s + z, the real level QuantizeLinear rounds."""
    return float(np.float64(v) / np.float64(s)) + z


@guard("quantize-saturates", TERM, TERM, TERM, TERM)
def quantize_saturates(s: ClassInfo, z: ClassInfo, lo: ClassInfo, hi: ClassInfo) -> bool:
    """True if QuantizeLinear(., s, z) maps `lo` to the lowest and `hi` to the highest value of
    z's 8-bit type, with 10^-3 of a level to spare (so no rounding tie decides): then it maps
    everything below lo and above hi to those too, and Q(Clip(y, lo, hi)) = Q(y). All four
    are one-element constants, s positive."""
    if not positive_scale(s) or z.type.dtype not in _EIGHT_BIT:
        return False
    if any(v.value is None or v.value.size != 1 for v in (z, lo, hi)):
        return False
    info = np.iinfo(_EIGHT_BIT[z.type.dtype])
    sc, zp = float(s.value.reshape(())), int(z.value.reshape(()))
    low = _level(sc, zp, float(lo.value.reshape(())))
    high = _level(sc, zp, float(hi.value.reshape(())))
    return low <= info.min + 0.5 - 1e-3 and high >= info.max - 0.5 + 1e-3


REQUANTIZE_RATIO = 256  # the largest integer ratio k of `scale-multiple`


@guard("scale-multiple", TERM, TERM)
def scale_multiple(a: ClassInfo, b: ClassInfo) -> bool:
    """True if positive scales `a` and `b` (`positive-scale`) satisfy a = k b exactly for an
    integer 1 <= k <= 256: every value (x - za) a of an 8-bit x is then k (x - za) steps of b,
    so QuantizeLinear(., b, zb) rounds nothing (|k (x - za)| <= 2^16, while float32's rounding
    of the product and the quotient moves it by at most 2^16 * 2^-23 of a level) and only
    saturates. (The check k * b == a runs in float64, where it is exact: b has 24 significant
    bits, k at most 9.)"""
    if not (positive_scale(a) and positive_scale(b)):
        return False
    fa, fb = float(a.value.reshape(())), float(b.value.reshape(()))
    k = round(fa / fb)
    return 1 <= k <= REQUANTIZE_RATIO and k * fb == fa


def _dequantized_range(x_dtype: int, s: ClassInfo, z: ClassInfo) -> tuple[float, float] | None:
    """(DQ(lowest), DQ(highest)) of x_dtype (uint8 or int8) dequantized by the one-element scale
    `s` and zero point `z`, in float32 as DequantizeLinear computes them ((q - zp) * s, ONNX
    operator spec); None when they are not such constants."""
    if x_dtype not in _EIGHT_BIT or s.value is None or z.value is None:
        return None
    if s.value.size != 1 or s.value.dtype != np.float32 or z.value.size != 1:
        return None
    info = np.iinfo(_EIGHT_BIT[x_dtype])
    zp, sc = int(z.value.reshape(())), s.value.reshape(())
    lo, hi = (np.float32(info.min - zp) * sc, np.float32(info.max - zp) * sc)
    return float(lo), float(hi)


@builder("dequantized-end", TERM, TERM, ATTR)
def dequantized_end(s: ClassInfo, z: ClassInfo, end: int) -> float | None:
    """DequantizeLinear(q, s, z) for q the lowest (`end` 0) or highest (`end` 1) value of the
    zero point's 8-bit type, as a float32 attribute value: the ends of the range a
    QuantizeLinear(., s, z) saturates to. None unless `s` is a one-element float32 constant
    and `z` a one-element uint8 or int8 one."""
    ends = _dequantized_range(z.type.dtype, s, z)
    if ends is None or end not in (0, 1) or not np.isfinite(ends[end]):
        return None
    return ends[end]


@guard("dequantized-within", TERM, TERM, TERM, TERM, TERM)
def dequantized_within(
    x: ClassInfo, s: ClassInfo, z: ClassInfo, lo: ClassInfo, hi: ClassInfo
) -> bool:
    """True if every value of DequantizeLinear(x, s, z), x uint8 or int8, lies in [lo, hi]: its
    lowest and highest, (qmin - zp) s and (qmax - zp) s in float32, are within the one-element
    float32 constants `lo` and `hi` (`s` positive), so a Clip(., lo, hi) of it changes nothing.
    A NaN bound compares false and is refused."""
    ends = _dequantized_range(x.type.dtype, s, z) if positive_scale(s) else None
    if ends is None or lo.value is None or hi.value is None:
        return False
    if lo.value.size != 1 or hi.value.size != 1:
        return False
    if lo.value.dtype != np.float32 or hi.value.dtype != np.float32:
        return False
    return float(lo.value.reshape(())) <= ends[0] and ends[1] <= float(hi.value.reshape(()))


@guard("conv-accumulates-in-int32", TERM)
def conv_accumulates_in_int32(w: ClassInfo) -> bool:
    """True if a QLinearConv with this weight ([C_out, C_in / group, k...], static) sums its
    K = prod(w.shape[1:]) products of at most 255 * 127, plus a bias of at most 2^24, in int32
    without overflow (1 <= K <= 65,792)."""
    shape = w.type.shape
    if shape is None or len(shape) < 3 or not all(isinstance(d, int) for d in shape):
        return False
    k = int(np.prod(shape[1:]))
    return shape[0] >= 1 and 1 <= k and k * U8_TIMES_S8 + BIAS_UNITS <= INT32_MAX


@guard("bias-fits-int24", TERM, TERM, TERM)
def bias_fits_int24(b: ClassInfo, sx: ClassInfo, w: ClassInfo) -> bool:
    """True if the constant Conv bias `b` ([C_out]) is at most 2^24 in units of s_x * s_w[c]
    (s_x the one-element input scale, s_w the per-channel weight scales of `w`,
    `conv_pair_steps`): its int32 form is exact to the rounding and leaves the int32 sums
    room."""
    return _bias_fits(b, sx, w, ("conv",))


@guard("bias-fits-int24-full-range", TERM, TERM, TERM)
def bias_fits_int24_full_range(b: ClassInfo, sx: ClassInfo, w: ClassInfo) -> bool:
    """`bias-fits-int24` with the weight's full-range steps (`conv_full_range_steps`, finer,
    so a bias counts more units)."""
    return _bias_fits(b, sx, w, ("conv-full",))


@guard("bias-fits-int24-bias-floored", TERM, TERM, TERM)
def bias_fits_int24_bias_floored(b: ClassInfo, sx: ClassInfo, w: ClassInfo) -> bool:
    """`bias-fits-int24` with the weight's steps raised for the bias (`conv-bias-floored-steps`):
    true by construction for a finite bias and scale, unless a raised step overflows."""
    return _bias_fits_steps(b, sx, _floored_steps(w.value, b.value, sx.value, ("conv",)))


@guard("bias-fits-int24-full-range-bias-floored", TERM, TERM, TERM)
def bias_fits_int24_full_range_bias_floored(b: ClassInfo, sx: ClassInfo, w: ClassInfo) -> bool:
    """`bias-fits-int24-bias-floored` with full-range steps
    (`conv-full-range-bias-floored-steps`)."""
    return _bias_fits_steps(b, sx, _floored_steps(w.value, b.value, sx.value, ("conv-full",)))


def _bias_fits(b: ClassInfo, sx: ClassInfo, w: ClassInfo, how: tuple) -> bool:
    if w.value is None or w.value.ndim < 3 or w.value.size == 0:
        return False
    return _bias_fits_steps(b, sx, _weight_steps(w.value, how))


def _bias_fits_steps(b: ClassInfo, sx: ClassInfo, steps: np.ndarray | None) -> bool:
    """Whether the constant bias `b` is at most 2^24 in units of s_x * `steps` (per channel),
    the units a normal float32 (`_bias_units`)."""
    if steps is None or b.value is None or sx.value is None or sx.value.size != 1:
        return False
    if b.value.ndim != 1 or b.value.shape[0] != steps.shape[0]:
        return False
    units = _bias_units(float(sx.value.reshape(())), steps)
    if not np.all(np.isfinite(units) & (units >= FLOAT32_TINY)):
        return False
    ratio = np.abs(b.value.astype(np.float64)) / units
    return bool(np.all(np.isfinite(ratio)) and np.all(ratio <= BIAS_UNITS))


@guard("requantizes-in-range", TERM, TERM, TERM)
def requantizes_in_range(sx: ClassInfo, w: ClassInfo, sy: ClassInfo) -> bool:
    """True if QLinearConv's rescale of its int32 sums, s_x * s_w[c] / s_y (s_w the
    per-channel steps `conv_pair_steps` of `w`), keeps the largest sum (K * 255 * 127 + 2^24,
    see `conv-accumulates-in-int32`) within 2^30: the float product then converts to an
    integer before it saturates to 8 bits (a larger one overflows the conversion)."""
    return _conv_requantizes(sx, w, sy, ("conv",))


@guard("requantizes-in-range-full-range", TERM, TERM, TERM)
def requantizes_in_range_full_range(sx: ClassInfo, w: ClassInfo, sy: ClassInfo) -> bool:
    """`requantizes-in-range` with the weight's full-range steps (`conv_full_range_steps`)."""
    return _conv_requantizes(sx, w, sy, ("conv-full",))


@guard("requantizes-in-range-bias-floored", TERM, TERM, TERM, TERM)
def requantizes_in_range_bias_floored(
    sx: ClassInfo, w: ClassInfo, b: ClassInfo, sy: ClassInfo
) -> bool:
    """`requantizes-in-range` with the weight's steps raised for the bias `b`
    (`conv-bias-floored-steps`)."""
    return _conv_requantizes(sx, w, sy, ("conv",), b)


@guard("requantizes-in-range-full-range-bias-floored", TERM, TERM, TERM, TERM)
def requantizes_in_range_full_range_bias_floored(
    sx: ClassInfo, w: ClassInfo, b: ClassInfo, sy: ClassInfo
) -> bool:
    """`requantizes-in-range-bias-floored` with full-range steps
    (`conv-full-range-bias-floored-steps`)."""
    return _conv_requantizes(sx, w, sy, ("conv-full",), b)


def _conv_requantizes(
    sx: ClassInfo, w: ClassInfo, sy: ClassInfo, how: tuple, b: ClassInfo | None = None
) -> bool:
    """`requantizes-in-range` for the steps `how` of `w`, raised for the bias `b` if given."""
    if not (positive_scale(sx) and positive_scale(sy)) or w.value is None or w.value.ndim < 3:
        return False
    if w.value.size == 0:  # no channel to step
        return False
    if b is None:
        steps = _weight_steps(w.value, how)
    else:
        steps = _floored_steps(w.value, b.value, sx.value, how)
        if steps is None:
            return False
    k = int(np.prod(w.value.shape[1:]))
    ratio = float(sx.value.reshape(())) * float(steps.max(initial=0.0))
    ratio /= float(sy.value.reshape(()))
    return (k * U8_TIMES_S8 + BIAS_UNITS) * ratio <= 2.0**30


@guard("static-matmul-requantizes", TERM, TERM, TERM)
def static_matmul_requantizes(sx: ClassInfo, w: ClassInfo, sy: ClassInfo) -> bool:
    """True if QLinearMatMul's rescale of its int32 sums, s_x * s_w[n] / s_y (s_w the column
    steps `pair_steps(w, per_column=True)` of the constant [K, N] weight `w`), keeps the
    largest sum (K * 255 * 127) within 2^30 (see `requantizes-in-range`, the QLinearConv
    form)."""
    return _matmul_requantizes(sx, w, sy, (0, True))


@guard("static-matmul-requantizes-full-range", TERM, TERM, TERM)
def static_matmul_requantizes_full_range(sx: ClassInfo, w: ClassInfo, sy: ClassInfo) -> bool:
    """`static-matmul-requantizes` with the weight's full-range steps (`full_range_steps`)."""
    return _matmul_requantizes(sx, w, sy, ("full", 0))


def _matmul_requantizes(sx: ClassInfo, w: ClassInfo, sy: ClassInfo, how: tuple) -> bool:
    if not (positive_scale(sx) and positive_scale(sy)) or w.value is None or w.value.ndim != 2:
        return False
    k = w.value.shape[0]
    ratio = float(sx.value.reshape(())) * float(_weight_steps(w.value, how).max(initial=0.0))
    return k * U8_TIMES_S8 * ratio / float(sy.value.reshape(())) <= 2.0**30


@bound("fake-quantize", TERM, TERM, TERM)
def fake_quantize(x: np.ndarray, s: np.ndarray, z: np.ndarray) -> np.ndarray:
    """|x - DQ(Q(x, s, zp), s, zp)| per element: half a step inside the range the 8-bit type
    covers, [(q_min - zp) s, (q_max - zp) s], plus the distance to it outside (saturation),
    plus float32 rounding (2^-20 of |x| and of the range)."""
    x = x.astype(np.float64)
    sc, zp = abs(float(np.asarray(s).reshape(()))), int(np.asarray(z).reshape(()))
    info = np.iinfo(np.asarray(z).dtype)
    low, high = (info.min - zp) * sc, (info.max - zp) * sc
    outside = np.maximum(0.0, np.maximum(low - x, x - high))
    return outside + sc / 2 + 2.0**-20 * (np.abs(x) + 256 * sc)


@bound("conv-static-8bit", TERM, TERM, TERM, TERM, TERM)
def conv_static_8bit(
    xq: np.ndarray, sx: np.ndarray, zx: np.ndarray, w: np.ndarray, sy: np.ndarray
) -> np.ndarray:
    """|Q(Conv(DQ(xq), w, b), s_y, zp_y) - QLinearConv(...)| in output levels, per output
    channel (shape [C_out, 1, ...], broadcasting over the output), weights stepped by
    `conv_pair_steps` (see `_conv_static_bound`)."""
    return _conv_static_bound(xq, sx, zx, w, sy, conv_pair_steps(w))


@bound("conv-static-8bit-full-range", TERM, TERM, TERM, TERM, TERM)
def conv_static_8bit_full_range(
    xq: np.ndarray, sx: np.ndarray, zx: np.ndarray, w: np.ndarray, sy: np.ndarray
) -> np.ndarray:
    """`conv-static-8bit` with full-range weight steps, `conv_full_range_steps(w)`."""
    return _conv_static_bound(xq, sx, zx, w, sy, conv_full_range_steps(w))


@bound("conv-static-8bit-bias-floored", TERM, TERM, TERM, TERM, TERM, TERM)
def conv_static_8bit_bias_floored(xq, sx, zx, w, b, sy) -> np.ndarray:
    """`conv-static-8bit` with the weight's steps raised for the bias `b`
    (`bias_floored_steps` of `conv_pair_steps(w)`)."""
    steps = bias_floored_steps(conv_pair_steps(w), b, float(np.asarray(sx).reshape(())))
    return _conv_static_bound(xq, sx, zx, w, sy, steps)


@bound("conv-static-8bit-full-range-bias-floored", TERM, TERM, TERM, TERM, TERM, TERM)
def conv_static_8bit_full_range_bias_floored(xq, sx, zx, w, b, sy) -> np.ndarray:
    """`conv-static-8bit-full-range` with the weight's steps raised for the bias `b`."""
    steps = bias_floored_steps(conv_full_range_steps(w), b, float(np.asarray(sx).reshape(())))
    return _conv_static_bound(xq, sx, zx, w, sy, steps)


@bound("conv-static-8bit-rounded", TERM, TERM, TERM, TERM, TERM, TERM)
def conv_static_8bit_rounded(xq, sx, zx, w, sy, orig) -> np.ndarray:
    """`conv-static-8bit` of the Conv by w standing in for the Conv by `orig` (w a calibrated
    rounding of it, patterns/quant/rounding_static.rules), plus the weight's move (see
    `_conv_static_bound`'s `orig`)."""
    return _conv_static_bound(xq, sx, zx, w, sy, conv_pair_steps(w), orig)


@bound("conv-static-8bit-full-range-rounded", TERM, TERM, TERM, TERM, TERM, TERM)
def conv_static_8bit_full_range_rounded(xq, sx, zx, w, sy, orig) -> np.ndarray:
    """`conv-static-8bit-full-range` of the Conv by w standing in for the Conv by `orig`, plus
    the weight's move."""
    return _conv_static_bound(xq, sx, zx, w, sy, conv_full_range_steps(w), orig)


def _conv_static_bound(xq, sx, zx, w, sy, steps: np.ndarray, orig=None) -> np.ndarray:
    """One level for the two roundings, plus (over s_y) the weight's rounding, K max|x| s_w / 2
    (K terms of at most max|x| = max|xq - zp_x| s_x each; s_w = `steps`, [C_out]), the
    bias's, s_x s_w / 2, and the float32 rounding of both sums, 2^-20 K (max|x| sum|w_c| +
    2^24 s_x s_w). With `orig` (the float Conv's weight, which w stands in for): the move,
    max|x| sum |w_c - orig_c|, and the float32 rounding of the sum over orig, 2^-20 K max|x|
    sum|orig_c|, added. Float32's subnormal range (`_underflow`, which the float-valued Gemm
    bound adds) is left out of this and `_matmul_static_bound`: in output levels it is at most
    (2K + 4 + 255 * 127 K) 2^-149 / s_y, under 2^-78 levels for K < 2^31 and s_y >= 2^-24 (the
    rules' guard, `positive_scale`), which 1 + real / s_y cannot hold in float64."""
    x_max = float(np.abs(xq.astype(np.float64) - float(np.asarray(zx).reshape(()))).max(initial=0))
    sx_, sy_ = float(np.asarray(sx).reshape(())), abs(float(np.asarray(sy).reshape(())))
    x_max *= sx_
    sw = steps.astype(np.float64)
    channels = (w.shape[0], int(np.prod(w.shape[1:])))
    wc = np.abs(w.astype(np.float64)).reshape(channels)
    k = wc.shape[1]
    real = k * x_max * sw / 2 + sx_ * sw / 2
    real += 2.0**-20 * k * (x_max * wc.sum(axis=1) + BIAS_UNITS * sx_ * sw)
    if orig is not None:
        o = orig.astype(np.float64).reshape(channels)
        moved = np.abs(w.astype(np.float64).reshape(channels) - o).sum(axis=1)
        real += x_max * moved + 2.0**-20 * k * x_max * np.abs(o).sum(axis=1)
    return (1 + real / sy_).reshape((w.shape[0],) + (1,) * (w.ndim - 2))


@bound("matmul-static-8bit", TERM, TERM, TERM, TERM, TERM)
def matmul_static_8bit(
    xq: np.ndarray, sx: np.ndarray, zx: np.ndarray, w: np.ndarray, sy: np.ndarray
) -> np.ndarray:
    """|Q(MatMul(DQ(xq), w), s_y, zp_y) - QLinearMatMul(...)| in output levels, per element,
    weights stepped by `pair_steps(w, per_column=True)` (see `_matmul_static_bound`)."""
    return _matmul_static_bound(xq, sx, zx, w, sy, pair_steps(w, per_column=True))


@bound("matmul-static-8bit-full-range", TERM, TERM, TERM, TERM, TERM)
def matmul_static_8bit_full_range(
    xq: np.ndarray, sx: np.ndarray, zx: np.ndarray, w: np.ndarray, sy: np.ndarray
) -> np.ndarray:
    """`matmul-static-8bit` with full-range weight steps, `full_range_steps(w)`."""
    return _matmul_static_bound(xq, sx, zx, w, sy, full_range_steps(w))


@bound("matmul-static-8bit-rounded", TERM, TERM, TERM, TERM, TERM, TERM)
def matmul_static_8bit_rounded(xq, sx, zx, w, sy, orig) -> np.ndarray:
    """`matmul-static-8bit` of the MatMul by w standing in for the MatMul by `orig` (w a
    calibrated rounding of it), plus the weight's move (see `_matmul_static_bound`)."""
    return _matmul_static_bound(xq, sx, zx, w, sy, pair_steps(w, per_column=True), orig)


@bound("matmul-static-8bit-full-range-rounded", TERM, TERM, TERM, TERM, TERM, TERM)
def matmul_static_8bit_full_range_rounded(xq, sx, zx, w, sy, orig) -> np.ndarray:
    """`matmul-static-8bit-full-range` of the MatMul by w standing in for the MatMul by `orig`,
    plus the weight's move."""
    return _matmul_static_bound(xq, sx, zx, w, sy, full_range_steps(w), orig)


def _matmul_static_bound(xq, sx, zx, w, sy, steps: np.ndarray, orig=None) -> np.ndarray:
    """One level for the two roundings, plus (over s_y) the weight's rounding, sum_k |x_k|
    s_w[n] / 2 (x = DQ(xq), s_w = `steps`, [N]), and the float32 rounding of both sums, ((K +
    8) 2^-23 + 2^-20) |x| @ (|w| + s_w / 2). With `orig` (the float MatMul's weight, which w
    stands in for): the move, |x| @ |w - orig|, and the float32 rounding of the sum over orig,
    `_sum_rounding` of |x| @ |orig|, added. No subnormal term: see `_conv_static_bound`."""
    x = _dequantized(xq, sx, zx)
    sw = steps.astype(np.float64)
    k = w.shape[0]
    rounding = x.sum(axis=-1, keepdims=True) * (sw / 2)
    sums = _sum_rounding(k, x @ (np.abs(w.astype(np.float64)) + sw / 2))
    if orig is not None:
        sums = sums + _orig_terms(x, w, orig)
    return 1 + (rounding + sums) / abs(float(np.asarray(sy).reshape(())))


def _orig_terms(x: np.ndarray, w: np.ndarray, orig: np.ndarray, bias: bool = False) -> np.ndarray:
    """What a product by w standing in for one by `orig` adds to a static bound (real units, per
    output): the move |x| @ |w - orig| and the float32 rounding of the sum over orig, ((K + 8)
    2^-23 + 2^-20) |x| @ |orig|, with `bias` 2^-22 of |x| @ |orig| more for adding it after
    (x: |DQ(xq)| [..., K], float64; w, orig [K, N])."""
    o = orig.astype(np.float64)
    f32 = _sum_rounding(w.shape[0], 1.0) + (2.0**-22 if bias else 0.0)
    return x @ (np.abs(w.astype(np.float64) - o) + f32 * np.abs(o))


@bound("gemm-static-8bit", TERM, TERM, TERM, TERM, TERM)
def gemm_static_8bit(
    xq: np.ndarray, sx: np.ndarray, zx: np.ndarray, w: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """|Gemm(DQ(xq), w, c) - (MatMulInteger(xq, q(w), zx) s_x s_w + c)| per output element
    (float units), weights stepped by `pair_steps(w, per_column=True)` (see
    `_gemm_static_bound`)."""
    return _gemm_static_bound(xq, sx, zx, w, c, pair_steps(w, per_column=True))


@bound("gemm-static-8bit-transposed", TERM, TERM, TERM, TERM, TERM)
def gemm_static_8bit_transposed(
    xq: np.ndarray, sx: np.ndarray, zx: np.ndarray, w: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """`gemm-static-8bit` for Gemm with transB = 1 (w stored [N, K])."""
    return gemm_static_8bit(xq, sx, zx, np.swapaxes(w, 0, 1), c)


@bound("gemm-static-8bit-full-range", TERM, TERM, TERM, TERM, TERM)
def gemm_static_8bit_full_range(
    xq: np.ndarray, sx: np.ndarray, zx: np.ndarray, w: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """`gemm-static-8bit` with full-range weight steps, `full_range_steps(w)`."""
    return _gemm_static_bound(xq, sx, zx, w, c, full_range_steps(w))


@bound("gemm-static-8bit-transposed-full-range", TERM, TERM, TERM, TERM, TERM)
def gemm_static_8bit_transposed_full_range(
    xq: np.ndarray, sx: np.ndarray, zx: np.ndarray, w: np.ndarray, c: np.ndarray
) -> np.ndarray:
    """`gemm-static-8bit-full-range` for Gemm with transB = 1 (w stored [N, K])."""
    return gemm_static_8bit_full_range(xq, sx, zx, np.swapaxes(w, 0, 1), c)


@bound("gemm-static-8bit-rounded", TERM, TERM, TERM, TERM, TERM, TERM)
def gemm_static_8bit_rounded(xq, sx, zx, w, c, orig) -> np.ndarray:
    """`gemm-static-8bit` of the Gemm by w standing in for the Gemm by `orig` (w a calibrated
    rounding of it), plus the weight's move (see `_gemm_static_bound`)."""
    return _gemm_static_bound(xq, sx, zx, w, c, pair_steps(w, per_column=True), orig)


@bound("gemm-static-8bit-transposed-rounded", TERM, TERM, TERM, TERM, TERM, TERM)
def gemm_static_8bit_transposed_rounded(xq, sx, zx, w, c, orig) -> np.ndarray:
    """`gemm-static-8bit-rounded` for Gemm with transB = 1 (w and orig stored [N, K])."""
    return gemm_static_8bit_rounded(xq, sx, zx, np.swapaxes(w, 0, 1), c, np.swapaxes(orig, 0, 1))


@bound("gemm-static-8bit-full-range-rounded", TERM, TERM, TERM, TERM, TERM, TERM)
def gemm_static_8bit_full_range_rounded(xq, sx, zx, w, c, orig) -> np.ndarray:
    """`gemm-static-8bit-full-range` of the Gemm by w standing in for the Gemm by `orig`, plus
    the weight's move."""
    return _gemm_static_bound(xq, sx, zx, w, c, full_range_steps(w), orig)


@bound("gemm-static-8bit-transposed-full-range-rounded", TERM, TERM, TERM, TERM, TERM, TERM)
def gemm_static_8bit_transposed_full_range_rounded(xq, sx, zx, w, c, orig) -> np.ndarray:
    """`gemm-static-8bit-full-range-rounded` for Gemm with transB = 1 (w and orig stored [N,
    K])."""
    return gemm_static_8bit_full_range_rounded(
        xq, sx, zx, np.swapaxes(w, 0, 1), c, np.swapaxes(orig, 0, 1)
    )


@bound("matmul-static-8bit-to-float", TERM, TERM, TERM, TERM)
def matmul_static_8bit_to_float(xq, sx, zx, w) -> np.ndarray:
    """|MatMul(DQ(xq), w) - MatMulInteger(xq, q(w), zx) s_x s_w| per output element (float
    units), weights stepped by `pair_steps(w, per_column=True)`: `_gemm_static_bound` with a
    bias of zeros."""
    return _gemm_static_bound(xq, sx, zx, w, _no_bias(w), pair_steps(w, per_column=True))


@bound("matmul-static-8bit-to-float-full-range", TERM, TERM, TERM, TERM)
def matmul_static_8bit_to_float_full_range(xq, sx, zx, w) -> np.ndarray:
    """`matmul-static-8bit-to-float` with full-range weight steps, `full_range_steps(w)`."""
    return _gemm_static_bound(xq, sx, zx, w, _no_bias(w), full_range_steps(w))


@bound("matmul-static-8bit-to-float-rounded", TERM, TERM, TERM, TERM, TERM)
def matmul_static_8bit_to_float_rounded(xq, sx, zx, w, orig) -> np.ndarray:
    """`matmul-static-8bit-to-float` of the MatMul by w standing in for the MatMul by `orig` (w
    a calibrated rounding of it), plus the weight's move (see `_gemm_static_bound`)."""
    steps = pair_steps(w, per_column=True)
    return _gemm_static_bound(xq, sx, zx, w, _no_bias(w), steps, orig)


@bound("matmul-static-8bit-to-float-full-range-rounded", TERM, TERM, TERM, TERM, TERM)
def matmul_static_8bit_to_float_full_range_rounded(xq, sx, zx, w, orig) -> np.ndarray:
    """`matmul-static-8bit-to-float-full-range` of the MatMul by w standing in for the MatMul
    by `orig`, plus the weight's move."""
    return _gemm_static_bound(xq, sx, zx, w, _no_bias(w), full_range_steps(w), orig)


def _no_bias(w: np.ndarray) -> np.ndarray:
    """A bias of zeros for the [K, N] weight `w`: [N] float32 (the MatMul rules' Gemm bound)."""
    return np.zeros(w.shape[-1], np.float32)


def _gemm_static_bound(xq, sx, zx, w, c, steps: np.ndarray, orig=None) -> np.ndarray:
    """The weight's rounding, sum_k |x_k| s_w[n] / 2 (x = DQ(xq), exact; s_w = `steps`, the
    column scales of the [K, N] weight), the float32 rounding of both sums and of the
    int32-to-float32 cast and rescale (`_sum_rounding`), and of adding c on each side (2^-22
    of |c| and of the products' magnitudes). With `orig` (the float Gemm's weight, which w
    stands in for): `_orig_terms` added."""
    x = _dequantized(xq, sx, zx)
    sw = steps.astype(np.float64)
    aw = np.abs(w.astype(np.float64))
    rounding = x.sum(axis=-1, keepdims=True) * (sw / 2)
    sums = _sum_rounding(w.shape[0], x @ (aw + sw / 2))
    if orig is not None:
        sums = sums + _orig_terms(x, w, orig, bias=True)
    levels = _dequantized(xq, 1.0, zx).sum(axis=-1, keepdims=True)  # sum_k |xq_k - zp_x|
    tiny = _underflow(w.shape[0], levels * PAIR_LEVELS)
    return rounding + sums + tiny + 2.0**-22 * (np.abs(c.astype(np.float64)) + x @ (aw + sw))


def _underflow(k: int, integer_sums: np.ndarray) -> np.ndarray:
    """What float32's subnormal range adds to a bound in absolute terms (IEEE 754: a result below
    2^-126 is rounded to a multiple of 2^-149, so each operation may err by 2^-150 whatever its
    size): each of the K products and sums of the float side, the rescale's product and the
    bias's add, and the rescale s_x s_w itself, which may round to 0, times the integer sums it
    multiplies (at most `integer_sums` in magnitude). `verify` found a Gemm of a weight entry
    of 2^-126 (a step of 2^-126 / 127, subnormal) whose float side gave -2^-149 and whose
    quantized side, its rescale rounded to 0, gave 0."""
    return (2 * k + 4 + integer_sums) * 2.0**-149


@bound("one-level", TERM, TERM)
def one_level(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One level of the 8-bit output, per element of the broadcast of `a` and `b`: an integer
    kernel that rounds its exact result once where the float form rounds once too."""
    return np.ones(np.broadcast_shapes(np.shape(a), np.shape(b)))


# ---- lowering QDQ groups to integer kernels (patterns/quant/lower.rules) -------------------------
# An integer kernel sums products of 8-bit values less their zero points, each at most 255 * 255
# in magnitude, in int32. onnxruntime's x86 kernels without VNNI add pairs of uint8-by-int8
# products in int16 first (vpmaddubsw), which saturates unless |b| <= 64 (2 * 255 * 64 < 2^15);
# uint8-by-uint8 and int8-by-int8 products take other paths (measured on onnxruntime 1.32:
# exact at 255 * 255 and -128 * -128). An int8 a by a uint8 b has no onnxruntime kernel.

U8_TIMES_U8 = 255 * 255  # the largest |(a - za) * (b - zb)| of two 8-bit values
INT16_SAFE_S8 = 64  # the largest |b| of an int8 b a uint8 a multiplies in onnxruntime's pairs


def _integer_pair_ok(a: ClassInfo, b: ClassInfo) -> bool:
    """True if onnxruntime's integer kernels take this 8-bit dtype pair exactly (see above)."""
    if a.type.dtype not in _EIGHT_BIT or b.type.dtype not in _EIGHT_BIT:
        return False
    if a.type.dtype == b.type.dtype:
        return True
    if (a.type.dtype, b.type.dtype) != (2, 3) or b.value is None:  # uint8 a, int8 constant b
        return False
    return int(np.abs(b.value.astype(np.int64)).max(initial=0)) <= INT16_SAFE_S8


def _static_dims(x: ClassInfo) -> tuple[int, ...] | None:
    """x's shape when every dimension is a static int, else None."""
    shape = x.type.shape
    if shape is None or not all(isinstance(d, int) for d in shape):
        return None
    return tuple(shape)


@guard("integer-matmul-exact", TERM, TERM)
def integer_matmul_exact(a: ClassInfo, b: ClassInfo) -> bool:
    """True if MatMulInteger / QLinearMatMul of 8-bit `a` [..., M, K] by `b` [..., K, N] is
    exact on onnxruntime: a dtype pair its kernels take without int16 saturation (see above),
    both of rank >= 2, and a static K with K * 255 * 255 <= 2^31 - 1 (K <= 33,025), so the
    int32 sums do not overflow."""
    if not _integer_pair_ok(a, b):
        return False
    ra, rb = a.type.shape, b.type.shape
    if ra is None or rb is None or len(ra) < 2 or len(rb) < 2:
        return False
    k = rb[-2]
    return isinstance(k, int) and 1 <= k and k * U8_TIMES_U8 <= INT32_MAX


@guard("integer-matmul-requantizes", TERM, TERM, TERM, TERM)
def integer_matmul_requantizes(b: ClassInfo, sa: ClassInfo, sb: ClassInfo, sy: ClassInfo) -> bool:
    """True if QLinearMatMul's rescale of its int32 sums by sa * sb / sy keeps the largest sum
    (K * 255 * 255, K = b's second-last dimension) within 2^30, so the float product converts
    to an integer before it saturates (see `requantizes-in-range`, the QLinearConv form)."""
    shape = b.type.shape
    if not all(positive_scale(s) for s in (sa, sb, sy)) or shape is None or len(shape) < 2:
        return False
    if not isinstance(shape[-2], int):
        return False
    ratio = float(sa.value.reshape(())) * float(sb.value.reshape(())) / float(sy.value.reshape(()))
    return shape[-2] * U8_TIMES_U8 * ratio <= 2.0**30


@guard("integer-conv-exact", TERM, TERM)
def integer_conv_exact(x: ClassInfo, w: ClassInfo) -> bool:
    """True if ConvInteger of 8-bit `x` by `w` ([C_out, C_in / group, k...], static) is exact
    on onnxruntime: a dtype pair its kernels take without int16 saturation (see above) and
    K = prod(w.shape[1:]) with K * 255 * 255 <= 2^31 - 1."""
    dims = _static_dims(w)
    if not _integer_pair_ok(x, w) or dims is None or len(dims) < 3:
        return False
    k = int(np.prod(dims[1:]))
    return dims[0] >= 1 and 1 <= k and k * U8_TIMES_U8 <= INT32_MAX


@guard("channel-scales", TERM, TERM, TERM, ATTR)
def channel_scales(w: ClassInfo, sw: ClassInfo, zw: ClassInfo, axis: int) -> bool:
    """True if weight `w` ([C_out, ...]) is dequantized with positive float32 scales `sw`, one
    for the tensor or one per output channel (a vector of C_out along `axis` 0), and one zero
    point `zw`, all its elements equal (onnxruntime's QLinearConv takes no other)."""
    s, z, shape = sw.value, zw.value, w.type.shape
    if s is None or z is None or shape is None or len(shape) < 1 or s.dtype != np.float32:
        return False
    if s.size != 1 and (s.ndim != 1 or axis not in (0, -len(shape)) or s.shape[0] != shape[0]):
        return False
    if z.size == 0 or z.size not in (1, s.size) or not np.all(z == z.reshape(-1)[0]):
        return False
    return bool(np.all((s >= 2.0**-24) & (s <= 2.0**24)))


@guard("bias-scales", TERM, TERM, ATTR, TERM, TERM, TERM)
def bias_scales(
    b: ClassInfo, sb: ClassInfo, axis: int, sx: ClassInfo, sw: ClassInfo, w: ClassInfo
) -> bool:
    """True if the int32 bias `b` ([C_out] of weight `w`) is dequantized with scales `sb` (one,
    or one per channel along `axis` 0) equal to sx * sw[c] within 2^-20 (onnxruntime's
    quantizer computes them so in float32), and |b| <= 2^24 (exact in float32, leaving the
    int32 sums room)."""
    s, v = sb.value, b.value
    if s is None or v is None or v.ndim != 1 or sx.value is None or sw.value is None:
        return False
    c = v.shape[0]
    if w.type.shape is None or len(w.type.shape) < 1 or w.type.shape[0] != c:
        return False
    if s.size != 1 and (s.ndim != 1 or axis != 0 or s.shape[0] != c):
        return False
    if sw.value.size not in (1, c) or s.dtype != np.float32:
        return False
    want = float(sx.value.reshape(-1)[0]) * np.broadcast_to(sw.value.astype(np.float64), (c,))
    got = np.broadcast_to(s.astype(np.float64).reshape(-1), (c,))
    if not np.all(want > 0) or not np.all(np.abs(got - want) <= 2.0**-20 * want):
        return False
    return int(np.abs(v.astype(np.int64)).max(initial=0)) <= BIAS_UNITS


@guard("integer-conv-requantizes", TERM, TERM, TERM, TERM)
def integer_conv_requantizes(w: ClassInfo, sx: ClassInfo, sw: ClassInfo, sy: ClassInfo) -> bool:
    """True if QLinearConv's rescale by sx * sw[c] / sy keeps the largest sum (K * 255 * 255
    plus a bias of 2^24) within 2^30 (see `requantizes-in-range`)."""
    dims = _static_dims(w)
    if dims is None or len(dims) < 3 or sw.value is None or sw.value.size not in (1, dims[0]):
        return False
    if not (positive_scale(sx) and positive_scale(sy)):
        return False
    k = int(np.prod(dims[1:]))
    top = float(np.abs(sw.value.astype(np.float64)).max(initial=0.0))
    ratio = float(sx.value.reshape(())) * top / float(sy.value.reshape(()))
    return (k * U8_TIMES_U8 + BIAS_UNITS) * ratio <= 2.0**30


@guard("pool-sums-in-range", TERM, TERM, TERM)
def pool_sums_in_range(x: ClassInfo, sx: ClassInfo, sy: ClassInfo) -> bool:
    """True if a QLinearGlobalAveragePool of `x` ([N, C, H, W], static H and W) sums its
    H * W 8-bit values in int32 (H * W <= 2^22) and its rescale sx / (sy H W) is within
    [2^-31, 2^7] (onnxruntime refuses one outside [2^-32, 256), "parameter out of
    computation range": measured on onnxruntime 1.32, found by `verify`)."""
    shape = x.type.shape
    if shape is None or len(shape) < 3 or not all(isinstance(d, int) for d in shape[2:]):
        return False
    hw = int(np.prod(shape[2:]))
    if not (1 <= hw <= 2**22 and positive_scale(sx) and positive_scale(sy)):
        return False
    ratio = float(sx.value.reshape(())) / (float(sy.value.reshape(())) * hw)
    return 2.0**-31 <= ratio <= 2.0**7


def _dequantized(q: np.ndarray, s: np.ndarray, z: np.ndarray) -> np.ndarray:
    """|q - zp| * s in float64: the magnitudes DequantizeLinear gives (one scale, zero point)."""
    zp = float(np.asarray(z).reshape(())) if np.size(z) else 0.0
    return np.abs(q.astype(np.float64) - zp) * abs(float(np.asarray(s).reshape(())))


def _sum_rounding(k: int, magnitudes: np.ndarray) -> np.ndarray:
    """The float32 rounding of a sum of K products, computed two ways (by float32 products and
    partial sums; by exact integers converted and rescaled in float32), given the sum of the
    products' magnitudes: ((K + 8) 2^-23 + 2^-20) of it."""
    return ((k + 8) * 2.0**-23 + 2.0**-20) * magnitudes


@bound("dequantized-matmul", TERM, TERM, TERM, TERM, TERM, TERM)
def dequantized_matmul(a, sa, za, b, sb, zb) -> np.ndarray:
    """|MatMul(DQ(a), DQ(b)) - Cast(MatMulInteger(a, b, za, zb)) * sa sb| per output element:
    the float32 rounding of the sums (`_sum_rounding` of |DQ(a)| @ |DQ(b)|)."""
    return _sum_rounding(b.shape[-2], _dequantized(a, sa, za) @ _dequantized(b, sb, zb))


@bound("qlinear-matmul", TERM, TERM, TERM, TERM, TERM, TERM, TERM)
def qlinear_matmul(a, sa, za, b, sb, zb, sy) -> np.ndarray:
    """|Q(MatMul(DQ(a), DQ(b)), sy, zy) - QLinearMatMul(...)| in output levels, per element:
    one level for the two roundings, plus the sums' float32 rounding over sy."""
    sy_ = abs(float(np.asarray(sy).reshape(())))
    return 1 + dequantized_matmul(a, sa, za, b, sb, zb) / sy_


@bound("dequantized-conv", TERM, TERM, TERM, TERM, TERM, TERM)
def dequantized_conv(x, sx, zx, w, sw, zw) -> np.ndarray:
    """|Conv(DQ(x), DQ(w)) - Cast(ConvInteger(x, w, zx, zw)) * sx sw| per output channel (shape
    [C_out, 1, ...], broadcasting over the output): the sums' float32 rounding, each sum of K
    products at most max|DQ(x)| times the channel's sum of |DQ(w)|."""
    k, sums = _conv_sums(x, sx, zx, w, sw, zw)
    return _sum_rounding(k, sums).reshape((w.shape[0],) + (1,) * (w.ndim - 2))


def _dequantized_weight(w: np.ndarray, sw: np.ndarray, zw: np.ndarray) -> np.ndarray:
    """|w - zp| * s in float64 per element of weight `w` [C_out, ...], its scales one or one per
    output channel, its zero point one value (`channel-scales`)."""
    zp = float(np.asarray(zw).reshape(-1)[0])
    s = np.abs(np.asarray(sw, dtype=np.float64)).reshape((-1,) + (1,) * (w.ndim - 1))
    return np.abs(w.astype(np.float64) - zp) * s


def _conv_sums(x, sx, zx, w, sw, zw) -> tuple[int, np.ndarray]:
    """(K, per output channel the largest sum of |products| a Conv(DQ(x), DQ(w)) adds): K =
    prod(w.shape[1:]) terms, each at most max|DQ(x)| times the channel's |DQ(w)|."""
    x_max = float(_dequantized(x, sx, zx).max(initial=0.0))
    wc = _dequantized_weight(w, sw, zw).reshape(w.shape[0], -1)
    return wc.shape[1], x_max * wc.sum(axis=1)


@bound("qlinear-conv", TERM, TERM, TERM, TERM, TERM, TERM, TERM)
def qlinear_conv(x, sx, zx, w, sw, zw, sy) -> np.ndarray:
    """|Q(Conv(DQ(x), DQ(w)), sy, zy) - QLinearConv(...)| in output levels per output channel
    (shape [C_out, 1, ...]): one level for the two roundings, plus the sums' float32 rounding
    over sy."""
    k, sums = _conv_sums(x, sx, zx, w, sw, zw)
    real = _sum_rounding(k, sums) / abs(float(np.asarray(sy).reshape(())))
    return (1 + real).reshape((w.shape[0],) + (1,) * (w.ndim - 2))


@bound("qlinear-conv-with-bias", TERM, TERM, TERM, TERM, TERM, TERM, TERM, TERM, TERM)
def qlinear_conv_with_bias(x, sx, zx, w, sw, zw, b, sb, sy) -> np.ndarray:
    """`qlinear-conv` with an int32 bias b dequantized by scales sb: the float side adds b sb,
    the integer side b in units of sx sw[c]; they differ by |b| |sb - sx sw[c]|, and the bias
    joins the sums' rounding."""
    k, sums = _conv_sums(x, sx, zx, w, sw, zw)
    c = w.shape[0]
    units = abs(float(np.asarray(sx).reshape(-1)[0])) * np.broadcast_to(
        np.abs(np.asarray(sw, dtype=np.float64)).reshape(-1), (c,)
    )
    bias = np.abs(b.astype(np.float64))
    scales = np.broadcast_to(np.abs(np.asarray(sb, dtype=np.float64)).reshape(-1), (c,))
    real = _sum_rounding(k + 1, sums + bias * scales) + bias * np.abs(scales - units)
    real /= abs(float(np.asarray(sy).reshape(())))
    return (1 + real).reshape((c,) + (1,) * (w.ndim - 2))


@bound("qlinear-global-average-pool", TERM, TERM, TERM, TERM)
def qlinear_global_average_pool(x, sx, zx, sy) -> np.ndarray:
    """|Q(GlobalAveragePool(DQ(x)), sy, zy) - QLinearGlobalAveragePool(...)| in output levels,
    per [N, C] mean (shape [N, C, 1, ...]): one level for the two roundings, plus the float32
    rounding of the mean of H * W values over sy."""
    hw = int(np.prod(x.shape[2:]))
    mean = _dequantized(x, sx, zx).reshape(x.shape[0], x.shape[1], hw).mean(axis=2)
    real = _sum_rounding(hw, mean) / abs(float(np.asarray(sy).reshape(())))
    return (1 + real).reshape(x.shape[:2] + (1,) * (x.ndim - 2))


EXACT_BOUNDS = frozenset({"exact-when-finite"})  # bounds of rules exact on finite values


@bound("exact-when-finite", TERM)
def exact_when_finite(y: np.ndarray) -> np.ndarray:
    """Zero per element of `y`: a rewrite exact on finite values (`verify` draws finite values
    for `quant` rules), stated as a `quant` rule because a NaN comes out differently."""
    return np.zeros(np.shape(y))
