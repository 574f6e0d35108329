"""Saturation: run the rules one iteration at a time under budgets, finishing host rules in
Python between iterations.

egglog's `run` has no node or time limit of its own (DESIGN.md, measured facts), so the loop
runs one iteration, then checks e-nodes and the clock, and says why it stopped: `saturated`,
`iteration-limit`, `node-limit` or `time-limit`.

Host rules (rules with guards or builders) record their matches as rows; after each iteration
the new rows are read from a snapshot, guards are evaluated on the captured e-classes' facts,
builders compute attribute values, and the results are unioned in one batch (Tensat's apply
step done outside the e-graph).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from dsl.ir import Call, Capture, Literal, OpNode, Rule
from rewrite import registry
from rewrite.egraph import EGraph, Snapshot
from rewrite.emit import COMBINED, HostRule, egg_string, term_text
from rewrite.ops import OPS, decode_attr, encode_attr


@dataclass(frozen=True)
class Limits:
    """Saturation budgets: iterations, e-nodes, wall-clock seconds."""

    max_iterations: int = 30
    max_nodes: int = 1_000_000
    timeout: float = 120.0


@dataclass
class SaturationReport:
    """Why saturation stopped and what it did. seconds: wall-clock time of the loop."""

    stop_reason: str = ""
    iterations: int = 0
    enodes: int = 0
    seconds: float = 0.0
    fired: Counter = field(default_factory=Counter)
    rejected: Counter = field(default_factory=Counter)  # host matches whose guard failed


class UnsoundRuleError(RuntimeError):
    """A rule produced a term whose type differs from the matched term's type."""


def saturate(eg: EGraph, host_rules: list[HostRule], limits: Limits) -> tuple[SaturationReport, Snapshot]:
    """Run all rules until saturation or a budget runs out.

    Returns the report and a final snapshot of the e-graph (for extraction). Raises
    UnsoundRuleError if a host rule builds a term of another type than what it matched.
    """
    report = SaturationReport()
    relations = tuple(h.relation for h in host_rules)
    host_names = {h.rule.name for h in host_rules}
    processed: set = set()
    seen_rows = None
    start = time.perf_counter()
    while True:
        if report.iterations >= limits.max_iterations:
            report.stop_reason = "iteration-limit"
            break
        run = eg.run(f"(run {COMBINED} 1)")[-1].report
        report.iterations += 1
        for name, n in run.num_matches_per_rule.items():
            if n and name not in host_names:
                report.fired[name] += n
        unions = []
        sizes = eg.sizes()
        rows = tuple(sizes.get(r, 0) for r in relations)
        if host_rules and rows != seen_rows:  # new matches to finish in Python
            seen_rows = rows
            unions = _apply_host(eg.snapshot(relations), host_rules, processed, report)
            if unions:
                eg.run("\n".join(unions))
        report.enodes = eg.enode_count()
        if not run.updated and not unions:
            report.stop_reason = "saturated"
            break
        if report.enodes > limits.max_nodes:
            report.stop_reason = "node-limit"
            break
        if time.perf_counter() - start > limits.timeout:
            report.stop_reason = "time-limit"
            break
    snap = eg.snapshot(relations)
    report.enodes = len(snap.nodes)
    report.seconds = time.perf_counter() - start
    return report, snap


def _apply_host(snap: Snapshot, host_rules: list[HostRule], processed: set, report) -> list[str]:
    unions = []
    for h in host_rules:
        kinds = attr_kinds(h.rule)
        for row in snap.rows.get(h.relation, ()):
            # e-class ids are local to one snapshot: key the match by stable terms instead
            key = (h.relation, *(snap.rep(x) if isinstance(x, int) else x for x in row))
            if key in processed:
                continue
            processed.add(key)
            binding = dict(zip(h.columns, row[1:]))
            rhs = _instantiate(h.rule, binding, kinds, snap)
            if rhs is None:
                report.rejected[h.rule.name] += 1
                continue
            report.fired[h.rule.name] += 1
            unions.append(f"(union {snap.rep(row[0])} {rhs})")
    return unions


def _instantiate(rule: Rule, binding: dict, kinds: dict, snap: Snapshot) -> str | None:
    """The result term's egglog text for one match, or None when a guard fails or a builder
    cannot build."""
    terms = set(rule.term_captures)

    def arg(a):
        if isinstance(a, Literal):
            return a.value
        if isinstance(a, Capture):
            if a.name in terms:
                return snap.info(binding[a.name])
            return decode_attr(kinds[a.name], binding[a.name])
        if isinstance(a, Call):
            return _call(registry.BUILDERS[a.fn], a.args)
        return None

    def _call(fn, args):
        return fn.fn(*(arg(x) for x in args))

    for g in rule.guards:
        if bool(_call(registry.GUARDS[g.fn], g.args)) == g.negate:
            return None

    failed = []

    def attr(v, kind):
        if isinstance(v, Call):
            value = arg(v)
            if value is None:
                failed.append(v.fn)
            return egg_string(encode_attr(kind, value))
        if isinstance(v, Capture):
            return egg_string(binding[v.name])
        return egg_string(encode_attr(kind, v.value))

    text = term_text(rule.rhs, lambda n: snap.rep(binding[n]), attr)
    return None if failed else text


def attr_kinds(rule: Rule) -> dict[str, str]:
    """Attribute capture name -> attribute kind, from where the left side binds it."""
    kinds: dict[str, str] = {}

    def walk(t):
        if isinstance(t, OpNode):
            spec = OPS.get(t.op)
            for name, v in t.attrs:
                if isinstance(v, Capture):
                    kinds.setdefault(v.name, spec.attr_index[name].kind)
            for a in t.args:
                walk(a)

    walk(rule.lhs)
    return kinds
