"""Steering a drawn leaf by the guards' requests (`verify.hints`).

`Steer.finalize` runs when a sampler has proposed a leaf's shape: it fixes the rank
(`Rank`, `RankAtLeast`) and a dimension's multiple (`DimMultiple`), then the leaf's relations
to captures drawn before it (`Within`, `Beyond`, `KeepType`), then its own shape
(`OneElement`, `Many`, `ChannelOf`, `CopyValues`) and role (`Const`, `Input`, `Fill`). A
request whose other capture is not drawn yet is applied when that one is drawn, from its side.
`verify.draw.Gen` mixes this in.
"""

from __future__ import annotations

import math

from verify import hints as H
from verify.values import BOOLS

MAX_RANK = 5


class Steer:
    """Request handling for `verify.draw.Gen`, which provides `draw`, `pick`, `reqs`, `types`,
    `leaves`, `new_shape` and `filled`."""

    def finalize(self, leaf) -> None:
        """Apply the guards' requests to `leaf`, whose shape a sampler just proposed: its
        rank, then its relations to other captures, then its own shape and role."""
        reqs = self.reqs.get(leaf.name, ())
        mine = {type(r): r for r in reqs if r.name == leaf.name}
        shape = leaf.shape
        rank = mine.get(H.Rank) or mine.get(H.RankAtLeast)
        if rank is not None and (isinstance(rank, H.Rank) or len(shape) < rank.n):
            shape = self._with_rank(shape, rank.n)
        if H.OneElement in mine:
            shape = (1,) * len(shape)
        multiple = mine.get(H.DimMultiple)
        if multiple is not None and shape:
            shape = list(shape)
            axis = multiple.axis % len(shape)
            shape[axis] = multiple.m * max(1, round(shape[axis] / multiple.m))
            shape = tuple(shape)
        shape = self._relations(leaf, shape, reqs, ones=H.OneElement in mine)
        if H.Many in mine and math.prod(shape) <= 1:
            shape = self._many(
                shape,
                [
                    self.types[r.big].shape
                    for r in reqs
                    if isinstance(r, H.Within) and r.name == leaf.name and r.big in self.types
                ],
            )
        if H.ChannelOf in mine and mine[H.ChannelOf].of in self.types:
            shape = self._channel_shape(self.types[mine[H.ChannelOf].of].shape, shape)
        copy = mine.get(H.CopyValues)
        if copy is not None and self._drawn(copy.source):
            shape, leaf.copy_of = self.leaves[copy.source].shape, copy.source
        if tuple(shape) != leaf.shape and leaf.value is not None:
            leaf.value = None
        leaf.shape = tuple(shape)
        self._role(leaf, mine)

    def _relations(self, leaf, shape, reqs, ones: bool) -> tuple[int, ...]:
        """`shape` adjusted to the `Within`, `Beyond` and `KeepType` requests naming `leaf`
        whose other capture is drawn already."""
        for r in reqs:
            big, small = getattr(r, "big", None), r.name
            if isinstance(r, H.Within) and small == leaf.name and big in self.types:
                shape = _shrink(shape, self.types[big].shape)
            elif isinstance(r, H.Within) and big == leaf.name and small in self.types:
                shape = _grow(shape, self.types[small].shape)
            elif isinstance(r, H.Beyond) and small == leaf.name and big in self.types:
                shape = self._beyond(self.types[big].shape, ones)
            elif isinstance(r, H.Beyond) and big == leaf.name and small in self.types:
                shape = self._below(self.types[small].shape)
            elif isinstance(r, H.KeepType) and leaf.name in (r.name, r.inp):
                other = r.inp if leaf.name == r.name else r.name
                shape = self.leaves[other].shape if self._drawn(other) else shape
        return tuple(shape)

    def _role(self, leaf, mine: dict) -> None:
        """Constant or input, and the values a `Fill` gives (set now, so that the node's
        type is inferred from them)."""
        if H.Fill in mine:
            leaf.value = self.filled(leaf, mine[H.Fill].value)
        if H.Positive in mine:
            leaf.domains = ("positive",)
        if H.Wide in mine:
            leaf.domains = (*leaf.domains, "wide")
        if H.DeadChannel in mine:
            leaf.domains = (*leaf.domains, "dead-channel")
        if H.Const in mine or H.Fill in mine or leaf.copy_of:
            leaf.const = True
        if H.Input in mine and leaf.value is None:
            leaf.const = False
        elif not leaf.const and leaf.value is None:
            leaf.const = self.draw(BOOLS, f"{leaf.name} is a constant")

    def _many(self, shape, bigs) -> tuple[int, ...]:
        """`shape` with more than one element, still broadcasting into every one of `bigs`."""
        if bigs and bigs[0]:
            b = tuple(bigs[0])
            axes = [
                i
                for i in range(len(b))
                if b[i] > 1
                and all(len(o) >= len(b) - i and o[len(o) - len(b) + i] == b[i] for o in bigs)
            ]
            if axes:
                i = self.pick(axes, "axis")
                k = max(len(shape), len(b) - i)
                out = [1] * (k - len(shape)) + list(shape)
                out[k - (len(b) - i)] = b[i]
                return tuple(out)
        return tuple(shape[:-1]) + (2,)

    def _drawn(self, name: str) -> bool:
        leaf = self.leaves.get(name)
        return leaf is not None and leaf.shape is not None and not leaf.absent

    def _with_rank(self, shape, n: int) -> tuple[int, ...]:
        if len(shape) >= n:
            return tuple(shape[len(shape) - n :])
        return self.new_shape(n - len(shape)) + tuple(shape)

    def _beyond(self, x, ones: bool = False) -> tuple[int, ...]:
        """A shape that broadcasts with `x` into a bigger shape than `x` (with `ones`, one
        of size-1 axes only: one more axis than `x`)."""
        x = tuple(x)
        if ones:
            return (1,) * (len(x) + 1)
        unit = [i for i, d in enumerate(x) if d == 1]
        if unit and (len(x) >= MAX_RANK or self.draw(BOOLS, "grow an axis")):
            i = self.pick(unit, "axis")
            return x[:i] + (2,) + x[i + 1 :]
        return (self.pick((2, 3), "new axis"),) + x

    def _below(self, z) -> tuple[int, ...]:
        """A shape that `z` broadcasts with into a bigger shape than itself."""
        z = tuple(z)
        big = [i for i, d in enumerate(z) if d != 1]
        if not big:
            return z
        i = self.pick(big, "axis")
        return z[:i] + (1,) + z[i + 1 :]

    def _channel_shape(self, y, shape) -> tuple[int, ...]:
        if y is None or len(y) < 3:
            return shape
        ones = (1,) * (len(y) - 2)
        return (1, y[1]) + ones if self.draw(BOOLS, "leading 1") else (y[1],) + ones

    # ---- values ------------------------------------------------------------------------------


def _shrink(shape, big) -> tuple[int, ...]:
    """`shape` cut down to broadcast into `big`: at most its rank, unequal sizes set to 1."""
    s = tuple(shape)[max(0, len(shape) - len(big)) :]
    aligned = tuple(big)[len(big) - len(s) :]
    return tuple(d if d == b else 1 for d, b in zip(s, aligned))


def _grow(shape, small) -> tuple[int, ...]:
    """`shape` grown so that `small` broadcasts into it: at least its rank, its sizes kept."""
    k = max(len(shape), len(small))
    s = (1,) * (k - len(shape)) + tuple(shape)
    sm = (1,) * (k - len(small)) + tuple(small)
    return tuple(d if m == 1 else m for d, m in zip(s, sm))
