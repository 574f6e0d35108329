"""Values of drawn leaves: element strategies per dtype and mode, arrays, fills.

Floats, `full`: 2 in 6 ordinary values (|v| <= 100), 1 in 6 small ones (|v| <= 4), 1 in 6
any float of the width (Hypothesis favours the extremes: huge, tiny, subnormal), 1 in 6 NaN,
1 in 6 NaN, +-Inf or -0.0: NaN is where most float rewrites go wrong. Floats, `bounded`
(comparisons with a tolerance, where huge values make any regrouping of sums overflow or
cancel): 7 in 8 finite |v| <= 8 without subnormals, 1 in 8 NaN or a signed zero. Floats,
`finite` (`quant` rules: quantization scales are ranges of finite values): the same without
NaN. Floats, `grid` (`verify.sweep`'s check): quarters in [-128, 128), scales powers of two,
so that quantization meets rounding ties. Integers: the whole range of the dtype (Hypothesis
favours small values and the bounds). A leaf a hint asks to be positive (`hints.Positive`, a
quantization scale) has its drawn zeros replaced by 1 and its negatives by their magnitudes:
with the 1 in 8 zeros of `finite`, a rule of five scales had half its draws refused. A leaf a
hint asks to be wide (`hints.Wide`, a bias) draws half its `finite` elements up to 2^9; one with
a dead channel (`hints.DeadChannel`, a Conv weight) has, in half the draws, one output channel
scaled by 2^-24. Every
element is drawn on its own, so a counterexample shrinks element by element.
"""

from __future__ import annotations

import math
from functools import cache, lru_cache

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from verify.dtypes import FLOATS, int_bounds, np_type

# Value domains of input slots, (op, slot) -> domain (`verify.draw.elements`): a numpy
# reference cannot raise integers to negative powers, a variance is not negative, and an
# integer divided by zero is undefined (onnxruntime dies of SIGFPE).
VALUE_DOMAINS = {
    ("Pow", 1): "exponent",
    ("BatchNormalization", 4): "nonneg",
    ("Div", 1): "nonzero",
    ("Mod", 1): "nonzero",
    ("Gather", 1): "index",  # within an axis of 2 or more (`verify.ops_movement._gather`)
}


class Values:
    """Value drawing for `verify.draw.Gen`, which provides `draw`, `leaves` and
    `values_mode`."""

    def _draw_values(self) -> None:
        order = sorted(self.leaves.values(), key=lambda leaf: leaf.copy_of is not None)
        for leaf in order:
            if leaf.absent:
                continue
            if leaf.copy_of and self.leaves.get(leaf.copy_of) is not None:
                src = self.leaves[leaf.copy_of]
                if src.value is not None and src.value.shape == leaf.shape:
                    leaf.value = src.value.astype(np_type(leaf.dtype))
            if leaf.value is None:
                leaf.value = self.draw(self.array(leaf), f"value of {leaf.name}")

    def filled(self, leaf, v) -> np.ndarray:
        """A constant array of `leaf`'s shape and dtype, every element `v` (for floats and
        v = 0, the signs of the zeros are drawn: -0.0 is all-equal to 0 too)."""
        dt = np_type(leaf.dtype)
        value = np.full(leaf.shape, v).astype(dt)
        if leaf.dtype in FLOATS and v == 0 and value.size:  # -0.0 is all-equal to 0 as well
            signs = self.draw(hnp.arrays(bool, leaf.shape), "signs of zero")
            value = np.where(signs, -value, value).astype(dt)
        return value

    def array(self, leaf):
        """Strategy for the values of `leaf` (its dtype, shape and the value domains of the
        slots it feeds, `VALUE_DOMAINS`, and those its requests give it)."""
        domains = frozenset({VALUE_DOMAINS.get(u) for u in leaf.uses} - {None} | set(leaf.domains))
        return _arrays(leaf.dtype, leaf.shape, self.values_mode, domains)


@cache
def sampled(options: tuple):
    """`st.sampled_from(options)`, one strategy object per tuple (Hypothesis validates each
    new strategy object on its first draw, which dominates drawing time otherwise)."""
    return st.sampled_from(options)


@cache
def ints(lo: int, hi: int):
    """`st.integers(lo, hi)`, one strategy object per range (Hypothesis's own strategy cache
    costs tens of microseconds a call, and drawing calls it for every choice)."""
    return st.integers(lo, hi)


BOOLS = st.booleans()


@lru_cache(maxsize=4096)
def _arrays(dtype: int, shape: tuple, mode: str, domains: frozenset):
    # fill=nothing: every element is drawn on its own (a fill value would make most of the
    # array one value)
    el = elements(dtype, mode, domains)
    arrays = hnp.arrays(np_type(dtype), shape, elements=el, fill=st.nothing())
    if "dead-channel" in domains and dtype in FLOATS and shape and shape[0] >= 1:
        # a Conv weight with a dead channel (`hints.DeadChannel`), in half the draws (shrinking
        # towards none): one output channel, drawn, scaled by 2^-24
        return st.one_of(arrays, st.tuples(arrays, ints(0, shape[0] - 1)).map(_dead_channel))
    return arrays


def _dead_channel(drawn: tuple) -> np.ndarray:
    w, c = drawn
    w = w.copy()
    w[c] = w[c] * w.dtype.type(2.0**-24)
    return w


@cache
def elements(dtype: int, mode: str, domains: frozenset):
    """Hypothesis strategy for one element of `dtype`; `mode` and `domains` as in `Gen`.

        Floats, `full`: 2 in 6 ordinary values (|v| <= 100), 1 in 6 small ones (|v| <= 4), 1 in 6
    any float of the width
        (Hypothesis favours the extremes: huge, tiny, subnormal), 1 in 6 NaN, 1 in 6 NaN, +-Inf
        or -0.0 (NaN is where most float rewrites go wrong).
        Floats, `bounded`: 7 in 8 finite |v| <= 8 (no subnormals), 1 in 8 NaN or a signed zero.
        Floats, `grid` (and `grid4`, which draws 4-bit integers): k / 4 for k in [-512, 512),
        non-negative ones (scales) 2^-4 to 2^4.
        Integers: the whole range of the dtype (Hypothesis favours small values and the bounds).
    """
    dt = np_type(dtype)
    if dtype in FLOATS:
        width = dt.itemsize * 8
        if mode == "full":
            ordinary = st.floats(-100, 100, width=width)
            # where activations bend (Gelu and its tanh or sigmoid forms differ only for
            # |x| < 10: a seed whose draws were all large or special passed such a rule)
            small = st.floats(-4, 4, width=width)
            specials = st.sampled_from([math.nan, math.inf, -math.inf, -0.0])
            s = st.one_of(
                ordinary, ordinary, small, st.floats(width=width), st.just(math.nan), specials
            )
        elif mode in ("grid", "grid4"):  # `every value` checks (`verify.sweep`): ties are common
            # scales: powers of two, so x / s lands on half-integers (0.5 first: the grid's
            # x / s then has ties and runs past both ends of the 8-bit ranges)
            if "nonneg" in domains or "positive" in domains:
                return sampled((0.5, 1.0, 0.25, 2.0, 0.125, 4.0, 0.0625, 8.0, 16.0))
            return st.integers(-512, 511).map(lambda k: k / 4)
        elif mode == "finite":
            finite = st.floats(-8, 8, width=width, allow_subnormal=False)
            s = st.one_of(*[finite] * 7, st.sampled_from([0.0, -0.0]))
            if "wide" in domains:  # a bias (`hints.Wide`): half its elements up to 2^9
                s = st.one_of(s, st.floats(-512, 512, width=width, allow_subnormal=False))
        else:
            finite = st.floats(-8, 8, width=width, allow_subnormal=False)
            s = st.one_of(*[finite] * 7, st.sampled_from([0.0, -0.0, math.nan]))
        if "positive" in domains:  # a scale: a zero would only be refused
            return s.map(lambda v: abs(v) if v != 0 else 1.0)
        return s.map(abs) if "nonneg" in domains else s
    if dt == np.bool_:
        return st.booleans()
    low, high = int_bounds(dtype)
    if "exponent" in domains:
        return st.integers(0, 3)
    if "index" in domains:
        return st.integers(-2, 1)
    lo = 1 if "positive" in domains else 0 if "nonneg" in domains else low
    s = st.integers(lo, high)
    return s.filter(lambda v: v != 0) if "nonzero" in domains else s
