"""Ops declared in rule files: ops no installed registry has (a vendor's op, a custom op of a
user's runtime), each defined by a body in registry ops.

`dsl` lowers a form `(op com.acme.Swish (@x) :cost elementwise (Mul @x (Sigmoid @x)))` to a
`Declaration` and `declare`s it. The op becomes one `OpSpec` of the op table (`vocab.ops.OPS`:
its domain, inputs, attributes with defaults, cost class, no family, version 1, `declared`)
with a type rule (`vocab.shape_registry`) that gets the output type from the body: ONNX shape
inference on a one-node model that carries the body as a model-local function. From then on
the engine, the importers and the exporters see it like any op of the table. The body as an
ONNX `FunctionProto` (`function_proto`) makes a model that uses the op runnable anywhere: the
ONNX exporter and `verify` attach it to the models they write (`functions_for`).

Declaring is idempotent: the same declaration again (a file loaded twice) changes nothing; a
different one under a declared name, or an op in a domain an installed registry owns, raises
`DeclarationError`. Declarations live as long as the process, like the op table.

Sources: ONNX IR, functions (https://onnx.ai/onnx/repo-docs/IR.html#functions): a model-local
FunctionProto defines the op of its (domain, name); an attribute reaches its nodes through
`ref_attr_name`, its default is in `attribute_proto`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import Any

import onnx
from onnx import helper, numpy_helper

from vocab.onnx_nodes import onnx_node
from vocab.ops import NONE, OPS, REQUIRED, OpSpec, TensorValue, registry_domains
from vocab.ops import type_signature as registry_signature
from vocab.shape_registry import type_rule
from vocab.types import UNKNOWN, TensorType, keep_input_dims, tensor_type

_ATTR_TYPES = {
    "int": onnx.AttributeProto.INT,
    "float": onnx.AttributeProto.FLOAT,
    "string": onnx.AttributeProto.STRING,
    "ints": onnx.AttributeProto.INTS,
    "floats": onnx.AttributeProto.FLOATS,
    "strings": onnx.AttributeProto.STRINGS,
    "tensor": onnx.AttributeProto.TENSOR,
}
# the element types an input the body never reads directly may take
_ANY_TENSOR = tuple(
    f"tensor({t})" for t in "float double float16 int64 int32 int8 uint8 bool".split()
)


@dataclass(frozen=True)
class AttrRef:
    """A body node's attribute that takes the value of the declared op's attribute `name`."""

    name: str


@dataclass(frozen=True)
class BodyNode:
    """One node of a body: a registry op (a table name, `Op#K` included), its input value
    names ("" for an absent optional input), its output's name, and its attributes as
    `(name, value)` pairs, a value being canonical (`vocab.ops`) or an `AttrRef`."""

    op: str
    inputs: tuple[str, ...]
    output: str
    attrs: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Declaration:
    """An op a rule file declares: its `OpSpec` (input names are the body's input value names)
    and its body, nodes in order, the last one computing the op's output. `opset`: the
    default-domain opset the body is read at (the lowest at which the table has all of its
    ops). `origin`: where it is written (`file:line:col`), for messages; not compared."""

    spec: OpSpec
    body: tuple[BodyNode, ...]
    opset: int
    origin: str = field(default="", compare=False)


class DeclarationError(ValueError):
    """A declaration the op table cannot take (see `declare`)."""


DECLARED: dict[str, Declaration] = {}  # qualified name -> its declaration


def declare(d: Declaration) -> None:
    """Register `d`: its spec into `vocab.ops.OPS`, its type rule into the shape registry.
    The same declaration again does nothing. Raises DeclarationError for a name declared
    differently before, or an op of a domain an installed registry owns (`registry_domains`)."""
    name = d.spec.qualname
    old = DECLARED.get(name)
    if old is not None:
        if old != d:
            where = f" at {old.origin}" if old.origin else ""
            raise DeclarationError(f"{name} is already declared{where}, differently")
        return
    if d.spec.domain in registry_domains() or OPS.get(name) is not None:
        what = f"domain '{d.spec.domain}'" if d.spec.domain else "the default domain"
        raise DeclarationError(
            f"{name} is in {what}, which an installed registry owns; declare ops in a domain"
            " of your own (com.acme.Swish)"
        )
    OPS.add(d.spec)
    type_rule(name)(partial(_body_type, name))
    DECLARED[name] = d


def declaration(name: str) -> Declaration | None:
    """The declaration of op `name` (`Op#K`: of `Op`), or None for an op no rule file
    declared."""
    return DECLARED.get(name.partition("#")[0])


def function_proto(name: str, opset: int) -> onnx.FunctionProto:
    """The body of declared op `name` as a model-local ONNX function, importing the default
    domain at `opset` (a model's functions import the model's opset; at least the body's own
    `Declaration.opset`). The op's attributes are the function's, with their defaults;
    body attributes written `@name` refer to them (`ref_attr_name`)."""
    d = DECLARED[name]
    nodes = []
    for b in d.body:
        spec = OPS.get(b.op)
        fixed = [(a, v) for a, v in b.attrs if not isinstance(v, AttrRef)]
        node = onnx_node(b.op, list(b.inputs), [b.output], fixed)
        for a, v in b.attrs:
            if isinstance(v, AttrRef):
                ref = helper.make_attribute_ref(v.name, _ATTR_TYPES[spec.attr_index[a].kind])
                ref.name = a
                node.attribute.append(ref)
        nodes.append(node)
    attrs = d.spec.attrs
    versions = {OPS.get(b.op).domain: OPS.get(b.op).version for b in d.body}
    imports = [helper.make_opsetid("", max(opset, d.opset))]
    imports += [helper.make_opsetid(k, v) for k, v in sorted(versions.items()) if k]
    return helper.make_function(
        d.spec.domain,
        d.spec.name,
        list(d.spec.inputs),
        [d.body[-1].output],
        nodes,
        imports,
        attributes=[a.name for a in attrs if a.default in (NONE, REQUIRED)],
        attribute_protos=[
            _attribute(a.name, a.kind, a.default)
            for a in attrs
            if a.default not in (NONE, REQUIRED)
        ],
    )


def functions_for(
    nodes: Iterable[onnx.NodeProto], opset: int, have: Iterable[onnx.FunctionProto] = ()
) -> list[onnx.FunctionProto]:
    """The functions (`function_proto` at default-domain `opset`) of the declared ops that
    `nodes` use, sorted by name, leaving out those `have` already defines (a model's own)."""
    known = {(f.domain, f.name) for f in have}
    names = {
        f"{n.domain}.{n.op_type}"
        for n in nodes
        if n.domain and (n.domain, n.op_type) not in known and f"{n.domain}.{n.op_type}" in DECLARED
    }
    return [function_proto(name, opset) for name in sorted(names)]


def type_signature(op: str, opset: int):
    """`vocab.ops.type_signature` that also knows the declared ops: (input type strings,
    output type strings, type parameter -> allowed type strings). A declared op's type
    parameters are those of its body: values that one body op's schema ties to one parameter
    share it, and a parameter allows what every schema it stands in allows. Raises
    onnx.defs.SchemaError for an op neither a registry nor a rule file has."""
    d = declaration(op)
    return registry_signature(op, opset) if d is None else _body_signature(d)


def _body_signature(d: Declaration):
    parent: dict[str, str] = {}
    allowed: dict[str, tuple[str, ...]] = {}

    def find(v: str) -> str:
        while parent.setdefault(v, v) != v:
            v = parent[v]
        return v

    def tie(value: str, param: str, types) -> None:
        a, b = find(f"v:{value}"), find(param)
        both = allowed.get(b, types)
        merged = tuple(t for t in allowed.get(a, types) if t in both and t in types)
        if a != b:
            parent[b] = a
            allowed.pop(b, None)
        allowed[a] = merged

    for k, b in enumerate(d.body):
        ins, outs, params = registry_signature(b.op, d.opset)
        for i, name in enumerate(b.inputs):
            if name:
                type_str = ins[min(i, len(ins) - 1)]
                param = f"{k}:{type_str}" if type_str in params else f"{k}:{i}"
                tie(name, param, params.get(type_str, (type_str,)))
        out = outs[min(OPS.get(b.op).output, len(outs) - 1)]
        tie(b.output, f"{k}:{out}" if out in params else f"{k}:out", params.get(out, (out,)))

    def param(value: str) -> str:
        return "T" + find(f"v:{value}").removeprefix("v:")

    values = [*d.spec.inputs, d.body[-1].output]
    types = {param(v): allowed.get(find(f"v:{v}"), _ANY_TENSOR) for v in values}
    return [param(v) for v in d.spec.inputs], [param(d.body[-1].output)], types


def _attribute(name: str, kind: str, value) -> onnx.AttributeProto:
    if isinstance(value, TensorValue):
        value = numpy_helper.from_array(value.array())
    elif isinstance(value, tuple):
        value = list(value)
    return helper.make_attribute(name, value, attr_type=_ATTR_TYPES[kind])


def _body_type(name: str, attrs: dict, inputs: tuple) -> TensorType:
    """Type rule of declared op `name` (`vocab.shape_registry.TypeFn`)."""
    if any(t is not None and not t.dtype for t in inputs):
        return UNKNOWN
    try:
        return _infer(name, tuple(sorted(attrs.items())), tuple(inputs))
    except TypeError:  # an unhashable attribute value (canonical values are hashable)
        return UNKNOWN


@lru_cache(maxsize=4096)
def _infer(name: str, attrs: tuple, inputs: tuple) -> TensorType:
    """ONNX shape inference on one node of `name` in a model carrying its function."""
    d = DECLARED[name]
    names = [f"in{i}" if t is not None else "" for i, t in enumerate(inputs)]
    while names and not names[-1]:
        names.pop()
    vis = [
        helper.make_tensor_value_info(n, t.dtype, None if t.shape is None else list(t.shape))
        for n, t in zip(names, inputs)
        if n
    ]
    node = onnx_node(name, names, ["out"], attrs)
    graph = helper.make_graph(
        [node], "infer", vis, [helper.make_value_info("out", onnx.TypeProto())]
    )
    fn = function_proto(name, d.opset)
    imports = [*fn.opset_import, helper.make_opsetid(d.spec.domain, d.spec.version)]
    model = helper.make_model(graph, opset_imports=imports, functions=[fn])
    model.ir_version = 10
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # onnx raises its own inference errors: the type is unknown
        return UNKNOWN
    return keep_input_dims(tensor_type(inferred.graph.output[0].type), inputs)
