"""Saturation: run the rules one iteration at a time under budgets, finishing host rules in
Python between iterations.

egglog's `run` has no node or time limit of its own (DESIGN.md, measured facts), so the loop
checks e-nodes and the clock before each iteration, and says why it stopped: `saturated`,
`iteration-limit`, `node-limit` or `time-limit`. One iteration cannot be interrupted, and on a
graph that grows geometrically (associativity and commutativity on a long sum multiply the
e-nodes by ~20 per iteration) the next one may take longer than everything before it; so an
iteration is not started when, growing as much as the last one did, it or the extraction of the
e-graph it leaves would cross a limit.

Host rules (rules with guards or builders) record their matches as rows; after each iteration
the new rows are read from a snapshot, guards are evaluated on the captured e-classes' facts,
builders compute attribute values, and the results are unioned in one batch (Tensat's apply
step done outside the e-graph).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from engine.apply import UnsoundRuleError, apply_matches
from engine.egraph import EGraph, Snapshot
from engine.emit import COMBINED, HostRule, egg_rule_name

__all__ = ["Limits", "SaturationReport", "UnsoundRuleError", "saturate"]


@dataclass(frozen=True)
class Limits:
    """Budgets of one optimization: iterations, e-nodes, wall-clock seconds.

    timeout: seconds from the start of `engine.optimize`. deadline: when set, the absolute
    `time.perf_counter()` value by which the run stops instead (a caller that spent part of the
    budget already, such as the CLI loading the model, passes its own)."""

    max_iterations: int = 30
    max_nodes: int = 1_000_000
    timeout: float = 120.0
    deadline: float | None = None


@dataclass
class SaturationReport:
    """Why saturation stopped and what it did. seconds: wall-clock time of the loop."""

    stop_reason: str = ""
    iterations: int = 0
    enodes: int = 0
    seconds: float = 0.0
    # per iteration: (seconds, host apply included; e-nodes after it)
    history: list[tuple[float, int]] = field(default_factory=list)
    # per time check before an iteration: (seconds left to the deadline, seconds the next
    # iteration and the extraction after it are predicted to take); the iteration started
    # only if the prediction fit
    budget: list[tuple[float, float]] = field(default_factory=list)
    fired: Counter = field(default_factory=Counter)
    # host-rule matches not applied: rule -> reason (the failing guard) -> count
    rejected: defaultdict = field(default_factory=lambda: defaultdict(Counter))
    host_firings: list = field(default_factory=list)  # HostFiring, when provenance is on
    # sites of the matches applied by SitedRules (engine.sites): rule -> value names
    sites: defaultdict = field(default_factory=lambda: defaultdict(list))
    # applied matches of multi-root rules: ((root handle, result e-node), ...) per match,
    # for extraction to take all of a match's results together (`engine.extract`)
    groups: list = field(default_factory=list)


def saturate(
    eg: EGraph,
    host_rules: list[HostRule],
    limits: Limits,
    provenance: tuple[str, ...] | None = None,
) -> tuple[SaturationReport, Snapshot]:
    """Run all rules until saturation or a budget runs out (see the module docstring).

    provenance: None, or the plain rules' provenance relations (`engine.emit.prov_relation`);
    then the final snapshot holds their rows in full, and `report.host_firings` lists the host
    rules' applied matches (`engine.apply.HostFiring`), for `engine.provenance`.

    Returns the report and a final snapshot of the e-graph (for extraction). An e-graph
    imported over `limits.max_nodes`, or a deadline already past, stops before the first
    iteration. Raises UnsoundRuleError if a host rule builds a term of another type than what
    it matched.
    """
    report = SaturationReport()
    relations = tuple(h.relation for h in host_rules)
    host_names = {egg_rule_name(h.rule) for h in host_rules}
    processed: set = set()
    seen_rows = None
    start = time.perf_counter()
    deadline = limits.deadline if limits.deadline is not None else start + limits.timeout
    report.enodes = imported = eg.enode_count()
    while True:
        stop = _budget_left(report, limits, deadline, _next_growth(imported, report.history))
        if stop:
            report.stop_reason = stop
            break
        clock = time.perf_counter()
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
            record = report.host_firings if provenance is not None else None
            snap = eg.snapshot(relations)
            unions = apply_matches(eg, snap, host_rules, processed, report, record)
            if unions:
                eg.load_rows(unions.rows)
        report.enodes = eg.enode_count()
        report.history.append((time.perf_counter() - clock, report.enodes))
        if not run.updated and not unions:
            report.stop_reason = "saturated"
            break
    snap = eg.snapshot(relations, provenance or ())
    report.enodes = len(snap.nodes)
    report.seconds = time.perf_counter() - start
    return report, snap


# Snapshot and extraction after the last iteration cost 60-140 us per e-node (measured on the
# 2-core machine, an associativity/commutativity blow-up and a 10k-node Llama-style graph);
# the low end, so that the estimate stops a run early only when it is surely over
EXTRACT_SECONDS_PER_ENODE = 5e-5


def _next_growth(imported: int, history: list[tuple[float, int]]) -> float:
    """The next iteration's predicted growth of the e-graph (e-nodes after / before): the last
    iteration's, times its own growth over the one before when that rose (associative and
    commutative rules grow an e-graph faster each iteration: 15 Adds by assoc and comm went
    1.8x, 2.6x, 3.6x, ...; the last growth alone let `--max-nodes 20000` reach 33,709).
    `imported`: the e-nodes before the first iteration; `history`: (seconds, e-nodes after)
    per iteration."""
    sizes = [imported, *(n for _, n in history)]
    if len(sizes) < 2:
        return 1.0
    last = sizes[-1] / max(sizes[-2], 1)
    if len(sizes) < 3:
        return last
    before = sizes[-2] / max(sizes[-3], 1)
    return last * max(1.0, last / max(before, 1e-9))


def _budget_left(report: SaturationReport, limits: Limits, deadline: float, growth: float) -> str:
    """Why no further iteration may start ("" if it may): a limit reached, or one the next
    iteration would cross if it grew the e-graph by `growth` (`_next_growth`) and took `growth`
    times as long as the last one, counting the extraction of the e-graph it leaves."""
    if report.iterations >= limits.max_iterations:
        return "iteration-limit"
    if report.enodes > limits.max_nodes or report.enodes * growth > limits.max_nodes:
        return "node-limit"
    growth = max(growth, 1.0)
    last = report.history[-1][0] if report.history else 0.0
    after = last * growth + report.enodes * growth * EXTRACT_SECONDS_PER_ENODE
    left = deadline - time.perf_counter()
    report.budget.append((left, after))
    if after > left:
        return "time-limit"
    return ""
