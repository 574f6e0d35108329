"""Which fx nodes have effects, and which must therefore keep their place.

Rewriting is sound on a graph whose values are pure functions of their inputs. Three kinds of
node break that, and each is decided from what torch declares about the op, never from its
name or a tag alone:

* writes: in-place ops. An ATen overload writes an argument when its schema says so
  (`_schema.is_mutable`, an argument annotated `Tensor(a!)`); torch functions and methods
  written in place (`x.add_()`, `operator.iadd`, `setitem`, `inplace=True`, `out=`) write their
  first argument (or `out`).
* random draws: ops tagged `nondeterministic_seeded` (or torch's random functions) *whose
  randomness is in use*: `dropout(p, train=False)` and `scaled_dot_product_attention` with
  `dropout_p == 0` draw nothing and are pure, whatever their tag says.
* switches: calls torch marks side-effectful that change global state later nodes read (grad
  mode, autocast, profiler ranges). Their extent cannot be recovered from data flow; a graph
  with one raises `FxImportError` (see `frontends.fx.nodes.FxImportError`).

`plan` turns writes and draws into an `Order`: an in-place op on a fresh value (one only it
reads) is left to the importer, which writes its pure form. Any other write pins its storage:
every node that computes a view of the written tensor, or reads one, is imported opaque and
all pinned nodes and random draws keep their relative order (the importer chains them through
`Node.implicit`). The rest of the graph is rewritten around them.

Aliasing comes from schemas too: a node's output may share storage with its inputs when its
ATen schema annotates a return (`Tensor(a)`), for `operator.getitem`, for the composite ops
that return their input unchanged (eval dropout, `type_as`), and for any callable we cannot
look up (conservatively).
"""

from __future__ import annotations

import functools
import operator
from dataclasses import dataclass

import torch
from torch import fx

from frontends.fx.nodes import FxImportError, mutating

# Composite ops whose schema has no alias annotation but which return their input itself
# when there is nothing to do (eval dropout, a type_as to the same type).
_RETURNS_INPUT = {
    "dropout",
    "feature_dropout",
    "alpha_dropout",
    "feature_alpha_dropout",
    "type_as",
    "dropout1d",
    "dropout2d",
    "dropout3d",
}
# Modules whose output is a new tensor (they may still write in place: `inplace=True`).
_FRESH_MODULES = (
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.Linear,
    torch.nn.BatchNorm1d,
    torch.nn.BatchNorm2d,
    torch.nn.BatchNorm3d,
    torch.nn.LayerNorm,
    torch.nn.RMSNorm,
    torch.nn.ReLU,
    torch.nn.GELU,
    torch.nn.Tanh,
    torch.nn.Sigmoid,
    torch.nn.Softmax,
    torch.nn.LogSoftmax,
    torch.nn.Embedding,
    torch.nn.MaxPool1d,
    torch.nn.MaxPool2d,
    torch.nn.MaxPool3d,
    torch.nn.AvgPool2d,
    torch.nn.AdaptiveAvgPool1d,
    torch.nn.AdaptiveAvgPool2d,
    torch.nn.LeakyReLU,
    torch.nn.Hardsigmoid,
    torch.nn.ReLU6,
)
_DROPOUTS = {"dropout", "feature_dropout", "alpha_dropout", "feature_alpha_dropout"}
_ARG_ALIASES = {"training": "train"}  # F.dropout's keyword for ATen's `train`


@dataclass(frozen=True)
class Order:
    """What the importer must keep as it is.

    pinned: nodes imported opaque (they read or compute a view of written storage).
    chain: pinned nodes and random draws in graph order; each reads the previous one's output
        implicitly, so extraction and export keep the order.
    reasons: one line per write that pinned storage, for `report.extra["in_order"]`.
    unlowered: in-place ops on fresh values that could not be written pure (see `plan`).
    """

    pinned: frozenset[fx.Node]
    chain: tuple[fx.Node, ...]
    reasons: tuple[str, ...]
    unlowered: frozenset[fx.Node] = frozenset()


def plan(gm: fx.GraphModule, unlowered: frozenset[fx.Node] = frozenset()) -> Order:
    """The Order of `gm`. Raises FxImportError for a switch.

    unlowered: in-place ops the importer could not write as pure ops (no pure form, or an
    in-place flag only the bound arguments show, `F.relu(x, True)`); their first argument
    counts as written and its storage is pinned."""
    writes = {}
    for n in gm.graph.nodes:
        check_switch(n)
        target = written(n, _module(gm, n))
        if n in unlowered and target is None and n.args and isinstance(n.args[0], fx.Node):
            target = n.args[0]
        if target is not None:
            writes[n] = target
    draws = {n for n in gm.graph.nodes if random_draw(n, _module(gm, n))}
    shared = [n for n, t in writes.items() if n in unlowered or not fresh(t, n)]
    reasons = [
        f"{n.name}: in-place {_name(n)} on {writes[n].name}, which others may read" for n in shared
    ]
    pinned = _pin(gm, writes, shared, draws)
    chain = tuple(n for n in gm.graph.nodes if n in pinned or n in draws)
    if pinned:
        reasons.append(f"{len(pinned)} nodes that read or write that storage kept as they are")
    return Order(frozenset(pinned), chain, tuple(reasons), frozenset(unlowered))


def _pin(gm, writes: dict, shared: list, draws: set) -> set[fx.Node]:
    """Nodes that read or view the storage the `shared` writes write into. A write that ends
    up opaque itself (pinned, or a random draw) writes for real, so its storage is pinned too,
    to a fixpoint."""
    roots: set[fx.Node] = set()
    rooted: set[fx.Node] = set()
    pinned: set[fx.Node] = set()
    while shared:
        for n in shared:
            roots |= storage_roots(writes[n], gm, writes)
        rooted.update(shared)
        members = alias_closure(roots, gm, writes)
        pinned = {n for n in members if n.op.startswith("call_")}
        pinned |= {u for m in members for u in m.users if u.op != "output"}
        shared = [n for n in writes if (n in pinned or n in draws) and n not in rooted]
    return pinned


# ---- writes and aliasing -----------------------------------------------------------------------


def written(n: fx.Node, module=None) -> fx.Node | None:
    """The fx node whose tensor `n` writes in place, or None (not in place, or it writes
    something that is not a node of this graph)."""
    if n.op not in ("call_function", "call_method", "call_module") or not mutating(n, module):
        return None
    if isinstance(n.kwargs.get("out"), fx.Node):
        return n.kwargs["out"]
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        args = t._schema.arguments
        for i, a in enumerate(args):
            if a.alias_info is not None and a.alias_info.is_write:
                v = n.args[i] if i < len(n.args) else n.kwargs.get(a.name)
                return v if isinstance(v, fx.Node) else None
    first = n.args[0] if n.args else None
    return first if isinstance(first, fx.Node) else None


def fresh(x: fx.Node, writer: fx.Node) -> bool:
    """Can `writer`'s in-place write into `x` be written as a pure op? Only if `writer` is
    the one reader of `x` and `x` is a new tensor (computed, not a view of another)."""
    module = _module(x.graph.owning_module, x)
    return (
        x.op.startswith("call_")
        and set(x.users) == {writer}
        and not may_alias(x, module)
        and written(x, module) is None
    )


def may_alias(n: fx.Node, module=None) -> bool:
    """Might `n`'s output share storage with one of its inputs? (See the module doc.)"""
    if n.op == "call_module":
        return not isinstance(module, _FRESH_MODULES) or bool(getattr(module, "inplace", False))
    if n.op not in ("call_function", "call_method"):
        return False
    t = n.target
    if t is operator.getitem:
        return True
    if isinstance(t, torch._ops.OpOverload):
        if t._schema.name.split("::")[-1] in _RETURNS_INPUT:
            return True
        return any(r.alias_info is not None for r in t._schema.returns)
    name = _name(n)
    if name in _RETURNS_INPUT:
        return True
    schemas = _pure_schemas(name)
    return schemas is None or any(r.alias_info is not None for s in schemas for r in s.returns)


def storage_roots(x: fx.Node, gm: fx.GraphModule, writes: dict) -> set[fx.Node]:
    """The nodes that own the storage `x` may be a view of (x itself when it owns it).
    writes: in-place node -> the node it writes (its output is that storage too)."""
    roots, stack, seen = set(), [x], set()
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in writes:
            stack.append(writes[n])
        elif n.all_input_nodes and may_alias(n, _module(gm, n)):
            stack.extend(n.all_input_nodes)
        else:
            roots.add(n)
    return roots


def alias_closure(roots: set[fx.Node], gm: fx.GraphModule, writes: dict) -> set[fx.Node]:
    """`roots` and every node whose output may be a view of them (or is written into them)."""
    members, stack = set(), list(roots)
    while stack:
        n = stack.pop()
        if n in members:
            continue
        members.add(n)
        for u in n.users:
            if writes.get(u) is n or may_alias(u, _module(gm, u)):
                stack.append(u)
    return members


# ---- random draws and switches -------------------------------------------------------------


def random_draw(n: fx.Node, module=None) -> bool:
    """Does `n` draw random numbers (consume the generator's state) when it runs?"""
    if n.op == "call_module":
        return (
            module is not None
            and "Dropout" in type(module).__name__
            and module.training
            and getattr(module, "p", 0) != 0
        )
    if n.op not in ("call_function", "call_method"):
        return False
    t = n.target
    if isinstance(t, torch._ops.OpOverload):
        if torch.Tag.nondeterministic_seeded not in t.tags:
            return False
        return not _randomness_off(n, t._schema)
    from torch._library.utils import _RANDOM_FUNCTIONS

    if t in _RANDOM_FUNCTIONS:
        return True
    schemas = _pure_schemas(_name(n))
    seeded = [s for s in schemas or () if _tagged_seeded(_name(n), s)]
    return bool(seeded) and not _randomness_off(n, seeded[0])


def _randomness_off(n: fx.Node, schema) -> bool:
    """True when the op's own switch turns its randomness off: attention with `dropout_p == 0`,
    dropout with `train=False` or `p == 0` (ATen returns the input without drawing; see
    aten/src/ATen/native/Dropout.cpp). Other random ops always draw."""
    names = [a.name for a in schema.arguments]
    given = dict(zip(names, n.args))
    given.update({_ARG_ALIASES.get(k, k): v for k, v in n.kwargs.items()})

    def value(name):
        default = next(a.default_value for a in schema.arguments if a.name == name)
        v = given.get(name, default)
        return v if type(v) in (int, float, bool) else None  # a node or SymFloat: unknown

    if "dropout_p" in names:
        return value("dropout_p") == 0
    if schema.name.split("::")[-1] in _DROPOUTS:
        return value("train") is False or value("p") == 0
    return False


def check_switch(n: fx.Node) -> None:
    """Raise FxImportError for a call that changes global state later nodes read (grad mode,
    autocast, profiler ranges): the nodes it governs cannot be told from data flow."""
    if n.op != "call_function" or not n.is_impure(impure_random=False):
        return
    name = _name(n)
    if "assert" in name or "constrain" in name or written(n) is not None or random_draw(n):
        return
    raise FxImportError(f"{n.name}: {name} changes state that later nodes depend on")


# ---- helpers -------------------------------------------------------------------------------


def _module(gm, n: fx.Node):
    if n.op != "call_module" or gm is None:
        return None
    return gm.get_submodule(n.target)


def _name(n: fx.Node) -> str:
    t = n.target
    if isinstance(t, str):
        return t
    if isinstance(t, torch._ops.OpOverload):
        return str(t).removeprefix("aten.")
    return getattr(t, "__name__", str(t))


def _pure_schemas(name: str):
    """Schemas of the ATen overloads named `name` that write nothing (None if ATen has no op
    of that name), so a torch function or method can be judged by its ATen form."""
    packet = _packet(name)
    if packet is None:
        return None
    schemas = [getattr(packet, o)._schema for o in packet.overloads()]
    return [s for s in schemas if not s.is_mutable]


@functools.cache
def _packet(name: str):
    """The ATen OpOverloadPacket named `name` (`__add__` also as `add`), or None."""
    for candidate in (name, name.strip("_")):
        packet = getattr(torch.ops.aten, candidate, None) if candidate else None
        if isinstance(packet, torch._ops.OpOverloadPacket):
            return packet
    return None


def _tagged_seeded(name: str, schema) -> bool:
    packet = _packet(name)
    overload = getattr(packet, schema.overload_name or "default")
    return torch.Tag.nondeterministic_seeded in overload.tags
