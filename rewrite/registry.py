"""Guards and builders: the named host functions that rules may call.

A guard is a predicate used in `(if ...)`; a builder computes an attribute value used in a
rule's result. Both are plain module-level functions registered by name with the kinds of
their parameters:

- `term`: a captured tensor value; the function receives a `ClassInfo` (type and, for an
  imported constant, its value),
- `attr`: an attribute value (a capture bound to an attribute, or a literal in the rule); the
  function receives the Python value (int, float, str, tuple), None when absent.

A guard that cannot decide (an unknown shape, a non-constant) returns False: a rule never fires
on a fact the engine does not know. Builders return None when they cannot build; the match is
then skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rewrite.types import ClassInfo

TERM, ATTR = "term", "attr"


@dataclass(frozen=True)
class HostFn:
    """A registered guard or builder: `name` as written in rules, its parameter kinds."""

    name: str
    fn: Callable[..., Any]
    params: tuple[str, ...]
    kind: str  # "guard" or "builder"

    @property
    def doc(self) -> str:
        return (self.fn.__doc__ or "").strip().splitlines()[0] if self.fn.__doc__ else ""


GUARDS: dict[str, HostFn] = {}
BUILDERS: dict[str, HostFn] = {}


def guard(name: str, *params: str):
    """Register a guard under `name` with parameter kinds `params` (TERM or ATTR)."""

    def deco(fn):
        GUARDS[name] = HostFn(name, fn, params, "guard")
        return fn

    return deco


def builder(name: str, *params: str):
    """Register a builder under `name` with parameter kinds `params` (TERM or ATTR)."""

    def deco(fn):
        BUILDERS[name] = HostFn(name, fn, params, "builder")
        return fn

    return deco


# ---- permutations ----------------------------------------------------------------------------


@guard("identity-perm", ATTR)
def identity_perm(perm: tuple[int, ...] | None) -> bool:
    """True if `perm` is (0, 1, ..., n-1). An absent perm (reverse) is identity only for n<=1,
    which needs the rank, so it is not accepted here."""
    return perm is not None and tuple(perm) == tuple(range(len(perm)))


@builder("compose-perm", ATTR, ATTR)
def compose_perm(p: tuple[int, ...] | None, q: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """Perm of Transpose(Transpose(x, p), q) as one Transpose: r[i] = p[q[i]].

    ONNX Transpose: output axis i is input axis perm[i] (ONNX operator spec, Transpose).
    """
    if p is None or q is None or len(p) != len(q):
        return None
    return tuple(p[i] for i in q)


# ---- constants -------------------------------------------------------------------------------


@guard("is-constant", TERM)
def is_constant(x: ClassInfo) -> bool:
    """True if the value is an imported constant (initializer or Constant node)."""
    return x.is_constant


@guard("all-equal", TERM, ATTR)
def all_equal(x: ClassInfo, v: Any) -> bool:
    """True if `x` is a constant whose every element equals `v` (NaN never equals)."""
    return x.value is not None and x.value.size > 0 and bool(np.all(x.value == v))


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


@guard("no-zero-dims", TERM)
def no_zero_dims(s: ClassInfo) -> bool:
    """True if `s` is a constant Reshape shape with no 0 entry (0 copies an input dim)."""
    return s.value is not None and bool(np.all(s.value != 0))


# ---- shapes and dtypes -----------------------------------------------------------------------


@guard("rank", TERM, ATTR)
def rank(x: ClassInfo, n: int) -> bool:
    """True if `x` has rank `n`."""
    return x.type.rank == n


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


@guard("has-dtype", TERM, ATTR)
def has_dtype(x: ClassInfo, elem_type: int) -> bool:
    """True if `x`'s ONNX element type is `elem_type` (e.g. a Cast's `to`)."""
    return bool(x.type.dtype) and x.type.dtype == elem_type


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
    grow `x` at run time: False.
    """
    zs, xs = z.type.shape, x.type.shape
    if zs is None or xs is None or len(zs) > len(xs):
        return False
    return all(
        _static_one(zd) or same_dim(zd, xd)
        for zd, xd in zip(zs, xs[len(xs) - len(zs):])
    )


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


@guard("is-float", TERM)
def is_float(x: ClassInfo) -> bool:
    """True if `x`'s element type is known and is a floating-point type."""
    return x.type.dtype in _FLOATS


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


@guard("channel-bias", TERM, TERM)
def channel_bias(b: ClassInfo, y: ClassInfo) -> bool:
    """True if constant `b` added to Conv output `y` (N, C, spatial...) is a per-channel
    bias: its shape, right-aligned against `y`, is (C, 1, ..., 1) possibly with leading 1s.
    Only `y`'s rank and its channel count C (a static int) are needed: batch and spatial
    dimensions may be symbolic (ONNX Conv: Y has shape (N, M, ...), M the output channels)."""
    ys = y.type.shape
    if b.value is None or ys is None or len(ys) < 3 or not isinstance(ys[1], int):
        return False
    shape, r = b.value.shape, y.type.rank
    if len(shape) != r and len(shape) != r - 1:
        return False
    if len(shape) == r and shape[0] != 1:
        return False
    tail = shape[-(r - 1):]
    return tail[0] == y.type.shape[1] and all(d == 1 for d in tail[1:])
