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
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from rewrite.apply import UnsoundRuleError, apply_matches
from rewrite.egraph import EGraph, Snapshot
from rewrite.emit import COMBINED, HostRule

__all__ = ["Limits", "SaturationReport", "UnsoundRuleError", "saturate"]


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
    # host-rule matches not applied: rule -> reason (the failing guard) -> count
    rejected: defaultdict = field(default_factory=lambda: defaultdict(Counter))


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
            unions = apply_matches(eg, eg.snapshot(relations), host_rules, processed, report)
            if unions:
                eg.load_rows(unions.rows)
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
