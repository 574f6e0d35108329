"""Turn an extraction choice (one e-node per e-class) back into a TermGraph.

Names: a graph input, constant or opaque output keeps its own name; otherwise an e-class takes
the name of the graph output it computes, else the name of the imported value whose original
node was chosen, else any imported value's name in the class (it is the same value), else a
fresh `rw_N` name. A chosen e-node that is exactly an imported node (same op, attributes and
input e-classes) keeps that node's name and payload, so the exporter reuses its proto.
"""

from __future__ import annotations

from vocab.graph import ABSENT, Node, TermGraph, Value
from vocab.ops import OPS, encode_attr


def build_graph(
    costs, choice: dict[int, int], roots: list[int], origins: list | None = None
) -> TermGraph:
    """TermGraph of the e-classes reachable from `roots` under `choice` (see module doc).

    origins: when a list, gets one entry per node of the result: the chosen ENode, or None
    for an opaque node (provenance maps nodes back to e-nodes with it)."""
    snap = costs.snap
    g = snap.graph
    order = _postorder(costs, choice, roots)
    originals = _original_keys(snap)
    output_name = {}
    for vid in g.outputs:
        output_name.setdefault(snap.handle[vid], g.values[vid].name)
    values: list[Value] = []
    vid_of: dict[int, int] = {}
    taken = {v.name for v in g.values}
    nodes: list[Node] = []
    constants = {}
    emitted_opaque: set[int] = set()
    fresh = iter(f"rw_{i}" for i in range(10**9))

    def new_value(name: str, c: int) -> int:
        values.append(Value(name, snap.type_of(c)))
        return len(values) - 1

    def fresh_name() -> str:
        name = next(fresh)
        while name in taken:
            name = next(fresh)
        taken.add(name)
        return name

    for c in order:
        i = choice[c]
        n = costs.enodes[i][1]
        if n.op == "Leaf":
            group = costs.group[i]
            if group < 0:  # graph input or constant: keeps its own name and type
                values.append(g.values[n.leaf])
                vid_of[c] = len(values) - 1
                if n.leaf in g.constants:
                    constants[vid_of[c]] = g.constants[n.leaf]
                continue
            if group not in emitted_opaque:
                emitted_opaque.add(group)
                if origins is not None:
                    origins.append(None)
                nodes.append(
                    _opaque(g.nodes[group], snap, choice, costs, vid_of, values, fresh_name)
                )
            continue
        orig = originals.get((n.op, n.attrs, n.children))
        name = output_name.get(c) or (g.values[orig.outputs[0]].name if orig else None)
        if name is None:
            hs = [v for v in snap.handles_of.get(c, ()) if 0 <= v < len(g.values)]
            name = g.values[min(hs)].name if hs else fresh_name()
        vid_of[c] = new_value(name, c)
        attrs = n.decoded_attrs()
        ins = tuple(ABSENT if snap.is_absent(k) else vid_of[k] for k in n.children)
        keep = orig is not None and name == g.values[orig.outputs[0]].name
        if origins is not None:
            origins.append(n)
        nodes.append(
            Node(
                n.op,
                ins,
                (vid_of[c],),
                attrs,
                False,
                orig.name if keep else "",
                "",
                orig.payload if keep else None,
                provenance=orig.provenance if keep else None,
            )
        )
    outputs = tuple(vid_of[snap.handle[v]] for v in g.outputs)
    inputs = tuple(vid_of.get(snap.handle[v], -1) for v in g.inputs)
    inputs = tuple(v for v in inputs if v >= 0)
    return TermGraph(tuple(values), tuple(nodes), inputs, outputs, constants, g.opset, g.meta)


def _opaque(node: Node, snap, choice, costs, vid_of, values, fresh_name) -> Node:
    """Re-emit an opaque node; an output whose e-class chose another e-node gets a fresh name."""
    ins = tuple(ABSENT if v == ABSENT else vid_of[snap.handle[v]] for v in node.inputs)
    outs = []
    for v in node.outputs:
        c = snap.handle.get(v)
        i = choice.get(c) if c is not None else None
        mine = i is not None and costs.enodes[i][1].op == "Leaf" and costs.enodes[i][1].leaf == v
        if mine:
            values.append(Value(snap.graph.values[v].name, snap.graph.values[v].type))
            vid_of[c] = len(values) - 1
        else:
            values.append(
                Value(fresh_name() if snap.graph.values[v].name else "", snap.graph.values[v].type)
            )
        outs.append(len(values) - 1)
    implicit = tuple(vid_of[snap.handle[v]] for v in node.implicit)
    return Node(
        node.op,
        ins,
        tuple(outs),
        (),
        True,
        node.name,
        node.domain,
        node.payload,
        implicit,
        node.implicit_names,
        node.provenance,
    )


def _original_keys(snap) -> dict:
    """(op, attribute strings, input e-classes) -> imported node, for untouched-node detection."""
    keys = {}
    for n in snap.graph.nodes:
        if n.opaque:
            continue
        spec = OPS.get(n.op)
        attrs = tuple(encode_attr(spec.attr_index[a].kind, v) for a, v in n.attrs)
        kids = tuple(snap.handle[i] for i in n.inputs)
        keys.setdefault((n.op, attrs, kids), n)
    return keys


def _postorder(costs, choice: dict[int, int], roots: list[int]) -> list[int]:
    """E-classes in dependency order (children first), iteratively (graphs are deep)."""
    order, done, stack = [], set(), [(r, False) for r in reversed(roots)]
    while stack:
        c, leaving = stack.pop()
        if leaving:
            if c not in done:
                done.add(c)
                order.append(c)
            continue
        if c in done:
            continue
        stack.append((c, True))
        stack.extend((k, False) for k in reversed(costs.kids[choice[c]]) if k not in done)
    return order
