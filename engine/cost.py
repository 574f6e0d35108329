"""Cost model: estimated run time of one node on a CPU, in nanoseconds.

cost = OVERHEAD_NS + FLOPs * NS_PER_FLOP + bytes moved * NS_PER_BYTE

- OVERHEAD_NS, the fixed cost of launching any kernel (onnxruntime's per-node dispatch on CPU
  is a few microseconds).
- FLOPs from the op's cost class (`OpSpec.cost`): 2*M*N*K for MatMul/Gemm (a multiply-add is 2
  FLOPs), 2*N*C_out*prod(out spatial)*C_in/group*prod(kernel) for Conv, one per output element
  for elementwise ops, a few per element for reductions and normalizations.
- bytes: all inputs read plus the output written, for ops that touch data; views (Reshape,
  Squeeze, Unsqueeze, Flatten) and shape queries pay the overhead only.
- 8-bit integer products (MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv: an 8-bit
  first input) cost `INT8_FLOP_FACTOR` of a float FLOP with uint8 activations: onnxruntime
  1.32's uint8-by-int8 MatMulInteger ran at 0.53-0.57x of float32 MatMul's time at BERT's
  shapes, its QLinearConv at 0.49-0.59x (uint8 by 7-bit int8) and 0.69-0.83x (uint8 by uint8)
  of float32 Conv's at ResNet-50's 3x3 shapes, on this 2-core AVX2 CPU without VNNI, 1 thread.
  With int8 activations its QLinearConv took 3.3-7.5x float's time (a slow path), so an int8
  first input costs `S8_FLOP_FACTOR` (`python bench/quant.py --kernels` prints both tables).
- several outputs: a node's first output (`Op`) pays the node; another (`Op#K`) only its own
  bytes written. The outputs of a Split are pieces of its input, each paying its share of the
  overhead and of the bytes, so that its pieces add up to the one Split node they export as.
When a shape is unknown, `UNKNOWN_BYTES` stands in for its size; when an input's type is not
given at all (an opaque node of an op the table knows, e.g. a Conv at an opset older than the
table's, is costed without its input types), the FLOPs fall back to the per-output guesses below.
Constant-only subgraphs cost 0
in extraction, because they are folded away afterwards (see `engine.extract`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from vocab.graph import ABSENT, TermGraph
from vocab.ops import OPS
from vocab.types import TensorType

OVERHEAD_NS = 2000.0
NS_PER_FLOP = 0.05  # ~20 GFLOP/s sustained on 2 cores
NS_PER_BYTE = 0.1  # ~10 GB/s memory bandwidth
UNKNOWN_BYTES = 4096
_PER_ELEMENT = {"elementwise": 1, "reduce": 2, "normalize": 8, "pool": 4}
INT8_FLOP_FACTOR = 0.5
S8_FLOP_FACTOR = 4.0
_INT8_FACTORS = {2: INT8_FLOP_FACTOR, 3: S8_FLOP_FACTOR}  # ONNX element types uint8, int8


@dataclass(frozen=True)
class CostModel:
    """The cost model's constants; `node_cost` is its only formula. Units: nanoseconds."""

    overhead_ns: float = OVERHEAD_NS
    ns_per_flop: float = NS_PER_FLOP
    ns_per_byte: float = NS_PER_BYTE

    def node_cost(
        self, op: str, attrs, inputs: tuple[TensorType | None, ...], out: TensorType | None
    ) -> float:
        """Estimated nanoseconds for `op` reading `inputs` (None = absent) and writing `out`.

        Opaque ops (not in the op table) are charged the overhead plus their output bytes.
        `inputs` may be shorter than the op's arity, or empty, and `out` None or of unknown
        shape: what is missing is priced as `UNKNOWN_BYTES`, and FLOPs that need a missing
        type (Conv's weight, MatMul's K) take the fallback guess. Never raises for any op.
        """
        spec = OPS.get(op)
        klass = spec.cost if spec else "opaque"
        if klass in ("view", "shape", "free"):
            return self.overhead_ns
        if spec is not None and spec.variadic_outputs and len(spec.outputs) == 1:
            # each output of a Split (`Split`, `Split#K`) is one piece of its input: it pays
            # its share of the one node's overhead and moves its own bytes (read and write),
            # so the pieces of one Split add up to the Split
            inp = _input(inputs, 0)
            share = _bytes(out) / max(_bytes(inp), 1) if inp is not None else 1.0
            return min(share, 1.0) * self.overhead_ns + 2 * _bytes(out) * self.ns_per_byte
        if spec is not None and spec.output > 0:
            # another output of a node its first output pays for: writing it
            return _bytes(out) * self.ns_per_byte
        flops = _flops(klass, attrs, inputs, out, _weight_slot(spec))
        first = _input(inputs, 0)
        if klass in ("matmul", "gemm", "conv") and first is not None:
            flops *= _INT8_FACTORS.get(first.dtype, 1.0)
        moved = _bytes(out) + (sum(_bytes(t) for t in inputs if t is not None) if spec else 0)
        return self.overhead_ns + flops * self.ns_per_flop + moved * self.ns_per_byte


def graph_node_cost(g: TermGraph, n, model: CostModel) -> float:
    """Estimated nanoseconds of node `n` of TermGraph `g` as it stands: `CostModel.node_cost`
    over the types the graph knows (absent inputs left out), with the node's attributes."""
    ins = tuple(g.values[i].type for i in n.inputs if i != ABSENT)
    out = g.values[n.outputs[0]].type if n.outputs and n.outputs[0] != ABSENT else None
    return model.node_cost(n.op, n.attrs, ins, out)


def _bytes(t: TensorType | None) -> int:
    n = t.nbytes if t is not None else None
    return UNKNOWN_BYTES if n is None else n


def _numel(t: TensorType | None) -> int:
    if t is None:
        return 0
    n = t.numel
    return UNKNOWN_BYTES // 4 if n is None else n


def _input(inputs, i: int) -> TensorType | None:
    """The type of input `i`, or None when it is absent or not given."""
    return inputs[i] if i < len(inputs) else None


def _weight_slot(spec) -> int:
    """The input slot of a convolution's weight, by its schema name (`W` of Conv, `w` of
    ConvInteger and of QLinearConv, whose slot 1 is the input's scale); 1 when unnamed so."""
    names = spec.inputs if spec is not None else ()
    return next((i for i, n in enumerate(names) if n in ("W", "w")), 1)


def _flops(klass: str, attrs, inputs, out: TensorType | None, weight: int = 1) -> float:
    if klass in _PER_ELEMENT:
        return _PER_ELEMENT[klass] * max(_numel(out), _numel(_input(inputs, 0)))
    if klass in ("matmul", "gemm"):
        a = _input(inputs, 0)
        k = a.shape[-1] if a is not None and a.static and a.rank else None
        if klass == "gemm" and k is not None and dict(attrs).get("transA"):
            k = a.shape[0]
        return 2.0 * _numel(out) * (k if isinstance(k, int) else 64)
    if klass == "conv":
        w = _input(inputs, weight)
        per_out = int(np.prod(w.shape[1:])) if w is not None and w.static and w.rank else 64
        return 2.0 * _numel(out) * per_out
    return 0.0
