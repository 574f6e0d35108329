"""What `verify.graphs` builds random ONNX graphs with: a pool of typed values (`Val`) and the
graph under construction (`Builder`), which draws constants, broadcastable shapes and values
from the pool with Hypothesis."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import onnx
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

FLOAT, HALF, DOUBLE = TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE
INT64, INT32, BOOL = TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL
FLOATS = (FLOAT, HALF, DOUBLE)
SYMBOLIC_SIZE = 2  # what `frontends.onnx.check.random_inputs` gives a symbolic dimension
SPECIAL = (0.0, 1.0, -1.0, 0.5, 2.0, math.sqrt(2.0), 1e-5)
# IEEE edge values scattered into random float tensors (initializers, and inputs in
# `verify.fuzz`): rules must stay exact on them
EDGE = (math.nan, math.inf, -math.inf, -0.0)
# ops whose result ONNX leaves to the implementation for NaN/Inf: a float -> integer Cast
# (C++ undefined behaviour; ONNX Cast-19 says nothing), and the order of NaN among values
# (ArgMax, ArgMin, TopK). A graph with one gets no edge values.
EDGE_UNDEFINED = frozenset({"Cast", "CastLike", "ArgMax", "ArgMin", "TopK"})
_INTEGERS = frozenset(
    {
        TensorProto.INT8,
        TensorProto.INT16,
        TensorProto.INT32,
        TensorProto.INT64,
        TensorProto.UINT8,
        TensorProto.UINT16,
        TensorProto.UINT32,
        TensorProto.UINT64,
    }
)


def edge_undefined(nodes) -> bool:
    """True if one of `nodes` (NodeProtos) is undefined on NaN/Inf (`EDGE_UNDEFINED`; a Cast
    only when it casts to an integer type, CastLike always)."""
    for n in nodes:
        if n.op_type == "Cast":
            if any(a.name == "to" and a.i in _INTEGERS for a in n.attribute):
                return True
        elif n.op_type in EDGE_UNDEFINED:
            return True
    return False


DIMS = (1, 2, 3, 4, 8)
INT_MAX = 2**63 - 1


@dataclass
class Val:
    """A value in the pool: its name, element type and shape (ints, or `N`), the constant it
    holds if known, and the node that made it (op and inputs) for motifs that undo it."""

    name: str
    dtype: int
    shape: tuple
    const: np.ndarray | None = None
    op: str = ""
    args: tuple = ()
    attrs: dict = field(default_factory=dict)

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def static(self) -> bool:
        """True if every dimension is an int (no symbolic `N`)."""
        return all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int:
        """Product of the static dimensions (symbolic ones count as 1)."""
        return int(np.prod([d for d in self.shape if isinstance(d, int)], dtype=np.int64))


class Builder:
    """The graph under construction: nodes, initializers, inputs, and the pool of values."""

    def __init__(self, draw, opset: int):
        self.draw, self.opset = draw, opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.pool: list[Val] = []
        self.count = 0

    def fresh(self, prefix: str) -> str:
        """A new value name, `prefix` then a counter unique in the graph."""
        self.count += 1
        return f"{prefix}{self.count}"

    def input(self, dtype: int, shape: tuple) -> Val:
        """A new graph input of `dtype` (ONNX element type) and `shape`, added to the pool."""
        v = Val(self.fresh("in"), dtype, shape)
        self.inputs.append(helper.make_tensor_value_info(v.name, dtype, list(shape)))
        self.pool.append(v)
        return v

    def const(self, array: np.ndarray, node: bool = False) -> Val:
        """A constant: an initializer, or (`node`) a Constant node."""
        array = np.asarray(array)
        dtype = helper.np_dtype_to_tensor_dtype(array.dtype)
        v = Val(self.fresh("c"), dtype, tuple(int(d) for d in array.shape), array)
        tensor = numpy_helper.from_array(array, v.name)
        if node:
            self.nodes.append(helper.make_node("Constant", [], [v.name], value=tensor))
        else:
            self.inits.append(tensor)
        return v

    def add(self, op: str, args: list, dtype: int, shape: tuple, **attrs) -> Val:
        """Append node `op(args)` with `attrs`; its output (of `dtype` and `shape`) joins the
        pool. An arg of None is an absent optional input."""
        v = Val(self.fresh(op.lower()[:4]), dtype, tuple(shape), None, op, tuple(args), attrs)
        names = ["" if a is None else a.name for a in args]
        self.nodes.append(helper.make_node(op, names, [v.name], **attrs))
        self.pool.append(v)
        return v

    def pick(self, ok=lambda v: True) -> Val | None:
        """A value of the pool that satisfies `ok`, the most recent ones most likely (and what
        a failure shrinks towards)."""
        cands = [v for v in self.pool if ok(v)]
        if not cands:
            return None
        return cands[-1 - self.draw(st.integers(0, len(cands) - 1))]

    def number(self, dtype: int):
        """A scalar for a constant: a value rules look for, or any small one."""
        if dtype == BOOL:
            return self.draw(st.booleans())
        if dtype in (INT64, INT32):
            return self.draw(st.sampled_from((0, 1, -1, 2, 3)))
        if self.draw(st.integers(0, 2)):
            return self.draw(st.sampled_from(SPECIAL))
        return self.draw(st.floats(-3, 3, allow_nan=False, width=32))

    def tensor(self, dtype: int, shape: tuple) -> np.ndarray:
        """A constant of `shape` (all ints): one value repeated, or random values."""
        np_type = helper.tensor_dtype_to_np_dtype(dtype)
        if self.draw(st.booleans()):
            return np.full(shape, self.number(dtype), dtype=np_type)
        rng = np.random.default_rng(self.draw(st.integers(0, 2**16)))
        if dtype == BOOL:
            return rng.integers(0, 2, shape).astype(bool)
        if dtype in (INT64, INT32):
            return rng.integers(-3, 4, shape).astype(np_type)
        arr = rng.standard_normal(shape).astype(np_type)
        if arr.size and self.draw(st.integers(0, 3)) == 0:  # now and then some edge values
            scatter_edges(arr, rng)
        return arr

    def broadcastable(self, shape: tuple) -> tuple:
        """A shape that broadcasts into `shape`: trailing dims, some set to 1."""
        keep = self.draw(st.integers(0, len(shape)))
        out = []
        for d in shape[len(shape) - keep :]:
            out.append(1 if not isinstance(d, int) or self.draw(st.booleans()) else d)
        return tuple(out)

    def _finite(self) -> None:
        """NaN/Inf in the constants replaced by 0/+-3 (for graphs with an `EDGE_UNDEFINED` op)."""
        for t in _constants(self.inits, self.nodes):
            _finite_tensor(t)

    def model(self, outputs: list[Val]) -> onnx.ModelProto:
        """The ONNX model (opset `self.opset`, IR version 10) whose outputs are `outputs`."""
        if edge_undefined(self.nodes):
            self._finite()
        outs = [helper.make_tensor_value_info(v.name, v.dtype, list(v.shape)) for v in outputs]
        graph = helper.make_graph(self.nodes, "fuzz", self.inputs, outs, self.inits)
        return helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", self.opset)], ir_version=10
        )


def scatter_edges(arr: np.ndarray, rng: np.random.Generator) -> None:
    """Set about one element in eight of float array `arr` (in place) to an `EDGE` value."""
    flat = arr.reshape(-1)
    pick = rng.random(flat.size) < 0.125
    flat[pick] = rng.choice(np.array(EDGE, dtype=arr.dtype), int(pick.sum()))


def finite_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` whose float initializers and main-graph `Constant` values have their
    NaN/Inf replaced by 0/+-3 (`model` is not changed)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for t in _constants(out.graph.initializer, out.graph.node):
        _finite_tensor(t)
    return out


def has_edges(model: onnx.ModelProto, feeds: dict) -> bool:
    """True if a float initializer, main-graph `Constant` value or feed of `model` holds a NaN
    or an infinity."""
    arrays = [
        numpy_helper.to_array(t) for t in _constants(model.graph.initializer, model.graph.node)
    ]
    arrays += list(feeds.values())
    return any(a.dtype.kind == "f" and not np.all(np.isfinite(a)) for a in arrays)


def _constants(inits, nodes) -> list[onnx.TensorProto]:
    """The initializers `inits` and the values of the `Constant` nodes among `nodes`."""
    return [*inits] + [
        a.t for n in nodes if n.op_type == "Constant" for a in n.attribute if a.name == "value"
    ]


def _finite_tensor(t: onnx.TensorProto) -> None:
    a = numpy_helper.to_array(t)
    if a.dtype.kind == "f" and not np.all(np.isfinite(a)):
        t.CopyFrom(
            numpy_helper.from_array(np.nan_to_num(a, nan=0.0, posinf=3.0, neginf=-3.0), t.name)
        )
