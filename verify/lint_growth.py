"""Unbounded growth: does a rule (or a pair of rules) keep adding e-nodes on its own pattern?

The left side of a rule is instantiated as a graph, each capture and wildcard a distinct
input of unknown type, and the rule alone (or with one other rule) runs on it in the real
engine (`engine.egraph.EGraph`, `engine.saturate.saturate`) for a few iterations. A rule
set that is terminating modulo the e-graph saturates on such a small term within a few
iterations; one whose result matches its own pattern with a larger term (x -> Relu(x) under a
rule Relu(x) -> Relu(Relu(x))) or an `equal` pair that builds new terms forever is still
growing at the bound.

Guards are dropped for this check (the graph has no types or values to decide them, and a
guard that stops a loop only on some inputs is not a bound), so the check over-approximates:
a loop it reports may be cut by guards in practice, which the rule's gloss then explains. A
rule whose result needs a builder (`Call`) cannot run without its guards' facts and is not
checked.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from dataclasses import dataclass

from dsl.ir import Absent, Capture, Literal, OpNode, Rule, RuleSet
from dsl.unify import apart, strip, substitute
from engine.egraph import EGraph
from engine.emit import emit
from engine.saturate import Limits, saturate
from verify.findings import Finding
from vocab.graph import ABSENT, Node, TermGraph, Value
from vocab.ops import OPS, REQUIRED
from vocab.types import UNKNOWN

ITERATIONS = 8
MAX_NODES = 5_000
PLACEHOLDER = {"int": 1, "float": 1.0, "string": "", "ints": (1,), "floats": (1.0,)}


@dataclass(frozen=True)
class Growth:
    """The bounded run: `stop` (the saturation stop reason), e-nodes per iteration."""

    stop: str
    enodes: tuple[int, ...]

    @property
    def grows(self) -> bool:
        """True if the run hit a limit instead of saturating (the rule set may grow forever)."""
        return self.stop != "saturated"


def checkable(rule: Rule) -> bool:
    """True if `rule` can run without host facts once its guards are dropped (no builder)."""
    return not dataclasses.replace(rule, guards=()).needs_host


def term_graph(lhs: OpNode) -> TermGraph:
    """`lhs` as a graph: every capture and wildcard a distinct input of unknown type (a
    capture used twice is one input), every attribute its literal, its op-table default, or a
    placeholder value of its kind."""
    values: list[Value] = []
    nodes: list[Node] = []
    inputs: dict[str, int] = {}

    def value(name: str) -> int:
        values.append(Value(name, UNKNOWN))
        return len(values) - 1

    def leaf(t) -> int:
        if isinstance(t, Absent):
            return ABSENT
        key = t.name if isinstance(t, Capture) else f"_w{len(values)}"
        if key not in inputs:
            inputs[key] = value(key)
        return inputs[key]

    def node(t: OpNode) -> int:
        ins = tuple(node(a) if isinstance(a, OpNode) else leaf(a) for a in t.args)
        spec = OPS.get(t.op)
        attrs = []
        for name, v in t.attrs:
            a = spec.attr_index[name]
            if isinstance(v, Literal):
                attrs.append((name, v.value))
            elif a.default is REQUIRED or a.default is None:
                attrs.append((name, PLACEHOLDER[a.kind]))
            else:
                attrs.append((name, a.default))
        out = value(f"_n{len(values)}")
        nodes.append(Node(t.op, ins, (out,), tuple(attrs)))
        return out

    root = node(lhs)
    return TermGraph(tuple(values), tuple(nodes), tuple(inputs.values()), (root,))


def run_growth(rules: list[Rule], lhs: OpNode, iterations: int = ITERATIONS) -> Growth:
    """Saturate `rules` (guards dropped; each must be `checkable`) on the graph of `lhs` for
    at most `iterations` iterations and `MAX_NODES` e-nodes. Raises
    `engine.egraph.EGraphError` if egglog rejects the program."""
    plain = tuple(dataclasses.replace(r, guards=()) for r in rules)
    ops = set().union(*(r.lhs_ops | r.rhs_ops for r in plain)) | {n for n in _ops(lhs)}
    eg = EGraph(term_graph(lhs), emit(RuleSet(plain, ())), ops)
    limits = Limits(max_iterations=iterations, max_nodes=MAX_NODES, timeout=30.0)
    report, _ = saturate(eg, [], limits)
    return Growth(report.stop_reason, tuple(n for _, n in report.history))


# ---- findings --------------------------------------------------------------------------------


def growth_findings(rules: RuleSet, counts: Counter) -> list[Finding]:
    """`grows` findings: each checkable rule alone on its pattern(s), guards dropped, then
    each pair of rules without guards where each builds an op the other matches, on both
    patterns. Pairs with a guarded rule are not run: with the guards dropped, a rule such as
    x * 1 -> x merges every product with its operand and hides or fakes loops."""
    plain = [r for r in rules.rules if checkable(r)]
    counts["unchecked"] = len(rules.rules) - len(plain)
    out, alone = [], set()
    for r in plain:
        counts["rules"] += 1
        g = _grows([r], r)
        if g:
            alone.add(r.name)
            out.append(Finding("grows", r.name, r.span, f"on its own pattern: {g}"))
    pure = [r for r in plain if not r.guards]  # a pair is run only as written: no guards
    for a, b in itertools.combinations(pure, 2):
        if a.span == b.span or a.name in alone or b.name in alone:
            continue
        if _builds(a) & _matches(b) and _builds(b) & _matches(a):
            counts["pairs"] += 1
            g = _grows([a, b], a) or _grows([a, b], b) or _grows_nested(a, b)
            if g:
                out.append(
                    Finding(
                        "grows",
                        b.name,
                        b.span,
                        f"together with {a.name} ({a.span}): {g}",
                        other=a.name,
                    )
                )
    return out


def _grows(rules: list[Rule], r: Rule) -> str:
    for lhs in [r.lhs, r.rhs] if r.kind == "equal" else [r.lhs]:
        g = run_growth(rules, lhs)
        if g.grows:
            counts = " -> ".join(map(str, g.enodes))
            return f"e-nodes {counts} after {len(g.enodes)} iterations ({g.stop})"
    return ""


def _grows_nested(a: Rule, b: Rule) -> str:
    """For two rules that each rewrite an op into the same op at the root (commutativity and
    associativity of one op, the classic pair): the pair on each one's pattern with each
    capture replaced by the pattern itself. On a pattern of three operands they saturate (a dozen
    bracketings and orders), on nine they do not (3^9 e-nodes): `rewrite optimize` stopped
    at the node limit on a 14-operand Add chain that lint had passed (the black-box rule
    author's finding)."""
    heads = {t.op if isinstance(t, OpNode) else None for r in (a, b) for t in (r.lhs, r.rhs)}
    if len(heads) != 1 or None in heads:
        return ""
    for r in (a, b):
        g = run_growth([a, b], _nested(r))
        if g.grows:
            counts = " -> ".join(map(str, g.enodes))
            return (
                f"on {r.name}'s pattern nested in itself, e-nodes {counts} after "
                f"{len(g.enodes)} iterations ({g.stop}): the pair enumerates every bracketing "
                "and order"
            )
    return ""


def _nested(r: Rule) -> OpNode:
    """`r`'s pattern with each term capture replaced by a copy of the pattern, its captures
    renamed apart (`dsl.unify.apart`), so that the copies are distinct subterms."""
    copies = {c: strip(apart(r, f"n{i}").lhs) for i, c in enumerate(r.term_captures)}
    return substitute(r.lhs, copies)


def _matches(r: Rule) -> frozenset:
    return r.lhs_ops | (r.rhs_ops if r.kind == "equal" else frozenset())


def _builds(r: Rule) -> frozenset:
    return r.rhs_ops | (r.lhs_ops if r.kind == "equal" else frozenset())


def _ops(t) -> set[str]:
    if isinstance(t, OpNode):
        return {t.op}.union(*(_ops(a) for a in t.args))
    return set()
