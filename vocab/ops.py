"""The op table: every operator the engine can match, derived from the operator registries.

The vocabulary is read at start-up from `onnx.defs.get_all_schemas_with_history()` (every
domain and version: inputs with their optional and variadic markers, outputs, attributes with
their types and defaults, type constraints, since-versions, function bodies) and, on the first
request for one of its domains, from onnxruntime's contrib schemas
(`onnxruntime.capi.onnxruntime_pybind11_state.get_all_operator_schema()`: `com.microsoft`).
Nothing a registry knows is typed here again. The hand-written overlay below adds only what no
registry knows: an op's cost class (`rewrite.cost`), the named families it belongs to
(`FAMILIES`, match.pd's `define_operator_list`), commutativity, and the few ops that stay
opaque by policy.

Each `OpSpec` is one op in one opset range, in the form the engine uses: one egglog
constructor per op, whose slots are the newest version's inputs (a variadic input is
`VARIADIC_SLOTS` optional slots) and the union of every version's attributes. An older
version is represented only where its inputs are no more than the newest ones and its
attributes keep their kinds (then a rule's unwritten attribute must still equal its default,
so a rule written for the newest form never matches an older form that means something else).
Default-domain forms older than `MIN_OPSET` are not represented: such models are converted
(`frontends.onnx.opset`).

An op is *matchable* (in `OPS`) unless it is control flow (a subgraph attribute: `If`, `Loop`,
`Scan`, ...), works on sequences, optionals or maps, is a training op, or has an attribute kind
the e-graph cannot hold as a literal; random ops are in `OPS` marked `random` (never matched).
An op with several outputs is several e-graph constructors with the same slots: `Op` is its
first output and `Op#K` its output K (`Split#1`, `LayerNormalization#2`); the ONNX exporter
writes the projections of one application as one node. `vocabulary()` lists every registry
op with the reason it is not matchable (`rewrite ops`).

Sources: the ONNX operator specification (https://onnx.ai/onnx/operators/) as `onnx.defs`
carries it; onnxruntime's contrib operator schemas (docs/ContribOperators.md in onnxruntime).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx
import onnx.defs
from onnx import helper, numpy_helper


class _Marker(Enum):
    """Sentinels that keep their identity through pickling (the table's cache)."""

    REQUIRED = "required"


REQUIRED = _Marker.REQUIRED  # attribute that the ONNX spec requires (no default)
NONE = None  # optional attribute whose absence has a meaning of its own (no default value)

ATTR_KINDS = ("int", "float", "string", "ints", "floats", "strings", "tensor")
MIN_OPSET = 13  # the oldest default-domain forms the engine represents
MAX_OPSET = 26  # the newest default-domain opset onnxruntime 1.32 runs
MAX_IR_VERSION = 13  # the newest IR version onnxruntime 1.32 loads
VARIADIC_SLOTS = 8  # input slots of a variadic op; a node with more inputs stays opaque
TENSOR_ATTR_MAX = 64  # elements of a tensor attribute the e-graph holds as a literal
DEFAULT_DOMAIN = ""
ORT_DOMAINS = ("com.microsoft",)  # onnxruntime's contrib domains in the vocabulary
# the domains beyond the default one that a runtime runs: a ruleset that writes ops of
# another domain (`(ruleset NAME :domain D)`) is enabled where the model imports D or the
# chosen target has it
TARGETS = {"onnx": frozenset(), "onnxruntime": frozenset(("ai.onnx.ml", *ORT_DOMAINS))}

_KINDS = {
    onnx.AttributeProto.INT: "int",
    onnx.AttributeProto.FLOAT: "float",
    onnx.AttributeProto.STRING: "string",
    onnx.AttributeProto.INTS: "ints",
    onnx.AttributeProto.FLOATS: "floats",
    onnx.AttributeProto.STRINGS: "strings",
    onnx.AttributeProto.TENSOR: "tensor",
}
_SUBGRAPH = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)


class TensorValue(NamedTuple):
    """A tensor attribute's value as the engine holds it (hashable, canonical): ONNX element
    type, shape and the elements in C order (Python ints, floats or bools)."""

    dtype: int
    shape: tuple[int, ...]
    values: tuple

    @classmethod
    def of(cls, array: np.ndarray) -> TensorValue:
        """The TensorValue of numpy `array`."""
        a = np.asarray(array)
        return cls(
            helper.np_dtype_to_tensor_dtype(a.dtype), tuple(a.shape), tuple(a.ravel().tolist())
        )

    def array(self) -> np.ndarray:
        """The numpy array (dtype from the ONNX element type)."""
        dtype = helper.tensor_dtype_to_np_dtype(self.dtype)
        return np.array(self.values, dtype=dtype).reshape(self.shape)


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op: its name, kind (one of `ATTR_KINDS`) and default value.

    `default` is a Python value of the kind (`int`, `float`, `str`, `tuple[int, ...]`,
    `tuple[float, ...]`, `tuple[str, ...]`, `TensorValue`), `NONE` when an absent attribute
    means something else (e.g. Transpose without `perm` reverses the axes), or `REQUIRED`.
    """

    name: str
    kind: str
    default: Any = NONE


@dataclass(frozen=True)
class OpSpec:
    """One operator of the vocabulary, in one opset range.

    inputs: input slot names in ONNX order; `n_required` of them must be present, the rest are
        optional (absent optional inputs are the `Absent` term in the e-graph). A variadic input
        is `VARIADIC_SLOTS` slots `name_0`, `name_1`, ... (`variadic` is True).
    outputs: output names; the e-graph term of a node is its first output.
    attrs: the attributes, in a fixed order (the order of the egglog constructor's arguments).
    cost: cost class used by `engine.cost` (`elementwise`, `matmul`, `gemm`, `conv`, `reduce`,
        `normalize`, `movement`, `view`, `free`, `pool`, `shape`, `kernel`).
    since/until: opset range of `domain` in which this form holds (until exclusive);
        `version` is the registry's since-version of the form.
    families: the `FAMILIES` the op belongs to.
    effectful/random: such ops are never matched by rules (they stay opaque).
    function: the registry defines the op by a function body in other ops.
    declared: a rule file declares the op (`vocab.declared`); no registry has it.
    """

    name: str
    inputs: tuple[str, ...]
    n_required: int
    attrs: tuple[AttrSpec, ...] = ()
    cost: str = "elementwise"
    since: int = MIN_OPSET
    until: int = 10_000
    effectful: bool = False
    random: bool = False
    commutative: bool = False
    domain: str = DEFAULT_DOMAIN
    outputs: tuple[str, ...] = ("output",)
    n_outputs_required: int = 1
    variadic: bool = False
    version: int = 0
    families: tuple[str, ...] = ()
    function: bool = False
    version_inputs: int = -1  # input slots this form has (-1: all of them)
    version_attrs: frozenset[str] | None = None  # attributes this form has (None: all of them)
    variadic_outputs: bool = False  # the last output is variadic (Split's `outputs`)
    output: int = 0  # a projection `Op#K` is the op's output K (module docstring)
    # declared in a rule file (`vocab.declared`), defined by its body: its nodes write every
    # attribute, since onnx's function inliner ignores a function's attribute defaults
    declared: bool = False
    attr_index: dict[str, AttrSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attr_index", {a.name: a for a in self.attrs})

    @property
    def arity(self) -> int:
        """Number of input slots (required + optional)."""
        return len(self.inputs)

    @property
    def qualname(self) -> str:
        """The op's name in rules and in the e-graph: `Name` in the default domain, else
        `domain.Name` (`com.microsoft.FusedConv`)."""
        base = self.name if self.domain == DEFAULT_DOMAIN else f"{self.domain}.{self.name}"
        return f"{base}#{self.output}" if self.output else base

    @property
    def n_outputs(self) -> int:
        """How many outputs a node of this op may have (`VARIADIC_SLOTS` more than the fixed
        ones for a variadic output)."""
        return (
            len(self.outputs) - 1 + VARIADIC_SLOTS if self.variadic_outputs else len(self.outputs)
        )

    def supports(self, opset: int) -> bool:
        """True if this form is the one in force at `opset` of its domain."""
        return self.since <= opset < self.until

    def has_input(self, i: int) -> bool:
        """True if input slot `i` exists in this form (older forms may have fewer)."""
        return i < (self.arity if self.version_inputs < 0 else self.version_inputs)

    def has_attr(self, name: str) -> bool:
        """True if attribute `name` exists in this form."""
        return name in self.attr_index and (
            self.version_attrs is None or name in self.version_attrs
        )


# ---- the overlay: what no registry knows -------------------------------------------------

# Named op families (match.pd's define_operator_list): the engine, the frontends, `verify` and
# rule files (`(for op UNARY_ELEMENTWISE ...)`) all read them from here.
FAMILIES: dict[str, tuple[str, ...]] = {
    # y = f(x) elementwise, same shape and dtype, no attributes
    "UNARY_ELEMENTWISE": tuple(
        "Abs Acos Acosh Asin Asinh Atan Atanh BitwiseNot Ceil Cos Cosh Erf Exp Floor HardSwish "
        "Log Mish Neg Not Reciprocal Relu Round Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Tan "
        "Tanh".split()
    ),
    # elementwise, same shape and dtype, with attributes
    "ACTIVATION": tuple("Celu Elu Gelu HardSigmoid LeakyRelu Selu Shrink ThresholdedRelu".split()),
    # two inputs, multidirectional (numpy) broadcasting, the first input's dtype
    "BINARY_ARITHMETIC": tuple(
        "Add BitShift BitwiseAnd BitwiseOr BitwiseXor Div Mod Mul Pow Sub".split()
    ),
    "COMPARISON": tuple("Equal Greater GreaterOrEqual Less LessOrEqual".split()),
    "LOGICAL": tuple("And Or Xor".split()),
    # variadic, multidirectional broadcasting
    "VARIADIC_ELEMENTWISE": tuple("Max Mean Min Sum".split()),
    "REDUCTION": tuple(
        "ReduceL1 ReduceL2 ReduceLogSum ReduceLogSumExp ReduceMax ReduceMean ReduceMin "
        "ReduceProd ReduceSum ReduceSumSquare".split()
    ),
    "NORMALIZATION": tuple(
        "BatchNormalization GroupNormalization InstanceNormalization LayerNormalization "
        "LpNormalization MeanVarianceNormalization RMSNormalization".split()
    ),
    "SOFTMAX": tuple("Hardmax LogSoftmax Softmax".split()),
    # the output is the input's data, reinterpreted (no copy in onnxruntime)
    "VIEW": tuple("Flatten Identity Reshape Squeeze Unsqueeze".split()),
    "MOVEMENT": tuple(
        "Compress Concat DepthToSpace Expand Gather GatherElements GatherND Pad ReverseSequence "
        "ScatterElements ScatterND Slice SpaceToDepth Split Tile Transpose Trilu".split()
    ),
    "POOL": tuple(
        "AveragePool GlobalAveragePool GlobalLpPool GlobalMaxPool LpPool MaxPool MaxRoiPool "
        "MaxUnpool RoiAlign".split()
    ),
    "CONV": tuple("Conv ConvInteger ConvTranspose DeformConv QLinearConv".split()),
    "MATMUL": tuple("Einsum Gemm MatMul MatMulInteger QLinearMatMul".split()),
    "QUANTIZATION": tuple("DequantizeLinear DynamicQuantizeLinear QuantizeLinear".split()),
    # the output's elements are some of the first input's (a Pad's also its constant, zero by
    # default): an activation quantized on its way in keeps its scale on the way out
    "SELECTING": tuple(
        "DepthToSpace Flatten GlobalMaxPool Identity MaxPool Pad Reshape Slice SpaceToDepth "
        "Squeeze Transpose Unsqueeze".split()
    ),
    # the output is the input clipped to an interval (Relu: [0, inf)): an activation quantized
    # on its way out is the input's quantization with the interval's ends as its range
    "CLIPPING": tuple("Clip Relu".split()),
    "SHAPE": tuple("Shape Size".split()),
    "RANDOM": tuple(
        "Bernoulli Multinomial RandomNormal RandomNormalLike RandomUniform "
        "RandomUniformLike".split()
    ),
}
# unions, named too
# Ops never folded into a constant, though their inputs are constants: a DequantizeLinear of
# an 8-bit weight is the quantized model's point (a runtime fuses DQ(int8 weight) into its
# integer kernel, PyTorch 2 export quantization's lowering too); folded, the weight is 4x the
# bytes and the integer kernel is gone.
KEPT_UNFOLDED = frozenset({"DequantizeLinear"})

FAMILIES["BROADCASTING"] = (
    FAMILIES["BINARY_ARITHMETIC"]
    + FAMILIES["COMPARISON"]
    + FAMILIES["LOGICAL"]
    + FAMILIES["VARIADIC_ELEMENTWISE"]
    + ("Where",)
)
# ops that quantize, dequantize or compute on quantized integers (their rules get `verify`'s
# `every value` check, `verify.sweep`)
FAMILIES["QUANTIZED"] = FAMILIES["QUANTIZATION"] + (
    "ConvInteger",
    "MatMulInteger",
    "QLinearConv",
    "QLinearMatMul",
    "com.microsoft.DynamicQuantizeMatMul",
    "com.microsoft.MatMulIntegerToFloat",
    "com.microsoft.MatMulNBits",
    "com.microsoft.QLinearAdd",
    "com.microsoft.QLinearMul",
    "com.microsoft.QLinearSigmoid",
    "com.microsoft.QLinearGlobalAveragePool",
)
# output type = first input's type (dtype and shape)
FAMILIES["SAME_TYPE"] = (
    FAMILIES["UNARY_ELEMENTWISE"]
    + FAMILIES["ACTIVATION"]
    + FAMILIES["SOFTMAX"]
    + ("Clip", "Dropout", "Identity", "LpNormalization", "MeanVarianceNormalization")
    + ("BatchNormalization", "InstanceNormalization", "GroupNormalization")
    + ("LayerNormalization", "RMSNormalization")
)
# onnxruntime's contrib elementwise ops of one input: output type = the input's (their
# schemas, onnxruntime/core/graph/contrib_ops); qualified names, so naming them loads nothing
FAMILIES["CONTRIB_UNARY_ELEMENTWISE"] = ("com.microsoft.Gelu", "com.microsoft.QuickGelu")
# output shape = first input's shape (the dtype may differ: Cast, IsNaN)
FAMILIES["SAME_SHAPE"] = FAMILIES["SAME_TYPE"] + ("Cast", "CastLike", "IsInf", "IsNaN")
FAMILIES["COMMUTATIVE"] = (
    "Add",
    "And",
    "BitwiseAnd",
    "BitwiseOr",
    "BitwiseXor",
    "Equal",
    "Mul",
    "Or",
    "Xor",
    *FAMILIES["VARIADIC_ELEMENTWISE"],
)

_COST_BY_FAMILY = (  # first family that names the op gives its cost class
    ("REDUCTION", "reduce"),
    ("NORMALIZATION", "normalize"),
    ("SOFTMAX", "normalize"),
    ("VIEW", "view"),
    ("MOVEMENT", "movement"),
    ("POOL", "pool"),
    ("CONV", "conv"),
    ("SHAPE", "shape"),
    ("UNARY_ELEMENTWISE", "elementwise"),
    ("ACTIVATION", "elementwise"),
    ("BROADCASTING", "elementwise"),
    ("QUANTIZATION", "elementwise"),
)
_COST = {
    "MatMul": "matmul",
    "MatMulInteger": "matmul",
    "QLinearMatMul": "matmul",
    "Einsum": "matmul",
    "Gemm": "gemm",
    "Identity": "free",
    "Constant": "free",
    "Cast": "elementwise",
    "CastLike": "elementwise",
    "Clip": "elementwise",
    "Dropout": "elementwise",
    "PRelu": "elementwise",
    "IsNaN": "elementwise",
    "IsInf": "elementwise",
    "Range": "movement",
    "ConstantOfShape": "movement",
    "EyeLike": "movement",
    "OneHot": "movement",
}
# ops of other domains whose cost class is known (the rest are `kernel`): MatMulNBits computes
# a float product of its first input [..., K] by its dequantized weight (onnxruntime's spec)
_CONTRIB_COST = {"com.microsoft.MatMulNBits": "matmul"}
# the cost classes `engine.cost` prices (`OpSpec.cost`); an op declaration names one
COST_CLASSES = (
    "elementwise",
    "matmul",
    "gemm",
    "conv",
    "reduce",
    "normalize",
    "movement",
    "view",
    "free",
    "pool",
    "shape",
    "kernel",
)
_TRAINING_DOMAINS = ("ai.onnx.preview.training",)
_INTERNAL_DOMAINS = ("com.ms.internal.nhwc", "com.microsoft.nchwc")


def _families(name: str) -> tuple[str, ...]:
    return tuple(f for f, ops in FAMILIES.items() if name in ops)


def _cost(name: str, families: tuple[str, ...]) -> str:
    if name in _COST:
        return _COST[name]
    for family, klass in _COST_BY_FAMILY:
        if family in families:
            return klass
    return "kernel"


# ---- reading the registries --------------------------------------------------------------


@dataclass(frozen=True)
class VocabEntry:
    """One registry op (newest form) as `rewrite ops` lists it: the newest `OpSpec` and, when
    the engine cannot match it, why (`reason`; "" when matchable)."""

    spec: OpSpec
    reason: str


def _python_value(v):
    """An attribute value as the engine holds it: bytes -> str, lists -> tuples, tensors ->
    `TensorValue`."""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, (list, tuple)):
        return tuple(_python_value(x) for x in v)
    if isinstance(v, onnx.TensorProto):
        return TensorValue.of(numpy_helper.to_array(v))
    return v


def attribute_value(a: onnx.AttributeProto):
    """The engine's Python value of ONNX attribute `a` (`_python_value` of its value)."""
    return _python_value(helper.get_attribute_value(a))


class _Schema(NamedTuple):
    """The parts of an `onnx.defs.OpSchema` (or onnxruntime's) the table reads."""

    domain: str
    name: str
    version: int
    inputs: tuple[tuple[str, str], ...]  # (name, "single" | "optional" | "variadic")
    min_input: int
    outputs: tuple[tuple[str, str], ...]
    attrs: tuple[tuple[str, int, bool, Any], ...]  # (name, AttributeProto type, required, default)
    types_ok: bool  # every input and output can be a tensor
    function: bool
    deprecated: bool


_OPTION = {0: "single", 1: "optional", 2: "variadic"}


def _read(s, default_of) -> _Schema:
    def params(ps):
        return tuple((p.name, _OPTION[int(p.option.value)]) for p in ps)

    constraints = {c.type_param_str: c.allowed_type_strs for c in s.type_constraints}

    def tensor_ok(p) -> bool:
        type_str = p.type_str if hasattr(p, "type_str") else p.typeStr  # onnxruntime's name
        allowed = constraints.get(type_str, [type_str])
        return any(t.startswith("tensor(") for t in allowed)

    attrs = tuple(
        (a.name, int(a.type.value), bool(a.required), default_of(a)) for a in s.attributes.values()
    )
    function = bool(getattr(s, "has_function", False)) or bool(
        getattr(s, "has_context_dependent_function", False)
    )
    return _Schema(
        s.domain,
        s.name,
        int(s.since_version),
        params(s.inputs),
        int(s.min_input),
        params(s.outputs),
        attrs,
        all(tensor_ok(p) for p in [*s.inputs, *s.outputs]),
        function,
        bool(s.deprecated),
    )


def _onnx_default(a):
    d = a.default_value
    if d is None or not d.name:
        return NONE
    return attribute_value(d)


def _ort_default(a):
    raw = getattr(a, "_default_value", b"")
    if not raw:
        return NONE
    proto = onnx.AttributeProto.FromString(raw)
    return attribute_value(proto) if proto.name else NONE


def _in_force(schemas, floor: int, ceiling: int) -> list:
    """The registry schemas (onnx's or onnxruntime's OpSchema objects) of the forms in force
    somewhere in [floor, ceiling] of their domain: reading a schema's fields is the slow part
    of building the table (~0.3 ms each), and most of the history is older."""
    by_op: dict = {}
    for s in schemas:
        by_op.setdefault((s.domain, s.name), []).append((s.since_version, s))
    out = []
    for versions in by_op.values():
        versions.sort(key=lambda v: v[0])
        versions = [v for v in versions if v[0] <= ceiling]
        for i, (_, s) in enumerate(versions):
            if i + 1 == len(versions) or versions[i + 1][0] > floor:
                out.append(s)
    return out


@cache
def _onnx_schemas() -> tuple[_Schema, ...]:
    all_ = [
        s for s in onnx.defs.get_all_schemas_with_history() if s.domain not in _TRAINING_DOMAINS
    ]
    default = [s for s in all_ if s.domain in ("", "ai.onnx")]
    other = [s for s in all_ if s.domain not in ("", "ai.onnx")]
    keep = _in_force(default, MIN_OPSET, MAX_OPSET) + _in_force(other, 1, 10_000)
    return tuple(_read(s, _onnx_default) for s in keep)


@cache
def _ort_schemas() -> tuple[_Schema, ...]:
    """onnxruntime's contrib schemas of `ORT_DOMAINS` (empty if onnxruntime is missing)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
    except ImportError:  # onnxruntime is optional for the vocabulary
        return ()
    mine = [s for s in ort_state.get_all_operator_schema() if s.domain in ORT_DOMAINS]
    return tuple(_read(s, _ort_default) for s in _in_force(mine, 1, 10_000))


@cache
def _ort_raw(domain: str, name: str):
    """onnxruntime's newest schema of contrib op `domain.name` (None if there is none)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_state
    except ImportError:
        return None
    found = [s for s in ort_state.get_all_operator_schema() if (s.domain, s.name) == (domain, name)]
    return max(found, key=lambda s: s.since_version, default=None)


def type_signature(op: str, opset: int):
    """The type signature of `op` (a table name, `Op#K` included) in force at default-domain
    `opset`: (input type strings, output type strings, type parameter -> allowed type strings)
    from its schema: `onnx.defs` for the ONNX domains, onnxruntime's registry for its contrib
    domains (their newest version; `opset` does not apply to them). Raises
    onnx.defs.SchemaError for an op neither registry has."""
    spec = OPS.get(op)
    name, domain = (spec.name, spec.domain) if spec else (op, "")
    schema = _ort_raw(domain, name) if domain in ORT_DOMAINS else None
    if schema is None:
        schema = onnx.defs.get_schema(name, opset, domain)
        ins = [i.type_str for i in schema.inputs]
        outs = [o.type_str for o in schema.outputs]
    else:
        ins = [i.typeStr for i in schema.inputs]
        outs = [o.typeStr for o in schema.outputs]
    params = {c.type_param_str: tuple(c.allowed_type_strs) for c in schema.type_constraints}
    return ins, outs, params


def _reason(s: _Schema) -> str:
    """Why the engine cannot match `s` ("" if it can)."""
    if s.deprecated:
        return "deprecated"
    for name, kind, required, _ in s.attrs:
        if kind in _SUBGRAPH:
            return f"control flow (subgraph attribute {name})"
        if required and kind not in _KINDS:
            return f"attribute {name} of a kind the e-graph does not hold"
    if not s.types_ok:
        return "works on sequences, optionals or maps, not tensors"
    variadic = [n for n, o in s.inputs if o == "variadic"]
    if variadic and s.inputs[-1][1] != "variadic":
        return "a variadic input before the last"
    if len(variadic) > 1:
        return "several variadic inputs"
    return ""


def _slots(s: _Schema) -> tuple[tuple[str, ...], int, bool]:
    """(input slot names, required count, variadic) of schema `s`."""
    names: list[str] = []
    variadic = False
    required = None
    for i, (name, option) in enumerate(s.inputs):
        if option == "variadic":
            variadic = True
            names += [f"{name}_{k}" for k in range(VARIADIC_SLOTS)]
            required = i + max(s.min_input - i, 0) if required is None else required
            break
        if option == "optional" and required is None:
            required = i
        names.append(name)
    if required is None:
        required = len(names)
    return tuple(names), min(required, len(names)), variadic


def _attr_specs(s: _Schema) -> dict[str, AttrSpec]:
    out = {}
    for name, kind, required, default in s.attrs:
        if kind not in _KINDS:
            continue  # optional attribute of another kind: a node using it stays opaque
        out[name] = AttrSpec(name, _KINDS[kind], REQUIRED if required else default)
    return out


def _specs_of(versions: list[_Schema], floor: int, ceiling: int) -> list[OpSpec]:
    """The OpSpecs of one op (its registry versions, oldest first) in the opsets
    [floor, ceiling]: the newest version's slots, each representable older form."""
    versions = [v for v in versions if v.version <= ceiling]
    # the forms in force at `floor` or later: older ones neither get a spec nor add slots
    versions = [
        v
        for i, v in enumerate(versions)
        if i + 1 == len(versions) or versions[i + 1].version > floor
    ]
    if not versions:
        return []
    newest = versions[-1]
    inputs, n_required, variadic = _slots(newest)
    attrs: dict[str, AttrSpec] = {}
    for v in reversed(versions):  # newest first: the newest kind and default win
        for name, a in _attr_specs(v).items():
            attrs.setdefault(name, a)
    families = _families(newest.name)
    domain = newest.domain
    common = dict(
        name=newest.name,
        inputs=inputs,
        attrs=tuple(attrs[k] for k in sorted(attrs)),
        cost=_cost(newest.name, families)
        if domain in ("", "ai.onnx.ml")
        else _CONTRIB_COST.get(f"{domain}.{newest.name}", "kernel"),
        random="RANDOM" in families,
        commutative="COMMUTATIVE" in families,
        domain=domain,
        outputs=tuple(n for n, _ in newest.outputs),
        n_outputs_required=sum(1 for _, o in newest.outputs if o == "single") or 1,
        variadic_outputs=bool(newest.outputs) and newest.outputs[-1][1] == "variadic",
        variadic=variadic,
        families=families,
    )
    out = []
    for i, v in enumerate(versions):
        until = versions[i + 1].version if i + 1 < len(versions) else 10_000
        if until <= floor or _reason(v):
            continue
        v_inputs, v_required, v_variadic = _slots(v)
        own = _attr_specs(v)
        if (
            len(v_inputs) > len(inputs)  # (names may differ: BatchNormalization-9's `mean`)
            or v_variadic != variadic
            or any(attrs[k].kind != a.kind for k, a in own.items())
        ):
            continue  # an older form the newest slots cannot hold: opaque at those opsets
        out.append(
            OpSpec(
                **common,
                n_required=v_required,
                since=max(v.version, floor),
                until=until,
                version=v.version,
                function=v.function,
                version_inputs=len(v_inputs) if v is not newest else -1,
                version_attrs=frozenset(own),
            )
        )
    return out


def _by_op(schemas: Iterable[_Schema]) -> dict[tuple[str, str], list[_Schema]]:
    out: dict[tuple[str, str], list[_Schema]] = {}
    for s in sorted(schemas, key=lambda s: (s.domain, s.name, s.version)):
        out.setdefault(("" if s.domain == "ai.onnx" else s.domain, s.name), []).append(s)
    return out


def _domain_of(qualname: str) -> str:
    return qualname.rsplit(".", 1)[0] if "." in qualname else DEFAULT_DOMAIN


class OpTable:
    """Lookup of `OpSpec` by qualified name (`Name`, or `domain.Name` outside the default
    domain), optionally for one opset of the op's domain.

    Raises nothing on a miss: `get` returns None, so callers decide whether an unknown op is an
    error (the DSL checker) or an opaque node (the importers). onnxruntime's domains are read
    on the first request that names one.
    """

    def __init__(self, specs: Iterable[OpSpec] = (), loader=None):
        self._by_name: dict[str, list[OpSpec]] = {}
        self._loader = loader  # domain -> list[OpSpec], for domains read on demand
        self._loaded: set[str] = set()
        self._projections: dict[tuple[str, int], OpSpec] = {}
        for s in specs:
            self._add(s)

    def _add(self, s: OpSpec) -> None:
        self._by_name.setdefault(s.qualname, []).append(s)

    def add(self, spec: OpSpec) -> None:
        """Add `spec` (an op a rule file declares, `vocab.declared`) after the ops of its name
        (it becomes the newest form)."""
        self._add(spec)

    def load_domain(self, domain: str) -> None:
        """Read `domain`'s ops now, if they are read on demand and not yet read."""
        if self._loader is not None and domain not in self._loaded:
            self._loaded.add(domain)
            for s in self._loader(domain):
                self._add(s)

    def get(self, name: str, opset: int | None = None) -> OpSpec | None:
        """The spec of `name` in force at `opset` of its domain (the newest one when opset is
        None). `Op#K` (K >= 1) is output K of `Op`: the op's spec with `output` K."""
        if "#" in name:
            return self._projection(name, opset)
        specs = self._by_name.get(name)
        if specs is None and "." in name:
            self.load_domain(_domain_of(name))
            specs = self._by_name.get(name)
        if not specs:
            return None
        if opset is None:
            return specs[-1]
        return next((s for s in specs if s.supports(opset)), None)

    def _projection(self, name: str, opset: int | None) -> OpSpec | None:
        base, _, k = name.partition("#")
        spec = self.get(base, opset)
        if spec is None or not k.isdigit() or not 1 <= int(k) < spec.n_outputs:
            return None
        key = (name, spec.since)
        if key not in self._projections:
            self._projections[key] = replace(spec, output=int(k))
        return self._projections[key]

    def lookup(self, domain: str, op_type: str, opset: int | None = None) -> OpSpec | None:
        """`get` by an ONNX node's (domain, op_type) (`ai.onnx` is the default domain)."""
        domain = "" if domain == "ai.onnx" else domain
        return self.get(op_type if domain == DEFAULT_DOMAIN else f"{domain}.{op_type}", opset)

    def first_opset(self, name: str) -> int | None:
        """The lowest opset of its domain at which the table has a spec of `name`."""
        if self.get(name) is None:
            return None
        return min(s.since for s in self._by_name[name.partition("#")[0]])

    def names(self) -> list[str]:
        """All op names (qualified) read so far, sorted."""
        return sorted(self._by_name)

    def __contains__(self, name: str) -> bool:
        return self.get(name) is not None


def _matchable(schemas: Iterable[_Schema], floor_default: int) -> list[OpSpec]:
    out = []
    for (domain, _), versions in _by_op(schemas).items():
        if domain in _INTERNAL_DOMAINS:
            continue
        floor = floor_default if domain == DEFAULT_DOMAIN else 1
        ceiling = MAX_OPSET if domain == DEFAULT_DOMAIN else 10_000
        out += _specs_of(versions, floor, ceiling)
    return out


def _load(domain: str) -> list[OpSpec]:
    if domain in ORT_DOMAINS:
        return _matchable(_ort_schemas(), MIN_OPSET)
    return []


def vocabulary(domains: Iterable[str] | None = None) -> list[VocabEntry]:
    """Every registry op (newest form at or below `MAX_OPSET` in the default domain), matchable
    or not, sorted by (domain, name); `domains` limits which (default: all, onnxruntime's
    included when it is installed)."""
    schemas = [*_onnx_schemas(), *_ort_schemas()]
    out = []
    for (domain, _), versions in _by_op(schemas).items():
        if domain in _INTERNAL_DOMAINS or (domains is not None and domain not in domains):
            continue
        ceiling = MAX_OPSET if domain == DEFAULT_DOMAIN else 10_000
        versions = [v for v in versions if v.version <= ceiling]
        if not versions:
            continue
        newest = versions[-1]
        spec = OPS.get(newest.name if domain == DEFAULT_DOMAIN else f"{domain}.{newest.name}")
        reason = _reason(newest)
        if spec is None:  # not representable: the registry's newest form, for the listing
            spec = _listing_spec(newest)
            reason = reason or "no form the engine can hold"
        elif spec.random:
            reason = "random (never matched)"
        out.append(VocabEntry(spec, reason))
    return out


def _listing_spec(s: _Schema) -> OpSpec:
    inputs, n_required, variadic = _slots(s)
    return OpSpec(
        s.name,
        inputs,
        n_required,
        tuple(AttrSpec(n, _KINDS.get(k, "other"), REQUIRED if r else d) for n, k, r, d in s.attrs),
        cost="kernel",
        since=s.version,
        domain=s.domain,
        outputs=tuple(n for n, _ in s.outputs),
        variadic=variadic,
        version=s.version,
        families=_families(s.name),
        function=s.function,
    )


def _cached_default_specs() -> list[OpSpec]:
    """`_matchable` of onnx's schemas, through a pickle in the user's cache directory keyed by
    the onnx version and this file's source: reading the registry takes ~0.3 s per process,
    the pickle ~5 ms. Any failure to read or write the cache falls back to the registry."""
    key = hashlib.sha256(Path(__file__).read_bytes() + onnx.__version__.encode()).hexdigest()[:16]
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    path = base / "rewrite" / f"vocab-{key}.pkl"
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # absent, unreadable or from another Python: rebuild
        pass
    specs = _matchable(_onnx_schemas(), MIN_OPSET)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(pickle.dumps(specs))
        os.replace(tmp, path)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:  # a read-only home: no cache
        pass
    return specs


OPS = OpTable(_cached_default_specs(), loader=_load)


@cache
def registry_domains() -> frozenset[str]:
    """The domains the installed registries define ops in (onnx's, every one of them, and
    onnxruntime's contrib and internal domains): a rule file may not declare an op in one."""
    onnx_domains = {s.domain for s in onnx.defs.get_all_schemas_with_history()}
    return frozenset({DEFAULT_DOMAIN, "ai.onnx", *onnx_domains, *ORT_DOMAINS, *_INTERNAL_DOMAINS})


def family(name: str) -> tuple[str, ...]:
    """The ops of family `name` (`FAMILIES`). Raises KeyError for an unknown family."""
    return FAMILIES[name]


# ---- attribute values <-> egglog String literals -------------------------------------------
# Attributes live in the e-graph as canonical strings, so equal values are equal literals and an
# egglog pattern can require a default by writing its literal. The kind comes from the op table.

ABSENT_ATTR = "none"


def encode_attr(kind: str, value: Any) -> str:
    """Canonical egglog string of an attribute value of `kind` (`ABSENT_ATTR` for None).

    Floats use `repr` of the float32-rounded value so 1e-5 from ONNX (stored as float32) and
    1e-5 written in a rule compare equal. Strings lists and tensors are JSON.
    """
    if value is None:
        return ABSENT_ATTR
    if kind == "int":
        return str(int(value))
    if kind == "float":
        return _f32repr(value)
    if kind == "string":
        return str(value)
    if kind == "ints":
        return "[" + ",".join(str(int(v)) for v in value) + "]"
    if kind == "floats":  # a list can hold a scale per channel, written again at every match
        return _encode_floats(value) if isinstance(value, tuple) else _floats_text(value)
    if kind == "strings":
        return json.dumps(list(value))
    if kind == "tensor":
        t = value if isinstance(value, TensorValue) else TensorValue.of(value)
        return json.dumps([t.dtype, list(t.shape), list(t.values)])
    raise ValueError(f"unknown attribute kind {kind!r}")


def decode_attr(kind: str, text: str) -> Any:
    """Inverse of `encode_attr`: the Python value of an egglog attribute string."""
    if text == ABSENT_ATTR:
        return None
    if kind == "int":
        return int(text)
    if kind == "float":
        return float(text)
    if kind == "string":
        return text
    if kind == "strings":
        return tuple(json.loads(text))
    if kind == "tensor":
        dtype, shape, values = json.loads(text)
        return TensorValue(dtype, tuple(shape), tuple(values))
    items = [t for t in text[1:-1].split(",") if t]
    return tuple(map(int, items)) if kind == "ints" else tuple(map(float, items))


@lru_cache(maxsize=1024)
def _encode_floats(value: tuple) -> str:
    return _floats_text(value)


def _floats_text(value) -> str:
    """Each float as `_f32repr`, vectorized."""
    return "[" + ",".join(map(repr, np.asarray(value, np.float32).astype(float).tolist())) + "]"


def _f32repr(v: float) -> str:
    return repr(float(np.float32(v)))
