"""Quantization sites: where `quant` rules fired, so that extraction can keep a node in float.

A `quant` rule (numeric class `quant`, `patterns/quant/`) rewrites one node, a MatMul by a
constant weight say, into its integer form; after saturation the node's e-class holds both
the float e-node and the quantized one. A `Site` is one such e-class. Keeping a site in float
means extracting with the e-nodes the quant rules created in that e-class forbidden
(`engine.extract.extract(forbidden=...)`), so the float form is chosen there while everything
else is still extracted at least cost. Which sites to keep is the caller's choice: the user's
`--keep-float` names and `--op-types`, or an error budget measured on calibration inputs
(`frontends.onnx.quantize`); `engine.optimize.optimize(choose=...)` calls the chooser after
saturation, with a function that extracts the graph for a candidate choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from onnx.reference import ReferenceEvaluator

from dsl.ir import OpNode, Rule
from engine.cost import CostModel, graph_node_cost
from engine.egraph import VIEWS, ENode, Snapshot
from engine.provenance import Firing, matched, original_names
from vocab.graph import components
from vocab.onnx_nodes import onnx_node
from vocab.ops import OPS
from vocab.registry import EXACT_BOUNDS

MADE_DEPTH = 2  # how many ops deep an Operand may be computed from graph values


@dataclass(frozen=True, eq=False)
class Operand:
    """How to read, from one run of the float model, a value that a site's error estimate
    needs (an argument of its rule's bound, or the float output its error is relative to).

    names: the graph values its e-class holds (a run has any of them, or none). constant: its
    value, when the e-class holds a constant (read from the e-graph, as the run may have
    dropped it). made: when neither, an e-node of its e-class as (op, canonical attributes,
    input Operands), computed with onnx.reference from its inputs: the quantized activation
    Q(x, s, zp) that only rewriting made, which a static rule's bound reads. opset: the
    default-domain opset to compute `made` at."""

    names: tuple[str, ...] = ()
    constant: np.ndarray | None = None
    made: tuple[str, tuple, tuple[Operand, ...]] | None = None
    opset: int = 18

    def wanted(self) -> set[str]:
        """The graph values a run must give for `read` (those of `made`'s inputs too)."""
        if self.constant is not None:
            return set()
        if self.made is not None:
            return {n for o in self.made[2] for n in o.wanted()}
        return set(self.names)

    def read(self, run: dict) -> np.ndarray | None:
        """The value from `run` ({graph value name: array}), or None if it has none."""
        if self.constant is not None:
            return np.asarray(self.constant)
        if self.made is None:
            return next((np.asarray(run[n]) for n in self.names if n in run), None)
        op, attrs, operands = self.made
        args = [o.read(run) for o in operands]
        if any(a is None for a in args):
            return None
        names = [f"in{i}" for i in range(len(args))]
        node = onnx_node(op, names, ["out"], attrs)
        feeds = dict(zip(names, args))
        return np.asarray(ReferenceEvaluator(node, opsets={"": self.opset}).run(None, feeds)[0])


@dataclass(frozen=True)
class Site:
    """One e-class that a `quant` rule rewrote.

    index: position in the list `sites` returns. op: the op of the first imported node the
    rules' left sides matched (MatMul for a MatMul that rewriting fused into a Gemm first), or
    else of the e-node matched at the root. rules: the quant rules that fired there. names: the
    imported nodes the e-class computes, then the imported nodes the rules' left sides
    matched (what `--keep-float` patterns are matched against). value: the name of a graph
    value the e-class holds (the node's output), or None; values: those of every e-class of
    the site (a MatMul's and the Gemm's it was fused into). bound: the first rule's `(bound FN
    ARGS...)` as (FN, capture names), for an error estimate from the captures' values;
    operands: per capture the bound reads, how to read its value from a run of the float
    model (an `Operand`, or None where it cannot be). output: the float value the error is
    relative to: the root's, or for a rule whose result is a QuantizeLinear's integers (a
    static rule), the value that QuantizeLinear quantizes; level: then its scale, the float
    size of one of the levels the bound counts (None for a bound in float units). forbid:
    indexes into `Snapshot.nodes` of the e-nodes
    the quant rules created in this e-class (what keeping it in float forbids), and `enodes`
    those e-nodes themselves (to tell whether an extraction chose one). float_ns: the cost
    model's nanoseconds of the imported nodes of the quantized ops the site's rules matched
    (its products, `engine.cost.graph_node_cost`), what keeping it in float keeps. Sites whose rules
    matched a common imported node, or read a common constant (the weight), are one Site (a
    MatMul and the Gemm it was fused into)."""

    index: int
    op: str
    rules: tuple[str, ...]
    names: tuple[str, ...]
    value: str | None
    bound: tuple[str, tuple[str, ...]] | None
    forbid: frozenset[int]
    enodes: frozenset = frozenset()
    values: tuple[str, ...] = ()
    operands: dict = field(default_factory=dict)
    output: Operand | None = None
    level: Operand | None = None
    float_ns: float = 0.0

    @property
    def name(self) -> str:
        """The site's display name: its first node's name, or its value's."""
        return self.names[0] if self.names else self.value or f"site {self.index}"


@dataclass(frozen=True)
class Activation:
    """An activation that a `quant` rule quantized alone: a static mark's DQ(Q(x)) (patterns/
    quant/static.rules' quantize-observed), not a choice of its own but a step of the sites
    whose rules read it. Extraction could still take it where no quantized product reads it
    (an 8-bit MaxPool between two float Convs is cheaper than a float one), an error no site
    accounts for; so it stays in float when every site that reads it does (`forbidden`).

    forbid: indexes into `Snapshot.nodes` of the e-nodes its firings created and,
    transitively, those the exact rules built from them (the DequantizeLinear moved through a
    Relu and a MaxPool), imported e-nodes and ops over constants aside (a zero point a rule
    writes is one e-node that every activation shares). sites: the indexes of the Sites whose
    rules matched one of those e-nodes (the Convs that read the activation in 8 bits, and the
    one whose output it is)."""

    forbid: frozenset[int]
    sites: frozenset[int]


def sites(
    snap: Snapshot, rules: list[Rule], firings: list[Firing], cost: CostModel = CostModel()
) -> tuple[list[Site], list[Activation]]:
    """The e-classes where `quant` rules among `rules` fired (`firings`, from
    `engine.provenance.firings` on the final snapshot), one Site each, in the order of the
    graph's nodes; `cost` prices their float products (`Site.float_ns`). Second, the
    activations those rules quantized alone (`Activation`), tied to the sites that read them."""
    by_name = {r.name: r for r in rules}
    quant = [f for f in firings if by_name.get(f.name.removesuffix(" (reverse)")) is not None]
    quant = [f for f in quant if _chooses(by_name[f.name.removesuffix(" (reverse)")])]
    if not quant:
        return [], []
    index = {(c, n): i for i, (c, n) in enumerate(snap.nodes)}
    names = original_names(snap)
    held: dict[int, list[str]] = {}  # e-class -> the graph values it holds
    for vid, c in snap.handle.items():
        if 0 <= vid < len(snap.graph.values):
            held.setdefault(c, []).append(snap.graph.values[vid].name)
    value_of = {c: vs[0] for c, vs in held.items()}  # e-class -> the first
    computed: dict[int, list[str]] = {}  # e-class -> imported nodes with an output in it
    for n in snap.graph.nodes:
        for v in n.outputs:
            c = snap.handle.get(v)
            if c is not None:
                computed.setdefault(c, []).append(n.name or snap.graph.values[v].name)
    origins = _Origins(snap, firings, names)
    grouped: dict[int, list[Firing]] = {}
    for f in quant:
        grouped.setdefault(f.root, []).append(f)
    order = {c: i for i, c in enumerate(_graph_order(snap))}
    node_of = {n.name or snap.graph.values[n.outputs[0]].name: n for n in snap.graph.nodes}
    op_of = {name: n.op for name, n in node_of.items()}
    # the weights: constants of more than one element (a scale or zero point shared by many
    # activations ties nothing together)
    constant = {
        snap.handle[v]
        for v in snap.graph.constants
        if v in snap.handle and np.size(snap.graph.constants[v]) > 1
    }
    # and a weight read through a view (a bias-less Gemm's transB = 1 weight as its MatMul
    # reads it, a 1-D Conv's as its 2-D form reads it: `Snapshot.value_of`), which ties those
    # firings to the original product's
    constant |= {c for c, n in snap.nodes if n.op in VIEWS and n.children[0] in constant}
    # imported nodes that rewriting proved equal to their first input (an identity, such as
    # the marks of patterns/quant/static.rules): they compute nothing, so a site is not tied to
    # another through one, nor named by one's op
    marks = {
        n.name or snap.graph.values[n.outputs[0]].name
        for n in snap.graph.nodes
        if n.inputs
        and n.outputs
        and snap.handle.get(n.outputs[0]) is not None
        and snap.handle.get(n.outputs[0]) == snap.handle.get(n.inputs[0])
    }
    raw = []  # per root e-class: (root, firings, display names, names the left sides matched)
    alone: list[tuple[int, list[Firing]]] = []  # activations quantized alone
    for root in sorted(grouped, key=lambda c: order.get(c, len(order))):
        matched_names: list[str] = []
        weights: list[str] = []
        products, steps = [], []  # firings that rewrite a product, and the others
        for f in grouped[root]:
            names_f = [n for e in matched(snap, f) or () for n in origins.of(e) if n not in marks]
            weights_f = [f"@{c}" for c in f.terms.values() if c in constant]
            (products if names_f or weights_f else steps).append(f)
            matched_names += [n for n in names_f if n not in matched_names]
            weights += weights_f
        if steps and marks.intersection(computed.get(root, ())):
            # an activation's quantization at its mark (a step of other sites' rewrites, not a
            # choice), even where a product's output (a MatMul's to float) shares its e-class
            alone.append((root, steps))
            steps = []
        if products or steps:
            raw.append((root, products + steps, computed.get(root, []), matched_names + weights))
    # Sites that rewrite a common imported node or read a common constant (the weight) are one
    # site: MatMul + Add fused into a Gemm is quantized at the Gemm's e-class and at the
    # MatMul's, and keeping one in float must keep the product in float.
    # only the ops the quant rules quantize tie sites: a Relu or MaxPool the exact rules moved a
    # DequantizeLinear through is matched on the way into the next site, not quantized by it
    chosen = quantized_ops(by_name[f.name.removesuffix(" (reverse)")] for f in quant)
    first_with: dict[str, int] = {}
    links = []
    for i, (*_, matched_names) in enumerate(raw):
        for n in matched_names:
            if n.startswith("@") or op_of.get(n) in chosen:
                links.append((i, first_with.setdefault(n, i)))
    members: dict[int, list[int]] = {}
    for i, label in enumerate(components(len(raw), links)):
        members.setdefault(label, []).append(i)
    # which sites built each e-node: a site kept in float forbids those it built alone, in any
    # e-class (its weight's quantized form: an exact rule may have fused it into another
    # product, a Gemm reading the dequantized weight), not those it shares (a
    # DynamicQuantizeLinear of an activation three projections read, an activation's own)
    at = {n: i for i, (_, n) in enumerate(snap.nodes)}
    built: dict[int, set] = {}
    for label, group in members.items():
        for i in group:
            for f in raw[i][1]:
                for e in f.created:
                    if e in at:
                        built.setdefault(at[e], set()).add(label)
    chosen_ids = {id(f) for group in members.values() for i in group for f in raw[i][1]}
    for f in firings:  # what an activation's step, or an exact rule, built too is shared
        if id(f) not in chosen_ids:
            for e in f.created:
                if e in at:
                    built.setdefault(at[e], set()).add(None)
    for e in names:  # and an imported e-node (a Transpose another product reads) is no site's
        if e in at:
            built.setdefault(at[e], set()).add(None)
    out, fired = [], []  # the Sites, and each one's firings
    for label, group in members.items():
        roots = [raw[i][0] for i in group]
        # the site's rule and bound first: an integer-output form's where there is one
        # (QLinearMatMul beside a MatMul to float: static mode's chains take it, and its bound
        # counts the output's rounding)
        fs = sorted((f for i in group for f in raw[i][1]), key=lambda f: not _to_levels(snap, f))
        forbid = {
            index[(raw[i][0], e)]
            for i in group
            for f in raw[i][1]
            for e in f.created
            if (raw[i][0], e) in index
        }
        if not forbid:
            continue
        forbid |= {k for k, labels in built.items() if labels == {label}}
        site_names: list[str] = []
        for i in group:
            names_i = (*raw[i][2], *raw[i][3])
            site_names += [n for n in names_i if n not in site_names and not n.startswith("@")]
        # the product's own name first: an activation the rules merged into its output's
        # e-class (a Relu a symmetric int8 output clamps) holds a name there too, and named
        # the site a Relu (`--keep-float` is written against the product's name)
        site_names.sort(key=lambda n: n in marks or op_of.get(n) not in chosen)
        first = fs[0]
        imported = [op_of[n] for i in group for n in raw[i][3] if n in op_of]
        imported.sort(key=lambda op: op not in chosen)
        products = dict.fromkeys(n for i in group for n in raw[i][3] if op_of.get(n) in chosen)
        float_ns = sum(graph_node_cost(snap.graph, node_of[n], cost) for n in products)
        lhs = matched(snap, first) or ()
        rule = by_name[first.name.removesuffix(" (reverse)")]
        bound, operands = None, {}
        if rule.bound is not None:
            bound = (rule.bound.fn, tuple(a.name for a in rule.bound.args))
            for a in bound[1]:
                operands[a] = _operand(snap, held, first.terms.get(a))
        values = tuple(value_of[r] for r in roots if r in value_of)
        output, level = Operand(values, opset=snap.graph.opset), None
        if lhs and lhs[0].op == "QuantizeLinear":  # integers: the bound counts its levels
            output = _operand(snap, held, lhs[0].children[0])
            level = _operand(snap, held, lhs[0].children[1])
        out.append(
            Site(
                index=len(out),
                op=imported[0] if imported else lhs[0].op if lhs else "",  # lhs: a fallback
                rules=tuple(dict.fromkeys(f.name for f in fs)),
                names=tuple(site_names),
                value=values[0] if values else None,
                values=values,
                bound=bound,
                forbid=frozenset(forbid),
                enodes=frozenset(snap.nodes[i][1] for i in forbid),
                operands=operands,
                output=output,
                level=level,
                float_ns=float_ns,
            )
        )
        fired.append(fs)
    chooses = {id(f) for f in quant}
    steps = [f for f in firings if id(f) not in chooses]  # the exact rules' firings
    return out, _activations(snap, index, names, alone, fired, steps)


def _to_levels(snap: Snapshot, f: Firing) -> bool:
    """True if firing `f`'s left side is a QuantizeLinear: its result is an 8-bit value."""
    lhs = matched(snap, f)
    return bool(lhs) and lhs[0].op == "QuantizeLinear"


def _activations(
    snap: Snapshot,
    index: dict,
    names: dict,
    alone: list[tuple[int, list[Firing]]],
    fired: list[list[Firing]],
    steps: list[Firing],
) -> list[Activation]:
    """The `Activation` of each root e-class in `alone` (with the firings that quantized it
    there): the e-nodes those firings created, closed under the exact firings `steps` (one
    that matched such an e-node adds those it created), imported e-nodes (`names`) aside; and
    the sites (`fired`: each Site's firings, by index) whose left sides matched one."""
    if not alone:
        return []
    built_from: dict = {}  # e-node -> the exact firings that matched it
    for f in steps:
        for e in matched(snap, f) or ():
            built_from.setdefault(e, []).append(f)
    reads = [{e for f in fs for e in matched(snap, f) or ()} for fs in fired]
    at: dict = {}  # e-node -> its indexes in Snapshot.nodes
    for (_, e), i in index.items():
        at.setdefault(e, []).append(i)
    constant: dict[int, bool] = {}  # e-class -> whether it computes from constants alone

    def computes(e: ENode) -> bool:
        """Whether `e` computes from an activation: not imported, and not an op over constants
        alone (a zero point a rule wrote, shared by every activation's e-nodes)."""
        return e not in names and not all(_constant(snap, c, constant) for c in e.children)

    out = []
    for _, fs in alone:
        made = {e for f in fs for e in f.created if computes(e)}
        todo = list(made)
        while todo:
            for f in built_from.get(todo.pop(), ()):
                for e in f.created:
                    if e not in made and computes(e):
                        made.add(e)
                        todo.append(e)
        forbid = frozenset(i for e in made for i in at.get(e, ()))
        tied = frozenset(i for i, seen in enumerate(reads) if seen & made)
        out.append(Activation(forbid, tied))
    return out


def _constant(snap: Snapshot, c: int, memo: dict[int, bool]) -> bool:
    """Whether e-class `c` holds a constant or an e-node over constants alone (memoized in
    `memo`; a class met again on the way down counts as not constant)."""
    if c not in memo:
        memo[c] = False
        memo[c] = snap.value_of(c) is not None or any(
            n.children and all(_constant(snap, k, memo) for k in n.children)
            for n in snap.classes.get(c, ())
        )
    return memo[c]


def _operand(
    snap: Snapshot, held: dict[int, list[str]], c: int | None, depth: int = MADE_DEPTH
) -> Operand | None:
    """How to read e-class `c`'s value from a run of the float model (`Operand`): its graph
    values, its constant, or else the first standard-domain e-node of it whose inputs can be
    read so, up to `depth` ops deep; None if none can."""
    if c is None:
        return None
    constant = snap.value_of(c)
    if c in held or constant is not None:
        return Operand(tuple(held.get(c, ())), constant, opset=snap.graph.opset)
    if depth == 0:
        return None
    for n in snap.classes.get(c, ()):
        if not _computable(snap, n):
            continue
        inputs = [_operand(snap, held, k, depth - 1) for k in n.children]
        if all(i is not None for i in inputs):
            made = (n.op, n.decoded_attrs(), tuple(inputs))
            return Operand(made=made, opset=snap.graph.opset)
    return None


def _computable(snap: Snapshot, n: ENode) -> bool:
    """Whether onnx.reference can compute e-node `n` from its inputs: a standard-domain op of
    one output with every input present."""
    spec = OPS.get(n.op) if n.op in OPS else None
    return (
        spec is not None
        and not spec.domain
        and spec.output == 0
        and not any(snap.is_absent(k) for k in n.children)
    )


class _Origins:
    """The imported nodes an e-node was rewritten from: itself if imported, else those of the
    e-nodes the left sides of the firings that created it matched, transitively."""

    def __init__(self, snap: Snapshot, firings: list[Firing], names: dict):
        self.snap, self.names = snap, names
        self.created_by: dict = {}
        for f in firings:
            for e in f.created:
                self.created_by.setdefault(e, []).append(f)
        self.memo: dict = {}

    def of(self, e, seen=None) -> list[str]:
        if e in self.names:
            return [self.names[e]]
        if e in self.memo:
            return self.memo[e]
        seen = set() if seen is None else seen
        if e in seen:
            return []
        seen.add(e)
        out: list[str] = []
        for f in self.created_by.get(e, ()):
            for m in matched(self.snap, f) or ():
                out += [n for n in self.of(m, seen) if n not in out]
        self.memo[e] = out
        return out


def quantized_ops(rules) -> set[str]:
    """The ops that `rules` rewrite (a quantization mode's rulesets: its quant rules, and the
    exact rules that hand other ops to them, a Gemm as MatMul + Add, a 1-D Conv as a 2-D one;
    or the quant rules that fired): each left side's root op, or the op under its root
    QuantizeLinear (the static rules' Q(Conv(DQ(x), w)))."""
    ops = set()
    for r in rules:
        t = r.lhs
        if isinstance(t, OpNode) and t.op == "QuantizeLinear" and isinstance(t.args[0], OpNode):
            t = t.args[0]
        if isinstance(t, OpNode):
            ops.add(t.op)
    return ops


def _chooses(rule: Rule) -> bool:
    """True for a `quant` rule whose result is a choice: one that may err (a bound that is not
    `vocab.registry.EXACT_BOUNDS`'), not a rewrite exact on finite values that is `quant` only
    for how it treats NaN."""
    return rule.fp == "quant" and (rule.bound is None or rule.bound.fn not in EXACT_BOUNDS)


def forbidden(
    chosen: list[Site], keep: frozenset[int], activations: list[Activation] = ()
) -> frozenset[int]:
    """The e-nodes to forbid so that the sites whose indexes are in `keep` stay in float, and
    with them the `activations` that only those sites read (or none does)."""
    out = {i for s in chosen if s.index in keep for i in s.forbid}
    for a in activations:
        if a.sites <= keep:
            out |= a.forbid
    return frozenset(out)


def _graph_order(snap: Snapshot) -> list[int]:
    """E-classes of the graph's node outputs, in node order."""
    return [snap.handle[v] for n in snap.graph.nodes for v in n.outputs if v in snap.handle]
