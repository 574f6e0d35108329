"""Drawing one example of a pattern: opset, dtypes, shapes, attributes, constants and values.

`Gen.draw()` walks a rule's left side bottom-up. Each operator node is handed to the
*sampler* of its op (`verify.node.sampler_of`, filled by `verify.ops_basic`, `verify.ops_nn` and
`verify.ops_movement`): the sampler knows what makes the op valid (Transpose's perm is a
permutation of the input's rank, MatMul's inner dimensions agree, ...) and proposes shapes for
the node's free inputs, values for its shape-like inputs (Reshape's shape, Squeeze's axes) and
values for its free attributes. Proposals then pass through the guards' requests
(`verify.hints`), and the node's output type comes from the engine's own shape rules
(`engine.infer.infer_type`).

Everything is drawn from Hypothesis's `data` object, so a failing example shrinks: towards
float32, opset 18, rank 0, size-1 dimensions, default attributes and small values.

A *leaf* is a term capture (drawn once, however often the pattern uses it) or a wildcard in
an input slot. A leaf in an optional slot may be drawn absent. Shapes of independent leaves
are drawn as broadcasts of one per-example *universe* shape (rank 0 to 5, with size-1 and,
rarely, size-0 dimensions), so elementwise patterns are valid without rejection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import assume

from dsl.ir import OpNode, Term
from engine.infer import infer_type
from verify import hints as H
from verify import ops_basic, ops_movement, ops_nn  # noqa: F401  (registers their samplers)
from verify.dtypes import FOUR_BIT, plan_dtypes
from verify.node import Leaf, NodeCtx, sampler_of
from verify.steer import MAX_RANK, Steer
from verify.sweep import SWEPT_4BIT, SWEPT_DTYPES
from verify.values import Values, ints, sampled
from vocab.types import TensorType

MAX_ELEMENTS = 256
OPSETS = (18, 19, 20, 21, 13, 14, 15, 16, 17)  # shrinking order: 18 first
# dimension sizes, in shrinking order; size 0 is rare (every tensor using it is empty)
_DIMS = (1,) * 6 + (2,) * 6 + (3,) * 6 + (4,) * 4 + (5,) * 2 + (0,)


LONGEST_DIM = 64  # the largest dimension `long_dims` draws (MAX_ELEMENTS cuts the others)


def long_dims(rule) -> tuple[int, ...]:
    """One past each integer constant of `rule` (its attributes' and guards' literals, a list's
    items too) that lies beyond `_DIMS` and within LONGEST_DIM: a rule right for axes up to
    its constants only (`ReduceMax(Slice(x, 0, 8)) -> ReduceMax(x)`) passed on the small
    dimensions drawn otherwise."""
    found: set[int] = set()

    def take(v) -> None:
        if isinstance(v, bool):
            return
        if isinstance(v, int) and max(_DIMS) <= v < LONGEST_DIM:
            found.add(v + 1)
        elif isinstance(v, tuple):
            for x in v:
                take(x)

    def walk(t) -> None:
        if isinstance(t, OpNode):
            for _, a in t.attrs:
                take(getattr(a, "value", None))
            for a in t.args:
                walk(a)

    for t in (rule.lhs, rule.rhs, *rule.roots, *rule.results):
        walk(t)
    for g in rule.guards:
        for a in g.args:
            take(getattr(a, "value", None))
    return tuple(sorted(found))


@dataclass(frozen=True)
class DrawnNode:
    """One drawn op node: input names ("" for absent), output name, canonical attributes
    (op-table order, as the engine's importer fills them in) and output type."""

    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: tuple[tuple[str, Any], ...]
    type: TensorType


@dataclass
class Example:
    """A drawn left side: its opset, leaves (graph inputs and initializers), nodes in
    topological order, root output name, and attribute captures' values."""

    opset: int
    leaves: dict[str, Leaf]
    nodes: list[DrawnNode]
    root: str
    attrs: dict[str, Any]
    types: dict[str, TensorType]
    output_of: dict[int, str]
    roots: tuple[str, ...] = ()  # a multi-root rule's other roots' outputs


class Gen(Steer, Values):
    """Draws one `Example` of pattern `lhs` from Hypothesis `data`.

    reqs: the guards' requests (`verify.hints.requests`). values: `full` (every float,
    NaN, infinities, -0.0 and subnormals included) or `bounded` (finite |v| <= 8, plus NaN and
    signed zeros; for comparisons with a tolerance, where huge values make any regrouping of
    sums overflow or cancel). lo_opset: the lowest opset every op of the rule exists at.
    long_dims: dimension sizes beyond `_DIMS` to draw too (`long_dims`: one past each integer
    constant of the rule, so that a Slice to 8 meets an axis of 9).
    What the draws depend on is only `data`, never state learnt while running (such as
    onnxruntime's missing kernels), so that a seed always replays the same examples. Calls
    `hypothesis.assume(False)` when the drawn choices make an invalid node.
    """

    def __init__(
        self,
        data,
        lhs: Term,
        reqs,
        values: str = "full",
        lo_opset: int = 13,
        roots=(),
        long_dims: tuple[int, ...] = (),
    ):
        self.data, self.lhs, self.values_mode = data, lhs, values
        # `_DIMS` and, drawn rarely (shrinking last), sizes past the rule's own constants
        extra = [d for d in long_dims if d not in _DIMS]  # about 1 draw in 5 in all
        self.dims = _DIMS + tuple(d for d in extra for _ in range(max(1, 6 // len(extra))))
        self.roots = tuple(roots)  # a multi-root rule's other roots, drawn after `lhs`
        self.lo_opset = lo_opset
        self.reqs: dict[str, list[H.Request]] = {}
        for r in reqs:  # an ordered de-duplication: a set's order changes with PYTHONHASHSEED
            names = dict.fromkeys(
                [r.name, *(getattr(r, f, None) for f in ("big", "source", "of", "inp"))]
            )
            for name in names:
                if name:
                    self.reqs.setdefault(name, []).append(r)
        self.leaves: dict[str, Leaf] = {}
        self.types: dict[str, TensorType] = {}
        self.attrs: dict[str, Any] = {}
        self.nodes: list[DrawnNode] = []
        self.output_of: dict[int, str] = {}  # id() of a pattern node -> its drawn output
        self._fresh = 0

    def draw(self, strategy, label: str | None = None):
        """Draw a value from Hypothesis `strategy` (`label` names it in a shrunk example)."""
        return self.data.draw(strategy, label=label)

    def pick(self, options, label: str | None = None):
        """One of `options` (shrinking towards the first)."""
        return self.data.draw(sampled(tuple(options)), label=label)

    # ---- the example -------------------------------------------------------------------------

    def example(self) -> Example:
        """Draw the whole example (see class doc)."""
        opsets = [o for o in OPSETS if o >= self.lo_opset] or [self.lo_opset]
        self.opset = self.pick(opsets, "opset")
        self._choose_dtypes()
        self.universe = self.new_shape(self.draw(ints(0, MAX_RANK), "rank"))
        root = self.node(self.lhs)
        others = tuple(self.node(t) for t in self.roots)
        self._draw_values()
        return Example(
            self.opset,
            self.leaves,
            self.nodes,
            root,
            self.attrs,
            self.types,
            self.output_of,
            others,
        )

    def _choose_dtypes(self) -> None:
        plan, self.plan_nodes = plan_dtypes(self.lhs, self.opset, self.roots)
        for rs in self.reqs.values():
            for r in rs:
                _dtype_request(plan, r)
        chosen: dict[int, int] = {}
        for v in plan.roots():
            options = plan.choices(v, chosen, ())
            if self.values_mode != "grid4":  # 4-bit types only where that check asks
                options = [o for o in options if o not in FOUR_BIT]
            assume(options)
            if self.values_mode == "grid":  # `verify.sweep`: 8-bit integers, where allowed
                options = [o for o in options if o in SWEPT_DTYPES] or options
            if self.values_mode == "grid4":  # 4-bit integers, where allowed
                options = [o for o in options if o in SWEPT_4BIT] or options
            chosen[v] = self.pick(options, "dtype")
        if self.values_mode == "grid4":  # an example without a 4-bit value sweeps nothing new
            assume(any(d in FOUR_BIT for d in chosen.values()))
        self.plan, self.chosen = plan, chosen

    def dtype_of(self, var: int) -> int:
        """The dtype chosen for dtype-plan variable `var` (its union-find root's choice)."""
        return self.chosen[self.plan.find(var)]

    def node(self, t: OpNode) -> str:
        """Draw node `t` (children first); returns its output name."""
        inputs = [self.node(a) if isinstance(a, OpNode) else None for a in t.args]
        sample = sampler_of(t.op)
        if sample is None:
            raise Unsupported(f"no example generator for operator {t.op}")
        ctx = NodeCtx(self, t, inputs)
        sample(ctx)
        ctx.finish()
        values = tuple(self.const_value(n) for n in ctx.names)
        typ = infer_type(t.op, ctx.attr_tuple(), tuple(ctx.types), values)
        assume(typ.shape is not None and typ.static and typ.dtype)
        assume(typ.numel <= 4 * MAX_ELEMENTS)
        out = t.bind or self.fresh("n")
        self.types[out] = typ
        self.nodes.append(DrawnNode(t.op, tuple(ctx.names), out, ctx.attr_tuple(), typ))
        self.output_of[id(t)] = out
        return out

    def fresh(self, prefix: str) -> str:
        """A new name `_{prefix}N` for an uncaptured leaf or node (N counts up per example)."""
        self._fresh += 1
        return f"_{prefix}{self._fresh}"

    def const_value(self, name: str):
        """The value of constant leaf `name` if already fixed, else None (also for inputs)."""
        leaf = self.leaves.get(name)
        return leaf.value if leaf is not None and leaf.const and not leaf.absent else None

    # ---- shapes ------------------------------------------------------------------------------

    def dim(self) -> int:
        """A dimension size from `_DIMS` (0 to 5, mostly 1 to 3; shrinks towards 1), or, about
        1 in 5 draws, one of the rule's `long_dims`."""
        return self.pick(self.dims, "dim")

    def new_shape(self, rank: int) -> tuple[int, ...]:
        """A drawn shape of `rank` dims, its largest dims cut to 1 or 2 until it has at most
        `MAX_ELEMENTS` elements."""
        shape = [self.dim() for _ in range(rank)]
        while math.prod(shape) > MAX_ELEMENTS:
            shape[shape.index(max(shape))] = 1 if max(shape) <= 2 else 2
        return tuple(shape)

    def nonscalar_shape(self) -> tuple[int, ...]:
        """`sub_shape()`, or one drawn dimension where that is a scalar: for an op over an
        axis (Softmax, ArgMax, TopK, ...), whose input has rank 1 at least."""
        return self.sub_shape() or (self.dim(),)

    def sub_shape(self, base: tuple[int, ...] | None = None) -> tuple[int, ...]:
        """A shape that broadcasts into `base` (the universe by default): a suffix of it,
        with some dimensions set to 1."""
        base = self.universe if base is None else base
        drop = base and self.draw(ints(0, 3), "drop axes") == 3  # mostly all axes
        k = len(base) - (self.draw(ints(1, len(base)), "dropped") if drop else 0)
        suffix = base[len(base) - k :]
        return tuple(1 if d != 1 and self.draw(ints(0, 3), "to 1") == 3 else d for d in suffix)

    def compatible(self, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        """A shape that broadcasts with all of `shapes`: mostly one that broadcasts into
        their broadcast, sometimes a bigger one (more leading axes, size-1 axes grown)."""
        if not shapes:
            return self.sub_shape()
        try:
            base = tuple(int(d) for d in np.broadcast_shapes(*shapes))
        except ValueError:
            return self.sub_shape()
        if self.draw(ints(0, 3), "grow") < 3:
            return self.sub_shape(base)
        extra = self.draw(ints(0, max(0, MAX_RANK - len(base))), "rank")
        grown = tuple(self.dim() if d == 1 else d for d in base)
        return self.new_shape(extra) + grown


class Unsupported(Exception):
    """The verifier cannot draw examples for this rule (e.g. no generator for an op)."""


def _dtype_request(plan, r) -> None:
    a = plan.var_of(r.name)
    if isinstance(r, H.SameDtype):
        b = plan.var_of(r.other)
        if a is not None and b is not None:
            plan.union(a, b)
    elif isinstance(r, H.DtypeIn) and a is not None:
        plan.restrict(a, r.dtypes)
    elif isinstance(r, H.DtypeFrom) and a is not None and plan.var_of(r.source) is not None:
        plan.depends[a] = (plan.var_of(r.source), r.fn)
