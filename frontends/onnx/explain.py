"""Read the provenance an optimized ONNX model carries (`rewrite explain`).

Where `frontends.onnx.exporter` put it: `rewrite.rules` in a node's or initializer's
`metadata_props` (IR >= 10), else one model-level `rewrite.rules` entry mapping names to trees.
"""

from __future__ import annotations

import json

import onnx

from engine.provenance import KEY


class NoProvenance(LookupError):
    """The name is not in the model, or the model carries no provenance at all."""


def find_provenance(model: onnx.ModelProto, name: str) -> tuple[str, dict | None]:
    """(what was found, e.g. "node rw_3 (Conv)", its provenance tree or None for an original
    node) for `name`: a node name, else the name of a node's output, else an initializer.

    Raises NoProvenance when nothing has that name, or when the model has no provenance at
    all (written with --no-provenance, not by `rewrite optimize`, or as its input unchanged).
    """
    g = model.graph
    by_model = _model_trees(model)
    found = next((n for n in g.node if n.name == name), None)
    found = found or next((n for n in g.node if name in n.output), None)
    if found is not None:
        what = f"node {found.name or name} ({found.op_type})"
    else:
        found = next((t for t in g.initializer if t.name == name), None)
        if found is None:
            raise NoProvenance(f"no node, output or initializer named {name!r}")
        what = f"constant {name}"
    tree = _own(found)
    if tree is None:
        tree = by_model.get(found.name)
    if tree is None and not by_model and not _any_own(g):
        raise NoProvenance(
            f"no provenance in this model ({KEY} metadata): written with "
            "--no-provenance, not by `rewrite optimize`, or as its input unchanged (no "
            "rewrite made it cheaper)"
        )
    return what, tree


def recorded_trees(model: onnx.ModelProto) -> dict[str, dict]:
    """Name -> provenance tree of every node and initializer of the main graph that carries
    one (its own metadata, else the model-level entry), e.g. a model `rewrite optimize` wrote;
    empty for a model without provenance."""
    out = dict(_model_trees(model))
    for x in (*model.graph.node, *model.graph.initializer):
        tree = _own(x)
        if tree is not None and x.name:
            out[x.name] = tree
    return out


def _own(proto) -> dict | None:
    for p in proto.metadata_props:
        if p.key == KEY:
            tree = _parsed(p.value)
            return tree if _is_tree(tree) else None
    return None


def _parsed(text: str):
    """`text` as JSON, or None where it is not JSON (metadata another tool wrote)."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def _is_tree(t) -> bool:
    """True for a provenance tree in the format `engine.provenance` describes (a rule name,
    the names it replaces, the trees before it): metadata of that key written by something
    else is left out rather than read as ours (it crashed the import and `explain`)."""
    if not isinstance(t, dict) or not isinstance(t.get("rule"), str):
        return False
    if not all(isinstance(t.get(k, []), list) for k in ("replaces", "after", "merged", "marks")):
        return False
    return all(_is_tree(a) for k in ("after", "merged") for a in t.get(k, []))


def _any_own(g: onnx.GraphProto) -> bool:
    return any(p.key == KEY for x in (*g.node, *g.initializer) for p in x.metadata_props)


def _model_trees(model: onnx.ModelProto) -> dict:
    for p in model.metadata_props:
        if p.key == KEY:
            trees = _parsed(p.value)
            if not isinstance(trees, dict):
                return {}
            return {k: t for k, t in trees.items() if _is_tree(t)}
    return {}
