"""Delta debugging: the smallest part of a failing configuration that still fails.

`ddmin` is Zeller and Hildebrandt's minimizing delta debugging algorithm (A. Zeller and
R. Hildebrandt, "Simplifying and Isolating Failure-Inducing Input", IEEE Transactions on
Software Engineering 28(2), 2002, Fig. 4): split the failing set into n parts; if one part
fails, go on with it (n = 2); else if the complement of one part fails, go on with that
(n - 1); else split finer (2n). The result is 1-minimal: removing any one element makes the
failure go away. With one culprit among n elements and no interactions it is a binary search,
at most 2 tests per halving: 2 * ceil(log2 n) tests. Culprit bisection runs it over the rules
that fired, then over the match sites of the culprit (`frontends.onnx.bisect`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Minimized(Generic[T]):
    """What `ddmin` found. items: the smallest failing subset found, in input order; tests:
    how many times the predicate ran (repeated subsets are answered from a cache); complete:
    False when `out_of_time` stopped the search (items then fail, but may not be minimal)."""

    items: tuple[T, ...]
    tests: int
    complete: bool


def ddmin(
    items: Sequence[T],
    fails: Callable[[tuple[T, ...]], bool],
    *,
    progress: Callable[[int, int], None] | None = None,
    out_of_time: Callable[[], bool] | None = None,
) -> Minimized[T]:
    """A 1-minimal subset of `items` for which `fails` holds (Zeller and Hildebrandt 2002).

    fails: the test, called with a subset in input order; True means the failure happens.
        `items` itself is assumed to fail (the caller checked) and is never tested; the empty
        subset is assumed to pass.
    progress: called after every test with (tests so far, size of the current candidate).
    out_of_time: asked before every test; True stops the search with the current candidate.
    Raises whatever `fails` raises.
    """
    cache: dict[frozenset[int], bool] = {}
    tests = 0

    def test(idx: list[int]) -> bool:
        nonlocal tests
        key = frozenset(idx)
        if key not in cache:
            cache[key] = bool(fails(tuple(items[i] for i in idx)))
            tests += 1
            if progress is not None:
                progress(tests, len(current))
        return cache[key]

    current, n = list(range(len(items))), 2
    while len(current) >= 2:
        parts = _split(current, n)
        found = None
        for part in parts:
            if out_of_time is not None and out_of_time():
                return Minimized(tuple(items[j] for j in current), tests, False)
            if test(part):
                found = (part, 2)
                break
        if found is None and n > 2:
            for part in parts:
                if out_of_time is not None and out_of_time():
                    return Minimized(tuple(items[j] for j in current), tests, False)
                drop = set(part)
                rest = [j for j in current if j not in drop]
                if test(rest):
                    found = (rest, max(n - 1, 2))
                    break
        if found is not None:
            current, n = found
        elif n < len(current):
            n = min(2 * n, len(current))
        else:
            break
    return Minimized(tuple(items[j] for j in current), tests, True)


def _split(idx: list[int], n: int) -> list[list[int]]:
    """`idx` in `n` contiguous parts of sizes differing by at most one (the first ones larger)."""
    size, extra = divmod(len(idx), n)
    parts, start = [], 0
    for k in range(n):
        end = start + size + (k < extra)
        parts.append(idx[start:end])
        start = end
    return parts
