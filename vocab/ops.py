"""The op table: every operator the engine can match, declared once.

The canonical vocabulary is the ONNX operator set (default domain, opsets 13-26). Each
`OpSpec` gives an op's inputs (optional ones included, in ONNX order), its attributes with
their kinds and defaults, its cost class, and whether it is effectful or random (such ops are
never matched). The DSL checker, the egglog sorts, the ONNX importer and exporter and the cost
model are all derived from this table; an op that is not here is imported as an opaque node.

Source of arities, attributes and defaults: the ONNX operator specification
(https://onnx.ai/onnx/operators/), for the opset range in `OpSpec.since`/`OpSpec.until`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

REQUIRED = object()  # attribute that the ONNX spec requires (no default)
NONE = None  # optional attribute whose absence has a meaning of its own (no default value)

ATTR_KINDS = ("int", "float", "string", "ints", "floats")


@dataclass(frozen=True)
class AttrSpec:
    """One attribute of an op: its name, kind (one of `ATTR_KINDS`) and default value.

    `default` is a Python value of the kind (`int`, `float`, `str`, `tuple[int, ...]`,
    `tuple[float, ...]`), `NONE` when an absent attribute means something else (e.g. Transpose
    without `perm` reverses the axes), or `REQUIRED`.
    """

    name: str
    kind: str
    default: Any = NONE


@dataclass(frozen=True)
class OpSpec:
    """One operator of the canonical vocabulary.

    inputs: input names in ONNX order; `n_required` of them must be present, the rest are
        optional (absent optional inputs are the `Absent` term in the e-graph).
    attrs: the attributes, in a fixed order (the order of the egglog constructor's arguments).
    cost: cost class used by `engine.cost` (`elementwise`, `matmul`, `gemm`, `conv`, `reduce`,
        `normalize`, `movement`, `view`, `free`, `pool`, `shape`).
    since/until: default-domain opset range in which this signature holds (until exclusive).
    effectful/random: such ops are never matched by rules (they stay opaque).
    """

    name: str
    inputs: tuple[str, ...]
    n_required: int
    attrs: tuple[AttrSpec, ...] = ()
    cost: str = "elementwise"
    since: int = 13
    until: int = 10_000
    effectful: bool = False
    random: bool = False
    commutative: bool = False
    attr_index: dict[str, AttrSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "attr_index", {a.name: a for a in self.attrs})

    @property
    def arity(self) -> int:
        """Number of input slots (required + optional)."""
        return len(self.inputs)

    def supports(self, opset: int) -> bool:
        """True if this signature is the one in force at default-domain `opset`."""
        return self.since <= opset < self.until


def _op(name, inputs, n_required=None, attrs=(), **kw) -> OpSpec:
    ins = tuple(inputs.split()) if isinstance(inputs, str) else tuple(inputs)
    req = len(ins) if n_required is None else n_required
    return OpSpec(name, ins, req, tuple(AttrSpec(*a) for a in attrs), **kw)


_UNARY = "Relu Neg Sqrt Erf Tanh Sigmoid Exp Log Abs Reciprocal Floor Ceil Not Sin Cos Sign"
_BINARY = "Add Sub Mul Div Pow Equal Less Greater And Or Mod LessOrEqual GreaterOrEqual"
_COMMUTATIVE = {"Add", "Mul", "Equal", "And", "Or"}

_TABLE: list[OpSpec] = [
    *[_op(n, "X") for n in _UNARY.split()],
    *[
        _op(
            n,
            "A B",
            commutative=n in _COMMUTATIVE,
            attrs=[("fmod", "int", 0)] if n == "Mod" else (),
        )
        for n in _BINARY.split()
    ],
    _op("Identity", "input", cost="free"),
    _op("Dropout", "data ratio training_mode", 1, [("seed", "int", NONE)], random=False),
    # saturate (since opset 19) only affects float8 targets; its default is exported as absent.
    _op("Cast", "input", attrs=[("to", "int", REQUIRED), ("saturate", "int", 1)]),
    # CastLike exists since opset 15; saturate (19) only matters for float8 and is never exported
    # at its default.
    _op("CastLike", "input target_type", attrs=[("saturate", "int", 1)], since=15),
    _op("Where", "condition X Y"),
    _op("Clip", "input min max", 1),
    _op("LeakyRelu", "X", attrs=[("alpha", "float", 0.01)]),
    _op("HardSigmoid", "X", attrs=[("alpha", "float", 0.2), ("beta", "float", 0.5)]),
    _op("Gelu", "X", attrs=[("approximate", "string", "none")], since=20),
    _op("Softmax", "input", attrs=[("axis", "int", -1)], cost="normalize"),
    _op("LogSoftmax", "input", attrs=[("axis", "int", -1)], cost="normalize"),
    _op(
        "LayerNormalization",
        "X Scale B",
        2,
        [("axis", "int", -1), ("epsilon", "float", 1e-5), ("stash_type", "int", 1)],
        cost="normalize",
        since=17,
    ),
    _op(
        "RMSNormalization",
        "X scale",
        attrs=[("axis", "int", -1), ("epsilon", "float", 1e-5), ("stash_type", "int", 1)],
        cost="normalize",
        since=23,
    ),
    _op("MatMul", "A B", cost="matmul"),
    _op(
        "Gemm",
        "A B C",
        2,
        [
            ("alpha", "float", 1.0),
            ("beta", "float", 1.0),
            ("transA", "int", 0),
            ("transB", "int", 0),
        ],
        cost="gemm",
    ),
    _op(
        "Conv",
        "X W B",
        2,
        [
            ("auto_pad", "string", "NOTSET"),
            ("dilations", "ints", NONE),
            ("group", "int", 1),
            ("kernel_shape", "ints", NONE),
            ("pads", "ints", NONE),
            ("strides", "ints", NONE),
        ],
        cost="conv",
    ),
    _op(
        "BatchNormalization",
        "X scale B input_mean input_var",
        attrs=[("epsilon", "float", 1e-5), ("momentum", "float", 0.9), ("training_mode", "int", 0)],
        cost="normalize",
        since=15,
    ),
    _op(
        "MaxPool",
        "X",
        attrs=[
            ("auto_pad", "string", "NOTSET"),
            ("ceil_mode", "int", 0),
            ("dilations", "ints", NONE),
            ("kernel_shape", "ints", REQUIRED),
            ("pads", "ints", NONE),
            ("storage_order", "int", 0),
            ("strides", "ints", NONE),
        ],
        cost="pool",
    ),
    # AveragePool-11 (opsets 11-18) has no dilations; declared with AveragePool-19's slots
    # (one egglog constructor per op), an importer never fills dilations below 19 (the
    # checker would reject it) and no rule writes one
    *(
        _op(
            "AveragePool",
            "X",
            attrs=[
                ("auto_pad", "string", "NOTSET"),
                ("ceil_mode", "int", 0),
                ("count_include_pad", "int", 0),
                ("dilations", "ints", NONE),
                ("kernel_shape", "ints", REQUIRED),
                ("pads", "ints", NONE),
                ("strides", "ints", NONE),
            ],
            cost="pool",
            since=since,
            until=until,
        )
        for since, until in ((13, 19), (19, 10_000))
    ),
    _op("GlobalAveragePool", "X", cost="pool"),
    _op("GlobalMaxPool", "X", cost="pool"),
    _op("Flatten", "input", attrs=[("axis", "int", 1)], cost="view"),
    _op("Transpose", "data", attrs=[("perm", "ints", NONE)], cost="movement"),
    _op("Reshape", "data shape", attrs=[("allowzero", "int", 0)], cost="view", since=14),
    _op("Squeeze", "data axes", 1, cost="view"),
    _op("Unsqueeze", "data axes", cost="view"),
    _op("Expand", "input shape", cost="movement"),
    _op("Slice", "data starts ends axes steps", 3, cost="movement"),
    # Pad-13 has no axes input; declared with the same slots as Pad-18 (one egglog constructor
    # per op), an importer never fills axes below 18 and no rule writes one
    _op(
        "Pad",
        "data pads constant_value axes",
        2,
        [("mode", "string", "constant")],
        cost="movement",
        since=13,
        until=18,
    ),
    _op(
        "Pad",
        "data pads constant_value axes",
        2,
        [("mode", "string", "constant")],
        cost="movement",
        since=18,
    ),
    _op("Gather", "data indices", attrs=[("axis", "int", 0)], cost="movement"),
    _op("Tile", "input repeats", cost="movement"),
    _op("Shape", "data", attrs=[("end", "int", NONE), ("start", "int", 0)], cost="shape", since=15),
    _op("Size", "data", cost="shape"),
    _op("Range", "start limit delta", cost="movement"),
    _op(
        "Constant",
        "",
        attrs=[
            ("value_float", "float", NONE),
            ("value_floats", "floats", NONE),
            ("value_int", "int", NONE),
            ("value_ints", "ints", NONE),
        ],
        cost="free",
    ),
    *[
        _op(
            n,
            "data axes",
            1,
            [("keepdims", "int", 1), ("noop_with_empty_axes", "int", 0)],
            cost="reduce",
            since=18,
        )
        for n in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL2")
    ],
    _op(
        "ReduceSum",
        "data axes",
        1,
        [("keepdims", "int", 1), ("noop_with_empty_axes", "int", 0)],
        cost="reduce",
    ),
    _op(
        "RandomNormalLike",
        "input",
        attrs=[
            ("dtype", "int", NONE),
            ("mean", "float", 0.0),
            ("scale", "float", 1.0),
            ("seed", "float", NONE),
        ],
        random=True,
    ),
    _op(
        "RandomUniformLike",
        "input",
        attrs=[
            ("dtype", "int", NONE),
            ("high", "float", 1.0),
            ("low", "float", 0.0),
            ("seed", "float", NONE),
        ],
        random=True,
    ),
]


class OpTable:
    """Lookup of `OpSpec` by name, optionally for one opset.

    Raises nothing on a miss: `get` returns None, so callers decide whether an unknown op is an
    error (the DSL checker) or an opaque node (the importers).
    """

    def __init__(self, specs: list[OpSpec]):
        self._by_name: dict[str, list[OpSpec]] = {}
        for s in specs:
            self._by_name.setdefault(s.name, []).append(s)

    def get(self, name: str, opset: int | None = None) -> OpSpec | None:
        """The spec of `name` in force at `opset` (the newest one when opset is None)."""
        specs = self._by_name.get(name)
        if not specs:
            return None
        if opset is None:
            return max(specs, key=lambda s: s.since)
        return next((s for s in specs if s.supports(opset)), None)

    def first_opset(self, name: str) -> int | None:
        """The lowest default-domain opset at which the table has a spec of `name`."""
        specs = self._by_name.get(name)
        return min(s.since for s in specs) if specs else None

    def names(self) -> list[str]:
        """All op names, sorted."""
        return sorted(self._by_name)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name


OPS = OpTable(_TABLE)


# ---- attribute values <-> egglog String literals -------------------------------------------
# Attributes live in the e-graph as canonical strings, so equal values are equal literals and an
# egglog pattern can require a default by writing its literal. The kind comes from the op table.

ABSENT_ATTR = "none"


def encode_attr(kind: str, value: Any) -> str:
    """Canonical egglog string of an attribute value of `kind` (`ABSENT_ATTR` for None).

    Floats use `repr` of the float32-rounded value so 1e-5 from ONNX (stored as float32) and
    1e-5 written in a rule compare equal.
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
    if kind == "floats":
        return "[" + ",".join(_f32repr(v) for v in value) + "]"
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
    items = [t for t in text[1:-1].split(",") if t]
    return tuple(int(t) for t in items) if kind == "ints" else tuple(float(t) for t in items)


def _f32repr(v: float) -> str:
    import numpy as np

    return repr(float(np.float32(v)))
