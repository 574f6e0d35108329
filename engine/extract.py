"""Extraction: choose one e-node per needed e-class, minimizing DAG cost, and build a TermGraph.

DAG cost counts a shared e-class once, however many users it has (egglog's built-in extractor
counts it once per use, see DESIGN.md). The algorithm, in the spirit of extraction-gym's
DAG-greedy extractors (github.com/egraphs-good/extraction-gym):

1. constant analysis: an e-class is constant when it holds an imported constant, or an e-node
   of a foldable op whose inputs are all constant (or a Shape of a statically shaped value) and
   whose result is not too large to store; constant e-classes cost nothing (folded later);
   a DequantizeLinear of constants (`vocab.ops.KEPT_UNFOLDED`: never folded) costs nothing
   either, and its consumers are charged for reading its stored integers, not the float
   tensor: runtimes fuse it into the op that reads it (onnxruntime turns DequantizeLinear +
   MatMul into MatMulNBits, QDQ Conv into QLinearConv), so a quantized weight is read at its
   stored width;
2. tree-cost greedy: each e-class takes its cheapest e-node, children's costs added, computed
   to a fixpoint with a worklist (e-graphs have cycles, e.g. after x == Identity(x));
3. DAG refinement: recompute with e-classes already needed by the current choice counted as
   free, which is what sharing means, then keep whichever choice has the lower true DAG cost
   (and no cycle).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

from engine.cost import CostModel, graph_node_cost
from engine.egraph import ENode, Snapshot
from engine.rebuild import build_graph
from vocab.graph import ABSENT, TermGraph
from vocab.ops import KEPT_UNFOLDED, OPS
from vocab.types import TensorType

FOLD_MAX_ELEMENTS = 1 << 16  # a computed constant larger than this (and its inputs) stays an op
_EPS = 1.0  # cost of a foldable e-node: near zero, positive so that choices stay acyclic
_NEW = 0.01  # added to an e-node the input graph does not have: ties go to the input's form


def small_enough_to_fold(out: TensorType, inputs: list[TensorType]) -> bool:
    """True if a computed constant of type `out` may be stored: its size is known and at most
    FOLD_MAX_ELEMENTS or its inputs' sizes added up (so folding never blows a model up: a
    Concat of constant weights, packed Q/K/V, is no bigger than its inputs, an Expand or Tile
    of one is). The one size rule shared by extraction (pricing constants at ~0) and
    `engine.fold`."""
    limit = max(FOLD_MAX_ELEMENTS, sum(t.numel or 0 for t in inputs))
    return out.numel is not None and out.numel <= limit


@dataclass(frozen=True)
class Extraction:
    """The extracted graph and the DAG cost (ns) of the selection and of the input.

    origins: parallel to `graph.nodes`, the chosen e-node of each (None for an opaque node)."""

    graph: TermGraph
    cost: float
    input_cost: float
    origins: tuple = ()


class _Costs:
    """Per-e-node data: children (opaque leaves get their node's inputs) and own cost."""

    def __init__(self, snap: Snapshot, model: CostModel):
        self.snap, self.model = snap, model
        g = snap.graph
        self.opaque_of = {v: i for i, n in enumerate(g.nodes) if n.opaque for v in n.outputs}
        self.enodes: list[tuple[int, ENode]] = snap.nodes
        self.kids: list[tuple[int, ...]] = []
        self.group: list[int] = []  # opaque node index, or -1
        for _c, n in self.enodes:
            if n.op == "Leaf" and n.leaf in self.opaque_of:
                idx = self.opaque_of[n.leaf]
                node = g.nodes[idx]
                reads = [i for i in node.inputs if i != ABSENT] + list(node.implicit)
                self.kids.append(tuple(snap.handle[i] for i in reads))
                self.group.append(idx)
            else:
                self.kids.append(tuple(k for k in n.children if not snap.is_absent(k)))
                self.group.append(-1)
        self.constant: set[int] = set()
        self._find_constant_classes()
        # e-classes computed by a DequantizeLinear of constants -> the stored input's type,
        # which a consumer is charged for reading (see the module doc)
        self.stored: dict[int, TensorType] = {}
        for i, (c, _) in enumerate(self.enodes):
            if self._dequantizes_constants(i):
                self.stored.setdefault(c, self.snap.type_of(self.kids[i][0]))
        # The input's own e-nodes, as (op, child classes). Among forms of equal cost the input's
        # wins: a rewrite that saves nothing (a scale moved up a chain that a Shape also reads)
        # would otherwise be taken by the order of the heap, and may duplicate shared nodes.
        self.original = {
            (n.op, tuple(snap.handle[i] for i in n.inputs if i != ABSENT))
            for n in g.nodes
            if not n.opaque
        }
        self.own = [self._own(i) for i in range(len(self.enodes))]

    def _own(self, i: int) -> float:
        c, n = self.enodes[i]
        if n.op in ("Leaf", "Absent"):
            if self.group[i] < 0:
                return 0.0
            return opaque_cost(self.snap.graph, self.snap.graph.nodes[self.group[i]], self.model)
        if c in self.constant and self._foldable(i) or self._dequantizes_constants(i):
            return _EPS
        ins = tuple(self.stored.get(k) or self.snap.type_of(k) for k in self.kids[i])
        attrs = n.decoded_attrs()
        new = 0.0 if (n.op, self.kids[i]) in self.original else _NEW
        return self.model.node_cost(n.op, attrs, ins, self.snap.type_of(c)) + new

    def _dequantizes_constants(self, i: int) -> bool:
        """True if e-node i is a kept-unfolded op (DequantizeLinear) of constants only."""
        _, n = self.enodes[i]
        kids = self.kids[i]
        return n.op in KEPT_UNFOLDED and bool(kids) and all(k in self.constant for k in kids)

    def _foldable(self, i: int) -> bool:
        c, n = self.enodes[i]
        if n.op == "Leaf":
            return n.leaf in self.snap.graph.constants
        if n.op == "Absent" or OPS.get(n.op).random or n.op in KEPT_UNFOLDED:
            return False
        if n.op == "Dropout" and len(n.children) > 2 and not self.snap.is_absent(n.children[2]):
            return False  # may drop at random (training_mode), as engine.fold knows
        out = self.snap.type_of(c)
        if n.op in ("Shape", "Size"):
            return self.snap.type_of(self.kids[i][0]).static
        if not all(k in self.constant for k in self.kids[i]):
            return False
        return small_enough_to_fold(out, [self.snap.type_of(k) for k in self.kids[i]])

    def _find_constant_classes(self) -> None:
        """Fill `self.constant` to a fixpoint (a class is constant once one e-node folds)."""
        parents: dict[int, list[int]] = {}
        for i, ks in enumerate(self.kids):
            for k in ks:
                parents.setdefault(k, []).append(i)
        work = list(range(len(self.enodes)))
        while work:
            i = work.pop()
            c = self.enodes[i][0]
            if c not in self.constant and self._foldable(i):
                self.constant.add(c)
                work.extend(parents.get(c, ()))


def extract(
    snap: Snapshot, model: CostModel | None = None, groups=(), forbidden=frozenset()
) -> Extraction:
    """Extract the cheapest graph from `snap` for the graph outputs of `snap.graph`.

    groups: the applied matches of multi-root rules (`SaturationReport.groups`: per match,
    (root handle, result e-node as (op, child handles, attribute strings)) per root). Each
    root's result alone usually costs more than the root (three projections of one packed
    MatMul each pay for the whole MatMul in a per-class choice), so each match's results are
    also tried together, and kept when they lower the DAG cost of the whole graph.

    forbidden: indexes into `snap.nodes` of e-nodes never chosen (their cost is infinite), e.g.
    the quantized forms of a node the user keeps in float (`engine.quantize`).

    Returns the extracted TermGraph with its DAG cost and the DAG cost of the input graph
    (both in the cost model's nanoseconds; constant-only subgraphs of the extracted graph cost
    nothing since they are folded, while the input is charged as it stands).
    """
    costs = _Costs(snap, model or CostModel())
    for i in forbidden:
        costs.own[i] = math.inf
    roots = [snap.handle[v] for v in snap.graph.outputs]
    choice = _greedy(costs, free=set())
    best, best_cost = choice, _dag_cost(costs, choice, roots)
    # Tree costs count a shared value once per use, so the greedy choice may undo sharing the
    # input had. Rerun it with the classes the best choice so far uses as free (each is paid
    # once however many times it is read), and with the classes the input graph uses.
    seeds = [_reachable(costs, best, roots)]
    own = _input_choice(costs)
    if own is not None:
        seeds.append(_reachable(costs, own, roots))
    for needed in seeds:
        for _ in range(2):
            cand = _greedy(costs, free=needed)
            if _reachable(costs, cand, roots, check_cycles=True) is None:
                break
            cand_cost = _dag_cost(costs, cand, roots)
            if cand_cost >= best_cost:
                break
            best, best_cost = cand, cand_cost
            needed = _reachable(costs, best, roots)
    if own is not None:
        best = _LocalSearch(costs, best, roots).revert_to(own)
        best_cost = _dag_cost(costs, best, roots)
    moves = _group_moves(costs, groups)
    if moves:
        search = _LocalSearch(costs, best, roots)
        for move in moves:
            search.try_together(move)
        if _reachable(costs, search.choice, roots, check_cycles=True) is not None:
            cand_cost = _dag_cost(costs, search.choice, roots)
            if cand_cost < best_cost:
                best, best_cost = search.choice, cand_cost
    origins: list = []
    graph = build_graph(costs, best, roots, origins)
    cost_in = input_cost(snap.graph, model or CostModel())
    return Extraction(graph, best_cost, cost_in, tuple(origins))


def _group_moves(costs: _Costs, groups) -> list[list[tuple[int, int]]]:
    """Each multi-root match as (e-class, e-node index) changes; results that are captured
    values (no e-node was built) or that the snapshot no longer has are left out."""
    if not groups:
        return []
    snap = costs.snap
    index = {
        (c, n.op, n.children, n.attrs): i
        for i, (c, n) in enumerate(costs.enodes)
        if n.op not in ("Leaf", "Absent")
    }
    moves = []
    for group in groups:
        move = []
        for root, node in group:
            if node is None or root not in snap.handle:
                continue
            op, kids, attrs = node
            key = (snap.handle[root], op, tuple(snap.handle.get(k, -1) for k in kids), attrs)
            if key in index:
                move.append((key[0], index[key]))
        if len(move) > 1:
            moves.append(move)
    return moves


def _input_choice(costs: _Costs) -> dict[int, int] | None:
    """The input graph as a choice: each class the input computes -> its input e-node (the
    first one, if rewriting merged two input nodes). None if some class has none."""
    choice: dict[int, int] = {}
    for i, (c, n) in enumerate(costs.enodes):
        if c in choice:
            continue
        if n.op in ("Leaf", "Absent") or (n.op, costs.kids[i]) in costs.original:
            choice[c] = i
    return choice


class _LocalSearch:
    """Single-class changes of an extraction choice, each kept only if it lowers the DAG cost.

    The DAG cost is kept up to date by reference counts (how many chosen e-nodes, or roots,
    read each e-class): changing one class's e-node adds the classes that become reachable
    and removes the ones no longer read, so a trial costs what it touches, not the graph.
    A change that would make the choice cyclic is never tried: a class can only reach `c` if
    it comes after `c` in a postorder of the current choice, so the search from the new
    e-node's children stops at classes before `c`. `budget` bounds the classes visited in
    all (work per extraction stays linear in the graph on big inputs).
    """

    def __init__(self, costs: _Costs, choice: dict[int, int], roots, budget: int | None = None):
        self.costs, self.choice, self.roots = costs, dict(choice), list(roots)
        self.refs: dict[int, int] = {}
        self.grefs: dict[int, int] = {}
        self.delta = 0.0
        reach = _reachable(costs, self.choice, self.roots)
        self.budget = budget if budget is not None else 40 * len(reach) + 100_000
        self._change(self.roots, +1)
        self._order()

    def _order(self) -> None:
        order, done = [], set()
        for r in self.roots:
            stack = [(r, False)]
            while stack:
                c, leaving = stack.pop()
                if leaving:
                    order.append(c)
                    continue
                if c in done:
                    continue
                done.add(c)
                stack.append((c, True))
                stack.extend((k, False) for k in self.costs.kids[self.choice[c]] if k not in done)
        self.budget -= len(order)
        self.topo = {c: i for i, c in enumerate(order)}

    def _pay(self, i: int, sign: int) -> None:
        g = self.costs.group[i]
        if g >= 0:
            n = self.grefs.get(g, 0) + sign
            self.grefs[g] = n
            if not (n == 1 if sign > 0 else n == 0):
                return
        self.delta += sign * self.costs.own[i]

    def _change(self, classes, sign: int) -> None:
        stack = list(classes)
        while stack:
            k = stack.pop()
            self.budget -= 1
            n = self.refs.get(k, 0) + sign
            self.refs[k] = n
            if n == (1 if sign > 0 else 0):
                i = self.choice[k]
                self._pay(i, sign)
                stack.extend(self.costs.kids[i])

    def _reaches(self, kids, c: int) -> bool:
        return self._reaches_any(kids, {c})

    def _switch(self, c: int, j: int) -> None:
        i = self.choice[c]
        self._pay(j, +1)
        self._pay(i, -1)
        self.choice[c] = j
        self._change(self.costs.kids[j], +1)
        self._change(self.costs.kids[i], -1)

    def try_together(self, move: list[tuple[int, int]]) -> bool:
        """Switch every (class, e-node) of `move` at once (the results of one multi-root
        match), and keep the switch only if it lowers the DAG cost. Classes the choice does
        not use are left alone. The move is abandoned if a new e-node's inputs reach one of
        the move's classes (a cycle), or when the search's budget is spent; the order is
        recomputed once per kept move."""
        move = [
            (c, j)
            for c, j in move
            if self.refs.get(c, 0) > 0 and c in self.topo and self.choice[c] != j
        ]
        kids = [k for _, j in move for k in self.costs.kids[j]]
        if len(move) < 2 or self.budget <= 0 or any(k not in self.choice for k in kids):
            return False
        if self._reaches_any(kids, {c for c, _ in move}):
            return False
        before, done = self.delta, []
        for c, j in move:
            done.append((c, self.choice[c]))
            self._switch(c, j)
        if self.delta < before - 1e-6:
            self._order()
            return True
        for c, i in reversed(done):
            self._switch(c, i)
        return False

    def _reaches_any(self, kids, targets: set[int]) -> bool:
        """True if a class in `kids` reaches one of `targets` through the current choice
        (classes before every target in the postorder cannot, and are not searched)."""
        bound = min(self.topo[c] for c in targets)
        stack, seen = list(kids), set()
        while stack:
            k = stack.pop()
            if k in targets:
                return True
            if k in seen or self.topo.get(k, bound + 1) < bound:
                continue
            seen.add(k)
            self.budget -= 1
            stack.extend(self.costs.kids[self.choice[k]])
        return False

    def revert_to(self, own: dict[int, int]) -> dict[int, int]:
        """Give back each class its e-node in `own` (the input's) where that lowers the DAG
        cost, parents first. Returns the new choice."""
        tries = sorted(
            (c for c in self.topo if own.get(c, self.choice[c]) != self.choice[c]),
            key=self.topo.get,
            reverse=True,
        )
        for c in tries:
            if self.budget <= 0:
                break
            if self.refs.get(c, 0) == 0 or c not in self.topo:
                continue
            i, j = self.choice[c], own[c]
            if any(k not in self.choice for k in self.costs.kids[j]) or self._reaches(
                self.costs.kids[j], c
            ):
                continue
            before = self.delta
            self._switch(c, j)
            if self.delta < before - 1e-6:
                self._order()
            else:
                self._switch(c, i)
        return self.choice


def _greedy(costs: _Costs, free: set[int]) -> dict[int, int]:
    """Tree-cost fixpoint (Knuth's generalization of Dijkstra): class -> chosen e-node index."""
    best: dict[int, float] = {}
    choice: dict[int, int] = {}
    parents: dict[int, list[int]] = {}
    for i, ks in enumerate(costs.kids):
        for k in ks:
            parents.setdefault(k, []).append(i)
    heap = [(costs.own[i], i) for i, ks in enumerate(costs.kids) if not ks]
    heapq.heapify(heap)
    counter = itertools.count()
    heap = [(c, next(counter), i) for c, i in heap]
    while heap:
        cost, _, i = heapq.heappop(heap)
        c = costs.enodes[i][0]
        if c in best:
            continue
        best[c], choice[c] = cost, i
        for p in parents.get(c, ()):
            pc = costs.enodes[p][0]
            if pc in best or any(k not in best for k in costs.kids[p]):
                continue
            total = costs.own[p] + sum(0.0 if k in free else best[k] for k in set(costs.kids[p]))
            heapq.heappush(heap, (total, next(counter), p))
    return choice


def _reachable(costs: _Costs, choice: dict[int, int], roots, check_cycles=False):
    """E-classes used by `choice` from `roots` (iterative DFS); None if check_cycles finds one."""
    state: dict[int, int] = {}  # 1 = on stack, 2 = done
    for r in roots:
        stack = [(r, False)]
        while stack:
            c, leaving = stack.pop()
            if leaving:
                state[c] = 2
                continue
            s = state.get(c)
            if s == 2:
                continue
            if s == 1:
                if check_cycles:
                    return None
                continue
            if c not in choice:
                raise ValueError(f"e-class {c} has no finite e-node")
            state[c] = 1
            stack.append((c, True))
            stack.extend((k, False) for k in costs.kids[choice[c]] if state.get(k) != 2)
    return set(state)


def _dag_cost(costs: _Costs, choice: dict[int, int], roots) -> float:
    total, groups = 0.0, set()
    for c in _reachable(costs, choice, roots):
        i = choice[c]
        g = costs.group[i]
        if g >= 0:
            if g in groups:
                continue
            groups.add(g)
        total += costs.own[i]
    return total


def input_cost(g: TermGraph, model: CostModel) -> float:
    """DAG cost (ns) of a TermGraph as it stands: every node paid once, nothing folded."""
    total = 0.0
    for n in g.nodes:
        if n.opaque:
            total += opaque_cost(g, n, model)
            continue
        total += graph_node_cost(g, n, model)
    return total


def opaque_cost(g: TermGraph, n, model: CostModel) -> float:
    """Cost (ns) of opaque node `n` of `g`: its op's cost formula over the input and output
    types the graph knows (absent inputs None), without attributes (an opaque node's are not
    canonical). The same number in the input's cost and in every extraction, since an opaque
    node is never rewritten."""
    ins = tuple(None if i == ABSENT else g.values[i].type for i in n.inputs)
    out = g.values[n.outputs[0]].type if n.outputs and n.outputs[0] != ABSENT else None
    return model.node_cost(n.op, (), ins, out)
