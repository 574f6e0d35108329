"""TermGraph -> ONNX.

Graph inputs and outputs keep their names, value infos and order; untouched nodes keep their
names and everything else on their `NodeProto`; opaque nodes are copied with renamed
inputs/outputs. The model's opset imports, functions and metadata are kept; a node of an op
a rule file declares (`vocab.declared`) brings its domain's opset import (version 1) and its
body as a model-local function, so that any runtime runs the model; the IR version is
capped at `vocab.ops.MAX_IR_VERSION`, the newest that onnxruntime 1.32 loads (onnx 1.23's
default, IR 14, is rejected by it).

Provenance (`engine.provenance`): a node a rewrite produced, and a constant folding made,
carries its tree as compact JSON under the key `rewrite.rules`: in `NodeProto.metadata_props`
/ `TensorProto.metadata_props` when the model's IR version is at least 10 (where ONNX added
those fields), else in one `ModelProto.metadata_props` entry `rewrite.rules` holding a JSON
object from node or initializer name to tree (older readers do not know per-node metadata).
"""

from __future__ import annotations

import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper

from engine.provenance import KEY, collect, dumps
from vocab.declared import functions_for
from vocab.graph import ABSENT, Node, TermGraph
from vocab.onnx_nodes import UNUSED, export_node
from vocab.ops import MAX_IR_VERSION, OPS

NODE_METADATA_IR = 10  # the first IR version with NodeProto/TensorProto.metadata_props


def export_model(g: TermGraph, arrays: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """Build a ModelProto from `g`, using `g.meta` (the imported model) as the template.

    arrays: for a model only onnxruntime will read (`check.session(model, arrays=...)`): each
    constant of `IN_MEMORY_BYTES` or more is written as external data at location `IN_MEMORY`
    and put into `arrays` by name, not copied into the proto (a candidate of the budget
    search: DistilBERT's 265 MB took 0.3 s to serialize and onnxruntime as long to parse, per
    candidate). Such a model is not a file anyone else can read.

    Raises ValueError if `g.meta` is not an `onnx.ModelProto`.
    """
    src = g.meta
    if not isinstance(src, onnx.ModelProto):
        raise ValueError("TermGraph has no ONNX model to export against (meta is not a ModelProto)")
    name = lambda vid: "" if vid == ABSENT else g.values[vid].name  # noqa: E731
    nodes = []
    for n in g.nodes:
        nodes += _rebind_outer_names(n, name)
        nodes.append(export_node(n, name))
    nodes = merge_projections(nodes)
    # values read by subgraphs (If, Loop, Scan bodies) are used too, under their own names
    used = {i for n in nodes for i in n.input} | {name(v) for v in g.outputs}
    used |= {name(v) for n in g.nodes for v in n.implicit}
    identities = _output_identities(g, src.graph, nodes)
    nodes += identities
    # built in place: helper.make_graph/make_model copy every initializer (twice), which
    # for a model of several hundred MB is most of the export's time and its peak memory
    model = onnx.ModelProto()
    graph = model.graph
    graph.name, graph.doc_string = src.graph.name, src.graph.doc_string
    graph.node.extend(nodes)
    inits = set()
    for vid, arr in g.constants.items():
        if name(vid) in used:
            arr = np.asarray(arr)
            if arrays is not None and _in_memory(arr):
                _write_stub(graph.initializer.add(), arr, name(vid))
                arrays[name(vid)] = arr
            else:
                _write_tensor(graph.initializer.add(), arr, name(vid))
            inits.add(name(vid))
    # an initializer also listed as an input (an overridable default) stays an input only
    # while the initializer is still there
    graph.input.extend(
        i for i in src.graph.input if i.name not in _init_names(src) or i.name in inits
    )
    graph.output.extend(src.graph.output)
    for vid, vi in zip(g.outputs, graph.output):
        _settle_dims(vi, g.values[vid].type.shape)
    model.opset_import.extend(src.opset_import)
    have = {i.domain for i in src.opset_import}
    for domain in sorted({n.domain for n in nodes if n.domain not in ("", "ai.onnx")} - have):
        # a rule wrote an op of a domain the model did not import: import its newest version
        version = max(
            s.version
            for s in (OPS.get(f"{domain}.{n.op_type}") for n in nodes if n.domain == domain)
            if s is not None
        )
        model.opset_import.append(helper.make_opsetid(domain, version))
    model.functions.extend(src.functions)
    # an op a rule file declares runs anywhere with its body attached (vocab.declared)
    model.functions.extend(functions_for(nodes, _default_opset(model), src.functions))
    model.ir_version = min(src.ir_version, MAX_IR_VERSION)
    # a constant a rule made is not an input: from an IR 3 model, an IR 4 one (onnx.checker
    # refused such an IR 3 file, and the CLI wrote it)
    lift_unlisted_initializers(model)
    for field in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(model, field, getattr(src, field))
    model.metadata_props.extend(
        p for p in src.metadata_props if p.key not in (KEY, "rewrite.structure")
    )
    _write_provenance(g, model, identities)
    return model


def _default_opset(model: onnx.ModelProto) -> int:
    return next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), 0)


def _write_provenance(
    g: TermGraph, model: onnx.ModelProto, identities: list[onnx.NodeProto] = ()
) -> None:
    """Put the provenance trees of `g` into `model` (see the module docstring). An Identity
    that keeps a graph output's name (`identities`) gets rule `keep-output-name`, replacing
    the source model's node that computed that output, after the tree of the value it copies."""
    trees = collect(g)
    if not trees:
        return
    src = g.meta.graph
    made = {o: n.name or o for n in src.node for o in n.output}
    by_output = {o: n.name for n in model.graph.node for o in n.output}
    for n in identities:
        copied = trees.get(by_output.get(n.input[0], n.input[0]))
        trees[n.name] = {
            "rule": "keep-output-name",
            "at": "frontends/onnx/exporter.py",
            "op": "Identity",
            "replaces": [made[n.output[0]]] if n.output[0] in made else [],
            "after": [copied] if copied else [],
        }
    if model.ir_version < NODE_METADATA_IR:
        model.metadata_props.add(key=KEY, value=dumps(trees))
        return
    for proto in (*model.graph.node, *model.graph.initializer):
        tree = trees.get(proto.name)
        if tree is not None and not any(p.key == KEY for p in proto.metadata_props):
            proto.metadata_props.add(key=KEY, value=dumps(tree))


def _four_bit(dtype: np.dtype) -> bool:
    """True for int4, uint4 and float4 (ONNX stores them packed, two a byte)."""
    return dtype.kind == "V" and helper.np_dtype_to_tensor_dtype(dtype) in _FOUR_BIT


_FOUR_BIT = frozenset({onnx.TensorProto.INT4, onnx.TensorProto.UINT4, onnx.TensorProto.FLOAT4E2M1})


def _packed_four_bit(arr: np.ndarray) -> bytes:
    """The bytes of a 4-bit array (ml_dtypes int4, uint4 or float4_e2m1fn: one element a
    byte, its value in the low 4 bits) as ONNX stores them (TensorProto raw_data): two a
    byte in row-major order, the even element in the low half, a zero half after an odd
    count. numpy_helper.from_array's packing, in fewer passes over the weight (it copies the
    array three times, then the proto once more: a standard-ONNX weight-only BERT-base spent
    0.5 s there)."""
    flat = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
    if flat.size % 2:
        flat = np.append(flat, np.uint8(0))
    return ((flat[0::2] & 0x0F) | (flat[1::2] << 4)).tobytes()


def _write_tensor(t: onnx.TensorProto, arr: np.ndarray, name: str) -> None:
    """Fill TensorProto `t` with `arr` (numpy_helper.from_array's encoding, without building a
    separate proto to copy; 4-bit types packed two a byte as numpy_helper does)."""
    if arr.dtype == object or arr.dtype.kind in "USO":
        t.CopyFrom(numpy_helper.from_array(arr, name))
        return
    t.name = name
    t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
    t.dims.extend(arr.shape)
    if _four_bit(arr.dtype):
        t.raw_data = _packed_four_bit(arr)
        return
    if arr.dtype == np.bool_:
        arr = arr.astype(np.uint8)  # ONNX stores bool as one byte per element, like numpy
    if sys.byteorder == "big":
        arr = arr.byteswap()
    t.raw_data = np.ascontiguousarray(arr).tobytes()


IN_MEMORY = "rewrite:in-memory"  # the external data location of `export_model`'s `arrays`
IN_MEMORY_BYTES = 1 << 16
# ONNX element types whose numpy arrays onnxruntime takes as they are (not bfloat16, float8
# or the packed 4-bit types, which numpy spells as void)
_IN_MEMORY_TYPES = frozenset("fiub")


def lift_unlisted_initializers(model: onnx.ModelProto) -> None:
    """An IR 3 model with initializers its graph does not list as inputs gets IR 4 (in place):
    IR 3 requires every initializer to be an input too (a default a caller may override), IR 4
    lets an initializer be a constant alone, which is what an unlisted one is to a runtime.
    onnxruntime's own quantizers write such files (the zero points and scales they add to an
    IR 3 model of the ONNX model zoo); onnx.checker refuses them, onnxruntime runs them."""
    if model.ir_version >= 4:
        return
    inputs = {i.name for i in model.graph.input}
    if any(t.name not in inputs for t in model.graph.initializer):
        model.ir_version = 4


def _settle_dims(vi: onnx.ValueInfoProto, shape) -> None:
    """Each dimension of graph output `vi` declared symbolic (or not at all) that the shape
    analysis found to be a number (`shape`, the output value's analyzed shape) is written as
    that number: inputs fixed by `--input-shape` carry their sizes to the outputs, as onnxsim's
    `--overwrite-input-shape` does (a TorchScript export names each output dimension a symbol
    of its own, which fixing the inputs' symbols leaves as it was). A dimension declared as a
    number, and a rank that differs, are left as they are."""
    t = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
    if t is None or shape is None or not t.HasField("shape") or len(t.shape.dim) != len(shape):
        return
    for d, n in zip(t.shape.dim, shape):
        if isinstance(n, int) and not d.HasField("dim_value"):
            d.dim_value = n


def _in_memory(arr: np.ndarray) -> bool:
    return arr.nbytes >= IN_MEMORY_BYTES and arr.dtype.kind in _IN_MEMORY_TYPES


def _write_stub(t: onnx.TensorProto, arr: np.ndarray, name: str) -> None:
    """Fill TensorProto `t` as `arr`'s name, type and shape, its data external at `IN_MEMORY`."""
    t.name = name
    t.data_type = helper.np_dtype_to_tensor_dtype(arr.dtype)
    t.dims.extend(arr.shape)
    t.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", IN_MEMORY), ("offset", "0"), ("length", str(arr.nbytes))):
        entry = t.external_data.add()
        entry.key, entry.value = key, value


def _rebind_outer_names(n: Node, name) -> list[onnx.NodeProto]:
    """Identity nodes that give an outer value the name a subgraph of `n` reads it by, when
    the rewrite renamed it (subgraphs refer to outer values by name)."""
    return [
        helper.make_node("Identity", [name(v)], [want], name=f"{want}_outer")
        for v, want in zip(n.implicit, n.implicit_names)
        if name(v) != want
    ]


def _init_names(src: onnx.ModelProto) -> set[str]:
    return {i.name for i in src.graph.initializer}


def merge_projections(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """`nodes` with the projections of one application merged into one node: nodes of one
    multi-output op (`vocab.ops`: `Split` and `Split#1` export as two Split nodes, each
    writing one output position) with the same domain, inputs and attributes become one node
    writing all their outputs, where the first of them was (its inputs exist there). Nodes
    that would write one position twice are left as they are."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(nodes):
        spec = OPS.lookup(p.domain, p.op_type)
        if spec is None or spec.n_outputs < 2:
            continue
        attrs = tuple(a.SerializeToString(deterministic=True) for a in p.attribute)
        groups.setdefault((p.domain, p.op_type, tuple(p.input), attrs), []).append(i)
    drop: set[int] = set()
    for idx in groups.values():
        if len(idx) < 2:
            continue
        outs: list[str] = []
        for i in idx:
            for k, o in enumerate(nodes[i].output):
                if not o or UNUSED in o:  # (a placeholder: vocab.onnx_nodes.node_outputs)
                    continue
                outs += [""] * (k + 1 - len(outs))
                if outs[k]:
                    break  # a position written twice: keep this group as it is
                outs[k] = o
            else:
                continue
            break
        else:
            first = nodes[idx[0]]
            # positions no member writes keep the first member's (a placeholder, or "")
            outs += [""] * (len(first.output) - len(outs))
            outs = [
                o or (first.output[k] if k < len(first.output) else "") for k, o in enumerate(outs)
            ]
            del first.output[:]
            first.output.extend(outs)
            first.name = first.name.split("#")[0]
            drop.update(idx[1:])
    return [p for i, p in enumerate(nodes) if i not in drop]


def _output_identities(g: TermGraph, src_graph: onnx.GraphProto, nodes) -> list[onnx.NodeProto]:
    """Identity nodes for graph outputs whose value lost its name (the output became another
    value, e.g. after Identity elimination), so output names never change."""
    produced = {o for n in nodes for o in n.output}
    out = []
    for vid, vi in zip(g.outputs, src_graph.output):
        have = g.values[vid].name
        if have != vi.name:
            out.append(helper.make_node("Identity", [have], [vi.name], name=f"{vi.name}_identity"))
        elif have not in produced and vid not in g.constants and vid not in g.inputs:
            raise ValueError(f"graph output {have!r} is produced by no node")
    return out
