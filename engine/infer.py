"""Output type (dtype and shape) of one op application, from the op's shape rules.

An op with a type rule (`vocab.shape_rules`: elementwise, broadcasting, Cast) gets its type
from the input types directly; every other op goes to ONNX shape inference
(`onnx.shape_inference`, with data propagation) on a one-node model, cached by op, attributes,
input types and small constant inputs, and an op with a symbolic shape rule then has the
dimensions ONNX leaves unknown named by the symbolic analysis (`engine.shapes`). An unknown
result is `TensorType()`: guards that need it fail, which is sound.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engine.shapes import analyze
from vocab.graph import ABSENT, Node, TermGraph, Value
from vocab.onnx_nodes import onnx_node
from vocab.ops import OPS
from vocab.shape_rules import rule_of
from vocab.symbolic import to_dim
from vocab.types import UNKNOWN, TensorType, keep_input_dims, tensor_type

_CONST_MAX = 64  # constant inputs up to this many elements take part in inference


def infer_type(op: str, attrs, inputs: tuple[TensorType | None, ...], values: tuple) -> TensorType:
    """Type of `op(inputs)` with canonical `attrs` (tuple of `(name, value)` pairs).

    inputs: one TensorType per input slot, None for an absent optional input.
    values: one numpy array or None per slot (constant inputs, e.g. Reshape's shape).
    Returns `TensorType()` when the type cannot be inferred; never raises.
    """
    if any(t is not None and t.shape is None and t.dtype == 0 for t in inputs):
        return UNKNOWN
    rule = rule_of(op)
    if rule is not None and rule.type is not None:
        return rule.type(dict(attrs), inputs)
    key = (op, attrs, inputs, tuple(_freeze(v) for v in values))
    try:
        t = _onnx_infer(key)
        symbolic = any(
            isinstance(d, str) for i in inputs if i is not None and i.shape for d in i.shape
        )
        if symbolic and rule is not None and rule.shape is not None:
            t = _with_symbolic(t, _symbolic_shape(key))
        return t
    except TypeError:  # unhashable attribute (should not happen with canonical attrs)
        return UNKNOWN


def _with_symbolic(t: TensorType, dims: tuple | None) -> TensorType:
    """`t` with the symbolic analysis's dimensions where it knows them."""
    if dims is None or (t.shape is not None and len(t.shape) != len(dims)):
        return t
    old = t.shape or (None,) * len(dims)
    return TensorType(t.dtype, tuple(d if d is not None else o for d, o in zip(dims, old)))


@lru_cache(maxsize=65536)
def _symbolic_shape(key) -> tuple | None:
    """Output dims of one op by the symbolic shape analysis (`engine.shapes`), for inputs
    with symbolic dimensions: "batch*seq" for a Reshape to (-1, D) of ("batch", "seq", D),
    where ONNX shape inference gives a fresh name. A dimension the analysis does not know
    (or knows only through a fresh symbol of its own) is None."""
    op, attrs, inputs, values = key
    vals, ins, consts = [], [], {}
    for t, v in zip(inputs, values):
        if t is None:
            ins.append(ABSENT)
            continue
        ins.append(len(vals))
        vals.append(Value(f"in{len(vals)}", t))
        if v is not None:
            dtype, shape, raw = v
            consts[len(vals) - 1] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    vals.append(Value("out", UNKNOWN))
    node = Node(op, tuple(ins), (len(vals) - 1,), attrs)
    graph = TermGraph(
        tuple(vals),
        (node,),
        tuple(i for i in range(len(vals) - 1) if i not in consts),
        (len(vals) - 1,),
        consts,
    )
    try:
        a = analyze(graph)
    except Exception:
        return None
    shape = a.shapes.get(len(vals) - 1)
    if shape is None:
        return None
    return tuple(
        None if any(str(s).startswith("_u") for s in d.free_symbols) else to_dim(d) for d in shape
    )


def _freeze(v):
    if v is None or v.size > _CONST_MAX:
        return None
    return (v.dtype, v.shape, v.tobytes())  # the dtype itself: bfloat16's .str is '<V2'


@lru_cache(maxsize=65536)
def _onnx_infer(key) -> TensorType:
    op, attrs, inputs, values = key
    names, inits, vis = [], [], []
    for i, (t, v) in enumerate(zip(inputs, values)):
        if t is None:
            names.append("")
            continue
        name = f"in{i}"
        names.append(name)
        if v is not None:
            dtype, shape, raw = v
            inits.append(
                numpy_helper.from_array(np.frombuffer(raw, dtype=dtype).reshape(shape), name)
            )
        vis.append(_value_info(name, t))
    while names and names[-1] == "":
        names.pop()
    node = onnx_node(op, names, ["out"], attrs)
    graph = helper.make_graph(
        [node], "infer", vis, [helper.make_tensor_value_info("out", 0, None)], inits
    )
    spec = OPS.get(op)
    imports = [helper.make_opsetid("", max(21, spec.version if spec and not spec.domain else 0))]
    if spec is not None and spec.domain:
        imports.append(helper.make_opsetid(spec.domain, spec.version))
    model = helper.make_model(graph, opset_imports=imports)
    model.ir_version = 10
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:
        return UNKNOWN
    t = keep_input_dims(tensor_type(inferred.graph.output[0].type), inputs)
    if t.shape is not None and any(isinstance(d, int) and d < 0 for d in t.shape):
        return UNKNOWN  # ONNX inference gives a Conv whose kernel outgrows its input -1 dims
    return t


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    shape = None if t.shape is None else [d if d is not None else None for d in t.shape]
    return helper.make_tensor_value_info(name, t.dtype or TensorProto.FLOAT, shape)
