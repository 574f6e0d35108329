"""`NodeCtx`: what an op's sampler sees of one pattern node while an example is drawn.

Each input slot is *known* (a child node's output, or a capture drawn earlier), *free* (a
leaf this node draws: the sampler proposes its shape with `put`) or *absent*. Each attribute
is fixed by the pattern (a literal, or a capture bound earlier) or free (the sampler proposes
a value with `attr`). Proposals pass through the guards' requests (`verify.hints`), so a
sampler only has to know its op.

The samplers register here (`sampler`, `SAMPLERS`), by op, and the leaves they draw are
`Leaf`s: the op modules (`verify.ops_basic`, ...) and the drawing (`verify.draw`) both build on
this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dsl.ir import Absent, Capture, Literal, OpNode
from verify import hints as H
from verify.dtypes import np_type
from verify.values import ints
from vocab.ops import NONE, OPS, REQUIRED, VARIADIC_SLOTS
from vocab.types import TensorType

SAMPLERS: dict[str, Callable[[NodeCtx], None]] = {}  # op -> sampler


# the samplers of ops no sampler names, the ops a rule file declares (`vocab.declared`): a
# body is any term, so a declared op is drawn as a guess that suits elementwise bodies, as a
# unary elementwise op (`unary`: one input) or a broadcasting one (`broadcast`: more), its
# attributes at their defaults
FALLBACKS: dict[str, Callable[[NodeCtx], None]] = {}


def sampler(*ops: str, fallback: str | None = None):
    """Register a sampler for `ops`: a function of a `NodeCtx` that puts every free input
    (`NodeCtx.put`) and sets every attribute (`NodeCtx.attr`); `fallback` also makes it the
    sampler of that kind of declared op (`FALLBACKS`)."""

    def deco(fn):
        for op in ops:
            SAMPLERS[op] = fn
        if fallback is not None:
            FALLBACKS[fallback] = fn
        return fn

    return deco


def sampler_of(op: str) -> Callable[[NodeCtx], None] | None:
    """The sampler of `op`: its own, or for an op a rule file declares the `FALLBACKS` one of
    its arity; None when there is none."""
    fn = SAMPLERS.get(op)
    spec = OPS.get(op) if fn is None else None
    if spec is not None and spec.declared:
        fn = FALLBACKS.get("unary" if spec.arity == 1 else "broadcast")
    return fn


@dataclass
class Leaf:
    """One leaf of the example. value: set for constants with fixed values (shape-like
    inputs, `Fill`, `CopyValues`), else drawn at the end; const: an initializer."""

    name: str
    dtype: int
    shape: tuple[int, ...] | None = None
    const: bool = False
    absent: bool = False
    value: np.ndarray | None = None
    uses: list[tuple[str, int]] = field(default_factory=list)
    copy_of: str | None = None
    domains: tuple[str, ...] = ()  # value domains requested for it (`hints.Positive`)

    @property
    def type(self) -> TensorType:
        """The leaf's tensor type (dtype, and shape once drawn)."""
        return TensorType(self.dtype, self.shape)


class NodeCtx:
    """One node being drawn. names: per slot, the input's name ("" if absent); types: per
    slot, its type once known (None while free or when absent)."""

    def __init__(self, gen, t: OpNode, inputs: list[str | None]):
        self.gen, self.t, self.op = gen, t, t.op
        self.spec = OPS.get(t.op)
        n = len(t.args)
        self.names: list[str] = [""] * n
        self.types: list[TensorType | None] = [None] * n
        self.pending: dict[int, Any] = {}
        self.attrs: dict[str, Any] = {}
        self._Leaf = Leaf
        for i, a in enumerate(t.args):
            self._slot(i, a, inputs[i])
        self.keep_type = any(
            isinstance(r, H.KeepType) and r.name == t.bind and _capture(t.args[0]) == r.inp
            for r in gen.reqs.get(t.bind or "", ())
        )

    def _slot(self, i: int, a, child: str | None) -> None:
        g = self.gen
        if child is not None:
            self.names[i], self.types[i] = child, g.types[child]
            return
        if isinstance(a, Absent):
            return
        name = a.name if isinstance(a, Capture) else None
        leaf = g.leaves.get(name) if name else None
        if leaf is None and name in g.types:  # an `Op@name` bound earlier
            self.names[i], self.types[i] = name, g.types[name]
            return
        if leaf is None:
            var = g.plan.var_of(name) if name else g.plan.find(g.plan.slot_var[(id(self.t), i)])
            leaf = self._Leaf(name or g.fresh("w"), g.dtype_of(var))
            g.leaves[leaf.name] = leaf
            # a capture in a variadic input's slots is one of its inputs, always there
            optional = i >= self.spec.n_required and not (
                self.spec.variadic and i >= self.spec.arity - VARIADIC_SLOTS
            )
            if optional and not g.reqs.get(leaf.name) and g.draw(ints(0, 2), "absent") == 2:
                leaf.absent = True
        leaf.uses.append((self.op, i))
        if leaf.absent:
            return
        self.names[i] = leaf.name
        if leaf.shape is None:
            self.pending[i] = leaf
        else:
            self.types[i] = leaf.type

    # ---- what samplers read ------------------------------------------------------------------

    def draw(self, strategy, label: str | None = None):
        """Draw a value from Hypothesis `strategy` (`label` names it in a shrunk example)."""
        return self.gen.draw(strategy, label)

    def pick(self, options, label: str | None = None):
        """One of `options` (shrinking towards the first)."""
        return self.gen.pick(options, label)

    def free(self, i: int) -> bool:
        """True if slot i is a leaf this node still has to `put`."""
        return i in self.pending and self.pending[i].shape is None

    def present(self, i: int) -> bool:
        """True if slot i has an input (not absent or past the end)."""
        return i < len(self.names) and self.names[i] != ""

    def shape(self, i: int) -> tuple[int, ...] | None:
        """The shape of slot i if known (None while free or when absent)."""
        t = self.types[i] if i < len(self.types) else None
        return None if t is None else tuple(t.shape)

    def dtype(self, i: int) -> int:
        """The dtype (ONNX element type) chosen for input slot i."""
        g = self.gen
        return g.dtype_of(g.plan.slot_var[(id(self.t), i)])

    @property
    def out_dtype(self) -> int:
        """The dtype (ONNX element type) chosen for the node's output."""
        g = self.gen
        return g.dtype_of(g.plan.slot_var[(id(self.t), -1)])

    def value(self, i: int):
        """The constant value of slot i, if it is a constant already drawn with values."""
        return self.gen.const_value(self.names[i]) if self.present(i) else None

    # ---- what samplers write -----------------------------------------------------------------

    def put(self, i: int, shape, value=None) -> TensorType | None:
        """Propose `shape` (and for a shape-like input, its `value`, which makes it a
        constant) for free slot i; returns the slot's final type. A known or absent slot is
        left as it is."""
        leaf = self.pending.get(i)
        if leaf is None:
            return self.types[i] if i < len(self.types) else None
        if leaf.shape is None:
            leaf.shape = tuple(int(d) for d in shape)
            if value is not None:
                leaf.value = np.asarray(value).astype(np_type(leaf.dtype)).reshape(leaf.shape)
                leaf.const = True
            self.gen.finalize(leaf)
        for j, other in self.pending.items():  # the same capture in several slots
            if other is leaf:
                self.types[j] = leaf.type
        self.gen.types[leaf.name] = leaf.type
        return leaf.type

    def attr(self, name: str, propose: Callable[[], Any] | Any = None) -> Any:
        """The value of attribute `name`: the pattern's literal, a capture's earlier value, or
        else `propose()` (after the guards' requests, e.g. `identity-perm`)."""
        if name in self.attrs:
            return self.attrs[name]
        v = dict(self.t.attrs)[name]
        form = OPS.get(self.op, self.gen.opset)
        if isinstance(v, Literal):
            value = v.value
        elif isinstance(v, Capture) and v.name in self.gen.attrs:
            value = self.gen.attrs[v.name]
        elif form is not None and not form.has_attr(name):  # not in the opset's form (Reshape-13
            default = self.spec.attr_index[name].default  # has no allowzero): its default
            value = None if default in (NONE, REQUIRED) else default
            if isinstance(v, Capture):
                self.gen.attrs[v.name] = value
        else:
            value = propose() if callable(propose) else propose
            if isinstance(v, Capture):
                reqs = self.gen.reqs.get(v.name, ())
                if value is not None and any(isinstance(r, H.IdentityPerm) for r in reqs):
                    value = tuple(range(len(value)))
                self.gen.attrs[v.name] = value
        self.attrs[name] = value
        return value

    def wants(self, i: int, kind: type) -> bool:
        """True if the leaf at slot i has a request of type `kind` (e.g. `hints.NoZero`)."""
        name = self.names[i] if i < len(self.names) else ""
        return any(isinstance(r, kind) and r.name == name for r in self.gen.reqs.get(name, ()))

    def filled(self, i: int):
        """The value a `Fill` request gives every element of the leaf at slot i, or None."""
        name = self.names[i] if i < len(self.names) else ""
        fills = [r for r in self.gen.reqs.get(name, ()) if isinstance(r, H.Fill) and r.name == name]
        return fills[0].value if fills else None

    def is_fixed(self, name: str) -> bool:
        """True if attribute `name` is not free: a literal or an already bound capture."""
        v = dict(self.t.attrs)[name]
        return isinstance(v, Literal) or (isinstance(v, Capture) and v.name in self.gen.attrs)

    def finish(self) -> None:
        """Put the slots and set the attributes the sampler left alone (defaults)."""
        for i in list(self.pending):
            if self.free(i):
                self.put(
                    i,
                    self.gen.compatible(
                        [s for s in map(self.shape, range(len(self.types))) if s is not None]
                    ),
                )
        for a in self.spec.attrs:
            if a.name not in self.attrs:
                if a.default is REQUIRED and not self.is_fixed(a.name):
                    raise RuntimeError(f"the {self.op} sampler left required :{a.name} unset")
                self.attr(a.name, None if a.default in (NONE, REQUIRED) else a.default)

    def attr_tuple(self) -> tuple[tuple[str, Any], ...]:
        """The node's attributes as (name, value) pairs, in op-table order."""
        return tuple((a.name, self.attrs[a.name]) for a in self.spec.attrs)


def _capture(t) -> str | None:
    return t.name if isinstance(t, Capture) else None
