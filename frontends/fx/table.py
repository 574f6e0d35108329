"""The spelling table: which call_function targets, call_method names, ATen overloads and
nn.Module classes lower to which canonical ops (handlers in `frontends.fx.spellings`).

Parameter lists follow the torch signature and the ATen schema of each spelling (aliases after
`|` cover both); `tests/test_fx_lowering.py` checks every ATen entry against its schema.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.ao.quantization.fx._decomposed  # registers the quantized_decomposed ops
import torch.nn.functional as F
from torch import nn

from frontends.fx import spellings as s
from frontends.fx.lower import Attr, Lowering, Params, Unmapped

aten = torch.ops.aten


@dataclass(frozen=True)
class Spelling:
    """How one target's arguments bind (`params`) and lower (`lower`)."""

    params: Params
    lower: Callable[[Lowering, dict], None]


FUNCTIONS: dict[object, Spelling] = {}  # call_function target, or "method:<name>"


def spell(params: str, lower, *targets) -> None:
    """Register `lower`, with parameter list `params` (see `Params`), for each of `targets`."""
    sp = Spelling(Params(params), lower)
    for target in targets:
        FUNCTIONS[target] = sp


def _methods(*names: str) -> list[str]:
    return [f"method:{n}" for n in names]


# ---- elementwise -------------------------------------------------------------------------------

BIN = "input|self|a other|b|exponent alpha=1 rounding_mode=None"
for op, kind, names, plain, overloads in [
    (
        "Add",
        "arith",
        "add add_ __add__ __iadd__",
        [operator.add, operator.iadd, torch.add],
        [aten.add.Tensor, aten.add.Scalar, aten.add_.Tensor, aten.add_.Scalar],
    ),
    (
        "Sub",
        "arith",
        "sub sub_ __sub__ __isub__ subtract",
        [operator.sub, operator.isub, torch.sub, torch.subtract],
        [aten.sub.Tensor, aten.sub.Scalar, aten.sub_.Tensor, aten.sub_.Scalar],
    ),
    (
        "Mul",
        "arith",
        "mul mul_ __mul__ __rmul__ __imul__ multiply",
        [operator.mul, operator.imul, torch.mul, torch.multiply],
        [aten.mul.Tensor, aten.mul.Scalar, aten.mul_.Tensor, aten.mul_.Scalar],
    ),
    (
        "Div",
        "arith",
        "div div_ __truediv__ __itruediv__ true_divide divide",
        [operator.truediv, operator.itruediv, torch.div, torch.divide, torch.true_divide],
        [aten.div.Tensor, aten.div.Scalar, aten.div.Tensor_mode, aten.div_.Tensor],
    ),
    (
        "Pow",
        "arith",
        "pow __pow__",
        [operator.pow, torch.pow],
        [aten.pow.Tensor_Scalar, aten.pow.Tensor_Tensor, aten.pow.Scalar],
    ),
    ("Equal", "compare", "eq __eq__", [operator.eq, torch.eq], [aten.eq.Tensor, aten.eq.Scalar]),
    (
        "Less",
        "compare",
        "lt __lt__ less",
        [operator.lt, torch.lt, torch.less],
        [aten.lt.Tensor, aten.lt.Scalar],
    ),
    (
        "Greater",
        "compare",
        "gt __gt__ greater",
        [operator.gt, torch.gt, torch.greater],
        [aten.gt.Tensor, aten.gt.Scalar],
    ),
    (
        "LessOrEqual",
        "compare",
        "le __le__ less_equal",
        [operator.le, torch.le, torch.less_equal],
        [aten.le.Tensor, aten.le.Scalar],
    ),
    (
        "GreaterOrEqual",
        "compare",
        "ge __ge__ greater_equal",
        [operator.ge, torch.ge, torch.greater_equal],
        [aten.ge.Tensor, aten.ge.Scalar],
    ),
    (
        "And",
        "logic",
        "__and__ logical_and bitwise_and",
        [operator.and_, torch.logical_and, torch.bitwise_and],
        [aten.logical_and.default, aten.__and__.Tensor, aten.bitwise_and.Tensor],
    ),
    (
        "Or",
        "logic",
        "__or__ logical_or bitwise_or",
        [operator.or_, torch.logical_or, torch.bitwise_or],
        [aten.logical_or.default, aten.__or__.Tensor, aten.bitwise_or.Tensor],
    ),
]:
    spell(BIN, s.binary(op, kind), *plain, *_methods(*names.split()), *overloads)
spell(BIN, s.binary("Add", swap=True), *_methods("__radd__"))
spell(
    BIN,
    s.binary("Sub", swap=True),
    torch.rsub,
    *_methods("__rsub__"),
    aten.rsub.Scalar,
    aten.rsub.Tensor,
)
spell(BIN, s.binary("Div", swap=True), *_methods("__rtruediv__"))
spell(BIN, s.binary("Pow", swap=True), *_methods("__rpow__"))

X = "input|self|a inplace=False"
for op, names in [
    ("Relu", "relu relu_"),
    ("Neg", "neg negative __neg__"),
    ("Sqrt", "sqrt"),
    ("Erf", "erf"),
    ("Tanh", "tanh"),
    ("Sigmoid", "sigmoid"),
    ("Exp", "exp"),
    ("Log", "log"),
    ("Abs", "abs __abs__"),
    ("Reciprocal", "reciprocal"),
    ("Floor", "floor"),
    ("Ceil", "ceil"),
    ("Sin", "sin"),
    ("Cos", "cos"),
    ("Sign", "sign"),
    ("Not", "logical_not bitwise_not __invert__"),
]:
    words = names.split()
    torch_fns = [getattr(torch, w) for w in words if hasattr(torch, w) and not w.startswith("_")]
    overloads = [
        getattr(aten, w).default for w in words if not w.startswith("_") and hasattr(aten, w)
    ]
    spell(X, s.unary(op), *torch_fns, *_methods(*words), *overloads)
spell(X, s.unary("Relu"), F.relu, torch.relu_, aten.relu_.default)
spell(X, s.unary("Neg"), operator.neg)
spell(X, s.unary("Abs"), operator.abs)
spell(X, s.unary("Not"), operator.invert)
spell(X, s.unary("Erf"), torch.special.erf)
spell(X, s.unary("Sigmoid"), F.sigmoid, torch.special.expit)
spell(X, s.unary("Tanh"), F.tanh)
spell(X, s.unary("HardSigmoid", alpha=1 / 6, beta=0.5), F.hardsigmoid, aten.hardsigmoid.default)
spell(X, s.rsqrt, torch.rsqrt, *_methods("rsqrt"), aten.rsqrt.default)
spell("input|self approximate='none'", s.gelu, F.gelu, aten.gelu.default)
spell(
    "input|self negative_slope=0.01 inplace=False",
    s.leaky_relu,
    F.leaky_relu,
    aten.leaky_relu.default,
)
CLAMP = "input|self min=None max=None"
spell(
    CLAMP,
    s.clip,
    torch.clamp,
    torch.clip,
    *_methods("clamp", "clip"),
    aten.clamp.default,
    aten.clamp.Tensor,
)
spell(
    "input|self min|min_val=-1.0 max|max_val=1.0 inplace=False",
    s.clip,
    F.hardtanh,
    aten.hardtanh.default,
)
spell(X, lambda lo, a: s.clip(lo, {**a, "min": 0, "max": 6}), F.relu6)
spell(
    "condition input|self|x other|y",
    s.where,
    torch.where,
    aten.where.self,
    aten.where.ScalarOther,
    aten.where.ScalarSelf,
    aten.where.Scalar,
)
spell("input|self condition other|y", s.where, *_methods("where"))
spell(
    "input|self mask value",
    s.masked_fill,
    torch.masked_fill,
    *_methods("masked_fill"),
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
)

TO = "dtype=None layout=None device=None pin_memory=None non_blocking=False copy=False"
spell(f"input|self *args {TO} memory_format=None", s.cast(), torch.Tensor.to, *_methods("to"))
spell("input|self dtype=None non_blocking=False", s.cast(), *_methods("type"))
for name, dtype in [
    ("float", torch.float32),
    ("double", torch.float64),
    ("half", torch.float16),
    ("bfloat16", torch.bfloat16),
    ("int", torch.int32),
    ("long", torch.int64),
    ("bool", torch.bool),
]:
    spell("input|self memory_format=None", s.cast(dtype), *_methods(name))
spell(
    f"input|self {TO.replace(' copy=False', '')} memory_format=None",
    s.cast(),
    aten._to_copy.default,
)
spell("input|self dtype non_blocking=False copy=False memory_format=None", s.cast(), aten.to.dtype)
spell(f"input|self {TO} memory_format=None", s.cast(), aten.to.dtype_layout)
spell(
    "input|self device dtype non_blocking=False copy=False memory_format=None",
    s.cast(),
    aten.to.device,
)

DROPOUT = "input p=0.5 training=True inplace=False"
spell(
    DROPOUT,
    s.dropout,
    F.dropout,
    F.dropout1d,
    F.dropout2d,
    F.dropout3d,
    F.alpha_dropout,
    F.feature_alpha_dropout,
)
spell("input p train", s.dropout, torch.dropout, aten.dropout.default)

SOFTMAX = "input|self dim dtype=None"
for op, fn, method, packet, private in [
    ("Softmax", F.softmax, "softmax", aten.softmax, aten._softmax),
    ("LogSoftmax", F.log_softmax, "log_softmax", aten.log_softmax, aten._log_softmax),
]:
    spell("input dim=None _stacklevel=3 dtype=None", s.softmax(op), fn)
    spell(SOFTMAX, s.softmax(op), getattr(torch, method), *_methods(method), packet.int)
    spell("input|self dim half_to_float", s.softmax(op), private.default)

# ---- matrix products, normalization, convolution, pooling -------------------------------------

spell(
    "input|self|a other|b|mat2",
    s.matmul,
    torch.matmul,
    operator.matmul,
    torch.mm,
    torch.bmm,
    *_methods("matmul", "mm", "bmm", "__matmul__"),
    aten.matmul.default,
    aten.mm.default,
    aten.bmm.default,
)
spell(
    "input|self mat1 mat2 beta=1 alpha=1",
    s.addmm,
    torch.addmm,
    *_methods("addmm"),
    aten.addmm.default,
)
spell("input weight bias=None", s.linear, F.linear, aten.linear.default)
CONV = "input weight bias=None stride=1 padding=0 dilation=1 groups=1"
spell(
    CONV,
    s.conv,
    F.conv1d,
    F.conv2d,
    F.conv3d,
    aten.conv1d.default,
    aten.conv2d.default,
    aten.conv3d.default,
    aten.conv1d.padding,
    aten.conv2d.padding,
    aten.conv3d.padding,
)
spell(
    "input weight bias stride padding dilation transposed output_padding groups",
    s.conv,
    aten.convolution.default,
)
spell(
    "input running_mean running_var weight=None bias=None training=False momentum=0.1 eps=1e-05",
    s.batch_norm,
    F.batch_norm,
)
spell(
    "input weight bias running_mean running_var training momentum eps cudnn_enabled",
    s.batch_norm,
    torch.batch_norm,
    aten.batch_norm.default,
)
spell("input normalized_shape weight=None bias=None eps=1e-05", s.layer_norm, F.layer_norm)
spell(
    "input normalized_shape weight=None bias=None eps=1e-05 cudnn_enable=True",
    s.layer_norm,
    torch.layer_norm,
    aten.layer_norm.default,
)
spell(
    "input normalized_shape weight=None eps=None",
    s.rms_norm,
    F.rms_norm,
    torch.rms_norm,
    aten.rms_norm.default,
)
for n in (1, 2, 3):
    spell(
        "input kernel_size stride=None padding=0 dilation=1 ceil_mode=False return_indices=False",
        s.pool("MaxPool", n),
        getattr(F, f"max_pool{n}d"),
    )
    spell(
        "input|self kernel_size stride=() padding=0 dilation=1 ceil_mode=False",
        s.pool("MaxPool", n),
        getattr(torch, f"max_pool{n}d"),
        getattr(aten, f"max_pool{n}d").default,
    )
    spell(
        "input|self kernel_size stride=None padding=0 ceil_mode=False count_include_pad=True "
        "divisor_override=None",
        s.pool("AveragePool", n),
        getattr(F, f"avg_pool{n}d"),
        *([getattr(aten, f"avg_pool{n}d").default] if n > 1 else []),
    )
    spell(
        "input|self output_size",
        s.global_avg_pool(n),
        getattr(F, f"adaptive_avg_pool{n}d"),
        getattr(aten, f"adaptive_avg_pool{n}d").default,
    )
spell("input|self output_size", s.global_avg_pool(2), aten._adaptive_avg_pool2d.default)
REDUCE = "input|self dim=None keepdim=False dtype=None"
for op, name in [("ReduceMean", "mean"), ("ReduceSum", "sum")]:
    spell(
        REDUCE,
        s.reduce(op),
        getattr(torch, name),
        *_methods(name),
        getattr(aten, name).dim if name == "mean" else aten.sum.dim_IntList,
    )
    spell("input|self dtype=None", s.reduce(op), getattr(aten, name).default)
for op, name in [("ReduceMax", "amax"), ("ReduceMin", "amin")]:
    spell(
        "input|self dim=() keepdim=False",
        s.reduce(op),
        getattr(torch, name),
        *_methods(name),
        getattr(aten, name).default,
    )
spell(
    "input weight padding_idx=None max_norm=None norm_type=2.0 scale_grad_by_freq=False "
    "sparse=False",
    s.embedding,
    F.embedding,
)
spell(
    "weight input|indices padding_idx=-1 scale_grad_by_freq=False sparse=False",
    s.embedding,
    aten.embedding.default,
)

# ---- shape and layout --------------------------------------------------------------------------

spell("input|self *shape", s.reshape, *_methods("view", "reshape"))
spell(
    "input|self shape|size",
    s.reshape,
    torch.reshape,
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
)
spell("input|self *dims", s.permute, *_methods("permute"))
spell("input|self dims", s.permute, torch.permute, aten.permute.default)
spell(
    "input|self dim0|axis0 dim1|axis1",
    s.transpose,
    torch.transpose,
    torch.swapaxes,
    *_methods("transpose", "swapaxes"),
    aten.transpose.int,
)
spell("input|self", s.t, torch.t, *_methods("t"), aten.t.default)
spell(
    "input|self dim", s.unsqueeze, torch.unsqueeze, *_methods("unsqueeze"), aten.unsqueeze.default
)
spell(
    "input|self dim=None",
    s.squeeze,
    torch.squeeze,
    *_methods("squeeze"),
    aten.squeeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
)
spell(
    "input|self start_dim=0 end_dim=-1",
    s.flatten,
    torch.flatten,
    *_methods("flatten"),
    aten.flatten.using_ints,
)
spell("input|self *size", s.expand, torch.Tensor.expand, *_methods("expand"))
spell("input|self size implicit=False", s.expand, aten.expand.default)
spell("input|self dim=0 start=None end=None step=1", s.slice_, aten.slice.Tensor)
spell("input|self dim index", s.select, torch.select, *_methods("select"), aten.select.int)
spell("input|self index", s.index, operator.getitem, *_methods("__getitem__"))
spell(
    "input|self memory_format=None", s.contiguous, *_methods("contiguous"), aten.contiguous.default
)
spell("input|self *repeats", s.repeat, *_methods("repeat"))
spell("input|self repeats", s.repeat, aten.repeat.default)

spell(
    "tensors dim|axis=0",
    s.concat,
    torch.cat,
    torch.concat,
    torch.concatenate,
    aten.cat.default,
)

# PyTorch 2 export quantization (`quantize_pt2e`): the decomposed quantize/dequantize ops it
# leaves in a graph (registered by torch.ao.quantization.fx._decomposed).
_qd = torch.ops.quantized_decomposed
_QT = "input scale zero_point quant_min quant_max dtype"
_QC = "input scales zero_points axis quant_min quant_max dtype"
spell(_QT, s.quantize(False), _qd.quantize_per_tensor.default, _qd.quantize_per_tensor.tensor)
spell(f"{_QC}", s.quantize(True), _qd.quantize_per_channel.default)
spell(
    f"{_QT} out_dtype=None",
    s.dequantize(False),
    _qd.dequantize_per_tensor.default,
    _qd.dequantize_per_tensor.tensor,
)
spell(f"{_QC} out_dtype=None", s.dequantize(True), _qd.dequantize_per_channel.default)

# Ops returning a tuple or list of tensors, read through `getitem(node, k)`: when every use of
# the node is such a getitem, each getitem is lowered with the node's arguments plus `item` = k,
# to output k of one canonical application (`Op#K` for K >= 1, vocab.ops); export writes the
# outputs of one application as one call (`frontends.fx.exporter`).
MULTI_OUTPUT: dict[object, Spelling] = {}


def multi(params: str, lower, *targets) -> None:
    """Register item handler `lower`, with parameter list `params`, for each of `targets`."""
    sp = Spelling(Params(params), lower)
    for target in targets:
        MULTI_OUTPUT[target] = sp


multi(
    "input|self split_size|split_size_or_sections|split_sizes dim=0",
    s.split_item,
    torch.split,
    *_methods("split", "split_with_sizes"),
    aten.split.Tensor,
    aten.split_with_sizes.default,
)
multi("input|self chunks dim=0", s.split_item, torch.chunk, *_methods("chunk"), aten.chunk.default)
multi("input|self dim=0", s.unbind_item, torch.unbind, *_methods("unbind"), aten.unbind.int)
multi(
    "input normalized_shape weight=None bias=None eps=1e-05",
    s.layer_norm_item,
    torch.native_layer_norm,
    aten.native_layer_norm.default,
)
# Batch norm's other outputs are the batch statistics of training (save_mean, save_invstd);
# ONNX BatchNormalization's running_mean/var outputs are the updated running statistics.
multi(
    "input weight bias running_mean running_var momentum eps",
    s.first_output(s.batch_norm, "batch norm's saved statistics (training only)"),
    aten._native_batch_norm_legit_no_training.default,
)
multi(
    "input weight bias running_mean running_var training momentum eps",
    s.first_output(s.batch_norm, "batch norm's saved statistics (training only)"),
    aten.native_batch_norm.default,
)
# torch's max pooling indices count within one (n, c) plane; ONNX MaxPool's Indices count over
# the whole tensor (ONNX spec, MaxPool: "flattened indices" with the batch and channel offsets).
multi(
    "input|self kernel_size stride=() padding=0 dilation=1 ceil_mode=False",
    s.first_output(s.pool("MaxPool", 2), "max pooling indices (ONNX counts them otherwise)"),
    aten.max_pool2d_with_indices.default,
)
# Left opaque: var_mean (ATen var_mean.correction / .dim, torch.var_mean). ONNX has no variance
# op; the decomposition ReduceSum((x - ReduceMean(x))^2) / (N - correction) is five nodes that
# round differently from torch's one-pass kernel, so it is not the same computation, and the
# engine would write the five back. topk, sort, max.dim and min.dim: torch does not promise
# which index a tie gives (torch docs), ONNX TopK and ArgMax do.

# Calls without tensor inputs that create a constant: evaluated at import, so rules see the
# value; an untouched one is copied back as it was.
CREATORS = {
    torch.arange,
    torch.zeros,
    torch.ones,
    torch.full,
    torch.scalar_tensor,
    aten.arange.default,
    aten.arange.start,
    aten.arange.start_step,
    aten.zeros.default,
    aten.ones.default,
    aten.full.default,
    aten.scalar_tensor.default,
}


# ---- modules -------------------------------------------------------------------------------


def _attr(m: nn.Module, name: str) -> Attr | None:
    t = getattr(m, name, None)
    return None if t is None else Attr(name, t)


def _conv(m, x) -> dict:
    if m.padding_mode != "zeros":
        raise Unmapped(f"padding_mode {m.padding_mode}")
    return dict(
        input=x,
        weight=_attr(m, "weight"),
        bias=_attr(m, "bias"),
        stride=m.stride,
        padding=m.padding,
        dilation=m.dilation,
        groups=m.groups,
    )


def _batch_norm(m, x) -> dict:
    if m.training or m.running_mean is None:
        raise Unmapped("batch norm in training or without running statistics")
    return dict(
        input=x,
        running_mean=_attr(m, "running_mean"),
        running_var=_attr(m, "running_var"),
        weight=_attr(m, "weight"),
        bias=_attr(m, "bias"),
        training=False,
        eps=m.eps,
    )


def _dropout(m, x) -> dict:
    return dict(input=x, training=m.training, p=m.p)


def _pool(m, x) -> dict:
    keys = (
        "kernel_size",
        "stride",
        "padding",
        "dilation",
        "ceil_mode",
        "return_indices",
        "count_include_pad",
        "divisor_override",
    )
    return dict(input=x, **{k: getattr(m, k) for k in keys if hasattr(m, k)})


def _adaptive(m, x) -> dict:
    return dict(input=x, output_size=m.output_size)


MODULES: dict[type, tuple[Callable, Callable]] = {
    nn.Conv1d: (s.conv, _conv),
    nn.Conv2d: (s.conv, _conv),
    nn.Conv3d: (s.conv, _conv),
    nn.Linear: (
        s.linear,
        lambda m, x: dict(input=x, weight=_attr(m, "weight"), bias=_attr(m, "bias")),
    ),
    nn.BatchNorm1d: (s.batch_norm, _batch_norm),
    nn.BatchNorm2d: (s.batch_norm, _batch_norm),
    nn.BatchNorm3d: (s.batch_norm, _batch_norm),
    nn.LayerNorm: (
        s.layer_norm,
        lambda m, x: dict(
            input=x,
            normalized_shape=m.normalized_shape,
            weight=_attr(m, "weight"),
            bias=_attr(m, "bias"),
            eps=m.eps,
        ),
    ),
    nn.RMSNorm: (
        s.rms_norm,
        lambda m, x: dict(
            input=x, normalized_shape=m.normalized_shape, weight=_attr(m, "weight"), eps=m.eps
        ),
    ),
    nn.ReLU: (s.unary("Relu"), lambda m, x: dict(input=x)),
    nn.Tanh: (s.unary("Tanh"), lambda m, x: dict(input=x)),
    nn.Sigmoid: (s.unary("Sigmoid"), lambda m, x: dict(input=x)),
    nn.GELU: (s.gelu, lambda m, x: dict(input=x, approximate=m.approximate)),
    nn.LeakyReLU: (s.leaky_relu, lambda m, x: dict(input=x, negative_slope=m.negative_slope)),
    nn.Hardsigmoid: (s.unary("HardSigmoid", alpha=1 / 6, beta=0.5), lambda m, x: dict(input=x)),
    nn.ReLU6: (s.clip, lambda m, x: dict(input=x, min=0, max=6)),
    nn.Softmax: (s.softmax("Softmax"), lambda m, x: dict(input=x, dim=m.dim)),
    nn.LogSoftmax: (s.softmax("LogSoftmax"), lambda m, x: dict(input=x, dim=m.dim)),
    nn.Identity: (s.identity, lambda m, x: dict(input=x)),
    nn.Dropout: (s.dropout, _dropout),
    nn.Dropout1d: (s.dropout, _dropout),
    nn.Dropout2d: (s.dropout, _dropout),
    nn.Dropout3d: (s.dropout, _dropout),
    nn.MaxPool1d: (s.pool("MaxPool", 1), _pool),
    nn.MaxPool2d: (s.pool("MaxPool", 2), _pool),
    nn.MaxPool3d: (s.pool("MaxPool", 3), _pool),
    nn.AvgPool2d: (s.pool("AveragePool", 2), _pool),
    nn.AdaptiveAvgPool1d: (s.global_avg_pool(1), _adaptive),
    nn.AdaptiveAvgPool2d: (s.global_avg_pool(2), _adaptive),
    nn.Flatten: (s.flatten, lambda m, x: dict(input=x, start_dim=m.start_dim, end_dim=m.end_dim)),
    nn.Embedding: (
        s.embedding,
        lambda m, x: dict(input=x, weight=_attr(m, "weight"), max_norm=m.max_norm),
    ),
}
