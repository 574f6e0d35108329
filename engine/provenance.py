"""Provenance: the rule firings that justify each node of the extracted graph.

The pinned egglog has no proof output, so the engine records firings itself: each plain rule's
action inserts a row into its `prov-NAME` relation beside its `union` (`engine.emit`), and
the host apply step records the matches it applied (`engine.apply.HostFiring`). From the
final snapshot (canonical e-classes) each firing gives

- the e-nodes its right side created: the result term walked over the captured e-classes,
  each op looked up as an e-node of the snapshot (a host rule's built e-nodes by handle);
- the e-nodes its left side matched: the pattern matched top-down from the root e-class, the
  captures fixed to the recorded e-classes (a wildcard takes the first e-node that fits).

An e-node is original when the import made it (an imported node's op, attributes and input
e-classes). A created e-node may have several justifications; each gets the smallest
justification tree, cost 0 for an original e-node and 1 + the costs of the firing's
non-original left-side e-nodes otherwise, found by Knuth's generalization of Dijkstra's
algorithm (cycle-safe: an e-node is justified only by e-nodes justified before it).

The tree of one node, the format of ONNX `rewrite.rules` metadata, fx `node.meta["rewrite"]`
and the report's `provenance` section (see README, "Provenance"):

    {"rule": NAME, "at": "FILE:LINE", "op": OP, "replaces": [ORIGINAL NODE NAMES],
     "ops": [THEIR OPS], "after": [TREES of the rewritten e-nodes the rule matched, fired
     before it], "merged": [TREES of original nodes of the same value a rule removed],
     "marks": [NAMES of the marks it consumed, see below; absent when none]}

Folding adds `{"rule": "fold:OP", "at": "engine/shapes.py" or "engine/fold.py", ...}`, OP the
op whose value was folded: on each constant that shape folding (before saturation,
`engine.shapes`) or constant folding (after extraction, `engine.fold`) made, and on each node
whose inputs shape folding changed; `replaces` names the nodes that folding removed. A rule that
matched a node shape folding changed has that node's fold tree in its `after`. `describe` says
in words what each firing of a tree did (`--explain`, `rewrite explain`).

Marks (ops of the `MARK_DOMAIN` domain: an activation's calibrated range, a smoothing scale, a
rounded weight) are nodes the quantization's own passes put on the graph, not the user's: a
firing that consumed one lists it under `marks`, not `replaces`, and a mark a rule removed, or
the constants its import shared, are not shown as the user's nodes.

A node imported with a tree of its own (a model an earlier run wrote, or the graph of static
quantization's first pass, which folds BatchNormalization) keeps it: a rule matching that node
has its tree in `after`, as for a node shape folding changed.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass, replace

from dsl.ir import Absent, Capture, ListCapture, Literal, OpNode, Rule, Term, Wildcard
from engine.egraph import ENode, Snapshot
from engine.emit import captures, prov_relation
from vocab.graph import ABSENT, Node, TermGraph, unique_name
from vocab.ops import OPS, encode_attr

KEY = "rewrite.rules"  # ONNX metadata_props key, fx node.meta key is "rewrite"
MARK_DOMAIN = "rewrite"  # the domain of the quantization's marks (patterns/quant/*.rules)
MAX_TREE = 200  # tree nodes per explained node; a deeper history is cut (`"truncated": true`)


@dataclass(frozen=True)
class Firing:
    """One rule firing in the final snapshot's e-classes.

    name: the rule (`NAME (reverse)` for an `equal` rule's right-to-left direction). at:
    `file:line`. lhs: the matched pattern. root: the matched e-class. terms/attrs: captures
    (e-class / attribute string). created: e-nodes the right side built."""

    name: str
    at: str
    lhs: Term
    root: int
    terms: dict
    attrs: dict
    created: tuple[ENode, ...]


def directions(rules: list[Rule]) -> list[tuple[str, Rule, Term, Term]]:
    """(name, rule, lhs, rhs) of each compiled direction of the plain rules."""
    out = []
    for r in rules:
        if r.needs_host:
            continue
        out.append((r.name, r, r.lhs, r.rhs))
        if r.kind == "equal":
            out.append((f"{r.name} (reverse)", r, r.rhs, r.lhs))
    return out


def relations(rules: list[Rule]) -> tuple[str, ...]:
    """The provenance relations of `rules` (to read in full from the final snapshot)."""
    return tuple(prov_relation(name) for name, *_ in directions(rules))


def firings(snap: Snapshot, rules: list[Rule], host_firings: list) -> list[Firing]:
    """Every recorded firing, in the final snapshot's e-classes, in a deterministic order."""
    index = {n: c for c, n in snap.nodes}
    out: list[Firing] = []
    for name, r, lhs, rhs in directions(rules):
        terms, attrs = captures(lhs)
        for row in snap.rows.get(prov_relation(name), ()):
            t = dict(zip(terms, row[1:]))
            a = dict(zip(attrs, row[1 + len(terms) :]))
            created: list[ENode] = []
            if _build(snap, index, rhs, t, a, created) is not None:
                out.append(Firing(name, _at(r), lhs, row[0], t, a, tuple(created)))
    for h in host_firings:
        root = snap.handle.get(h.root)
        made = tuple(
            ENode(op, tuple(snap.handle.get(k, -1) for k in kids), attrs)
            for _, op, kids, attrs in h.created
        )
        if root is not None:
            terms = {n: snap.handle[v] for n, v in h.terms if v in snap.handle}
            out.append(
                Firing(
                    h.rule.name,
                    _at(h.rule),
                    h.rule.lhs,
                    root,
                    terms,
                    dict(h.attrs),
                    tuple(n for n in made if n in index),
                )
            )
    return out


def _at(r: Rule) -> str:
    return f"{r.span.file}:{r.span.line}"


def _build(
    snap: Snapshot, index: dict, t: Term, terms: dict, attrs: dict, created: list
) -> int | None:
    """E-class of plain right side `t` over the captures, appending the e-nodes it is made of
    to `created`; None when an e-node is not in the snapshot."""
    if isinstance(t, Capture):
        return terms.get(t.name)
    if isinstance(t, Absent):
        return snap.handle.get(ABSENT)
    kids = [_build(snap, index, a, terms, attrs, created) for a in t.args]
    if any(k is None for k in kids):
        return None
    spec = OPS.get(t.op)
    texts = []
    for (_name, v), a in zip(t.attrs, spec.attrs):
        texts.append(encode_attr(a.kind, v.value) if isinstance(v, Literal) else attrs.get(v.name))
    n = ENode(t.op, tuple(kids), tuple(texts))
    c = index.get(n)
    if c is not None:
        created.append(n)
    return c


def matched(snap: Snapshot, f: Firing) -> list[ENode] | None:
    """The e-nodes the left side of `f` matched (top-down from its root), or None."""
    absent = snap.handle.get(ABSENT)

    def match(t: Term, c: int) -> list[ENode] | None:
        if isinstance(t, Capture):
            want = f.terms.get(t.name)
            return [] if want is None or want == c else None
        if isinstance(t, Wildcard):
            return []
        if isinstance(t, Absent):
            return [] if c == absent else None
        if t.bind and f.terms.get(t.bind, c) != c:
            return None
        spec = OPS.get(t.op)
        for n in snap.classes.get(c, ()):
            if n.op != t.op or not _attrs_fit(t, spec, n, f.attrs):
                continue
            found = [n]
            for a, k in zip(t.args, n.children):
                sub = match(a, k)
                if sub is None:
                    break
                found += sub
            else:
                return found
        return None

    return match(f.lhs, f.root)


def _attrs_fit(t: OpNode, spec, n: ENode, attrs: dict) -> bool:
    for (_name, v), a, s in zip(t.attrs, spec.attrs, n.attrs):
        if isinstance(v, Literal) and encode_attr(a.kind, v.value) != s:
            return False
        if isinstance(v, Capture) and attrs.get(v.name, s) != s:
            return False
    return True


def original_names(snap: Snapshot) -> dict[ENode, str]:
    """Imported e-nodes -> the name of their node (its output's name if it has none)."""
    out: dict[ENode, str] = {}
    for name, e in _enodes(snap):
        out.setdefault(e, name)
    return out


def _enodes(snap: Snapshot):
    """(name, e-node) of each matchable imported node, in graph order (two nodes computing
    the same may share an e-node)."""
    g = snap.graph
    for n in g.nodes:
        if n.opaque:
            continue
        spec = OPS.get(n.op)
        attrs = tuple(encode_attr(spec.attr_index[a].kind, v) for a, v in n.attrs)
        e = ENode(n.op, tuple(snap.handle[i] for i in n.inputs), attrs)
        yield n.name or g.values[n.outputs[0]].name, e


class Justification:
    """The smallest justification tree of every rewritten e-node of a snapshot (see the module
    docstring). `tree(enode)` is the JSON-ready tree, or None for an original e-node or one
    no recorded firing created."""

    def __init__(self, snap: Snapshot, fired: list[Firing]):
        self.names = original_names(snap)
        self.marks = {e for e in self.names if is_mark(e.op)}
        # trees the shape folding (`engine.shapes`) or an earlier run left on imported nodes,
        # by name
        self.folded = {
            n.name or snap.graph.values[n.outputs[0]].name: n.provenance
            for n in snap.graph.nodes
            if n.provenance is not None and not is_mark(n.op)
        }
        self.fired = fired
        self.lhs: list[list[ENode]] = []
        self.premises: list[list[ENode]] = []
        for f in fired:
            m = matched(snap, f) or []
            self.lhs.append(m)
            self.premises.append(list(dict.fromkeys(n for n in m if self.rewritten(n))))
        self.best = self._knuth()
        self.class_of = {n: c for c, n in snap.nodes}
        self.graph = snap.graph
        self.by_name = {n.name: n for n in snap.graph.nodes if n.name}
        self.producer = {o: n for n in snap.graph.nodes for o in n.outputs}
        self.enode_of = {name: e for name, e in _enodes(snap)}
        # original e-nodes of each e-class, and the firings that matched one as their root:
        # why an original node is gone when another e-node of its class is extracted
        self.originals: dict[int, list[ENode]] = {}
        for n in self.names:
            c = self.class_of.get(n)
            if c is not None and n not in self.marks:
                self.originals.setdefault(c, []).append(n)
        self.by_root: dict[ENode, int] = {}
        for i, m in enumerate(self.lhs):
            if (
                m
                and m[0] in self.names
                and m[0] not in self.marks
                and all(p in self.best for p in self.premises[i])
            ):
                self.by_root.setdefault(m[0], i)

    def rewritten(self, n: ENode) -> bool:
        """True for an e-node that is neither imported nor a leaf (a rewrite made it)."""
        return n.op not in ("Leaf", "Absent") and n not in self.names

    def _knuth(self) -> dict[ENode, int]:
        waiting: dict[ENode, list[int]] = {}
        remaining = [len(p) for p in self.premises]
        for i, p in enumerate(self.premises):
            for n in p:
                waiting.setdefault(n, []).append(i)
        heap = [
            (1, i, j)
            for i, p in enumerate(self.premises)
            if not p
            for j in range(len(self.fired[i].created))
        ]
        heapq.heapify(heap)
        best: dict[ENode, int] = {}
        cost: dict[ENode, int] = {}
        while heap:
            k, i, j = heapq.heappop(heap)
            n = self.fired[i].created[j]
            if n in best or not self.rewritten(n):
                continue
            best[n], cost[n] = i, k
            for w in waiting.get(n, ()):
                remaining[w] -= 1
                if remaining[w] == 0:
                    total = 1 + sum(cost[p] for p in self.premises[w])
                    for j2 in range(len(self.fired[w].created)):
                        heapq.heappush(heap, (total, w, j2))
        return best

    def _walk(self, e: ENode, i: int, budget: list[int]) -> dict:
        f = self.fired[i]
        budget[0] -= 1
        gone = sorted({(self.names[m], m.op) for m in self.lhs[i] if m in self.names})
        marks = [name for name, op in gone if is_mark(op)]
        gone = [(name, op) for name, op in gone if not is_mark(op)]
        node = {
            "rule": f.name,
            "at": f.at,
            "op": e.op,
            "replaces": [name for name, _ in gone],
            "ops": [op for _, op in gone],
        }
        if marks:
            node["marks"] = marks
        if budget[0] <= 0:
            node["truncated"] = True
            node["after"] = []
            return node
        node["after"] = [self._walk(p, self.best[p], budget) for p in self.premises[i]]
        node["after"] += [self.folded[r] for r in node["replaces"] if r in self.folded]
        return node

    def input_trees(self, node: Node, g: TermGraph) -> list[dict]:
        """For a kept imported node (`node` of extracted graph `g`, by name): the trees of the
        rules that matched the imported nodes whose values it no longer reads (an input now
        computed by another e-node of its e-class, e.g. an Identity removed)."""
        before = self.by_name.get(node.name)
        if before is None or before.op != node.op:
            return []
        budget, out = [MAX_TREE], []
        for a, b in zip(before.inputs, node.inputs):
            if a == ABSENT or b == ABSENT or self.graph.values[a].name == g.values[b].name:
                continue
            p = self.producer.get(a)
            e = self.enode_of.get(p.name or self.graph.values[p.outputs[0]].name) if p else None
            if e is not None and e in self.by_root:
                t = self._walk(e, self.by_root[e], budget)
                # an e-node several imported nodes share is named after the first of them
                mine = p.name or self.graph.values[p.outputs[0]].name
                t["replaces"] = sorted({*t["replaces"], mine} - {self.names[e]} | {mine})
                out.append(t)
        return out

    def tree(self, n: ENode) -> dict | None:
        """The justification tree of e-node `n` (module docstring), at most MAX_TREE nodes; None
        for an original e-node that stands in for no other original node, or a rewritten one
        no recorded firing created."""
        budget = [MAX_TREE]
        walk = lambda e, i: self._walk(e, i, budget)  # noqa: E731

        shown = set(self.lhs[self.best[n]]) if n in self.best else set()
        gone = sorted(
            (
                m
                for m in self.originals.get(self.class_of.get(n), ())
                if m != n and m not in shown and m in self.by_root
            ),
            key=self.names.get,
        )
        merged = [walk(m, self.by_root[m]) for m in gone]
        if n in self.best:
            top = walk(n, self.best[n])
        elif merged and n in self.names:
            top = {
                "rule": "original",
                "at": "",
                "op": n.op,
                "replaces": [],
                "ops": [],
                "after": [],
            }
        else:
            return None
        if merged:
            top["merged"] = merged
        return top


def is_mark(op: str) -> bool:
    """True for an op of `MARK_DOMAIN` (qualified name `rewrite.Observed`, ...)."""
    return op.startswith(MARK_DOMAIN + ".")


def attach(g: TermGraph, origins: tuple, just: Justification) -> tuple[TermGraph, int]:
    """`g` (an extracted graph) with `Node.provenance` set on every node whose e-node
    (`origins`, parallel to `g.nodes`) a rewrite produced, and such a node without a name
    named after its output. Returns the graph and how many rewritten nodes no recorded
    firing explains (0 when every rewrite was recorded)."""
    taken = {n.name for n in g.nodes if n.name}
    nodes, unexplained = [], 0
    for n, origin in zip(g.nodes, origins):
        tree = just.tree(origin) if origin is not None else None
        if origin is not None and tree is None and just.rewritten(origin):
            unexplained += 1
        if tree is None and origin is not None and n.name:
            lost = just.input_trees(n, g)
            if lost:
                tree = {"rule": "original", "at": "", "op": n.op, "replaces": [], "after": lost}
                if n.provenance is not None:
                    tree = {**n.provenance, "after": [*n.provenance["after"], *lost]}
        if tree is not None and tree["rule"] == "original" and "merged" in tree and n.provenance:
            tree = {**n.provenance, "merged": tree["merged"]}  # a node shape folding changed
        if tree is not None:
            name = n.name or unique_name(g.values[n.outputs[0]].name, taken)
            n = replace(n, name=name, provenance=tree)
        nodes.append(n)
    return replace(g, nodes=tuple(nodes)), unexplained


def collect(g: TermGraph) -> dict[str, dict]:
    """Name -> provenance tree of every node and constant of `g` that has one (the report's
    `provenance` section), sorted by name."""
    out = {n.name: n.provenance for n in g.nodes if n.provenance is not None}
    out.update(
        {
            g.values[v].name: g.values[v].provenance
            for v in g.constants
            if g.values[v].provenance is not None
        }
    )
    return dict(sorted(out.items()))


def replaced_names(provenance: dict[str, dict]) -> dict[str, tuple[str, ...]]:
    """For each node of a report's `provenance` section (`collect`), the names of the
    original nodes its tree says it replaces, through the rewrites before it (`after`), in
    order, each once: a Conv with its BatchNormalization folded in replaces both."""
    out = {}
    for name, tree in provenance.items():
        names: dict[str, None] = {}
        stack = [tree]
        while stack:
            t = stack.pop()
            names.update(dict.fromkeys(t.get("replaces", ())))
            stack.extend(reversed(t.get("after", ())))
        if names:
            out[name] = tuple(names)
    return out


def dumps(tree: dict) -> str:
    """The compact JSON text of a tree (the ONNX metadata value)."""
    return json.dumps(tree, separators=(",", ":"))


PATTERN_WIDTH = 80  # longest rule pattern `describe` prints inline


def describe(name: str, op: str, tree: dict, patterns: dict[str, str] | None = None) -> list[str]:
    """What the rules of `tree` (the provenance of node or constant `name`, of op `op`) did,
    one line per firing, the last firing first, e.g. `add-zero: removed Add node_linear, whose
    value node_mm computes (patterns/cleanup/identity.rules:12)`. patterns: rule name -> its
    source pattern (`pattern_text`), shown after the location when given. Older trees without
    `ops` name the nodes without their ops. A pattern longer than `PATTERN_WIDTH` characters is
    left out (its file:line says where to read it)."""
    lines: list[str] = []

    def gone(t: dict) -> str:
        ops = t.get("ops") or [""] * len(t["replaces"])
        return ", ".join(f"{o} {n}".strip() for o, n in zip(ops, t["replaces"]))

    def where(t: dict) -> str:
        rule = (patterns or {}).get(t["rule"].removesuffix(" (reverse)"))
        if rule and len(rule) > PATTERN_WIDTH:  # a long pattern is read at its file:line
            rule = None
        return f" ({t['at']}{': ' + rule if rule else ''})" if t["at"] else ""

    def walk(t: dict, made: str, depth: int) -> None:
        pad = "  " * depth
        if t["rule"].startswith("fold:") or t["rule"] == "constant-folding":
            what = gone(t) or "rewritten nodes"
            lines.append(f"{pad}{t['rule']}: folded {what} into {made} ({t.get('at', '')})")
        elif t["rule"] != "original":
            if t["replaces"]:
                was = f"replaced {gone(t)} with"
            elif t.get("marks"):
                was = f"replaced the mark {', '.join(t['marks'])} with"
            else:
                was = "rewrote rewritten nodes into"
            lines.append(f"{pad}{t['rule']}: {was} {made}{where(t)}")
        for sub in t.get("merged", ()):
            lines.append(
                f"{pad}{sub['rule']}: removed {gone(sub) or sub['op']}, whose value "
                f"{f'{op} {name}'.strip()} computes{where(sub)}"
            )
            for before in sub.get("after", ()):
                walk(before, f"an intermediate {before['op']}", depth + 1)
        for before in t.get("after", ()):
            walk(before, f"an intermediate {before['op']} (rewritten again above)", depth + 1)

    folded = tree["rule"].startswith("fold:") or tree["rule"] == "constant-folding"
    made = f"constant {name}" if folded and not op else f"{op} {name}".strip()
    walk(tree, made, 0)
    return lines


def pattern_text(lhs: Term, rhs: Term) -> str:
    """A rule's source pattern in the DSL's notation, `(Add @x 0) -> @x` (attributes the rule
    leaves free are not shown)."""

    def text(t) -> str:
        if isinstance(t, ListCapture):
            return f"@{t.name}..."
        if isinstance(t, Capture):
            return f"@{t.name}"
        if isinstance(t, Wildcard):
            return "_"
        if isinstance(t, Absent):
            return "_"
        attrs = [f":{k} {_attr_text(v)}" for k, v in t.attrs if not isinstance(v, Wildcard)]
        return "(" + " ".join([t.op, *map(text, t.args), *attrs]) + ")"

    return f"{text(lhs)} -> {text(rhs)}"


def _attr_text(v) -> str:
    if isinstance(v, Capture):
        return f"@{v.name}"
    if isinstance(v, Literal):
        return json.dumps(list(v.value) if isinstance(v.value, tuple) else v.value)
    return f"({v.fn} {' '.join(_attr_text(a) for a in v.args)})"
