"""List captures: the rules that a rule with `@xs...` stands for.

A list capture binds a run of a variadic input's slots (`vocab.ops.VARIADIC_SLOTS` of them:
`(Concat @xs... (Concat @ys... :axis @a) @zs... :axis @a)`). egglog matches fixed slots, so a
rule with lists (a template) is run as rules whose lists have one capture per item,
`xs.0`, `xs.1`, ... (`Rule.items`):

- `engine_rules`: the rules the engine runs. A list that ends its op's inputs is open: it gets
  every remaining slot, and an item bound to an absent slot is not part of the list (the host
  step reads the list, `engine.apply`). A list followed by other inputs gets each item count
  that fits, one rule per count (8 rules for the flattening above, not one per combination of
  the three lengths). Results spread a list (`(Concat @xs... @ys...)`) when the match is
  applied; a result with more inputs than the slots is not built.
- `concrete`: the rule for given item counts, every item a present input and every spread
  written out: what `verify` draws examples of, at random counts.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping

from dsl.ir import Absent, Capture, ListCapture, OpNode, Rule, Term
from vocab.ops import OPS, VARIADIC_SLOTS


def item_names(name: str, n: int) -> tuple[str, ...]:
    """The captures of the first `n` items of list `name`: `name.0`, `name.1`, ..."""
    return tuple(f"{name}.{k}" for k in range(n))


def max_items(rule: Rule) -> dict[str, int]:
    """The most items each list of `rule` can bind: the variadic slots its op has, less the
    other inputs written beside it."""
    out: dict[str, int] = {}
    for node in _list_nodes(rule.lhs):
        spec = OPS.get(node.op)
        free = spec.arity - sum(not isinstance(a, ListCapture) for a in node.args)
        for a in node.args:
            if isinstance(a, ListCapture):
                out[a.name] = min(free, VARIADIC_SLOTS)
    return out


def concrete(rule: Rule, counts: dict[str, int]) -> Rule | None:
    """`rule` with list `name` bound to `counts[name]` present items, on both sides: patterns
    and results list the items (`Capture("xs.0")`, ...) and pad the rest with `Absent`.
    Guards keep their `ListCapture` arguments, read through `Rule.items`. None when a side
    would have more inputs than its op's slots, or fewer than it needs."""
    if not rule.lists:
        return rule
    items = {n: item_names(n, counts[n]) for n in rule.lists}
    lhs, rhs = _fill(rule.lhs, items), _fill(rule.rhs, items)
    if lhs is None or rhs is None:
        return None
    return _instance(rule, lhs, rhs, items, ",".join(f"{n}={counts[n]}" for n in rule.lists))


def engine_rules(rule: Rule, most: Mapping[str, int] | None = None) -> list[Rule]:
    """The rules the engine runs for `rule` (itself when it has no lists; see the module
    docstring). Their names are the template's; `Rule.instance` tells them apart.

    most: op -> the most inputs a node of it has in the graph. A list followed by other
    inputs of such an op then gets the counts up to that many only: fewer egglog rules to
    compile, at the price of not matching a node that rewriting made longer (a Concat that
    flattening grew) in the same position."""
    if not rule.lists or rule.items:
        return [rule]
    nodes = _list_nodes(rule.lhs)
    fixed = [(a.name, n.op) for n in nodes for a in n.args[:-1] if isinstance(a, ListCapture)]
    open_ = {n.args[-1].name: n for n in nodes if isinstance(n.args[-1], ListCapture)}
    most = most or {}
    ranges = [range(min(VARIADIC_SLOTS, most.get(op, VARIADIC_SLOTS)) + 1) for _, op in fixed]
    fixed = [name for name, _ in fixed]
    out = []
    for combo in itertools.product(*ranges):
        counts = dict(zip(fixed, combo))
        for name, node in open_.items():  # an open list takes the slots that are left
            spec = OPS.get(node.op)
            used = sum(counts[a.name] if isinstance(a, ListCapture) else 1 for a in node.args[:-1])
            counts[name] = spec.arity - used
        items = {n: item_names(n, counts[n]) for n in rule.lists}
        lhs = _fill(rule.lhs, items)
        if lhs is None or any(c < 0 for c in counts.values()):
            continue
        tag = ",".join(f"{n}={counts[n]}" for n in fixed) or "open"
        out.append(_instance(rule, lhs, rule.rhs, items, tag))
    return out


def _instance(rule: Rule, lhs: Term, rhs: Term, items: dict, tag: str) -> Rule:
    names = tuple(i for n in rule.lists for i in items[n])
    return dataclasses.replace(
        rule,
        lhs=lhs,
        rhs=rhs,
        items=tuple((n, items[n]) for n in rule.lists),
        term_captures=rule.term_captures + names,
        instance=tag,
    )


def _list_nodes(t: Term) -> list[OpNode]:
    """The applications in `t` with a list capture among their inputs, outermost first."""
    if not isinstance(t, OpNode):
        return []
    mine = [t] if any(isinstance(a, ListCapture) for a in t.args) else []
    return mine + [n for a in t.args for n in _list_nodes(a)]


def _fill(t: Term, items: dict[str, tuple[str, ...]]) -> Term | None:
    """`t` with each list capture replaced by its items and each op's slots padded with
    `Absent`; None if an op gets more inputs than it has slots."""
    if not isinstance(t, OpNode):
        return t
    args: list[Term] = []
    for a in t.args:
        if isinstance(a, ListCapture):
            args += [Capture(i) for i in items[a.name]]
        else:
            filled = _fill(a, items)
            if filled is None:
                return None
            args.append(filled)
    spec = OPS.get(t.op)
    arity = spec.arity
    if len(args) > arity:
        return None
    if (
        any(isinstance(a, ListCapture) for a in t.args)
        and sum(not isinstance(a, Absent) for a in args) < spec.n_required
    ):
        return None  # empty lists left a required input out
    return dataclasses.replace(t, args=tuple(args) + (Absent(),) * (arity - len(args)))
