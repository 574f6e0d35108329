"""The e-graph: a TermGraph loaded into egglog, and snapshots of it read back into Python.

Import is bulk (DESIGN.md, measured egglog facts): every node becomes one row of a per-op
relation, written as a tab-separated file that egglog reads with `input`, and one pass of the
`load` ruleset builds all terms. Loading one command per node is superlinear and is never done.

A `Snapshot` is the e-graph frozen into rows (`EGraph.freeze`): e-nodes with their e-class,
handles (imported value -> e-class), and the rows of host-rule match relations. E-classes are
small ints local to one snapshot.
"""

from __future__ import annotations

import heapq
import tempfile
import weakref
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import egglog.bindings as egg
import numpy as np

from engine.emit import egg_string, schema
from engine.infer import infer_type
from vocab.graph import ABSENT, TermGraph
from vocab.ops import OPS, decode_attr, encode_attr
from vocab.types import UNKNOWN, ClassInfo, TensorType


class EGraphError(RuntimeError):
    """egglog rejected a program (a bug in emitted text or an unsound rule)."""


class EGraph:
    """An egglog e-graph holding one TermGraph, with the op schema and compiled rules loaded.

    graph: the imported graph (its value ids are the handles `(T i)`).
    program: the egglog text of the rules (`engine.emit.emit`).
    ops: the ops to declare (`engine.emit.schema`); None declares every op of the op table.
    It must hold every op of the graph's matchable nodes and of the rules' both sides.
    """

    def __init__(self, graph: TermGraph, program: str, ops: set[str] | None = None):
        self.graph = graph
        self.egg = egg.EGraph()
        self.next_id = len(graph.values)  # handles of e-classes added by host rules
        self.extra_types: dict[int, TensorType] = {}
        self.strings: dict = {}  # egglog String value -> Python str, shared by snapshots
        self.seen_rows: set = set()  # match-relation rows already handed to a snapshot
        self.run(schema(ops))
        self._load(graph)
        self.run(program)

    def run(self, text: str) -> list:
        """Run egglog commands; raises EGraphError with egglog's message on failure."""
        try:
            return self.egg.run_program(*self.egg.parse_program(text))
        except egg.EggSmolError as e:
            raise EGraphError(str(e)) from None

    def sizes(self) -> dict[str, int]:
        """Rows per egglog function/relation."""
        return dict(self.run("(print-size)")[-1].sizes)

    def enode_count(self) -> int:
        """E-nodes (op applications and leaves; handles not counted)."""
        s = self.sizes()
        return sum(n for name, n in s.items() if name in OPS or name == "Leaf")

    def _load(self, g: TermGraph) -> None:
        rows: dict[str, list[str]] = {}
        leaves = set(g.inputs) | set(g.constants)
        for n in g.nodes:
            if n.opaque:
                leaves.update(n.outputs)
                continue
            spec = OPS.get(n.op)
            cells = [str(n.outputs[0]), *(str(i) for i in n.inputs)]
            cells += [encode_attr(spec.attr_index[a].kind, v) for a, v in n.attrs]
            rows.setdefault(f"{n.op}Row", []).append("\t".join(cells))
        rows["LeafRow"] = [str(v) for v in sorted(leaves)]
        self.load_rows(rows, first=True)

    def load_rows(self, rows: dict[str, list[str]], first: bool = False) -> None:
        """Bulk-load rows (relation -> tab-separated lines) and run the `load` ruleset once.

        Besides the per-op rows this takes `UnionRow` lines "a<TAB>b", which union the
        handles (T a) and (T b): how the host apply step adds its results without one
        command per result (parsing and running single commands is quadratic in egglog)."""
        with tempfile.TemporaryDirectory(prefix="rewrite-load-") as tmp:
            cmds = [f"(union (T {ABSENT}) (Absent))"] if first else []
            for rel, lines in rows.items():
                if not lines:
                    continue
                path = Path(tmp) / f"{rel}.tsv"
                path.write_text("\n".join(lines) + "\n")
                cmds.append(f'(input {rel} "{path}")')
            cmds.append("(run load 1)")
            self.run("\n".join(cmds))

    def snapshot(self, relations: tuple[str, ...] = (), full: tuple[str, ...] = ()) -> Snapshot:
        """Freeze the e-graph into a Snapshot; `relations` are the match relations to read (new
        rows only), `full` relations read whole (the provenance relations, at the end)."""
        return Snapshot.read(self, relations, full)


@dataclass(frozen=True)
class ENode:
    """One e-node: op name, child e-classes, attribute strings, and for a Leaf its value id."""

    op: str
    children: tuple[int, ...]
    attrs: tuple[str, ...] = ()
    leaf: int = -1

    def decoded_attrs(self) -> tuple[tuple[str, object], ...]:
        """(name, value) of each of the op's attributes (op table order), decoded from the
        attribute strings (None for one not set)."""
        spec = OPS.get(self.op)
        return tuple((a.name, decode_attr(a.kind, s)) for a, s in zip(spec.attrs, self.attrs))


def _informative(t: TensorType) -> tuple[int, int]:
    """How much a type says: (dtype known, then 0 unknown rank / 1 some dimension unknown / 2
    every dimension an int or a symbol), compared as a tuple."""
    if t.shape is None:
        return (bool(t.dtype), 0)
    return (bool(t.dtype), 1 + all(d is not None for d in t.shape))


# ops whose result over an imported constant `Snapshot.value_of` reads as a constant (a view)
VIEWS = ("Transpose", "Unsqueeze")


@dataclass(eq=False)
class Snapshot:
    """The e-graph as rows. classes: e-class -> its e-nodes. handle: value id -> e-class.

    rows: match-relation rows that no earlier snapshot of the same EGraph returned (a row
    whose e-classes were merged since comes again; `apply_matches` keys matches by stable
    terms, so it is not applied twice)."""

    graph: TermGraph
    nodes: list[tuple[int, ENode]]
    classes: dict[int, list[ENode]]
    handle: dict[int, int]
    handles_of: dict[int, list[int]]
    rows: dict[str, list[tuple]]
    extra_types: dict[int, TensorType] = field(default_factory=dict)
    _types: dict[int, TensorType] = field(default_factory=dict)
    _reps: dict[int, str] = field(default_factory=dict)
    _finite: dict[int, ENode | None] | None = None

    def finite_node(self, c: int) -> ENode | None:
        """The e-node of class `c` that starts its shallowest finite term (every e-class in it
        has a handle or such an e-node in turn), or None if `c` has a handle or no finite
        term. The e-node with the fewest children may lead back to `c` (Squeeze(Unsqueeze(c))
        sits in c's class after squeeze-unsqueeze), so heights are computed for all classes
        at once, bottom-up (a Dijkstra over the e-graph as an and-or graph)."""
        if self._finite is None:
            self._finite = _shallowest(self.classes, self.handles_of)
        return self._finite.get(c)

    @staticmethod
    def read(eg: EGraph, relations: tuple[str, ...], full: tuple[str, ...] = ()) -> Snapshot:
        """Read egglog's e-graph of `eg` into a Snapshot: the e-nodes of known ops, `Leaf` and
        `Absent`, grouped into e-classes (renumbered 0..n-1), the handle `(T v)` of each imported
        or built value, and the rows of the match relations `relations` (only rows no earlier
        snapshot read) and `full` (all rows), with Term columns as e-class ids."""
        frozen = eg.egg.freeze().functions
        ids: dict = {}
        cid = lambda v: ids.setdefault(v, len(ids))  # noqa: E731
        i64, to_string = eg.egg.value_to_i64, eg.egg.value_to_string
        strings = eg.strings  # attribute values repeat: one FFI call per distinct value

        def string(v):
            s = strings.get(v)
            if s is None:
                s = strings[v] = to_string(v)
            return s

        nodes: list[tuple[int, ENode]] = []
        handle: dict[int, int] = {}
        for name, fn in frozen.items():
            if name == "T":
                for r in fn.rows:
                    handle[i64(r.inputs[0])] = cid(r.output)
            elif name == "Leaf":
                nodes += [(cid(r.output), ENode("Leaf", (), (), i64(r.inputs[0]))) for r in fn.rows]
            elif name == "Absent":
                nodes += [(cid(r.output), ENode("Absent", ())) for r in fn.rows]
            elif name in OPS:
                n_in = OPS.get(name).arity
                for r in fn.rows:
                    kids = tuple(cid(v) for v in r.inputs[:n_in])
                    attrs = tuple(string(v) for v in r.inputs[n_in:])
                    nodes.append((cid(r.output), ENode(name, kids, attrs)))
        rows = {}
        seen = eg.seen_rows
        for rel in relations + full:
            fn = frozen.get(rel)
            sorts = fn.input_sorts if fn else []
            new = []
            for r in fn.rows if fn else ():
                raw = (rel, *r.inputs)
                if rel not in full:
                    if raw in seen:  # read by an earlier snapshot, with the same e-classes
                        continue
                    seen.add(raw)
                new.append(
                    tuple(cid(v) if s == "Term" else string(v) for s, v in zip(sorts, r.inputs))
                )
            rows[rel] = new
        classes: dict[int, list[ENode]] = {}
        for c, n in nodes:
            classes.setdefault(c, []).append(n)
        handles_of: dict[int, list[int]] = {}
        for v, c in handle.items():
            handles_of.setdefault(c, []).append(v)
        return Snapshot(eg.graph, nodes, classes, handle, handles_of, rows, eg.extra_types)

    # ---- facts about e-classes -------------------------------------------------------------

    def type_of(self, c: int) -> TensorType:
        """The e-class's tensor type: an imported value's type if it holds one, else inferred
        from one of its e-nodes by the op table's shape rule.

        Iterative (an explicit stack, children before parents), so a chain of any depth is
        fine; on a cycle of e-classes the class met again while pending is seen as unknown."""
        t = self._types.get(c)
        if t is not None:
            return t
        stack = [(c, False)]
        while stack:
            x, ready = stack.pop()
            if ready:
                self._types[x] = self._infer(x)
                continue
            if x in self._types:
                continue
            self._types[x] = UNKNOWN  # pending: a cycle back to x sees it as unknown
            stack.append((x, True))
            if self._handle_static(x) is None:
                stack.extend(
                    (k, False)
                    for n in self.classes.get(x, ())
                    for k in n.children
                    if k not in self._types
                )
        return self._types[c]

    def _handle_static(self, c: int) -> TensorType | None:
        for v in self.handles_of.get(c, ()):
            t = self.handle_type(v)
            if t.static:
                return t
        return None

    def _infer(self, c: int) -> TensorType:
        """The most informative of the class's types: a static one at once; else the best of
        its handles' types (imported ones first) and its e-nodes' inferred types, ranked by
        `_informative` (a symbolic shape with every dimension named beats one with unknown
        dimensions, which beats an unknown rank)."""
        best, score = UNKNOWN, _informative(UNKNOWN)
        handles = sorted(
            self.handles_of.get(c, ()), key=lambda v: not 0 <= v < len(self.graph.values)
        )
        candidates = (self.handle_type(v) for v in handles)
        for t in candidates:
            if t.static:
                return t
            if _informative(t) > score:
                best, score = t, _informative(t)
        for n in self.classes.get(c, ()):
            if n.op in ("Leaf", "Absent"):
                continue
            t = self.infer_enode(n)
            if t.static:
                return t
            if _informative(t) > score:
                best, score = t, _informative(t)
        return best

    def handle_type(self, v: int) -> TensorType:
        """Type of handle (T v): an imported value's type, or one a host rule inferred."""
        if 0 <= v < len(self.graph.values):
            return self.graph.values[v].type
        return self.extra_types.get(v, UNKNOWN)

    def infer_enode(self, n: ENode) -> TensorType:
        """Type of e-node `n` computed from its children's types (op table shape rule)."""
        attrs = n.decoded_attrs()
        ins = tuple(None if self.is_absent(k) else self.type_of(k) for k in n.children)
        vals = tuple(None if self.is_absent(k) else self.value_of(k) for k in n.children)
        return infer_type(n.op, attrs, ins, vals)

    def is_absent(self, c: int) -> bool:
        """True if e-class `c` is the `Absent` class (an omitted optional input)."""
        return self.handle.get(ABSENT) == c

    def value_of(self, c: int):
        """The constant held by e-class `c`: an imported one, a `Constant` op's value (e.g.
        the shape a rule wrote for a Reshape), or a view of an imported one (read-only): its
        2-D Transpose (Gemm's transB = 1 weight as a MatMul reads it, fusion/gemm.rules) or an
        Unsqueeze by constant axes (a 1-D Conv's weight as the 2-D Conv reads it,
        quant/static.rules). None if the class holds none of these."""
        view = None
        for n in self.classes.get(c, ()):
            if n.op == "Leaf" and n.leaf in self.graph.constants:
                return self.graph.constants[n.leaf]
            if n.op == "Constant":
                return constant_op_value(n.attrs)
            if n.op in VIEWS and view is None:
                view = n
        return None if view is None else self._view_of_constant(view)

    def _view_of_constant(self, n: ENode):
        """The value of `VIEWS` e-node `n` of an imported constant: a Transpose that swaps the
        two axes of a 2-D one, an Unsqueeze by constant axes; read-only, or None."""
        v = next(
            (
                self.graph.constants[m.leaf]
                for m in self.classes.get(n.children[0], ())
                if m.op == "Leaf" and m.leaf in self.graph.constants
            ),
            None,
        )
        if v is None:
            return None
        if n.op == "Transpose":
            attrs = dict(n.decoded_attrs())
            if v.ndim != 2 or tuple(attrs.get("perm") or (1, 0)) != (1, 0):
                return None
            return _view(self.graph, v, ("T",))
        # Unsqueeze(v, axes): axes a constant of distinct axes of the result's rank
        axes = None if len(n.children) < 2 else self.value_of(n.children[1])
        if axes is None or axes.ndim != 1:
            return None
        rank = v.ndim + axes.size
        norm = tuple(sorted(int(a) % rank for a in axes if -rank <= int(a) < rank))
        if len(set(norm)) != axes.size:
            return None
        return _view(self.graph, v, ("unsqueeze", *norm))

    def info(self, c: int) -> ClassInfo:
        """What guards see of e-class `c`: its type is inferred only when a guard reads it
        (`is-constant` needs the value alone; a multi-root rule's rows evaluate thousands)."""
        return _LazyInfo(self, c)

    def rep(self, c: int, depth: int = 0) -> str:
        """egglog text of a term in e-class `c`: a handle `(T i)` when the class has one, else
        an e-node over its children's representatives. Raises EGraphError if none is found."""
        r = self._reps.get(c)
        if r is not None:
            return r
        hs = self.handles_of.get(c)
        if hs:
            r = f"(T {min(hs)})"
        elif depth > 50 or self.finite_node(c) is None:
            raise EGraphError(f"e-class {c} has no finite term")
        else:
            n = self.finite_node(c)
            kids = " ".join(self.rep(k, depth + 1) for k in n.children)
            r = f"({n.op} {kids} {' '.join(egg_string(a) for a in n.attrs)})"
        self._reps[c] = r
        return r


_VIEWS: dict[int, dict] = {}  # id(TermGraph) -> {(id(constant), how): view}, while it lives


def _view(graph: TermGraph, base: np.ndarray, how: tuple) -> np.ndarray:
    """The read-only view `how` (("T",): the transpose; ("unsqueeze", *axes)) of `base`, a
    constant of `graph`: the same object for as long as `graph` lives (the rules' builders
    remember what they computed of a weight by its identity, vocab.registry's step caches,
    and a snapshot is read again at every saturation iteration); dropped with the graph."""
    views = _VIEWS.get(id(graph))
    if views is None:
        views = _VIEWS[id(graph)] = {}
        weakref.finalize(graph, _VIEWS.pop, id(graph), None)
    key = (id(base), how)
    hit = views.get(key)
    if hit is not None and hit[0] is base:
        return hit[1]
    view = base.T if how == ("T",) else np.expand_dims(base, how[1:])
    view.setflags(write=False)
    views[key] = (base, view)
    return view


class _LazyInfo(ClassInfo):
    """A `ClassInfo` of a Snapshot's e-class whose type and value are computed when read."""

    def __init__(self, snap: Snapshot, c: int):  # no dataclass init: fields are properties
        object.__setattr__(self, "_where", (snap, c))

    @property
    def type(self) -> TensorType:
        snap, c = self._where
        return snap.type_of(c)

    @property
    def value(self):
        snap, c = self._where
        return snap.value_of(c)


@lru_cache(maxsize=4096)
def constant_op_value(attrs: tuple[str, ...]):
    """numpy value of a `Constant` e-node from its attribute strings (value_float,
    value_floats, value_int, value_ints, in op-table order); None if none is set. Read-only
    and shared: guards read a rule's per-channel scales (thousands of floats) on every match,
    so each attribute string is decoded once."""
    spec = OPS.get("Constant")
    for a, text in zip(spec.attrs, attrs):
        v = decode_attr(a.kind, text)
        if v is not None:
            arr = np.asarray(v, dtype=np.float32 if a.kind.startswith("float") else np.int64)
            arr.setflags(write=False)
            return arr
    return None


def _shallowest(
    classes: dict[int, list[ENode]], handles_of: dict[int, list[int]]
) -> dict[int, ENode | None]:
    """Per e-class, the e-node of least height (a class with a handle has height 0 and no
    e-node; an e-node's height is one more than its highest child's), for every class that
    has a finite term. Ties go to the e-node listed first."""
    heap: list[tuple[int, int, int, ENode | None]] = []
    pending: list[list] = []  # per e-node: [children not yet reached, class, e-node]
    parents: dict[int, list[int]] = {}
    for c, nodes in classes.items():
        if handles_of.get(c):
            heap.append((0, len(heap), c, None))
        for n in nodes:
            kids = set(n.children)
            for k in kids:
                parents.setdefault(k, []).append(len(pending))
            pending.append([len(kids), c, n])
            if not kids:
                heap.append((1, len(heap), c, n))
    heapq.heapify(heap)
    height: dict[int, int] = {}
    best: dict[int, ENode | None] = {}
    seq = len(heap)
    while heap:
        h, _, c, n = heapq.heappop(heap)
        if c in height:
            continue
        height[c], best[c] = h, n
        for i in parents.get(c, ()):
            entry = pending[i]
            entry[0] -= 1
            if entry[0] == 0:
                seq += 1
                heapq.heappush(
                    heap, (1 + max(height[k] for k in entry[2].children), seq, entry[1], entry[2])
                )
    return best
