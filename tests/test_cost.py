"""The cost model's integer kernels: FLOPs from the weight's slot, by activation dtype."""

from engine.cost import INT8_FLOP_FACTOR, NS_PER_FLOP, S8_FLOP_FACTOR, CostModel
from vocab.types import TensorType

F32, U8, S8, I32 = 1, 2, 3, 6
PADS = (("pads", (1, 1, 1, 1)),)


def _flop_ns(op: str, x_dtype: int, w_dtype: int) -> float:
    """The FLOP part of a 3x3 convolution's cost, 64 -> 64 channels at 56 x 56 (ResNet-50's
    first stage): the cost less that of the same node at 1 x 1 spatial size, bytes aside."""
    costs = []
    for hw in (56, 1):
        x, w = TensorType(x_dtype, (1, 64, hw, hw)), TensorType(w_dtype, (64, 64, 3, 3))
        s, z = TensorType(F32, ()), TensorType(x_dtype, ())
        inputs = {
            "Conv": (x, w, TensorType(F32, (64,))),
            "ConvInteger": (x, w),
            "QLinearConv": (x, s, z, w, s, z, s, z, TensorType(I32, (64,))),
        }[op]
        out = TensorType(I32 if op == "ConvInteger" else x_dtype, (1, 64, hw, hw))
        no_bytes = CostModel(ns_per_byte=0.0, overhead_ns=0.0)
        costs.append(no_bytes.node_cost(op, PADS, inputs, out))
    return costs[0] - costs[1]


def test_integer_convolutions_count_their_weights_flops_at_the_dtypes_factor():
    conv = _flop_ns("Conv", F32, F32)
    assert conv == NS_PER_FLOP * 2 * 64 * (56 * 56 - 1) * 64 * 9
    # QLinearConv's weight is its fourth input (its second is the input's scale)
    assert _flop_ns("QLinearConv", U8, S8) == conv * INT8_FLOP_FACTOR
    assert _flop_ns("ConvInteger", U8, S8) == conv * INT8_FLOP_FACTOR
    # int8 activations: onnxruntime's slow path on CPUs without VNNI, dearer than float
    assert _flop_ns("QLinearConv", S8, S8) == conv * S8_FLOP_FACTOR > conv
