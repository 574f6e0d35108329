"""Constant folding after extraction, and dead-node removal (`vocab.graph.prune`).

A node is folded when every input is a constant (or, for Shape/Size, the input's shape is
static) and its result is not much larger than its inputs (`FOLD_MAX_ELEMENTS`), the same
test extraction used to price constant e-classes at zero. The foldable nodes are evaluated in
two batches (`_split`, by which evaluator is faster on them): by onnxruntime's CPU kernels
with its graph optimizations off (the runtime the folded values stand in for), or, for a
batch it cannot run, by `onnx.reference.ReferenceEvaluator` (the ONNX reference
implementation), which also evaluates the parts onnxruntime is slow on; their outputs become
constants. Random ops, ops with subgraphs and `vocab.ops.KEPT_UNFOLDED` (a DequantizeLinear
of an 8-bit weight) are never folded.
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops._op import OpRunUnaryNum
from onnx.reference.ops.op_topk import TopK_11

from engine.extract import small_enough_to_fold
from engine.runtime import cpu_session
from vocab.graph import ABSENT, Node, TermGraph, components, prune
from vocab.onnx_nodes import export_node
from vocab.ops import KEPT_UNFOLDED, MAX_IR_VERSION, OPS
from vocab.types import TensorType, onnx_dtype

_NEVER = {
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "If",
    "Loop",
    "Scan",
    "SequenceMap",
}


def fold(g: TermGraph, provenance: bool = False) -> TermGraph:
    """Fold constant-only nodes of `g` into constants and drop nodes nothing uses.

    provenance: each new constant's `Value.provenance` says which nodes were folded into it
    (`engine.provenance` format: rule `fold:OP`, OP the op of the last node folded into it,
    `replaces` the folded nodes' names, `after` the trees of folded nodes that rewrites or
    shape folding produced).

    Returns a new TermGraph (the input is not changed). Raises nothing: a part of the batch
    neither evaluator can run stays unfolded.
    """
    consts = dict(g.constants)
    values = list(g.values)
    folded: list[Node] = []
    sources: dict[int, list[Node]] = {}  # folded value -> the nodes folded into it
    for n in g.nodes:
        if not _foldable(n, g, consts):
            continue
        if provenance:
            feeding = [m for i in n.inputs for m in sources.get(i, ())]
            for o in n.outputs:
                sources[o] = list({id(m): m for m in [*feeding, n]}.values())
        if n.op in ("Shape", "Size") and n.inputs[0] not in consts:
            consts[n.outputs[0]] = _shape_value(n, g.values[n.inputs[0]].type)
        else:
            folded.append(n)
            for o in n.outputs:
                consts[o] = None  # value computed below
    if folded:
        by_ort, by_reference = _split(folded, g)
        wanted = _read_after(g, folded)
        results: dict[int, np.ndarray] = {}
        for part, evaluators in ((by_ort, (True, False)), (by_reference, (False,))):
            for onnxruntime in evaluators if part else ():
                try:  # onnxruntime first where it may run the part; then the reference
                    results.update(_evaluate(part, g, consts, onnxruntime, wanted))
                    break
                except Exception:  # a part neither runs stays unfolded, never an error
                    continue
        consts.update(results)
    for vid, arr in consts.items():
        if arr is not None and vid not in g.constants:
            why = _fold_tree(sources[vid], g) if vid in sources else None
            typ = TensorType(onnx_dtype(arr.dtype), arr.shape)
            values[vid] = type(values[vid])(values[vid].name, typ, why)
    done = {vid for vid, a in consts.items() if a is not None}
    nodes = tuple(n for n in g.nodes if not all(o in done for o in n.outputs))
    kept = {vid: a for vid, a in consts.items() if a is not None}
    return prune(TermGraph(tuple(values), nodes, g.inputs, g.outputs, kept, g.opset, g.meta))


def _read_after(g: TermGraph, folded: list[Node]) -> set[int]:
    """The outputs of `folded` nodes that anything left after folding reads: a node not
    folded (its inputs, or the outer values its subgraphs read) or a graph output; every
    output of such a node, so that it folds whole. (`_split`'s two batches share no value
    but the Constant-like nodes each copies.) The rest are steps inside a folded chain, left
    uncomputed and pruned with their nodes: asked for as outputs, each would be a buffer of
    its own (weight-only's packing of BERT-base: about ten intermediate arrays of 340 MB)."""
    inside = {id(n) for n in folded}
    read = set(g.outputs)
    for n in g.nodes:
        if id(n) not in inside:
            read.update(n.inputs)
            read.update(n.implicit)
    return {o for n in folded if read.intersection(n.outputs) for o in n.outputs}


def _fold_tree(nodes: list[Node], g: TermGraph) -> dict:
    """Provenance tree of a folded constant: the original nodes folded into it by name, in
    graph order, and the trees of the folded nodes rewrites produced (each distinct tree once)."""
    name = lambda n: n.name or g.values[n.outputs[0]].name  # noqa: E731
    # trees of folded nodes that rewrites or shape folding produced, and of folded constants read
    trees = [n.provenance for n in nodes if n.provenance]
    trees += [g.values[i].provenance for n in nodes for i in n.inputs if i != ABSENT]
    after = {json.dumps(t, sort_keys=True): t for t in trees if t}
    return {
        "rule": f"fold:{nodes[-1].op}",
        "at": "engine/fold.py",
        "op": nodes[-1].op,
        "replaces": [name(n) for n in nodes if _original(n)],
        "ops": [n.op for n in nodes if _original(n)],
        "after": list(after.values()),
    }


def _original(n: Node) -> bool:
    """Whether `n` is a node of the imported graph (no rule or folding made it)."""
    return (n.provenance or {}).get("rule", "original") == "original"


def _foldable(n: Node, g: TermGraph, consts: dict) -> bool:
    if n.op in _NEVER or n.op in KEPT_UNFOLDED or n.domain not in ("", "ai.onnx"):
        return False
    if n.opaque and n.payload is not None and any(a.type in (5, 10) for a in n.payload.attribute):
        return False  # graph-valued attributes
    spec = OPS.get(n.op)
    if spec is not None and spec.domain not in ("", "ai.onnx"):
        # the reference evaluator runs the default domain only: an op of another (a contrib
        # op, a mark of patterns/quant/) would fail the whole batch it is evaluated in
        return False
    if spec is not None and spec.random:
        return False
    if n.op == "Dropout" and len(n.inputs) > 2 and n.inputs[2] != ABSENT:
        return False  # with a training_mode input it may drop at random: never bake one draw in
    if n.op in ("Shape", "Size") and n.inputs and g.values[n.inputs[0]].type.static:
        return True
    if not n.outputs or not all(i == ABSENT or i in consts for i in n.inputs):
        return False
    out = g.values[n.outputs[0]].type
    return small_enough_to_fold(out, [g.values[i].type for i in n.inputs if i != ABSENT])


def _shape_value(n: Node, t: TensorType) -> np.ndarray:
    shape = np.array(t.shape, dtype=np.int64)
    if n.op == "Size":
        return np.array(int(np.prod(shape)), dtype=np.int64)
    start, end = n.attr("start") or 0, n.attr("end")
    return shape[start:end]


class TopK(TopK_11):
    """The reference TopK, with a fast path for k = 1 over NaN-free floats (the column and
    block maxima of the quant rules' scales): argmax / argmin, which take the lowest index
    among ties as the ONNX spec says, instead of sorting every row (the reference's way:
    ~0.14 s per BERT weight, most of a quantization's time). `ReferenceEvaluator(new_ops=...)`
    finds it by its class name, the op's."""

    op_domain = ""

    def _run(self, data, ink, axis=None, largest=None, sorted=None):
        k = np.asarray(ink).ravel()
        a = -1 if axis is None else int(axis)
        if (
            k.size == 1
            and int(k[0]) == 1
            and data.ndim
            and data.shape[a] > 0
            and np.issubdtype(data.dtype, np.floating)
            and not np.isnan(data).any()
        ):
            pick = np.argmin if largest == 0 else np.argmax
            idx = pick(data, axis=a, keepdims=True)
            return np.take_along_axis(data, idx, axis=a), idx.astype(np.int64)
        return super()._run(data, ink, axis=axis, largest=largest, sorted=sorted)


class Round(OpRunUnaryNum):
    """The reference Round (half to even, ONNX spec) without its copy: `np.rint` keeps the
    dtype, where the reference's `np.round(x).astype(x.dtype)` writes the result twice (an
    embedding table's quantization rounds 30-50 M floats)."""

    op_domain = ""

    def _run(self, x):
        return (np.rint(x) if np.issubdtype(x.dtype, np.floating) else x.copy(),)


_FAST_OPS = [TopK, Round]


def _split(nodes: list[Node], g: TermGraph) -> tuple[list[Node], list[Node]]:
    """The batch `nodes` (in graph order) in two, for two evaluators: the connected parts
    (nodes joined by a value one makes and another reads) with a node `_reference_only` picks
    (a per-axis QuantizeLinear, an integer Div) go to the reference evaluator, the rest to
    onnxruntime. Measured on BERT-base's batches:
    onnxruntime 1.32's per-axis QuantizeLinear took 2.9 s for 73 weights (against the
    reference's 0.3-0.5 s), while on the weight-only rules' block chains (then TopK, Div,
    Round, Clip, Gather) onnxruntime took 2.5 s against the reference's 6.2 s, with the same
    values. A node with
    no inputs (a Constant) joins nothing; it goes with each part that reads it (to
    onnxruntime's when none does: a Constant whose reader is not constant)."""
    made_by: dict[int, int] = {}
    links = []
    for k, n in enumerate(nodes):
        links += [(k, made_by[i]) for i in n.inputs if i in made_by and nodes[made_by[i]].inputs]
        made_by.update((o, k) for o in n.outputs)
    part = components(len(nodes), links)
    slow = {part[k] for k, n in enumerate(nodes) if _reference_only(n, g)}
    groups: tuple[list[int], list[int]] = ([], [])
    for k, n in enumerate(nodes):
        if n.inputs:
            groups[part[k] in slow].append(k)
    read = [{i for k in members for i in nodes[k].inputs} for members in groups]
    out = []
    for part, members in enumerate(groups):  # each part's Constant-like nodes, first
        sources = [
            k
            for k, n in enumerate(nodes)
            if not n.inputs
            and (set(n.outputs) & read[part] or (part == 0 and not set(n.outputs) & read[1]))
        ]
        out.append([nodes[k] for k in sorted([*sources, *members])])
    return out[0], out[1]


def _reference_only(n: Node, g: TermGraph) -> bool:
    """Whether `n` goes to the reference evaluator: a per-axis QuantizeLinear (slow in
    onnxruntime), or an integer Div or Mod (onnxruntime's int32 Div(-2**31, -1) ends the
    process with SIGFPE, which no `except` catches; the reference evaluator computes it)."""
    if n.op in ("Div", "Mod"):
        dtype = g.values[n.outputs[0]].type.dtype if n.outputs else 0
        return dtype not in _FLOAT_TYPES
    if n.op != "QuantizeLinear" or len(n.inputs) < 2 or n.inputs[1] == ABSENT:
        return False
    shape = g.values[n.inputs[1]].type.shape
    return shape is None or int(np.prod(shape)) > 1


_FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
}


def _evaluate(
    nodes: list[Node],
    g: TermGraph,
    consts: dict,
    onnxruntime: bool = False,
    wanted: set[int] | None = None,
) -> dict[int, np.ndarray]:
    """The values `nodes` compute from `consts`, those in `wanted` (default: all), by
    onnxruntime's kernels or the reference evaluator. Raises what the evaluator raises."""
    name = lambda v: "" if v == ABSENT else g.values[v].name  # noqa: E731
    # a payload that is not an ONNX node (the fx frontend's) is not a proto to copy; canonical
    # nodes are then written from their attributes
    protos = [
        export_node(
            n if isinstance(n.payload, (onnx.NodeProto, type(None))) else replace(n, payload=None),
            name,
        )
        for n in nodes
    ]
    produced = {o for n in nodes for o in n.outputs}
    needed = sorted({i for n in nodes for i in n.inputs if i != ABSENT and i not in produced})
    # the constants are fed as graph inputs, not initializers: the evaluator takes the arrays
    # as they are, where initializers would copy every weight into protobuf and out again
    feeds = {name(i): np.asarray(consts[i]) for i in needed}
    inputs = [
        helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
        for k, v in feeds.items()
    ]
    outs = sorted(produced if wanted is None else produced & wanted)
    if not outs:  # a chain nothing reads: left as it is, and pruned
        return {}
    if onnxruntime:
        head, tail = _four_bit_tail(nodes, g)
        if tail:  # the part before it by onnxruntime, the 4-bit tail by the reference
            ahead = {o for n in head for o in n.outputs}
            boundary = {i for n in tail for i in n.inputs if i in ahead}
            first = _evaluate(head, g, consts, True, None if wanted is None else wanted | boundary)
            rest = _evaluate(tail, g, {**consts, **first}, False, wanted)
            return {o: v for o, v in {**first, **rest}.items() if o in outs}
    graph = helper.make_graph(
        protos, "fold", inputs, [helper.make_value_info(name(o), onnx.TypeProto()) for o in outs]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", g.opset)])
    if onnxruntime:
        model.ir_version = min(model.ir_version, MAX_IR_VERSION)
        results = _run_onnxruntime(model, feeds)
    else:
        results = ReferenceEvaluator(model, new_ops=_FAST_OPS).run(None, feeds)
    return {o: np.asarray(r) for o, r in zip(outs, results)}


_FOUR_BIT = (onnx.TensorProto.INT4, onnx.TensorProto.UINT4)


def _four_bit_tail(nodes: list[Node], g: TermGraph) -> tuple[list[Node], list[Node]]:
    """`nodes` (in graph order) in two: the Casts to int4 or uint4 and every node after them
    that reads what they make, and the rest. onnxruntime computes such a Cast but neither
    returns int4 to numpy nor moves it (no Reshape or Transpose kernel for int4: weight-only's
    standard-ONNX packing, whose Cast the saturation moves before its Flatten),
    so `_evaluate` gives it the rest (the weights' rounding, most of the work: BERT-base's
    took 2.4 s in the reference evaluator) and the reference evaluator the tail."""
    made: set[int] = set()
    head, tail = [], []
    for n in nodes:
        if (n.op == "Cast" and n.attr("to") in _FOUR_BIT) or made.intersection(n.inputs):
            tail.append(n)
            made.update(n.outputs)
        else:
            head.append(n)
    return head, tail


def _run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list:
    """`model` run once by onnxruntime's CPU kernels, its graph optimizations off (the nodes
    as written: none of onnxruntime's own folding). Raises what onnxruntime raises."""
    return cpu_session(model).run(None, feeds)
