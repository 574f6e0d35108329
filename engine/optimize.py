"""`optimize`: the engine as a straight line of stages.

    fold shapes -> select rules -> emit egglog -> import into the e-graph -> saturate
    -> extract -> fold

The output is never worse than the input under the cost model: if extraction finds nothing
cheaper, the input graph comes back unchanged (the same object).
"""

from __future__ import annotations

import numbers
import time
from dataclasses import asdict, dataclass, field, replace

from onnx import TensorProto

from dsl.ir import Absent, Capture, Literal, OpNode, Rule, RuleSet, Term, Wildcard
from engine import provenance as prov
from engine.cost import CostModel
from engine.egraph import EGraph
from engine.emit import emit, host_rules
from engine.extract import extract, input_cost
from engine.fold import fold
from engine.quantize import forbidden
from engine.quantize import sites as quant_sites
from engine.saturate import Limits, saturate
from engine.selection import pick_rules
from engine.shapes import FoldStats, fold_shapes
from vocab.graph import ABSENT, TermGraph
from vocab.ops import OPS

FP_CLASSES = ("exact", "reassoc", "approx", "quant")


def option_problem(
    allow=(), max_iterations=None, max_nodes=None, timeout=None, atol=None, rtol=None
) -> str:
    """What is wrong with the options every frontend passes to `optimize` ("" when nothing):
    a numeric class `allow` names that is not one of FP_CLASSES, a saturation limit that is
    not a positive number (max_iterations and max_nodes: integers; timeout: seconds), or a
    tolerance that is not a number >= 0. One line, naming the option as the CLI spells it."""
    bad = [c for c in allow if c not in FP_CLASSES]
    if bad:
        return f"allow: unknown numeric class {bad[0]!r} (choose from {', '.join(FP_CLASSES[1:])})"
    for name, v, kinds in (
        ("max-iterations", max_iterations, numbers.Integral),
        ("max-nodes", max_nodes, numbers.Integral),
        ("timeout", timeout, numbers.Real),
    ):
        if v is not None and (isinstance(v, bool) or not isinstance(v, kinds) or not v > 0):
            what = "integer" if kinds is numbers.Integral else "number of seconds"
            return f"{name} must be a positive {what}, not {v!r}"
    for name, v in (("atol", atol), ("rtol", rtol)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real) or not v >= 0):
            return f"{name} must be a number >= 0, not {v!r}"
    return ""


# (rtol, atol) per numeric class of the rules that fired, then per ONNX element type. Even
# `exact` rules change which kernel runs (MatMul + Add vs Gemm accumulate in another order),
# so floats get a few ulps; `reassoc` rules (e.g. BatchNorm folded into Conv weights) regroup
# sums; `approx` rules may change results by more. Used by both frontends' output checks.
TOLERANCES = {
    "exact": {
        TensorProto.FLOAT: (1e-5, 1e-6),
        TensorProto.DOUBLE: (1e-12, 1e-15),
        TensorProto.FLOAT16: (1e-3, 1e-4),
        TensorProto.BFLOAT16: (1e-2, 1e-3),
    },
    "reassoc": {
        TensorProto.FLOAT: (1e-3, 1e-4),
        TensorProto.DOUBLE: (1e-9, 1e-12),
        TensorProto.FLOAT16: (1e-2, 1e-3),
        TensorProto.BFLOAT16: (4e-2, 1e-2),
    },
    "approx": {
        TensorProto.FLOAT: (1e-2, 1e-3),
        TensorProto.DOUBLE: (1e-6, 1e-9),
        TensorProto.FLOAT16: (5e-2, 1e-2),
        TensorProto.BFLOAT16: (1e-1, 5e-2),
    },
    # int8 rounding of weights and activations (affine quantization): each rule states its
    # own error bound, which `verify` checks; through a whole network the errors add up, and
    # the output check allows 10% of an output's largest magnitude (onnxruntime's own dynamic
    # quantizer reaches 7.2% on BERT-base; measured in the issue that added quantization)
    "quant": {
        TensorProto.FLOAT: (1e-1, 1e-3),
        TensorProto.DOUBLE: (1e-1, 1e-3),
        TensorProto.FLOAT16: (1e-1, 1e-2),
        TensorProto.BFLOAT16: (1e-1, 5e-2),
    },
}


@dataclass(frozen=True)
class Report:
    """What one optimization did.

    stop_reason: `saturated`, `iteration-limit`, `node-limit` or `time-limit`.
    seconds: wall-clock seconds per stage (`shapes`, `emit`, `import`, `saturate`, `extract`,
        `fold`).
    fired: rule name -> times it fired (matches applied). rejected: rule name -> reason
        -> count, for matches that were not applied (which guard failed, which builder could
        not build): the answer to "why did my rule not fire?". skipped: rules left out, with the
        reason (opset, numeric class, `--skip`/`--only`).
    cost_before/cost_after: DAG cost in the cost model's nanoseconds (0 when the run stopped
        before the graph was imported).
    limit_stage: "" when no budget ran out; else the stage that was running when one did
        (`load`, `onnx-import`, `shapes`: the input comes back unchanged; `import`: the
        e-graph was over a limit before the first iteration; `saturate`). The graph returned
        is then the best one found so far.
    provenance: output node or constant name -> the tree of rules that justify it
        (`engine.provenance`); empty when provenance is off or nothing was rewritten.
    """

    stop_reason: str
    iterations: int
    enodes: int
    eclasses: int
    seconds: dict[str, float]
    fired: dict[str, int]
    rejected: dict[str, dict[str, int]]
    skipped: dict[str, str]
    nodes_before: int
    nodes_after: int
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    cost_before: float
    cost_after: float
    changed: bool
    fp: str  # loosest numeric class among the rules that fired ("exact" if none fired)
    extra: dict = field(default_factory=dict)
    limit_stage: str = ""
    provenance: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        """The report as plain JSON-serializable data."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def select(
    rules: RuleSet,
    opset: int,
    fp: tuple[str, ...] = ("exact",),
    domains: frozenset[str] = frozenset(),
) -> tuple[list[Rule], dict[str, str]]:
    """Rules usable on a graph of `opset` under the allowed numeric classes, and the skipped
    ones with a reason. domains: the domains beyond the default one that the model imports or
    its target runs (`vocab.ops.TARGETS`); a rule whose ruleset declares another (`Rule.domains`)
    or a higher opset than `opset` (`Rule.opset`) is skipped."""
    keep, skipped = [], {}
    for r in rules.rules:
        if r.fp not in fp:
            skipped[r.name] = f"numeric class {r.fp} not allowed"
            continue
        lacking = sorted(set(r.domains) - set(domains))
        if lacking:
            skipped[r.name] = (
                f"ruleset {r.ruleset} writes {', '.join(lacking)} ops, which neither the model"
                " nor the target has (--target onnxruntime has com.microsoft)"
            )
            continue
        if r.opset > opset:
            skipped[r.name] = f"ruleset {r.ruleset} needs opset {r.opset}, the model has {opset}"
            continue
        missing = sorted(op for op in r.lhs_ops | r.rhs_ops if OPS.get(op, opset) is None)
        if missing:
            skipped[r.name] = f"{', '.join(missing)} not available at opset {opset}"
            continue
        older = form_lacks(r.rhs, opset)
        if older:
            skipped[r.name] = f"{older} at opset {opset}"
            continue
        keep.append(r)
    return keep, skipped


def form_lacks(t: Term, opset: int) -> str:
    """Why the term `t` (a result, or a pattern) cannot be written at `opset` ("" if it can):
    an op missing there, or one that fills an input slot or sets an attribute (to other than
    its default) that the op's form at that opset does not have (ReduceMean's `axes` input is
    opset 18's; opset 13 has an attribute). A captured or wildcard attribute is whatever the
    matched node has."""
    if not isinstance(t, OpNode):
        return ""
    spec = OPS.get(t.op, opset)
    if spec is None:
        return f"{t.op} not available"
    for i, arg in enumerate(t.args):
        if not isinstance(arg, Absent) and not spec.has_input(i):
            return f"{t.op} has no input {spec.inputs[i]}"
    for name, value in t.attrs:
        if spec.has_attr(name):
            continue
        default = spec.attr_index[name].default
        if isinstance(value, (Capture, Wildcard)):  # a matched node's: its form's default
            continue
        if not (isinstance(value, Literal) and (value.value == default or value.value is None)):
            return f"{t.op} has no attribute {name}"
    return next((why for a in t.args if (why := form_lacks(a, opset))), "")


def reachable(rules: list[Rule], ops: set[str]) -> list[Rule]:
    """The rules that can match a graph whose matchable nodes have the ops `ops`, in order.

    A rule can match once every op of its left side is in the e-graph: in the graph, or
    added by the right side of a rule that can match (a fixpoint). An `equal` rule runs both
    ways, so either side will do and both sides' ops are added. The others never fire, and
    compiling them into egglog is most of the time spent on a small graph."""
    ops, keep = set(ops), [False] * len(rules)
    grew = True
    while grew:
        grew = False
        for i, r in enumerate(rules):
            if keep[i]:
                continue
            lhs, rhs = r.lhs_ops, r.rhs_ops
            if lhs <= ops or r.kind == "equal" and rhs <= ops:
                keep[i], grew = True, True
                ops |= lhs | rhs
    return [r for r, k in zip(rules, keep) if k]


def optimize(
    graph: TermGraph,
    rules: RuleSet,
    limits: Limits = Limits(),
    cost: CostModel = CostModel(),
    fp: tuple[str, ...] = ("exact",),
    shapes: bool = True,
    provenance: bool = True,
    skip: tuple[str, ...] = (),
    only: tuple[str, ...] = (),
    domains: frozenset[str] = frozenset(),
    choose=None,
    sums: tuple[str, ...] = (),
) -> tuple[TermGraph, Report]:
    """Rewrite `graph` with `rules` by equality saturation and cost-based extraction.

    domains: the domains beyond the default one that the model imports and its target runs;
    rules whose ruleset writes ops of others are skipped (`select`).

    shapes: run the symbolic shape folding (`engine.shapes`) first; the rule verifier turns
    it off to see what a rule alone does.
    provenance: record rule firings and set `Node.provenance` / `Value.provenance` on what
    rewrites and folding produced (`engine.provenance`); False gives a bare graph.
    skip/only: rule names, globs or `ruleset:NAME` (`engine.selection.pick_rules`); the rules
    they exclude are in `report.skipped`. sums: the integer sums the result's runtime has
    (`pick_rules`: rules whose ruleset says `:sums int32` run only with `("int32",)`).
    choose(sites, build) -> keep: decides which `quant` rule sites stay in float
    (`engine.quantize`). Called after saturation with the `Site`s (empty when no quant rule
    fired) and `build(keep)`, which extracts and folds the graph with the sites whose indexes
    are in the frozenset `keep` in float (a TermGraph, no provenance); returns the indexes to
    keep. The extraction that follows forbids the kept sites' quantized e-nodes, and the
    activations quantized alone that only kept sites read (`engine.quantize.Activation`);
    `report.extra["quantized_sites"]` lists the indexes of the sites it took quantized (when
    there were sites).

    Returns the optimized graph (or `graph` itself when nothing cheaper was found) and a
    Report. Raises `engine.egraph.EGraphError` if egglog rejects the compiled rules and
    `engine.saturate.UnsoundRuleError` if a rule changes a value's type, and
    `engine.selection.UnknownRulePatternError` for a skip/only pattern matching no rule.
    """
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def stage(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[name] = now - clock
        clock = now

    deadline = limits.deadline if limits.deadline is not None else clock + limits.timeout
    limits = replace(limits, deadline=deadline)
    rules, excluded = pick_rules(rules, skip, only, sums)
    original = graph
    if not provenance:
        graph = bare(graph)
    graph, shape_stats = (
        fold_shapes(graph, provenance=provenance) if shapes else (graph, FoldStats())
    )
    stage("shapes")
    if time.perf_counter() > deadline:  # out of time before the e-graph is built
        return original, as_given(original, "time-limit", "shapes", seconds, cost)
    chosen, skipped = select(rules, graph.opset, fp, domains)
    skipped = {**excluded, **skipped}
    ops = {n.op for n in graph.nodes if not n.opaque}
    chosen = reachable(chosen, ops)
    ops = ops.union(*(r.lhs_ops | r.rhs_ops for r in chosen))
    most: dict[str, int] = {}  # the most inputs a node of each variadic op has
    for n in graph.nodes:
        if not n.opaque and OPS.get(n.op).variadic:
            most[n.op] = max(most.get(n.op, 0), sum(i != ABSENT for i in n.inputs))
    program = emit(RuleSet(tuple(chosen), rules.files), provenance, most)
    stage("emit")
    eg = EGraph(graph, program, ops)
    stage("import")
    hosts = host_rules(chosen, most)
    recorded = provenance or choose is not None  # sites are found from the firings
    sat, snap = saturate(eg, hosts, limits, prov.relations(chosen) if recorded else None)
    stage("saturate")
    forbid: frozenset[int] = frozenset()
    if choose is not None:
        found, alone = quant_sites(snap, chosen, prov.firings(snap, chosen, sat.host_firings), cost)

        def build(keep: frozenset[int]) -> TermGraph:
            forbid = forbidden(found, keep, alone)
            return fold(extract(snap, cost, sat.groups, forbid).graph, False)

        forbid = forbidden(found, frozenset(choose(found, build)), alone)
        stage("choose")
    ex = extract(snap, cost, sat.groups, forbid)
    stage("extract")
    quantized = None
    if choose is not None:  # the sites whose quantized form the extraction took
        used = set(ex.origins)
        quantized = [s.index for s in found if s.enodes & used]
    cheaper = ex.cost < ex.input_cost * (1 - 1e-9)  # summation order differs in the last bits
    extracted, unexplained = ex.graph, 0
    if provenance and cheaper:
        just = prov.Justification(snap, prov.firings(snap, chosen, sat.host_firings))
        extracted, unexplained = prov.attach(ex.graph, ex.origins, just)
        stage("provenance")
    out = fold(extracted, provenance) if cheaper else graph
    changed = cheaper or graph is not original and len(graph.nodes) < len(original.nodes)
    if not changed:
        out = original
    cost_before = ex.input_cost if graph is original else input_cost(original, cost)
    stage("fold")
    report = Report(
        stop_reason=sat.stop_reason,
        iterations=sat.iterations,
        enodes=sat.enodes,
        eclasses=len(snap.classes),
        seconds=seconds,
        fired=dict(sat.fired),
        rejected={rule: dict(reasons) for rule, reasons in sat.rejected.items()},
        skipped=skipped,
        nodes_before=len(original.nodes),
        nodes_after=len(out.nodes),
        ops_before=original.op_counts(),
        ops_after=out.op_counts(),
        cost_before=cost_before,
        cost_after=ex.cost if cheaper else ex.input_cost if changed else cost_before,
        changed=changed,
        fp=_loosest(chosen, sat.fired) if cheaper else "exact",
        extra={
            "shapes": asdict(shape_stats),
            "history": sat.history,
            "budget": sat.budget,
            **({"sites": dict(sat.sites)} if sat.sites else {}),
        },
        limit_stage=""
        if sat.stop_reason == "saturated"
        else "saturate"
        if sat.iterations
        else "import",
        provenance=prov.collect(out) if provenance and changed else {},
    )
    if unexplained:
        report.extra["provenance_unexplained"] = unexplained
    if quantized is not None and found:
        report.extra["quantized_sites"] = quantized if cheaper else []
    return out, report


def bare(g: TermGraph) -> TermGraph:
    """`g` without the provenance a frontend's import recorded on its nodes and constants."""
    if not any(n.provenance for n in g.nodes) and not any(v.provenance for v in g.values):
        return g
    return replace(
        g,
        nodes=tuple(replace(n, provenance=None) for n in g.nodes),
        values=tuple(replace(v, provenance=None) for v in g.values),
    )


def as_given(
    graph: TermGraph | None,
    reason: str,
    stage: str,
    seconds: dict[str, float],
    cost: CostModel = CostModel(),
) -> Report:
    """The Report of a run that stopped in `stage` (a budget, `reason`, ran out) before
    saturation, returning its input unchanged. `graph` is the input (None if it was not
    imported yet: node counts and costs are then 0, for the frontend to fill in)."""
    n, ops = (len(graph.nodes), graph.op_counts()) if graph is not None else (0, {})
    c = input_cost(graph, cost) if graph is not None else 0.0
    return Report(
        stop_reason=reason,
        iterations=0,
        enodes=0,
        eclasses=0,
        seconds=seconds,
        fired={},
        rejected={},
        skipped={},
        nodes_before=n,
        nodes_after=n,
        ops_before=ops,
        ops_after=ops,
        cost_before=c,
        cost_after=c,
        changed=False,
        fp="exact",
        limit_stage=stage,
    )


def _loosest(rules: list[Rule], fired) -> str:
    by_name = {r.name: r.fp for r in rules}
    classes = {by_name.get(name.removesuffix(" (reverse)"), "exact") for name in fired}
    return max(classes, key=FP_CLASSES.index, default="exact")
