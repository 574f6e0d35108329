"""How the two sides' outputs are compared.

- Integers and bools: exactly.
- Floats, for an `exact` rule whose ops all compute each element on its own (no sums whose
  order a kernel may choose: the op table's cost classes `matmul`, `gemm`, `conv`, `reduce`,
  `normalize`, `pool`): exactly, bit for bit, except that every NaN equals every NaN; a zero
  must keep its sign (-0.0 against +0.0 fails: 1 / x tells them apart, and
  patterns/algebra/arith.rules keeps the rules that change it, such as x + 0.0 -> x, in class
  `reassoc`, as GCC's -fno-signed-zeros).
- Other floats: the numeric class's tolerance from `engine.optimize.TOLERANCES` (the
  optimizer's own output check), scaled by the magnitude of the computation:
  `|a - b| <= atol + rtol * max(|b|, S)`, S the largest finite magnitude among the example's
  inputs and intermediate values. Rounding errors of a regrouped sum are proportional to its
  terms, not to its result: (x + b) * s and x * s + b * s differ by about eps * |x * s| even
  when the result is near 0. NaN equals NaN; an infinity only equals itself. An `exact`
  rule gets no absolute floor (atol 0): its sides differ only by the order of sums, whose
  error scales with S, and a floor let `ReduceSum(x + 1e-7) -> ReduceSum(x)` pass (it is
  wrong by 4e-7 for x = 0, all of its result).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx import TensorProto

from engine.optimize import TOLERANCES
from verify.instance import op_names
from vocab.ops import OPS

INEXACT_COSTS = frozenset({"matmul", "gemm", "conv", "reduce", "normalize", "pool"})
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}


def mode_of(rule) -> str:
    """`bitwise` for an exact rule whose ops allow it, else `scaled` (see module doc)."""
    ops = op_names(rule.lhs) | op_names(rule.rhs)
    inexact = any(OPS.get(op).cost in INEXACT_COSTS for op in ops)
    return "bitwise" if rule.fp == "exact" and not inexact else "scaled"


@dataclass(frozen=True)
class Tolerance:
    """rtol/atol of one comparison; both 0 means exact."""

    rtol: float = 0.0
    atol: float = 0.0
    # a `quant` rule's bound: the largest |a-b| per element (an array that broadcasts to the
    # output), in place of rtol and atol
    limit: Any = field(default=None, compare=False)

    def __str__(self) -> str:
        if self.limit is not None:
            return "|a-b| <= the rule's bound, per element"
        if not self.rtol and not self.atol:
            return "exact (NaN == NaN; -0.0 != +0.0)"
        return f"|a-b| <= {self.atol:g} + {self.rtol:g} * max(|b|, S)"


def tolerance(mode: str, fp: str, elem_type: int) -> Tolerance:
    """The tolerance for outputs of ONNX `elem_type` under `mode` and numeric class `fp`."""
    if mode == "bitwise" or elem_type not in FLOAT_TYPES:
        return Tolerance()
    rtol, atol = TOLERANCES[fp].get(elem_type, (0.0, 0.0))
    if fp == "exact":
        atol = 0.0  # an exact rule regroups sums at most: its error scales with S (module doc)
    return Tolerance(rtol, atol)


@dataclass(frozen=True)
class Diff:
    """One comparison: verdict, max absolute and relative error, and why it failed."""

    ok: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    reason: str = ""


def compare(got: np.ndarray, want: np.ndarray, tol: Tolerance, scale: float = 0.0) -> Diff:
    """Compare `got` against `want` (see module doc). `scale` is S."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return Diff(False, np.inf, np.inf, f"shape {got.shape} != {want.shape}")
    if got.dtype != want.dtype:
        return Diff(False, np.inf, np.inf, f"dtype {got.dtype} != {want.dtype}")
    if got.size == 0:
        return Diff(True)
    if not np.issubdtype(want.dtype, np.floating):
        if np.array_equal(got, want):
            return Diff(True)
        g, w = got.astype(object).ravel(), want.astype(object).ravel()  # exact, no overflow
        errs = [abs(a - b) for a, b in zip(g, w)]
        rel = max(e / max(abs(a), abs(b)) for e, a, b in zip(errs, g, w) if e)
        ok = False
        if tol.limit is not None:  # a quant rule's bound on integer outputs: in levels
            bound = np.broadcast_to(np.asarray(tol.limit, np.float64), want.shape).ravel()
            ok = all(float(e) <= b for e, b in zip(errs, bound))
        return Diff(ok, float(max(errs)), float(rel), "" if ok else "values differ")
    g, w = got.astype(np.float64), want.astype(np.float64)
    exact = tol.limit is None and not tol.rtol and not tol.atol
    if exact and np.any((g == 0) & (w == 0) & (np.signbit(g) != np.signbit(w))):
        return Diff(False, 0.0, 0.0, "the sign of a zero differs (-0.0 against +0.0)")
    with np.errstate(invalid="ignore", over="ignore"):
        equal = (g == w) | (np.isnan(g) & np.isnan(w))
        err = np.where(equal, 0.0, np.abs(g - w))
        err = np.where(np.isnan(err), np.inf, err)
        rel = err / np.maximum(np.maximum(np.abs(w), np.abs(g)), np.finfo(np.float64).tiny)
        rel = np.where(equal, 0.0, np.where(np.isnan(rel), np.inf, rel))  # inf / inf
        bound = tol.atol + tol.rtol * np.maximum(np.abs(w), scale)
        if tol.limit is not None:
            bound = np.broadcast_to(np.asarray(tol.limit, np.float64), w.shape)
        ok = bool(np.all(equal | (err <= bound)))
    max_rel = float(np.max(rel))
    return Diff(ok, float(np.max(err)), max_rel, "" if ok else "values differ")


def scale_of(*value_maps: dict) -> float:
    """S: the largest finite magnitude among float arrays in the given name -> value maps."""
    s = 0.0
    for values in value_maps:
        for v in values.values():
            a = np.asarray(v) if v is not None else None
            if a is not None and a.size and np.issubdtype(a.dtype, np.floating):
                finite = np.abs(a[np.isfinite(a)].astype(np.float64))
                if finite.size:
                    s = max(s, float(finite.max()))
    return s


def worst(diffs: list[Diff]) -> Diff:
    """The failing diff with the largest error, else the largest error among passing ones."""
    if not diffs:
        return Diff(True)
    bad = [d for d in diffs if not d.ok]
    return max(bad or diffs, key=lambda d: (d.max_abs, d.max_rel))
