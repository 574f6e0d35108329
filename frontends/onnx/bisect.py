"""Culprit bisection: which rule, at which node, breaks a model's outputs.

    bisect_model(model, rules) -> BisectReport

The failure is what `rewrite optimize` checks: the optimized model's outputs differ from the
original's under onnxruntime on the check's random inputs (`frontends.onnx.check`: the same
seeds, the same tolerances), it cannot be run, or optimizing raises. Bisection is delta
debugging (`engine.ddmin`, Zeller and Hildebrandt 2002) in two rounds:

1. over the rules that fired in the failing run (the others stay out: they changed nothing),
   after checking that those rules alone still fail; with one culprit among n rules it takes
   at most 2 * ceil(log2 n) optimize runs;
2. over the match sites of each culprit (`engine.sites`: the culprit runs as a host rule
   applied only at chosen sites, named by the original value at the match's root), with the
   other culprits on. A culprit whose failing match is on a term built by another rewrite (no
   original node there) is reported alone, and the report says so.

Every run is a full `optimize_model` with a subset of the rules; the search stops when the
deadline passes (the report then says it is incomplete and gives what it narrowed down to).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from dsl.ir import Rule, RuleSet
from engine.ddmin import ddmin
from engine.saturate import Limits
from engine.sites import sited
from frontends.onnx import external, optimize_model
from frontends.onnx.check import (
    CheckError,
    cut_draws,
    draw_values,
    output_diff,
    random_inputs,
    random_outputs,
    run,
    session,
    tolerance_types,
)

RUNS, SEED = 2, 0  # the output check's input sets (frontends.onnx.check.compare)


class BisectError(RuntimeError):
    """The original model cannot be run under onnxruntime, so nothing can be compared."""


class _OutOfTime(Exception):
    """The deadline passed during an optimize run: its answer cannot be trusted."""


@dataclass(frozen=True)
class Culprit:
    """A rule of the minimal failing set. sites: the value names at the roots of its minimal
    failing matches, nodes: the ONNX nodes that write them ("" for a value no node writes);
    site_note: why no sites are given, when none are; fired_sites: how many sites it fired at."""

    rule: str
    where: str  # file:line of its definition
    file: str
    sites: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    fired_sites: int = 0
    site_note: str = ""


@dataclass(frozen=True)
class BisectReport:
    """What `bisect_model` found.

    failing: whether the optimized model failed at all (nothing to bisect otherwise).
    culprits: the minimal failing set of rules, each with its sites. fired: the rules that fired
    in the failing run. error: the failure of the minimal set, one line. inputs: the
    counterexample's inputs, name -> "dtype[shape]", and seed: its `random_inputs` seed (None:
    the inputs were given, `feeds`).
    rule_runs / site_runs: optimize runs spent on each round (the first, failing run and the
    reproduction with the fired rules only are counted in rule_runs). complete: False when
    the deadline stopped the search. note: why there is no culprit, or what is approximate.
    """

    failing: bool
    culprits: tuple[Culprit, ...] = ()
    fired: tuple[str, ...] = ()
    error: str = ""
    inputs: dict[str, str] = field(default_factory=dict)
    seed: int | None = SEED
    rule_runs: int = 0
    site_runs: int = 0
    complete: bool = True
    note: str = ""
    seconds: float = 0.0

    @property
    def runs(self) -> int:
        """Total optimize runs of the search: `rule_runs + site_runs`."""
        return self.rule_runs + self.site_runs


class _Trials:
    """Runs optimize with a subset of rules and tells whether the output check fails; the
    original model's outputs are computed once."""

    def __init__(self, model, fp, limits: Limits, folder, feeds=None):
        if folder is not None and any(True for _ in external.external_tensors(model)):
            # onnxruntime runs it from bytes: read the weights `load_model` left in their files
            model = onnx.ModelProto.FromString(model.SerializeToString())
            onnx.external_data_helper.load_external_data_for_model(model, str(folder))
        self.model, self.fp, self.limits, self.folder = model, fp, limits, folder
        self.given = bool(feeds)
        self.feeds = feeds or [random_inputs(model, SEED + r) for r in range(RUNS)]
        # a model with random nodes: every run reads the original's draws, as the check does
        self.random = random_outputs(model)
        self.draws = draw_values(model, self.feeds) if self.random else None
        # (the original's own random nodes made the draws: cutting them out cannot fail)
        checked = model if self.draws is None else cut_draws(model, self.draws[0])
        self.fed = self.feeds
        if self.draws is not None:
            self.fed = [{**f, **d} for f, d in zip(self.feeds, self.draws)]
        try:
            sess = session(checked)
            self.want = [run(sess, f) for f in self.fed]
        except CheckError as e:
            raise BisectError(f"the original model: {e}") from None
        self.elem = [o.type.tensor_type.elem_type for o in model.graph.output]
        tol = tolerance_types(model)
        self.tol = [tol[o.name] for o in model.graph.output]
        self.names = [o.name for o in model.graph.output]
        # outputs of draws the runs cannot share: not compared, as the output check does not
        self.drawn = self.random if self.draws is None else set()
        self.runs = 0
        self.failed_feed = 0
        self.last_report = None
        self.last_seconds = 0.0
        self.cache: dict[tuple, tuple[str | None, int]] = {}

    def out_of_time(self) -> bool:
        """True when another run, as long as the last one, would end past the deadline."""
        return time.perf_counter() + self.last_seconds > self.limits.deadline

    def error(self, rules: RuleSet) -> str | None:
        """The failure of optimizing with `rules` (one line), or None when its outputs match.
        Raises _OutOfTime when the deadline passed before or during the run."""
        key = tuple((r.name, type(r).__name__, getattr(r, "sites", None)) for r in rules.rules)
        if key in self.cache:  # the minimal set, tested during the search
            error, self.failed_feed = self.cache[key]
            return error
        clock = time.perf_counter()
        if clock > self.limits.deadline:
            raise _OutOfTime
        self.runs += 1
        try:
            error = self._run(rules)
        finally:
            self.last_seconds = time.perf_counter() - clock
        self.cache[key] = error, self.failed_feed
        return error

    def _run(self, rules: RuleSet) -> str | None:
        try:
            result, report = optimize_model(
                self.model,
                rules,
                fp=self.fp,
                limits=self.limits,
                folder=self.folder,
                provenance=False,
            )
        except Exception as e:  # optimizing raised: that is a failure too
            self.last_report = None
            return f"optimize raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        self.last_report = report
        if report.stop_reason == "time-limit":
            raise _OutOfTime
        if result is self.model:
            return None
        fed, skip = self.fed, self.drawn
        if self.draws is not None:
            cut = cut_draws(result, self.draws[0])
            if cut is None:  # a rewrite moved a random node: its outputs are not compared
                fed, skip = self.feeds, self.random
            else:
                result = cut
        try:
            sess = session(result)
            for k, feeds in enumerate(fed):
                got = run(sess, feeds)
                for name, elem, t, a, b in zip(self.names, self.elem, self.tol, got, self.want[k]):
                    if name in skip:
                        continue
                    d = output_diff(name, elem, a, b, report.fp, t)
                    if not d.ok:
                        self.failed_feed = k
                        return (
                            f"output {name} differs: max abs err {d.max_abs:.3g}, "
                            f"max err / max|b| {d.max_rel:.3g} (rtol {d.rtol:g}, atol {d.atol:g})"
                        )
        except CheckError as e:
            return str(e)
        return None


def bisect_model(
    model: onnx.ModelProto,
    rules: RuleSet,
    *,
    fp: tuple[str, ...] = ("exact",),
    limits: Limits = Limits(),
    folder=None,
    fired: dict[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    feeds: list[dict[str, np.ndarray]] | None = None,
) -> BisectReport:
    """Find a minimal set of rules, and of their match sites, whose application breaks the
    outputs of `model` (see the module docstring).

    rules: the RuleSet optimize ran with (skip/only already applied). fp, folder: as for
    `optimize_model`. limits: every optimize run's budgets; `limits.deadline` (or `timeout`
    from now) bounds the whole bisection. fired: the `report.fired` of a failing run already
    made (saves one run); without it, the rules that fire in a first run with all of them, or
    all of them where that run raises. progress: called with one line per run (runs so far,
    candidates left). feeds: the inputs to compare on (`--check-inputs`), in place of random
    ones (a model that runs only on its own inputs was said not to run at all).
    Returns a BisectReport. Raises BisectError when the original model cannot be run.
    """
    start = time.perf_counter()
    if limits.deadline is None:
        limits = Limits(
            limits.max_iterations, limits.max_nodes, limits.timeout, start + limits.timeout
        )
    trials = _Trials(model, fp, limits, folder, feeds)
    try:
        return _bisect(trials, rules, fired, progress or (lambda _line: None), start)
    except _OutOfTime:
        note = f"the time ran out after {trials.runs} optimize runs"
        return _report(trials, start, (), [], "", complete=False, note=note)


def _bisect(trials: _Trials, rules: RuleSet, fired, say, start: float) -> BisectReport:
    """The two rounds of `bisect_model`. Raises _OutOfTime."""
    if fired is None:
        if trials.error(rules) is None:
            note = "the optimized model passes the output check: nothing to bisect"
            return BisectReport(
                False, rule_runs=trials.runs, note=note, seconds=time.perf_counter() - start
            )
        # (optimizing raised: no report says what fired, so every rule is a candidate)
        fired = trials.last_report.fired if trials.last_report else dict.fromkeys(rules.names())
        which = "rules fired" if trials.last_report else "rules (optimizing raised)"
    else:
        which = "rules fired"
    names = {n.removesuffix(" (reverse)") for n in fired}
    candidates = [r for r in rules.rules if r.name in names]
    say(f"bisect: {len(candidates)} {which}; checking that they alone fail")
    if trials.error(RuleSet(tuple(candidates), rules.files)) is None:
        note = (
            "the failure does not reproduce with only the rules that fired "
            "(it needs a rule that did not fire, or it is not deterministic)"
        )
        return _report(trials, start, (), candidates, "", note=note)
    found = ddmin(
        candidates,
        lambda rs: trials.error(RuleSet(tuple(rs), rules.files)) is not None,
        progress=lambda k, left: say(f"bisect: rules: run {trials.runs}, {left} candidates left"),
        out_of_time=trials.out_of_time,
    )
    rule_runs = trials.runs
    if not found.complete:
        note = (
            f"the time ran out after {trials.runs} optimize runs, with "
            f"{len(found.items)} candidate rules left"
        )
        culprits = [_plain(r) for r in found.items]
        return _report(trials, start, culprits, candidates, "", complete=False, note=note)
    culprits = tuple(_sites(trials, found.items, r, rules.files, say) for r in found.items)
    error = trials.error(_minimal(found.items, culprits, rules.files))
    complete = not any(c.sites and c.site_note for c in culprits)
    note = "" if complete else "the time ran out while bisecting sites"
    return _report(
        trials,
        start,
        culprits,
        candidates,
        error or "",
        rule_runs=rule_runs,
        complete=complete,
        note=note,
    )


def _sites(trials: _Trials, culprits, rule: Rule, files, say) -> Culprit:
    """The culprit `rule` with a minimal set of its match sites that still fails, the other
    culprits on."""
    others = tuple(r for r in culprits if r is not rule)
    where = f"{rule.span.file}:{rule.span.line}"
    base = Culprit(rule.name, where, rule.span.file)

    def with_sites(sites) -> RuleSet:
        return RuleSet(others + tuple(sited(rule, sites)), files)

    error = trials.error(with_sites(None))  # applied everywhere, recording where
    recorded = trials.last_report.extra.get("sites", {}) if trials.last_report else {}
    all_sites = [
        s for name in (rule.name, f"{rule.name} (reverse)") for s in recorded.get(name, ())
    ]
    sites = list(dict.fromkeys(s for s in all_sites if s is not None))
    if error is None:
        return _note(
            base,
            "it fails only as a plain egglog rule, not applied from Python; "
            "reporting the rule alone",
        )
    if trials.last_report is None:  # optimizing raised: no report of where the rule fired
        return _note(
            base,
            "optimizing raised, so the sites it fired at are not known; reporting the rule alone",
        )
    if not sites:
        return _note(
            base,
            "its matches are on terms built by other rewrites, not original "
            "nodes; reporting the rule alone",
        )
    if None in all_sites and trials.error(with_sites(frozenset(sites))) is None:
        return _note(
            base,
            "the failing match is on a term built by another rewrite, not an "
            "original node; reporting the rule alone",
        )
    say(f"bisect: {rule.name} fired at {len(sites)} sites; bisecting them")
    start = trials.runs
    found = ddmin(
        sites,
        lambda ss: trials.error(with_sites(frozenset(ss))) is not None,
        progress=lambda k, left: say(
            f"bisect: sites of {rule.name}: run {trials.runs - start}, {left} candidates left"
        ),
        out_of_time=trials.out_of_time,
    )
    writers = {o: n.name for n in trials.model.graph.node for o in n.output}
    note = "" if found.complete else "the time ran out: these sites fail, but fewer may do"
    return Culprit(
        rule.name,
        where,
        rule.span.file,
        found.items,
        tuple(writers.get(s, "") for s in found.items),
        len(sites),
        note,
    )


def _plain(rule: Rule) -> Culprit:
    return Culprit(
        rule.name,
        f"{rule.span.file}:{rule.span.line}",
        rule.span.file,
        site_note="the time ran out before its sites were bisected",
    )


def _note(c: Culprit, note: str) -> Culprit:
    return Culprit(c.rule, c.where, c.file, site_note=note)


def _minimal(rules, culprits: tuple[Culprit, ...], files) -> RuleSet:
    """The minimal failing configuration: each culprit at its minimal sites (or everywhere)."""
    sites = {c.rule: frozenset(c.sites) for c in culprits if c.sites}
    out: list[Rule] = []
    for r in rules:
        out += sited(r, sites[r.name]) if r.name in sites else [r]
    return RuleSet(tuple(out), files)


def _report(trials, start, culprits, candidates, error, *, rule_runs=None, complete=True, note=""):
    feeds = trials.feeds[trials.failed_feed] if error else {}
    return BisectReport(
        failing=True,
        culprits=tuple(culprits),
        fired=tuple(r.name for r in candidates),
        error=error,
        inputs={k: f"{v.dtype}[{', '.join(map(str, v.shape))}]" for k, v in feeds.items()},
        seed=None if trials.given else SEED + trials.failed_feed,
        rule_runs=trials.runs if rule_runs is None else rule_runs,
        site_runs=0 if rule_runs is None else trials.runs - rule_runs,
        complete=complete,
        note=note,
        seconds=time.perf_counter() - start,
    )


def format_report(
    report: BisectReport, *, model: str, rule_paths=None, added=None, allow=(), check_inputs=None
) -> list[str]:
    """The report as lines for a terminal: per culprit its rule, `file:line`, sites (node
    names), then the counterexample's inputs, the error, the commands that reproduce it, and
    the runs it took. model, rule_paths (--rules), added (--add-rules), allow, check_inputs
    (--check-inputs): what the reproduce commands pass on."""
    if not report.failing or not report.culprits:
        return [f"bisect: {report.note}"] if report.note else []
    lines = []
    for c in report.culprits:
        lines.append(f"culprit: rule {c.rule} ({c.where})")
        if c.sites:
            if c.site_note:
                lines.append(f"  note: {c.site_note}")
            shown = ", ".join(
                f"node {n} (value {s})" if n else f"value {s}" for s, n in zip(c.sites, c.nodes)
            )
            lines.append(
                f"  site: {shown}; {len(c.sites)} of the {c.fired_sites} sites it fired at"
            )
        else:
            lines.append(f"  site: not isolated: {c.site_note}")
    if report.error:
        shapes = ", ".join(f"{k} {v}" for k, v in report.inputs.items())
        where = "the given inputs" if report.seed is None else "check.random_inputs seed"
        seed = "" if report.seed is None else f" {report.seed}"
        lines.append(f"  counterexample input: {shapes} ({where}{seed})")
        lines.append(f"  error: {report.error}")
    rules = f" --rules {','.join(map(str, rule_paths))}" if rule_paths else ""
    rules += f" --add-rules {','.join(map(str, added))}" if added else ""
    allowed = f" --allow {','.join(allow)}" if allow else ""
    allowed += f" --check-inputs {check_inputs}" if check_inputs else ""
    names = ",".join(c.rule for c in report.culprits)
    lines.append(f"  reproduce: rewrite optimize {model} out.onnx{rules} --only {names}{allowed}")
    for c in report.culprits:
        lines.append(f"             rewrite verify {c.file} --rule {c.rule}")
    lines.append(
        f"bisect: {len(report.fired)} rules fired; {report.rule_runs} optimize runs over "
        f"the rules, {report.site_runs} over the sites ({report.seconds:.1f} s)"
        + ("" if report.complete else "; incomplete: " + report.note)
    )
    return lines


__all__ = ["BisectError", "BisectReport", "Culprit", "bisect_model", "format_report"]
