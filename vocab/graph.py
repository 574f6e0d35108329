"""TermGraph: the engine's frontend-neutral graph, the hand-off between every stage.

Values are numbered; nodes read and write value ids. A node whose op is in the op table and
supported at the graph's opset carries its attributes as canonical Python values (every
attribute of the op-table spec present, defaults filled in); any other node is opaque: rules
never match it, and its frontend payload (`Node.payload`, an `onnx.NodeProto` for ONNX) goes
back out unchanged except for renamed inputs and outputs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vocab.types import TensorType

ABSENT = -1  # value id of an absent optional input


@dataclass(frozen=True)
class Value:
    """A tensor value: its name in the source graph (or a fresh one) and its type."""

    name: str
    type: TensorType
    # for a constant made by folding: the provenance tree of the fold (`engine.provenance`)
    provenance: Any = field(default=None, compare=False)


@dataclass(frozen=True)
class Node:
    """One node. inputs/outputs are value ids (ABSENT for a missing optional input).

    attrs: `(name, value)` pairs in op-table order for matchable nodes; empty for opaque ones.
    opaque: True when rules must not look inside (unknown op, custom domain, subgraphs,
        random or effectful op, or a signature outside the graph's opset).
    payload: the frontend's original node (e.g. `onnx.NodeProto`), set only while the node is
        exactly the original (always for opaque nodes); the exporter then reuses it, keeping
        its name, doc string and metadata. Nodes created by rewrites have payload None.
    """

    op: str
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    attrs: tuple[tuple[str, Any], ...] = ()
    opaque: bool = False
    name: str = ""
    domain: str = ""
    payload: Any = None
    implicit: tuple[int, ...] = ()  # outer-scope values its subgraphs read (If, Loop, Scan)
    implicit_names: tuple[str, ...] = ()  # ...by these names, which must exist when it runs
    # for a node a rewrite produced: the rules that justify it (`engine.provenance`)
    provenance: Any = field(default=None, compare=False)

    def attr(self, name: str) -> Any:
        """The value of attribute `name`, or None if the node does not set it."""
        return dict(self.attrs).get(name)


@dataclass(frozen=True, eq=False)
class TermGraph:
    """A graph of `Node`s over `Value`s, nodes in topological order.

    values: indexed by value id. inputs/outputs: value ids of the graph's inputs and outputs.
    constants: value id -> numpy array for initializers and folded constants.
    opset: default-domain opset. meta: the frontend's model-level data (kept for export).
    """

    values: tuple[Value, ...]
    nodes: tuple[Node, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    constants: dict[int, np.ndarray] = field(default_factory=dict)
    opset: int = 18
    meta: Any = None

    def op_counts(self) -> dict[str, int]:
        """op name -> number of nodes, for before/after tables."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return counts

    def type_of(self, vid: int) -> TensorType:
        """The tensor type of value `vid`."""
        return self.values[vid].type


def prune(g: TermGraph) -> TermGraph:
    """Drop nodes whose outputs nothing uses (graph outputs count as uses)."""
    used = set(g.outputs)
    keep = []
    for n in reversed(g.nodes):
        if any(o in used for o in n.outputs):
            keep.append(n)
            used.update(i for i in n.inputs + n.implicit if i != ABSENT)
    nodes = tuple(reversed(keep))
    consts = {v: a for v, a in g.constants.items() if v in used}
    return TermGraph(g.values, nodes, g.inputs, g.outputs, consts, g.opset, g.meta)


def unique_name(name: str, taken: set[str]) -> str:
    """`name`, or `name_K` for the first K >= 1 that is not in `taken`; the result is added to
    `taken` (a node or value name that no other in the graph has)."""
    pick, k = name, 0
    while pick in taken:
        k += 1
        pick = f"{name}_{k}"
    taken.add(pick)
    return pick


def components(n: int, links: Iterable[tuple[int, int]]) -> list[int]:
    """The connected components of items 0..n-1 joined by `links` (pairs of items), as one
    label per item: the smallest item of its component (union-find with path halving)."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in links:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return [root(i) for i in range(n)]
