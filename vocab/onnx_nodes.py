"""Canonical op -> ONNX `NodeProto`: the one place the engine (folding, shape inference) and the
ONNX exporter build ONNX nodes.

`onnx_node` writes a node from an op-table op and canonical attributes; `export_node` writes a
TermGraph `Node`, reusing its original proto (`Node.payload`) when it has one. Both leave out
attributes equal to their op-table default, as ONNX writers do.
"""

from __future__ import annotations

import onnx
from onnx import helper, numpy_helper

from vocab.graph import Node
from vocab.ops import NONE, OPS, REQUIRED, TensorValue


def export_node(n: Node, name) -> onnx.NodeProto:
    """One NodeProto for `n`; `name(value_id)` gives value names. Attributes equal to their
    op-table default are left out, as ONNX writers do."""
    inputs = [name(v) for v in n.inputs]
    while inputs and inputs[-1] == "":
        inputs.pop()
    outputs = [name(v) for v in n.outputs]
    if n.payload is not None:  # the original node, untouched: keep its proto, rename values
        proto = onnx.NodeProto()
        proto.CopyFrom(n.payload)
        del proto.input[:], proto.output[:]
        proto.input.extend(inputs)
        proto.output.extend(outputs)
        return proto
    return onnx_node(n.op, inputs, outputs, n.attrs, name=n.name or None)


_LIST_TYPES = {
    "ints": onnx.AttributeProto.INTS,
    "floats": onnx.AttributeProto.FLOATS,
    "strings": onnx.AttributeProto.STRINGS,
}


def onnx_node(
    op: str, inputs: list[str], outputs: list[str], attrs, name: str | None = None
) -> onnx.NodeProto:
    """NodeProto of a canonical op (`Name`, `domain.Name` or a projection `Name#K`, which
    writes output K) with canonical `attrs` (`(name, value)` pairs; a tensor attribute is a
    `TensorValue`); attributes that are absent or equal to their op-table default are left
    out, as ONNX writers do (a declared op's are all written: `OpSpec.declared`)."""
    spec = OPS.get(op)
    kw = {}
    for a, val in attrs:
        aspec = spec.attr_index[a]
        default = aspec.default not in (NONE, REQUIRED) and _same(val, aspec.default)
        if val is None or (default and not spec.declared):  # (OpSpec.declared: why)
            continue
        if isinstance(val, TensorValue):
            kw[a] = numpy_helper.from_array(val.array())
        else:
            kw[a] = list(val) if isinstance(val, tuple) else val
    node = helper.make_node(
        spec.name,
        inputs,
        node_outputs(spec, list(outputs), dict(attrs)),
        name=name,
        domain=spec.domain or None,
        **{a: v for a, v in kw.items() if not (isinstance(v, list) and v == [])},
    )
    # an empty list (a rank-0 Transpose's perm) has no element to infer its type from
    for a in [a for a, v in kw.items() if isinstance(v, list) and v == []]:
        kind = spec.attr_index[a].kind
        node.attribute.append(helper.make_attribute(a, [], attr_type=_LIST_TYPES[kind]))
    return node


UNUSED = "__unused"  # the mark of a placeholder output name (`node_outputs`)


def node_outputs(spec, outputs: list[str], attrs: dict) -> list[str]:
    """The output list of a node of `spec` (an `OpSpec`, maybe a projection `Op#K`) that
    writes `outputs` from position `spec.output` on. Positions before it, and after it up to
    the count the node must have (`num_outputs` of a variadic-output op such as Split, the
    required outputs of another: DynamicQuantizeLinear has three, TopK two), are
    left empty where ONNX lets an output be omitted (an optional one) and get a placeholder
    name `<first output>__unusedJ` otherwise: onnxruntime 1.32 crashes on a Split whose first
    output is ""."""
    first = outputs[0] if outputs else "out"
    out = []
    for j in range(spec.output):
        optional = j >= spec.n_outputs_required and not spec.variadic_outputs
        out.append("" if optional else f"{first}{UNUSED}{j}")
    out += outputs
    count = attrs.get("num_outputs") if spec.variadic_outputs else spec.n_outputs_required
    for j in range(len(out), count or 0):
        out.append(f"{first}{UNUSED}{j}")
    return out


def _same(a, b) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return tuple(a) == tuple(b)
    return a == b
