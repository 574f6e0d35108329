"""ONNX -> TermGraph.

Initializers and `Constant` nodes become constants (identical small constants are shared, so
the e-graph sees one value); shapes and dtypes come from ONNX shape inference with data
propagation; every node whose op is in the op table at the model's opset becomes a matchable
node with all attributes canonical (defaults filled in). Everything else is opaque and comes back
out unchanged: unknown ops, custom domains, ops with subgraph attributes (If, Loop, Scan),
random or effectful ops, and ops with more than one used output (an output is used when a
node, a subgraph or the graph's outputs read it: a Dropout's or a BatchNormalization's extra
outputs that an exporter named but nothing reads do not count, and are left out).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnx.external_data_helper import uses_external_data

from frontends.onnx.explain import recorded_trees
from frontends.onnx.external import mapped_array
from vocab.graph import ABSENT, Node, TermGraph, Value
from vocab.ops import NONE, OPS, REQUIRED, TENSOR_ATTR_MAX, OpSpec, attribute_value
from vocab.types import TensorType, tensor_type

_DEDUP_MAX_BYTES = 1 << 16  # constants up to this size are shared when byte-identical


class ImportError_(ValueError):
    """The model cannot be imported (its external data was not loaded, and no folder given)."""


def default_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain (ai.onnx) opset version, or 0 when it imports none: a model
    of `ai.onnx.ml` or `ai.onnx.preview.training` ops only is valid, and all its nodes are
    opaque (no op of the op table exists at opset 0), so it comes back unchanged."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return imp.version
    return 0


def import_model(
    model: onnx.ModelProto,
    folder: Path | None = None,
    arrays: dict[str, np.ndarray] | None = None,
) -> TermGraph:
    """Import an ONNX model. The model is not modified.

    folder: where the model's external data files are, when they were not loaded into it
    (`load_model`); the main graph's external initializers are then mapped from their files
    (`frontends.onnx.external.mapped_array`), not read. arrays: the values, by name, of the
    initializers the model holds without values (a `frontends.onnx.structure` copy's weights,
    kept as arrays by the caller), taken as they are (not copied). Returns a TermGraph whose
    `meta` is the original model (for export); its `opset` is 0 when the model imports no
    default-domain opset. Raises ExternalDataError for a data file shorter than its tensor,
    ImportError_ for external data not loaded when no `folder` is given (it is never read from
    the current directory).
    """
    opset = default_opset(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton(model), data_prop=True)
    except Exception:  # shape inference is best-effort: unknown shapes are sound
        inferred = model
    b = _Builder(opset, _types_of(inferred.graph))
    b.recorded = recorded_trees(model)
    b.domains |= {
        i.domain: i.version for i in model.opset_import if i.domain not in ("", "ai.onnx")
    }
    g = model.graph
    b.read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    b.read |= {name for n in g.node for name in _outer_names(n)}
    for init in g.initializer:
        external = uses_external_data(init)
        if arrays is not None and not external and is_stub(init):
            if init.name not in arrays:  # a caller's bug: say which, not numpy's reshape error
                raise ImportError_(f"initializer {init.name!r}: no values, and not in arrays")
            b.constant(init.name, arrays[init.name])
            continue
        if external and folder is None:  # never read relative to the cwd
            raise ImportError_(
                f"initializer {init.name!r}: external data not loaded and no folder given"
            )
        b.constant(
            init.name, mapped_array(init, folder) if external else numpy_helper.to_array(init)
        )
    inputs = tuple(b.value(i.name) for i in g.input if i.name not in b.const_names)
    for n in g.node:
        b.node(n)
    outputs = tuple(b.value(o.name) for o in g.output)
    return TermGraph(
        values=tuple(b.values),
        nodes=tuple(b.nodes),
        inputs=inputs,
        outputs=outputs,
        constants=b.constants,
        opset=opset,
        meta=model,
    )


def constants_by_name(g: TermGraph) -> dict[str, np.ndarray]:
    """The constants of imported graph `g` by their values' names: the arrays `import_model`
    takes back (`arrays`) for a `structure` of the model, and the initializers it holds (an
    initializer it shared with a byte-identical one is under that one's name only)."""
    return {g.values[v].name: a for v, a in g.constants.items()}


SKELETON_MAX_ELEMENTS = 64  # initializers up to this size stay in a skeleton (shape constants)


def is_weight(t: onnx.TensorProto) -> bool:
    """Whether initializer `t` has more than SKELETON_MAX_ELEMENTS elements: a weight, which a
    `skeleton` leaves out (a graph input in its place), as against a shape constant."""
    return (int(np.prod(t.dims)) if t.dims else 1) > SKELETON_MAX_ELEMENTS


def value_fields(t: onnx.TensorProto) -> list[str]:
    """The fields of TensorProto `t` that hold values (raw_data, or a typed field such as
    float_data), by presence: `ListFields()` would copy raw_data's bytes (BERT-base: 0.1-0.25
    s). External data is not among them."""
    return [f for f in _VALUE_FIELDS if (t.HasField(f) if f == "raw_data" else len(getattr(t, f)))]


_VALUE_FIELDS = (
    "raw_data",
    "float_data",
    "int32_data",
    "string_data",
    "int64_data",
    "double_data",
    "uint64_data",
)


def is_stub(t: onnx.TensorProto) -> bool:
    """Whether initializer `t` is a weight held without values (name, type and shape only, as
    `frontends.onnx.structure` keeps it): no value field, no external data."""
    return is_weight(t) and not uses_external_data(t) and not value_fields(t)


def skeleton(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` without its weights: every initializer with more than
    SKELETON_MAX_ELEMENTS elements becomes a graph input of the same type and shape.

    What shape inference and `onnx.checker` need (nodes, types, small constants such as Reshape
    targets) is all there, and copying it costs time linear in nodes, not in weight bytes (a
    whole model is serialized by every call into onnx's C++ code). Subgraphs, functions and
    opset imports, doc strings and metadata are kept."""
    out = onnx.ModelProto()
    fields = ("ir_version", "producer_name", "producer_version", "domain", "model_version")
    for f in (*fields, "doc_string"):
        setattr(out, f, getattr(model, f))
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    out.metadata_props.extend(model.metadata_props)
    g, src = out.graph, model.graph
    g.name, g.doc_string = src.name, src.doc_string
    g.node.extend(src.node)
    g.input.extend(src.input)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    names = {i.name for i in src.input}
    for init in src.initializer:
        if not is_weight(init):
            g.initializer.append(init)
        elif init.name not in names:
            g.input.append(
                helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    return out


def _types_of(graph: onnx.GraphProto) -> dict[str, TensorType]:
    types = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        types[vi.name] = tensor_type(vi.type)
    for init in graph.initializer:
        types[init.name] = TensorType(init.data_type, tuple(int(d) for d in init.dims))
    return types


class _Builder:
    def __init__(self, opset: int, types: dict[str, TensorType]):
        self.opset, self.types = opset, types
        self.domains: dict[str, int] = {"": opset}  # domain -> the model's opset of it
        self.values: list[Value] = []
        self.ids: dict[str, int] = {}
        self.nodes: list[Node] = []
        self.constants: dict[int, np.ndarray] = {}
        self.const_names: set[str] = set()
        self._by_digest: dict[tuple, int] = {}
        self.read: set[str] | None = None  # names something reads (None: every named output)
        self.shared: dict[str, str] = {}  # aliased constant -> its Constant node's or own name
        self.recorded: dict[str, dict] = {}  # name -> the tree an earlier run wrote on it

    def value(self, name: str) -> int:
        if not name:
            return ABSENT
        vid = self.ids.get(name)
        if vid is None:
            vid = self.ids[name] = len(self.values)
            self.values.append(Value(name, self.types.get(name, TensorType())))
        return vid

    def constant(self, name: str, array: np.ndarray, node: str | None = None) -> None:
        """Record constant `name` (an initializer, or the output of Constant node `node`)."""
        self.const_names.add(name)
        if array.nbytes <= _DEDUP_MAX_BYTES and array.dtype != object:
            key = (array.dtype.str, array.shape, hashlib.sha1(array.tobytes()).hexdigest())
            if key in self._by_digest:  # an alias: later references resolve to the first one
                self.ids[name] = self._by_digest[key]
                self.shared[name] = node or name
                return
        vid = self.value(name)
        self.values[vid] = Value(
            name,
            TensorType(helper.np_dtype_to_tensor_dtype(array.dtype), array.shape),
            _tree("fold:Constant", "Constant", [node])
            if node is not None
            else self.recorded.get(name),
        )
        self.constants[vid] = array
        if array.nbytes <= _DEDUP_MAX_BYTES and array.dtype != object:
            self._by_digest[key] = vid

    def node(self, n: onnx.NodeProto) -> None:
        if n.op_type == "Constant" and n.domain in ("", "ai.onnx") and len(n.output) == 1:
            array = _constant_value(n)
            if array is not None:
                self.constant(n.output[0], array, n.name or n.output[0])
                return
        inputs = tuple(self.value(i) for i in n.input)
        # the payload is a copy: a reference to a message of the model would keep the model's
        # whole protobuf arena (its weights) alive as long as the graph
        own = onnx.NodeProto()
        own.CopyFrom(n)
        n = own
        shared = sorted({self.shared[i] for i in n.input if i in self.shared})
        why = _tree("share-constant", n.op_type, shared) if shared else None
        earlier = self.recorded.get(n.name) if n.name else None
        if earlier is not None:  # a node an earlier run wrote: its history comes first
            why = {**why, "after": [earlier]} if why else earlier
        domain = "" if n.domain == "ai.onnx" else n.domain
        version = self.domains.get(domain)
        spec = OPS.lookup(domain, n.op_type, version) if version else None
        attrs = _canonical_attrs(n, spec, inputs, self) if spec else None
        used = [k for k, o in enumerate(n.output) if o and (self.read is None or o in self.read)]
        if attrs is None or any(k >= spec.n_outputs for k in used) or not (used or n.output[0]):
            outputs = tuple(self.value(o) for o in n.output)
            names = tuple(sorted(_outer_names(n) & self.ids.keys()))
            implicit = tuple(self.ids[name] for name in names)
            self.nodes.append(
                Node(
                    n.op_type, inputs, outputs, (), True, n.name, n.domain, n, implicit, names, why
                )
            )
            return
        pad = (ABSENT,) * (spec.arity - len(inputs))
        # one term per output read (`Op`, `Op#1`, ...: vocab.ops); the original proto is kept
        # for reuse only when it is one term with its first output
        payload = n if used in ([0], []) else None
        for k in used or [0]:
            op, name = (
                (spec.qualname, n.name)
                if k == 0
                else (f"{spec.qualname}#{k}", n.name and f"{n.name}#{k}")
            )
            out = (self.value(n.output[k]),)
            self.nodes.append(
                Node(op, inputs + pad, out, attrs, False, name, "", payload, provenance=why)
            )


def _tree(rule: str, op: str, replaces: list[str]) -> dict:
    """Provenance (`engine.provenance`) of what the import changed: a Constant node made an
    initializer (`fold:Constant`), or a node reading a byte-identical constant shared with an
    earlier one (`share-constant`; `replaces` the constants it no longer reads)."""
    return {
        "rule": rule,
        "at": "frontends/onnx/importer.py",
        "op": op,
        "replaces": replaces,
        "after": [],
    }


def _outer_names(n: onnx.NodeProto) -> set[str]:
    """Names that `n`'s subgraphs read from the enclosing graph (ONNX scoping: a subgraph
    may use any value visible where its node is)."""
    names: set[str] = set()
    for a in n.attribute:
        for g in [a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs):
            defined = {i.name for i in g.input} | {i.name for i in g.initializer}
            for inner in g.node:
                names |= {i for i in inner.input if i and i not in defined}
                names |= _outer_names(inner) - defined
                defined |= set(inner.output)
    return names


def _constant_value(n: onnx.NodeProto) -> np.ndarray | None:
    a = n.attribute[0] if len(n.attribute) == 1 else None
    if a is None or a.name == "sparse_value" or a.name.startswith("value_string"):
        return None
    value = helper.get_attribute_value(a)
    if a.name == "value":
        return numpy_helper.to_array(value)
    dtype = np.float32 if a.name.startswith("value_float") else np.int64
    return np.asarray(value, dtype=dtype)


def _canonical_attrs(n: onnx.NodeProto, spec: OpSpec, inputs, b: _Builder):
    """All attributes of `spec` as canonical Python values, or None if the node must be opaque."""
    if spec.random or spec.effectful or len(n.input) > spec.arity or len(n.input) < spec.n_required:
        return None
    given = {}
    for a in n.attribute:
        if a.name not in spec.attr_index or a.type in (
            onnx.AttributeProto.GRAPH,
            onnx.AttributeProto.GRAPHS,
        ):
            return None
        if a.type == onnx.AttributeProto.TENSOR and _numel(a.t) > TENSOR_ATTR_MAX:
            return None  # too big to be a literal of the e-graph
        given[a.name] = attribute_value(a)
    out = []
    for a in spec.attrs:
        v = given.get(a.name, a.default)
        if v is REQUIRED:
            return None
        out.append((a.name, v if v is not NONE else None))
    if n.op_type == "Transpose" and dict(out)["perm"] is None:
        rank = b.values[inputs[0]].type.rank if inputs[0] != ABSENT else None
        if rank is None:
            return None
        out = [("perm", tuple(range(rank - 1, -1, -1)))]
    return tuple(out)


def _numel(t: onnx.TensorProto) -> int:
    n = 1
    for d in t.dims:
        n *= d
    return n
