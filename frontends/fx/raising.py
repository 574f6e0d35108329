"""Canonical (ONNX) ops back to torch: one function per op, for both export dialects.

Each function gets a `Builder` (see `frontends.fx.exporter`) for one canonical node and returns
the fx node computing its output. `b.call(torch_fn, aten_op, ...)` writes the public torch
function in torch-dialect graphs and the ATen overload in torch.export graphs. Semantics follow
the ONNX specification; where torch differs the function bridges it (ONNX pads are begins then
ends, torch's are symmetric or last-axis-first; Reshape's 0 copies an input dimension).
A form torch cannot express raises `NoTorchForm`.
"""

from __future__ import annotations

import operator

import numpy as np
import onnx
import torch
import torch.ao.quantization.fx._decomposed  # registers the quantized_decomposed ops
import torch.nn.functional as F

from frontends.fx.tensors import torch_dtype

aten = torch.ops.aten


class NoTorchForm(ValueError):
    """A canonical node has no torch equivalent in this form (e.g. auto_pad, Shape of a
    symbolic shape)."""


def _ints(b, i: int) -> list[int]:
    c = b.const(i)
    if c is None:
        raise NoTorchForm(f"{b.node.op}: input {i} is not a constant")
    return [int(v) for v in np.asarray(c).reshape(-1)]


def _axes(b, axes, rank: int) -> list[int]:
    return sorted(a % rank for a in axes) if rank else list(axes)


def _static_rank(b, i: int = 0) -> int:
    r = b.type(i).rank
    if r is None:
        raise NoTorchForm(f"{b.node.op}: unknown rank")
    return r


# ---- elementwise -------------------------------------------------------------------------------

_UNARY = {
    "Relu": (torch.relu, aten.relu.default),
    "Neg": (torch.neg, aten.neg.default),
    "Sqrt": (torch.sqrt, aten.sqrt.default),
    "Erf": (torch.erf, aten.erf.default),
    "Tanh": (torch.tanh, aten.tanh.default),
    "Sigmoid": (torch.sigmoid, aten.sigmoid.default),
    "Exp": (torch.exp, aten.exp.default),
    "Log": (torch.log, aten.log.default),
    "Abs": (torch.abs, aten.abs.default),
    "Reciprocal": (torch.reciprocal, aten.reciprocal.default),
    "Floor": (torch.floor, aten.floor.default),
    "Ceil": (torch.ceil, aten.ceil.default),
    "Sin": (torch.sin, aten.sin.default),
    "Cos": (torch.cos, aten.cos.default),
    "Sign": (torch.sign, aten.sign.default),
    "Not": (torch.logical_not, aten.logical_not.default),
}

# op -> (torch function, ATen overload for tensor operands, ATen overload for a scalar second)
_BINARY = {
    "Add": (torch.add, aten.add.Tensor, aten.add.Tensor),
    "Sub": (torch.sub, aten.sub.Tensor, aten.sub.Tensor),
    "Mul": (torch.mul, aten.mul.Tensor, aten.mul.Tensor),
    "Div": (torch.div, aten.div.Tensor, aten.div.Tensor),
    "Pow": (torch.pow, aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar),
    "Equal": (torch.eq, aten.eq.Tensor, aten.eq.Scalar),
    "Less": (torch.lt, aten.lt.Tensor, aten.lt.Scalar),
    "Greater": (torch.gt, aten.gt.Tensor, aten.gt.Scalar),
    "LessOrEqual": (torch.le, aten.le.Tensor, aten.le.Scalar),
    "GreaterOrEqual": (torch.ge, aten.ge.Tensor, aten.ge.Scalar),
    "And": (torch.logical_and, aten.logical_and.default, None),
    "Or": (torch.logical_or, aten.logical_or.default, None),
}


def unary(b):
    """Elementwise unary op (`_UNARY`: Relu, Exp, Not, ...) as its torch function."""
    fn, op = _UNARY[b.node.op]
    return b.call(fn, op, b.x(0))


def binary(b):
    """Elementwise binary op (`_BINARY`); a 0-d constant second operand is passed as a Python
    number to the Scalar overload where one exists."""
    fn, tensor_op, scalar_op = _BINARY[b.node.op]
    y = b.scalar_or_x(1) if scalar_op is not None else b.x(1)
    return b.call(fn, scalar_op if not isinstance(y, torch.fx.Node) else tensor_op, b.x(0), y)


def mod(b):
    """Mod: torch.fmod when `fmod=1` (sign of the dividend, as C), else torch.remainder (sign of
    the divisor, as Python's %)."""
    if b.attr("fmod"):
        return b.call(torch.fmod, aten.fmod.Tensor, b.x(0), b.x(1))
    return b.call(torch.remainder, aten.remainder.Tensor, b.x(0), b.x(1))


def identity(b):
    """Identity and inference Dropout: the input itself, no node."""
    return b.x(0)


def where(b):
    """Where(c, x, y): torch.where, with the ATen overload matching which of x, y are scalars."""
    c, x, y = b.x(0), b.scalar_or_x(1), b.scalar_or_x(2)
    kinds = (isinstance(x, torch.fx.Node), isinstance(y, torch.fx.Node))
    op = {
        (True, True): aten.where.self,
        (True, False): aten.where.ScalarOther,
        (False, True): aten.where.ScalarSelf,
        (False, False): aten.where.Scalar,
    }[kinds]
    return b.call(torch.where, op, c, x, y)


def cast(b):
    """Cast / CastLike: Tensor.to(dtype) (aten._to_copy); CastLike takes the dtype of input 1."""
    to = b.attr("to") if b.node.op == "Cast" else b.type(1).dtype
    dtype = torch_dtype(to)
    return b.call(torch.Tensor.to, aten._to_copy.default, b.x(0), dtype=dtype)


def clip(b):
    """Clip: torch.clamp with bounds that are all numbers or all tensors (mixed ones become
    tensors); an absent bound is None."""
    lo, hi = (None if b.absent(i) else b.scalar_or_x(i) for i in (1, 2))
    nodes = [v for v in (lo, hi) if isinstance(v, torch.fx.Node)]
    if nodes and len(nodes) + [lo, hi].count(None) != 2:
        lo, hi = (None if b.absent(i) else b.x(i) for i in (1, 2))
    op = aten.clamp.Tensor if nodes else aten.clamp.default
    return b.call(torch.clamp, op, b.x(0), lo, hi)


def leaky_relu(b):
    """LeakyRelu: F.leaky_relu with negative slope `alpha`."""
    return b.call(F.leaky_relu, aten.leaky_relu.default, b.x(0), b.attr("alpha"))


def hard_sigmoid(b):
    """HardSigmoid max(0, min(1, alpha*x + beta)): F.hardsigmoid for torch's alpha=1/6,
    beta=0.5, else mul, add and clamp."""
    alpha, beta = b.attr("alpha"), b.attr("beta")
    if np.isclose(alpha, 1 / 6) and beta == 0.5:
        return b.call(F.hardsigmoid, aten.hardsigmoid.default, b.x(0))
    y = b.call(torch.mul, aten.mul.Tensor, b.x(0), alpha)
    y = b.call(torch.add, aten.add.Tensor, y, beta)
    return b.call(torch.clamp, aten.clamp.default, y, 0.0, 1.0)


def gelu(b):
    """Gelu: F.gelu, `approximate` "none" or "tanh" as in ONNX (opset 20)."""
    return b.call(F.gelu, aten.gelu.default, b.x(0), approximate=b.attr("approximate"))


def softmax(b):
    """Softmax / LogSoftmax over `axis` (ONNX opset >= 13 semantics, one axis, as torch's dim)."""
    log = b.node.op == "LogSoftmax"
    if b.aten:
        op = aten._log_softmax.default if log else aten._softmax.default
        return b.call(None, op, b.x(0), b.attr("axis"), False)
    return b.call(torch.log_softmax if log else torch.softmax, None, b.x(0), b.attr("axis"))


# ---- matrix products, normalization, convolution, pooling -------------------------------------


def matmul(b):
    """MatMul: torch.matmul (numpy matmul semantics in both)."""
    return b.call(torch.matmul, aten.matmul.default, b.x(0), b.x(1))


def gemm(b):
    """Gemm: F.linear when it is x @ w.T + bias (what nn.Linear computes), else addmm/mm."""
    alpha, beta, ta, tb = (b.attr(k) for k in ("alpha", "beta", "transA", "transB"))
    c_ok = b.absent(2) or (b.type(2).rank or 0) <= 1
    if tb and not ta and alpha == 1.0 and beta == 1.0 and c_ok:
        bias = None if b.absent(2) else b.x(2)
        return b.call(F.linear, aten.linear.default, b.x(0), b.x(1), bias)
    x, w = b.x(0), b.x(1)
    x = b.call(torch.t, aten.t.default, x) if ta else x
    w = b.call(torch.t, aten.t.default, w) if tb else w
    if b.absent(2):
        y = b.call(torch.mm, aten.mm.default, x, w)
        return y if alpha == 1.0 else b.call(torch.mul, aten.mul.Tensor, y, alpha)
    return b.call(torch.addmm, aten.addmm.default, b.x(2), x, w, beta=beta, alpha=alpha)


def conv(b):
    """Conv: F.convNd (aten.convolution); asymmetric pads become an explicit zero pad first."""
    if b.attr("auto_pad") != "NOTSET":
        raise NoTorchForm("Conv with auto_pad")
    n = _static_rank(b, 1) - 2
    strides = list(b.attr("strides") or [1] * n)
    dilations = list(b.attr("dilations") or [1] * n)
    pads = list(b.attr("pads") or [0] * 2 * n)
    x = b.x(0)
    if pads[:n] != pads[n:]:
        x = b.call(F.pad, aten.constant_pad_nd.default, x, _torch_pads(pads))
        pads = [0] * 2 * n
    bias = None if b.absent(2) else b.x(2)
    group = b.attr("group")
    if b.aten:
        return b.call(
            None,
            aten.convolution.default,
            x,
            b.x(1),
            bias,
            strides,
            pads[:n],
            dilations,
            False,
            [0] * n,
            group,
        )
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}.get(n)
    if fn is None:
        raise NoTorchForm(f"Conv{n}d")
    return b.call(fn, None, x, b.x(1), bias, strides, pads[:n], dilations, group)


def _torch_pads(pads: list[int]) -> list[int]:
    """ONNX (begin_0, ..., begin_k, end_0, ..., end_k) -> torch (begin_k, end_k, ...)."""
    n = len(pads) // 2
    return [p for i in reversed(range(n)) for p in (pads[i], pads[n + i])]


def batch_norm(b):
    """BatchNormalization in inference mode: F.batch_norm with running mean and variance
    (ATen: _native_batch_norm_legit_no_training, output 0). Training mode raises NoTorchForm."""
    if b.attr("training_mode"):
        raise NoTorchForm("BatchNormalization in training mode")
    x, s, bias, mean, var = (b.x(i) for i in range(5))
    eps = b.attr("epsilon")
    if not b.aten:
        return b.call(F.batch_norm, None, x, mean, var, s, bias, False, 0.0, eps)
    y = b.call(
        None, aten._native_batch_norm_legit_no_training.default, x, s, bias, mean, var, 0.0, eps
    )
    return b.getitem(y, 0)


def layer_norm(b):
    """LayerNormalization over the axes from `axis` on: F.layer_norm with that static
    normalized shape; NoTorchForm if a normalized dimension is symbolic."""
    rank = _static_rank(b)
    shape = b.type(0).shape[b.attr("axis") % rank :]
    if not all(isinstance(d, int) for d in shape):
        raise NoTorchForm("LayerNormalization over symbolic dimensions")
    bias = None if b.absent(2) else b.x(2)
    return b.call(
        F.layer_norm, aten.layer_norm.default, b.x(0), list(shape), b.x(1), bias, b.attr("epsilon")
    )


def layer_norm_outputs(b):
    """LayerNormalization with its Mean or InvStdDev read (`LayerNormalization#1`, `#2`):
    torch.native_layer_norm (aten.native_layer_norm), whose (y, mean, rstd) are ONNX's (Y,
    Mean, InvStdDev) with the same shapes for a float32 input and stash type (see
    `frontends.fx.spellings.layer_norm_item`). Returns the tuple node; NoTorchForm for another
    dtype, a symbolic normalized dimension or a scale not of the normalized shape."""
    rank = _static_rank(b)
    shape = b.type(0).shape[b.attr("axis") % rank :]
    if b.type(0).dtype != onnx.TensorProto.FLOAT or b.attr("stash_type") != 1:
        raise NoTorchForm("LayerNormalization's Mean and InvStdDev of a non-float32 input")
    if not all(isinstance(d, int) for d in shape) or b.type(1).shape != shape:
        raise NoTorchForm("LayerNormalization's Mean over symbolic dimensions or a broadcast scale")
    bias = None if b.absent(2) else b.x(2)
    return b.call(
        torch.native_layer_norm,
        aten.native_layer_norm.default,
        b.x(0),
        list(shape),
        b.x(1),
        bias,
        b.attr("epsilon"),
    )


def rms_norm(b):
    """RMSNormalization: F.rms_norm over the axes from `axis` on (stash_type 1: torch computes
    float32 inputs in float32, and upcasts half inputs as ONNX does)."""
    rank = _static_rank(b)
    shape = b.type(0).shape[b.attr("axis") % rank :]
    if not all(isinstance(d, int) for d in shape) or b.attr("stash_type") != 1:
        raise NoTorchForm("RMSNormalization over symbolic dimensions or with a stash type")
    return b.call(F.rms_norm, aten.rms_norm.default, b.x(0), list(shape), b.x(1), b.attr("epsilon"))


def _pool_args(b) -> tuple[int, list[int], list[int], list[int]]:
    if b.attr("auto_pad") != "NOTSET" or b.attr("ceil_mode"):
        raise NoTorchForm(f"{b.node.op} with auto_pad or ceil_mode")
    kernel = list(b.attr("kernel_shape"))
    n = len(kernel)
    pads = list(b.attr("pads") or [0] * 2 * n)
    if pads[:n] != pads[n:]:
        raise NoTorchForm(f"{b.node.op} with asymmetric pads")
    return n, kernel, list(b.attr("strides") or [1] * n), pads[:n]


def max_pool(b):
    """MaxPool: F.max_poolNd (ATen: max_poolNd_with_indices, output 0) with symmetric pads."""
    n, kernel, strides, pads = _pool_args(b)
    dil = list(b.attr("dilations") or [1] * n)
    if not b.aten:
        fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[n]
        return b.call(fn, None, b.x(0), kernel, strides, pads, dil)
    if n == 1:
        return b.call(None, aten.max_pool1d.default, b.x(0), kernel, strides, pads, dil)
    op = {2: aten.max_pool2d_with_indices.default, 3: aten.max_pool3d_with_indices.default}[n]
    return b.getitem(b.call(None, op, b.x(0), kernel, strides, pads, dil), 0)


def avg_pool(b):
    """AveragePool: F.avg_poolNd with symmetric pads, ceil_mode off and `count_include_pad`."""
    n, kernel, strides, pads = _pool_args(b)
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[n]
    op = {1: aten.avg_pool1d.default, 2: aten.avg_pool2d.default, 3: aten.avg_pool3d.default}[n]
    return b.call(fn, op, b.x(0), kernel, strides, pads, False, bool(b.attr("count_include_pad")))


def global_pool(b):
    """GlobalAveragePool / GlobalMaxPool: mean / amax over the spatial axes, kept as size 1."""
    dims = list(range(2, _static_rank(b)))
    if b.node.op == "GlobalAveragePool":
        return b.call(torch.mean, aten.mean.dim, b.x(0), dims, True)
    return b.call(torch.amax, aten.amax.default, b.x(0), dims, True)


_REDUCE = {
    "ReduceMean": (torch.mean, aten.mean.dim),
    "ReduceSum": (torch.sum, aten.sum.dim_IntList),
    "ReduceMax": (torch.amax, aten.amax.default),
    "ReduceMin": (torch.amin, aten.amin.default),
}


def reduce(b):
    """Reduce*: mean/sum/amax/amin over the constant axes (all when absent, or the input itself
    with noop_with_empty_axes), ReduceL2 as vector_norm, ReduceProd as one prod per axis."""
    rank = _static_rank(b)
    if b.absent(1):
        if b.attr("noop_with_empty_axes"):
            return b.x(0)
        axes = list(range(rank))
    else:
        axes = _axes(b, _ints(b, 1), rank)
    keep = bool(b.attr("keepdims"))
    if b.node.op == "ReduceL2":
        return b.call(
            torch.linalg.vector_norm, aten.linalg_vector_norm.default, b.x(0), 2, axes, keep
        )
    if b.node.op == "ReduceProd":
        y = b.x(0)
        for a in sorted(axes, reverse=True):
            y = b.call(torch.prod, aten.prod.dim_int, y, a, keep)
        return y
    fn, op = _REDUCE[b.node.op]
    return b.call(fn, op, b.x(0), axes, keep)


# ---- shape and layout --------------------------------------------------------------------------


def reshape(b):
    """Reshape: torch.reshape. ONNX's 0 (copy the input's dimension) becomes that dimension:
    a number, or `sym_size(x, i)` read at run time when it is symbolic."""
    shape = _ints(b, 1)
    x = b.x(0)
    if not b.attr("allowzero") and 0 in shape:
        src = b.type(0).shape
        if src is None or any(d == 0 and i >= len(src) for i, d in enumerate(shape)):
            raise NoTorchForm("Reshape copying a dimension of unknown rank")
        shape = [d if d != 0 else b.size(0, i) for i, d in enumerate(shape)]
    return b.call(torch.reshape, aten.reshape.default, x, shape)


def flatten(b):
    """Flatten: torch.flatten(x, 1) for axis 1, else a reshape to the static 2-D result shape;
    NoTorchForm otherwise."""
    axis, rank = b.attr("axis"), _static_rank(b)
    if axis % max(rank, 1) == 1 and rank >= 2:
        return b.call(torch.flatten, aten.flatten.using_ints, b.x(0), 1)
    if b.out.static:
        return b.call(torch.reshape, aten.reshape.default, b.x(0), list(b.out.shape))
    raise NoTorchForm("Flatten of a symbolic shape")


def transpose(b):
    """Transpose: torch.permute by `perm` (reversed axes when absent, as ONNX specifies)."""
    perm = b.attr("perm")
    perm = list(perm) if perm is not None else list(reversed(range(_static_rank(b))))
    return b.call(torch.permute, aten.permute.default, b.x(0), perm)


def squeeze(b):
    """Squeeze: torch.squeeze of the constant axes (all size-1 axes when absent)."""
    if b.absent(1):
        return b.call(torch.squeeze, aten.squeeze.default, b.x(0))
    axes = _axes(b, _ints(b, 1), _static_rank(b))
    return b.call(torch.squeeze, aten.squeeze.dims, b.x(0), axes)


def unsqueeze(b):
    """Unsqueeze: one torch.unsqueeze per axis, in increasing order of output axis."""
    axes = _axes(b, _ints(b, 1), _static_rank(b) + len(_ints(b, 1)))
    y = b.x(0)
    for a in axes:
        y = b.call(torch.unsqueeze, aten.unsqueeze.default, y, a)
    return y


def expand(b):
    """Expand: Tensor.expand to the result's shape; an axis the input has at the same symbolic
    size is written -1 (keep it)."""
    src, out = b.type(0).shape, b.out.shape
    if src is None or out is None:
        raise NoTorchForm("Expand of unknown rank")
    lead = len(out) - len(src)
    sizes = [
        o if isinstance(o, int) else -1 if i >= lead and src[i - lead] == o else None
        for i, o in enumerate(out)
    ]
    if None in sizes:
        raise NoTorchForm("Expand to a symbolic shape")
    return b.call(torch.Tensor.expand, aten.expand.default, b.x(0), sizes)


def tile(b):
    """Tile: Tensor.repeat with the constant repeats."""
    return b.call(torch.Tensor.repeat, aten.repeat.default, b.x(0), _ints(b, 1))


def slice_(b):
    """Slice with constant starts/ends/axes/steps: aten.slice per axis (ATen) or Python
    indexing; a negative step raises NoTorchForm (torch slicing has none)."""
    starts, ends = _ints(b, 1), _ints(b, 2)
    rank = _static_rank(b)
    axes = _ints(b, 3) if not b.absent(3) else list(range(len(starts)))
    steps = _ints(b, 4) if not b.absent(4) else [1] * len(starts)
    if any(s <= 0 for s in steps):
        raise NoTorchForm("Slice with a negative step")
    y = b.x(0)
    for a, s, e, st in zip(axes, starts, ends, steps):
        if b.aten:
            y = b.call(None, aten.slice.Tensor, y, a % rank, s, e, st)
        else:
            index = (slice(None),) * (a % rank) + (slice(s, e, st),)
            y = b.call(operator.getitem, None, y, index)
    return y


def split(b):
    """Split, all its outputs: torch.split (aten.split_with_sizes) into the constant `split`
    sizes, or into `num_outputs` items of ceil(length / num_outputs), the last shorter (ONNX
    spec, Split-18), which needs a static length. Returns the list node; the exporter takes
    its items (`Split#K` is item K)."""
    rank = _static_rank(b)
    axis = b.attr("axis") % rank
    if not b.absent(1):
        sizes = _ints(b, 1)
    else:
        count, length = b.attr("num_outputs"), b.type(0).shape[axis]
        if not count or not isinstance(length, int):
            raise NoTorchForm("Split into num_outputs of a symbolic length")
        size = -(-length // count)
        sizes = [size] * (count - 1) + [length - size * (count - 1)]
        if sizes[-1] <= 0:
            raise NoTorchForm(f"Split of {length} into {count} outputs")
    return b.call(torch.split, aten.split_with_sizes.default, b.x(0), sizes, axis)


def concat(b):
    """Concat: torch.cat of the inputs present (a variadic input's slots), along `axis`."""
    xs = [b.x(i) for i in range(len(b.node.inputs)) if not b.absent(i)]
    return b.call(torch.cat, aten.cat.default, xs, b.attr("axis"))


def gather(b):
    """Gather: torch.select for a 0-d constant index, else advanced indexing on `axis`."""
    rank, axis = _static_rank(b), b.attr("axis")
    c = b.const(1)
    if c is not None and np.ndim(c) == 0:
        return b.call(torch.select, aten.select.int, b.x(0), axis % rank, int(c))
    if b.aten:
        return b.call(None, aten.index.Tensor, b.x(0), [None] * (axis % rank) + [b.x(1)])
    index = (slice(None),) * (axis % rank) + (b.x(1),)
    return b.call(operator.getitem, None, b.x(0), index)


def pad(b):
    """Pad with constant pads (ONNX begins then ends, reordered for torch): F.pad in constant
    mode (default value 0), reflect or edge (torch "replicate"); NoTorchForm with axes."""
    if not b.absent(3):
        raise NoTorchForm("Pad with axes")
    pads, mode = _torch_pads(_ints(b, 1)), b.attr("mode")
    if mode == "constant":
        value = 0.0 if b.absent(2) else float(np.asarray(b.const(2)).reshape(()))
        return b.call(F.pad, aten.constant_pad_nd.default, b.x(0), pads, value)
    if b.aten:
        raise NoTorchForm(f"Pad mode {mode} in ATen form")
    return b.call(F.pad, None, b.x(0), pads, {"reflect": "reflect", "edge": "replicate"}[mode])


def constant(b):
    """Constant: a buffer holding its value."""
    return b.own_constant()


# QuantizeLinear / DequantizeLinear as PyTorch 2 export quantization's decomposed ops (see
# `frontends.fx.spellings`' note on their semantics): one scale -> *_per_tensor with Python
# numbers, a vector of scales -> *_per_channel with the scales and int64 zero points as buffers.
_QD = torch.ops.quantized_decomposed


def _quant_args(b) -> tuple[list, torch.dtype, bool]:
    """(scale and zero point arguments, the 8-bit dtype, per channel) of a Q/DQ node whose
    scale and zero point are constants."""
    s = b.const(1)
    z = np.zeros((), np.uint8) if b.absent(2) else b.const(2)
    if s is None or z is None:
        raise NoTorchForm(f"{b.node.op}: a scale or zero point that is not a constant")
    dt = torch_dtype(onnx.helper.np_dtype_to_tensor_dtype(np.asarray(z).dtype))
    if dt not in (torch.uint8, torch.int8) or np.asarray(s).dtype != np.float32:
        raise NoTorchForm(f"{b.node.op}: a {dt} zero point or a scale that is not float32")
    if np.size(s) == 1:
        return [float(np.asarray(s).reshape(())), int(np.asarray(z).reshape(()))], dt, False
    if np.ndim(s) != 1 or np.shape(z) != np.shape(s):
        raise NoTorchForm(f"{b.node.op}: blocked quantization")
    rank = _static_rank(b)
    axis = (b.attr("axis") if b.attr("axis") is not None else 1) % rank
    zp = b.ex.buffer(np.asarray(z, np.int64), b.node.inputs[2], b.node)
    return [b.x(1), zp, axis], dt, True


def quantize_linear(b):
    """QuantizeLinear: quantized_decomposed.quantize_per_tensor / _per_channel."""
    args, dt, per_channel = _quant_args(b)
    info = torch.iinfo(dt)
    op = _QD.quantize_per_channel.default if per_channel else _QD.quantize_per_tensor.default
    return b.call(op, op, b.x(0), *args, info.min, info.max, dt)


def dequantize_linear(b):
    """DequantizeLinear (to float32): quantized_decomposed.dequantize_per_tensor / _per_channel."""
    if b.out.dtype != onnx.TensorProto.FLOAT:
        raise NoTorchForm("DequantizeLinear: an output that is not float32")
    args, dt, per_channel = _quant_args(b)
    info = torch.iinfo(dt)
    op = _QD.dequantize_per_channel.default if per_channel else _QD.dequantize_per_tensor.default
    return b.call(op, op, b.x(0), *args, info.min, info.max, dt)


RAISE = {
    **{op: unary for op in _UNARY},
    **{op: binary for op in _BINARY},
    "Mod": mod,
    "Identity": identity,
    "Dropout": identity,
    "Where": where,
    "Cast": cast,
    "CastLike": cast,
    "Clip": clip,
    "LeakyRelu": leaky_relu,
    "HardSigmoid": hard_sigmoid,
    "Gelu": gelu,
    "Softmax": softmax,
    "LogSoftmax": softmax,
    "MatMul": matmul,
    "Gemm": gemm,
    "Conv": conv,
    "BatchNormalization": batch_norm,
    "LayerNormalization": layer_norm,
    "RMSNormalization": rms_norm,
    "MaxPool": max_pool,
    "AveragePool": avg_pool,
    "GlobalAveragePool": global_pool,
    "GlobalMaxPool": global_pool,
    **{op: reduce for op in (*_REDUCE, "ReduceL2", "ReduceProd")},
    "Reshape": reshape,
    "Flatten": flatten,
    "Transpose": transpose,
    "Squeeze": squeeze,
    "Unsqueeze": unsqueeze,
    "Expand": expand,
    "Tile": tile,
    "Slice": slice_,
    "Concat": concat,
    "Gather": gather,
    "Pad": pad,
    "Constant": constant,
    "QuantizeLinear": quantize_linear,
    "DequantizeLinear": dequantize_linear,
}

# Ops with several outputs written as one torch call returning a tuple or list (named as the
# call), whose items the exporter takes (`Op#K` is item K); LayerNormalization only when a
# projection of the application is read (else `layer_norm` above, one output).
TUPLES = {
    "Split": ("split", split),
    "LayerNormalization": ("native_layer_norm", layer_norm_outputs),
}
