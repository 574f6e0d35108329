"""How torch spells the canonical (ONNX) ops: functions, methods, ATen overloads, modules.

`FUNCTIONS` maps a call_function target (a torch function, an `operator` function, an ATen
`OpOverload`) or a call_method name to a `Spelling`: the parameter list its arguments bind to
and the handler that emits canonical nodes. `MODULES` maps an `nn.Module` class to a function
that reads the module's configuration into the same arguments. Every handler checks what ONNX
cannot express (a dtype ONNX's op does not take, training mode, an asymmetric option) and raises
`Unmapped`, so the node stays opaque rather than change meaning.

Sources of semantics: the ONNX operator specification and torch's documentation; where they
differ the handler says how it is bridged (e.g. torch's `view` shape vs ONNX Reshape's 0).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import fx

from frontends.fx.lower import Attr, Lowering, Unmapped, elem
from frontends.fx.tensors import FLOATS, to_numpy
from vocab.graph import ABSENT
from vocab.ops import OPS

INT64_MAX = 2**63 - 1


def _same_dtype(lo: Lowering, *xs) -> torch.dtype:
    dts = {lo.dtype(x) for x in xs if isinstance(x, (fx.Node, Attr))}
    if len(dts) != 1 or None in dts:
        raise Unmapped("operand dtypes differ")
    return dts.pop()


# ---- elementwise -------------------------------------------------------------------------------


def binary(op: str, kind: str = "arith", swap: bool = False):
    """Add/Sub/Mul/Div/Pow (`arith`: result dtype = operand dtype, no bool), comparisons
    (`compare`: bool result; only Equal takes bool operands) and And/Or (`logic`: bool only).
    Python numbers become 0-d constants of the tensor operand's dtype, as torch converts them."""

    def lower(lo: Lowering, a: dict) -> None:
        if a.get("alpha", 1) != 1 or a.get("rounding_mode") is not None:
            raise Unmapped("alpha or rounding_mode")
        x, y = (a["other"], a["input"]) if swap else (a["input"], a["other"])
        dt = _same_dtype(lo, x, y)
        out = lo.out_dtype
        if kind == "arith" and (out != dt or dt == torch.bool):
            raise Unmapped("type promotion")
        if kind == "compare" and (out != torch.bool or (dt == torch.bool and op != "Equal")):
            raise Unmapped("comparison types")
        if kind == "logic" and dt != torch.bool:
            raise Unmapped("bitwise op on integers")
        lo.emit(op, [lo.operand(x, dt), lo.operand(y, dt)])

    return lower


_FLOAT_ONLY = set("Sqrt Erf Tanh Sigmoid Exp Log Reciprocal Floor Ceil Sin Cos Gelu".split())


def unary(op: str, **attrs):
    """An elementwise op with the input's dtype (Not: bool; float-only ops: floats)."""

    def lower(lo: Lowering, a: dict) -> None:
        x = a["input"]
        dt = lo.dtype(x)
        if dt != lo.out_dtype or (op in _FLOAT_ONLY and dt not in FLOATS):
            raise Unmapped("dtype")
        if (op == "Not") != (dt == torch.bool):
            raise Unmapped("Not takes bool only")
        lo.emit(op, [lo.tensor(x)], attrs)

    return lower


def rsqrt(lo: Lowering, a: dict) -> None:
    """rsqrt(x) = 1 / sqrt(x)."""
    if lo.dtype(a["input"]) not in FLOATS:
        raise Unmapped("dtype")
    lo.emit("Reciprocal", [lo.emit("Sqrt", [lo.tensor(a["input"])])])


def gelu(lo: Lowering, a: dict) -> None:
    """F.gelu / nn.GELU: Gelu with the same `approximate` ("none" or "tanh"), float inputs."""
    unary("Gelu", approximate=a["approximate"])(lo, a)


def leaky_relu(lo: Lowering, a: dict) -> None:
    """F.leaky_relu / nn.LeakyReLU: LeakyRelu with alpha = negative_slope."""
    unary("LeakyRelu", alpha=float(a["negative_slope"]))(lo, a)


def clip(lo: Lowering, a: dict) -> None:
    """clamp/clip/hardtanh/relu6: Clip with constant (or tensor) bounds."""
    x, dt = a["input"], lo.dtype(a["input"])
    if dt != lo.out_dtype or dt == torch.bool:
        raise Unmapped("dtype")
    lo_, hi = (
        lo.optional(v) if isinstance(v, fx.Node) or v is None else lo.operand(v, dt)
        for v in (a["min"], a["max"])
    )
    lo.emit("Clip", [lo.tensor(x), lo_, hi])


def where(lo: Lowering, a: dict) -> None:
    """where(c, x, y) and masked_fill(x, mask, v) = where(mask, v, x)."""
    dt = lo.out_dtype
    if lo.dtype(a["condition"]) != torch.bool:
        raise Unmapped("condition dtype")
    for v in (a["input"], a["other"]):
        if isinstance(v, fx.Node) and lo.dtype(v) != dt:
            raise Unmapped("type promotion")
    c, x, y = lo.tensor(a["condition"]), lo.operand(a["input"], dt), lo.operand(a["other"], dt)
    lo.emit("Where", [c, x, y])


def masked_fill(lo: Lowering, a: dict) -> None:
    """masked_fill(x, mask, v) = Where(mask, v, x)."""
    where(lo, {"condition": a["mask"], "input": a["value"], "other": a["input"]})


def cast(dtype: torch.dtype | None = None):
    """x.to(dtype), x.float(), aten._to_copy: Cast, when only the dtype changes."""

    def lower(lo: Lowering, a: dict) -> None:
        want = dtype or a.get("dtype")
        for extra in a.get("args", ()):
            if isinstance(extra, torch.dtype) and want is None:
                want = extra
            elif not _same_device(lo, extra, a["input"]):
                raise Unmapped(f"to({extra!r})")
        layout = a.get("layout") not in (None, torch.strided)
        if not _same_device(lo, a.get("device"), a["input"]) or layout:
            raise Unmapped("device or layout change")
        if a.get("memory_format") not in (None, torch.preserve_format):
            raise Unmapped("memory format")
        if want is None and lo.dtype(a["input"]) == lo.out_dtype:  # x.to(its own device)
            lo.emit("Identity", [lo.tensor(a["input"])])
            return
        if want is None:
            raise Unmapped("no dtype")
        if lo.out_dtype != want or lo.dtype(a["input"]) is None:
            raise Unmapped("dtype")
        lo.emit("Cast", [lo.tensor(a["input"])], {"to": elem(want)})

    return lower


def _same_device(lo: Lowering, device, x) -> bool:
    """Is `device` (None: unchanged) the device `x` is on? Unknown devices are not the same."""
    if device is None:
        return True
    have = lo.imp.device_of(x) if isinstance(x, fx.Node) else None
    return have is not None and torch.device(device) == have


def identity(lo: Lowering, a: dict) -> None:
    """nn.Identity."""
    lo.emit("Identity", [lo.tensor(a["input"])])


def dropout(lo: Lowering, a: dict) -> None:
    """Dropout outside training: ONNX Dropout without training_mode, which returns its input."""
    if a.get("training", False) or a.get("train", False):
        raise Unmapped("dropout in training")
    p = a.get("p", 0.5)
    ratio = lo.constant(np.asarray(p, dtype=np.float32)) if isinstance(p, (int, float)) else None
    if ratio is None:
        raise Unmapped("symbolic dropout ratio")
    lo.emit("Dropout", [lo.tensor(a["input"]), ratio])


def softmax(op: str):
    """The handler for softmax/log_softmax over `dim`: `op` (Softmax or LogSoftmax) with
    axis=dim, float inputs, no dtype change."""

    def lower(lo: Lowering, a: dict) -> None:
        x = a["input"]
        if a["dim"] is None or a.get("half_to_float") or a.get("dtype") not in (None, lo.dtype(x)):
            raise Unmapped("softmax options")
        if lo.dtype(x) not in FLOATS:
            raise Unmapped("dtype")
        lo.emit(op, [lo.tensor(x)], {"axis": int(a["dim"])})

    return lower


# ---- matrix products, normalization, convolution, pooling -----------------------------------


def matmul(lo: Lowering, a: dict) -> None:
    """matmul / @: MatMul, both operands and the result of one dtype."""
    x, y = a["input"], a["other"]
    if _same_dtype(lo, x, y) != lo.out_dtype:
        raise Unmapped("dtype")
    lo.emit("MatMul", [lo.tensor(x), lo.tensor(y)])


def addmm(lo: Lowering, a: dict) -> None:
    """addmm(c, a, b, beta, alpha) = Gemm(a, b, c, alpha, beta)."""
    if _same_dtype(lo, a["input"], a["mat1"], a["mat2"]) != lo.out_dtype:
        raise Unmapped("dtype")
    ins = [lo.tensor(a["mat1"]), lo.tensor(a["mat2"]), lo.tensor(a["input"])]
    lo.emit("Gemm", ins, {"alpha": float(a["alpha"]), "beta": float(a["beta"])})


def linear(lo: Lowering, a: dict) -> None:
    """linear(x, w, b) = x @ w.T + b: Gemm(transB=1) for 2-D x, else MatMul with the weight
    transposed (a constant view of w, so export refers to w itself) and Add."""
    x, w, b = a["input"], a["weight"], a["bias"]
    if _same_dtype(lo, x, w, *([b] if b is not None else [])) != lo.out_dtype:
        raise Unmapped("dtype")
    if lo.rank(w) != 2 or (b is not None and lo.rank(b) != 1):
        raise Unmapped("weight rank")
    if lo.rank(x) == 2:
        lo.emit("Gemm", [lo.tensor(x), lo.tensor(w), lo.optional(b)], {"transB": 1})
        return
    y = lo.emit("MatMul", [lo.tensor(x), lo.transposed(w)])
    if b is not None:
        lo.emit("Add", [y, lo.tensor(b)])


def _ntuple(v, n: int) -> tuple[int, ...]:
    v = tuple(v) if isinstance(v, (list, tuple)) else (v,) * n
    if len(v) == 1:
        v = v * n
    if len(v) != n or not all(isinstance(i, int) for i in v):
        raise Unmapped("non-constant int tuple")
    return v


def conv(lo: Lowering, a: dict) -> None:
    """convNd / convolution (not transposed): Conv with ONNX pads (begins then ends)."""
    x, w, b = a["input"], a["weight"], a["bias"]
    if a.get("transposed") or _same_dtype(lo, x, w) != lo.out_dtype or lo.rank(x) != lo.rank(w):
        raise Unmapped("transposed, dtype or unbatched input")
    kernel = lo.shape(w)[2:]
    n = len(kernel)
    stride, dilation = _ntuple(a["stride"], n), _ntuple(a["dilation"], n)
    padding = a["padding"]
    if padding == "valid":
        padding = 0
    elif padding == "same":
        if any(s != 1 for s in stride):
            raise Unmapped("same padding with stride")
        total = [d * (k - 1) for d, k in zip(dilation, kernel)]
        begins = [t // 2 for t in total]
        pads = (*begins, *(t - b for t, b in zip(total, begins)))
    if padding != "same":
        pads = _ntuple(padding, n) * 2
    attrs = {
        "dilations": dilation,
        "group": int(a["groups"]),
        "kernel_shape": kernel,
        "pads": pads,
        "strides": stride,
    }
    lo.emit("Conv", [lo.tensor(x), lo.tensor(w), lo.optional(b)], attrs)


def batch_norm(lo: Lowering, a: dict) -> None:
    """Inference batch norm: BatchNormalization (missing weight/bias become ones/zeros)."""
    x, mean, var = a["input"], a["running_mean"], a["running_var"]
    if a.get("training") or mean is None or var is None or lo.dtype(x) not in FLOATS:
        raise Unmapped("training or no running statistics")
    c = lo.shape(mean)
    scale = lo.tensor(a["weight"]) if a["weight"] is not None else _fill(lo, c, 1, mean)
    bias = lo.tensor(a["bias"]) if a["bias"] is not None else _fill(lo, c, 0, mean)
    ins = [lo.tensor(x), scale, bias, lo.tensor(mean), lo.tensor(var)]
    lo.emit("BatchNormalization", ins, {"epsilon": float(a["eps"])})


def _fill(lo: Lowering, shape, value, like) -> int:
    return lo.constant(to_numpy(torch.full(tuple(shape), value, dtype=lo.dtype(like))))


def layer_norm(lo: Lowering, a: dict) -> None:
    """layer_norm over the last len(normalized_shape) axes: LayerNormalization(axis=-k)."""
    _layer_norm(lo, a, "LayerNormalization")


def layer_norm_item(lo: Lowering, a: dict) -> None:
    """Item `item` of native_layer_norm(x, shape, w, b, eps) = (y, mean, rstd): output `item`
    of LayerNormalization (ONNX: Y, Mean, InvStdDev; `LayerNormalization#1`, `#2`).

    Mean and rstd (ATen's native_layer_norm) are the mean and 1 / sqrt(biased variance + eps)
    over the normalized axes, of shape x.shape[:-k] + [1] * k: ONNX's Mean and InvStdDev are the
    same values with the same shape (ONNX spec, LayerNormalization-17). Their dtype differs:
    ONNX's is the stash type (float32, `stash_type` 1), ATen's the input's (CPU and CUDA, for
    weights of the input's dtype). So items 1 and 2 map for float32 inputs only."""
    if a["item"] == 0:
        layer_norm(lo, a)
        return
    if lo.dtype(a["input"]) != torch.float32 or lo.out_dtype != torch.float32:
        raise Unmapped("mean and rstd of a non-float32 input (ONNX's are float32)")
    _layer_norm(lo, a, f"LayerNormalization#{a['item']}")


def _layer_norm(lo: Lowering, a: dict, op: str) -> None:
    x, shape = a["input"], tuple(a["normalized_shape"])
    if lo.dtype(x) not in FLOATS or (op == "LayerNormalization" and lo.dtype(x) != lo.out_dtype):
        raise Unmapped("dtype")
    scale = lo.tensor(a["weight"]) if a["weight"] is not None else _fill(lo, shape, 1, x)
    attrs = {"axis": -len(shape), "epsilon": float(a["eps"])}
    lo.emit(op, [lo.tensor(x), scale, lo.optional(a["bias"])], attrs)


def rms_norm(lo: Lowering, a: dict) -> None:
    """rms_norm over the last len(normalized_shape) axes: RMSNormalization(axis=-k); torch's
    default eps (None) is the dtype's machine epsilon."""
    x, shape = a["input"], tuple(a["normalized_shape"])
    dt = lo.dtype(x)
    if dt not in FLOATS or dt != lo.out_dtype:
        raise Unmapped("dtype")
    eps = torch.finfo(dt).eps if a["eps"] is None else float(a["eps"])
    scale = lo.tensor(a["weight"]) if a["weight"] is not None else _fill(lo, shape, 1, x)
    lo.emit("RMSNormalization", [lo.tensor(x), scale], {"axis": -len(shape), "epsilon": eps})


def pool(op: str, n: int):
    """max/avg pooling of n spatial dims on batched input, without ceil_mode."""

    def lower(lo: Lowering, a: dict) -> None:
        x = a["input"]
        if lo.rank(x) != n + 2 or a.get("ceil_mode") or a.get("return_indices"):
            raise Unmapped("unbatched input, ceil_mode or indices")
        if a.get("divisor_override") is not None or lo.dtype(x) not in FLOATS:
            raise Unmapped("divisor_override or dtype")
        kernel = _ntuple(a["kernel_size"], n)
        stride = _ntuple(a["stride"], n) if a["stride"] not in (None, [], ()) else kernel
        attrs = {"kernel_shape": kernel, "strides": stride, "pads": _ntuple(a["padding"], n) * 2}
        if op == "MaxPool":
            attrs["dilations"] = _ntuple(a["dilation"], n)
        else:
            attrs["count_include_pad"] = int(a["count_include_pad"])
        lo.emit(op, [lo.tensor(x)], attrs)

    return lower


def global_avg_pool(n: int):
    """The handler for adaptive_avg_pool{n}d to output size 1: GlobalAveragePool on
    rank-(n+2) float inputs."""

    def lower(lo: Lowering, a: dict) -> None:
        x = a["input"]
        if lo.rank(x) != n + 2 or _ntuple(a["output_size"], n) != (1,) * n:
            raise Unmapped("not global")
        if lo.dtype(x) not in FLOATS:
            raise Unmapped("dtype")
        lo.emit("GlobalAveragePool", [lo.tensor(x)])

    return lower


def reduce(op: str):
    """mean/sum/amax/amin over dims (all when none): Reduce* with an axes constant."""

    def lower(lo: Lowering, a: dict) -> None:
        x, dims = a["input"], a.get("dim")
        if a.get("dtype") is not None or lo.dtype(x) != lo.out_dtype or lo.dtype(x) == torch.bool:
            raise Unmapped("dtype")
        dims = () if dims is None else (dims,) if isinstance(dims, int) else tuple(dims)
        axes = lo.ints(dims) if dims else ABSENT
        lo.emit(op, [lo.tensor(x), axes], {"keepdims": int(bool(a.get("keepdim", False)))})

    return lower


def embedding(lo: Lowering, a: dict) -> None:
    """embedding(ids, w) = Gather(w, ids, axis=0) (padding_idx only affects gradients)."""
    if a.get("max_norm") is not None or lo.dtype(a["input"]) not in (torch.int64, torch.int32):
        raise Unmapped("max_norm or index dtype")
    lo.emit("Gather", [lo.tensor(a["weight"]), lo.tensor(a["input"])], {"axis": 0})


# ---- shape and layout --------------------------------------------------------------------------


def _dims(v) -> tuple:
    if len(v) == 1 and isinstance(v[0], (list, tuple, torch.Size)):
        return tuple(v[0])
    return tuple(v)


def reshape(lo: Lowering, a: dict) -> None:
    """view/reshape: Reshape. A 0 in a torch shape is a 0-size axis, so allowzero=1 then.
    A size computed at run time (a SymInt node, with dynamic shapes) is read from the result's
    symbolic type: a dimension equal to the input's at the same axis becomes ONNX's 0 (copy
    it), and at most one other becomes -1."""
    shape = _dims(a["shape"]) if isinstance(a["shape"], (tuple, list)) else (a["shape"],)
    if all(_literal(d) for d in shape):
        lo.emit("Reshape", [lo.tensor(a["input"]), lo.ints(shape)], {"allowzero": int(0 in shape)})
        return
    src, out = lo.type(a["input"]).shape, lo.out.shape
    if src is None or out is None or len(out) != len(shape) or 0 in shape:
        raise Unmapped("symbolic reshape")
    target = []
    for i, (d, o) in enumerate(zip(shape, out)):
        if _literal(d) or isinstance(o, int):
            target.append(d if _literal(d) else o)
        elif i < len(src) and src[i] == o:
            target.append(0)
        else:
            target.append(None)
    if target.count(None) + target.count(-1) > 1 or 0 in out:
        raise Unmapped("more than one size unknown")
    target = [-1 if d is None else d for d in target]
    lo.emit("Reshape", [lo.tensor(a["input"]), lo.ints(target)])


def _literal(d) -> bool:
    return isinstance(d, int) and not isinstance(d, bool)


def permute(lo: Lowering, a: dict) -> None:
    """permute(dims): Transpose with perm = dims (made non-negative)."""
    rank = lo.rank(a["input"])
    perm = tuple(d % rank for d in _dims(a["dims"])) if rank else ()
    if sorted(perm) != list(range(rank)):
        raise Unmapped("not a permutation")
    lo.emit("Transpose", [lo.tensor(a["input"])], {"perm": perm})


def transpose(lo: Lowering, a: dict) -> None:
    """transpose(dim0, dim1): Transpose with the two axes swapped."""
    rank = lo.rank(a["input"])
    if rank == 0:
        raise Unmapped("0-d transpose")
    perm = list(range(rank))
    i, j = a["dim0"] % rank, a["dim1"] % rank
    perm[i], perm[j] = perm[j], perm[i]
    lo.emit("Transpose", [lo.tensor(a["input"])], {"perm": tuple(perm)})


def t(lo: Lowering, a: dict) -> None:
    """t() of a matrix: Transpose with perm (1, 0); Unmapped for other ranks."""
    if lo.rank(a["input"]) != 2:
        raise Unmapped("t() of a non-matrix")
    lo.emit("Transpose", [lo.tensor(a["input"])], {"perm": (1, 0)})


def unsqueeze(lo: Lowering, a: dict) -> None:
    """unsqueeze(dim): Unsqueeze with axes [dim]."""
    lo.emit("Unsqueeze", [lo.tensor(a["input"]), lo.ints([a["dim"]])])


def squeeze(lo: Lowering, a: dict) -> None:
    """squeeze(dims): torch skips axes whose size is not 1, ONNX rejects them; only the size-1
    axes are passed on (Identity when none is)."""
    x, dims = a["input"], a.get("dim")
    if dims is None:
        lo.emit("Squeeze", [lo.tensor(x)])
        return
    shape = lo.shape(x)
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    keep = sorted({d % len(shape) for d in dims if shape[d % len(shape)] == 1}) if shape else []
    if not keep:
        lo.emit("Identity", [lo.tensor(x)])
        return
    lo.emit("Squeeze", [lo.tensor(x), lo.ints(keep)])


def flatten(lo: Lowering, a: dict) -> None:
    """flatten(1, -1) of a batch is ONNX Flatten(axis=1); other ranges a static Reshape."""
    x = a["input"]
    rank = lo.rank(x)
    start, end = (a["start_dim"] % rank, a["end_dim"] % rank) if rank else (0, 0)
    if rank >= 2 and start == 1 and end == rank - 1:
        lo.emit("Flatten", [lo.tensor(x)], {"axis": 1})
        return
    shape = (-1,) if start == 0 and end == max(rank - 1, 0) else lo.out_shape()
    lo.emit("Reshape", [lo.tensor(x), lo.ints(shape)], {"allowzero": int(0 in shape)})


def expand(lo: Lowering, a: dict) -> None:
    """expand(sizes): Expand. ONNX broadcasts the input with the shape given, so an axis the
    input already has at its size (a symbol included) is written 1; a new or widened axis
    needs its size as a number."""
    src, out = lo.type(a["input"]).shape, lo.out.shape
    if src is None or out is None:
        raise Unmapped("unknown shape")
    lead = len(out) - len(src)
    shape = []
    for i, o in enumerate(out):
        if isinstance(o, int):
            shape.append(o)
        elif i >= lead and src[i - lead] == o:
            shape.append(1)
        else:
            raise Unmapped("expand to a symbolic size")
    lo.emit("Expand", [lo.tensor(a["input"]), lo.ints(shape)])


def slice_(lo: Lowering, a: dict) -> None:
    """x[..., start:end:step] on `dim` (aten.slice): Slice, a missing end becoming INT64_MAX."""
    start = 0 if a["start"] is None else a["start"]
    end = INT64_MAX if a["end"] is None else a["end"]
    ins = [lo.tensor(a["input"]), lo.ints([start]), lo.ints([end]), lo.ints([a["dim"]])]
    lo.emit("Slice", ins + [lo.ints([a["step"]])])


def select(lo: Lowering, a: dict) -> None:
    """select(dim, i) = Gather(x, i, axis=dim) with a 0-d index (the axis goes away)."""
    if not isinstance(a["index"], int):
        raise Unmapped("symbolic index")
    idx = lo.constant(np.asarray(a["index"], dtype=np.int64))
    lo.emit("Gather", [lo.tensor(a["input"]), idx], {"axis": int(a["dim"])})


def index(lo: Lowering, a: dict) -> None:
    """x[idx] for a tuple of slices, None, Ellipsis and ints (basic indexing; tensor indices
    stay opaque): one Slice over the axes with a non-trivial slice, a Gather per int (from the
    last axis down, so earlier axes keep their numbers), then one Unsqueeze for the Nones."""
    x, idx = a["input"], a["index"]
    items = list(idx) if isinstance(idx, tuple) else [idx]
    if not all(
        i is None
        or i is Ellipsis
        or isinstance(i, slice)
        or (isinstance(i, int) and not isinstance(i, bool))
        for i in items
    ):
        raise Unmapped("advanced indexing")
    rank, consuming = lo.rank(x), sum(1 for i in items if i is not None and i is not Ellipsis)
    if items.count(Ellipsis) > 1 or consuming > rank:
        raise Unmapped("index")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items[at : at + 1] = [slice(None)] * (rank - consuming)
    else:
        items += [slice(None)] * (rank - consuming)
    slices, ints, nones, axis, out_axis = [], [], [], 0, 0
    for i in items:
        if i is None:
            nones.append(out_axis)
            out_axis += 1
            continue
        if isinstance(i, slice):
            if i != slice(None):
                slices.append((axis, i))
            out_axis += 1
        else:
            ints.append((axis, i))
        axis += 1
    y = lo.tensor(x)
    if slices:
        y = _slice(lo, y, slices)
    for ax, i in reversed(ints):
        y = lo.emit("Gather", [y, lo.constant(np.asarray(i, dtype=np.int64))], {"axis": ax})
    if nones:
        y = lo.emit("Unsqueeze", [y, lo.ints(nones)])
    if not (slices or ints or nones):
        lo.emit("Identity", [y])


def _slice(lo: Lowering, x: int, slices) -> int:
    starts, ends, steps = [], [], []
    for _, s in slices:
        step = 1 if s.step is None else s.step
        if not isinstance(step, int) or step <= 0:
            raise Unmapped("slice step")
        starts.append(0 if s.start is None else s.start)
        ends.append(INT64_MAX if s.stop is None else s.stop)
        steps.append(step)
    axes = [ax for ax, _ in slices]
    return lo.emit("Slice", [x, lo.ints(starts), lo.ints(ends), lo.ints(axes), lo.ints(steps)])


def split_item(lo: Lowering, a: dict) -> None:
    """Item `item` of split(x, size | sizes, dim) or chunk(x, chunks, dim): output `item` of
    ONNX Split along dim (`Split#K` for item K >= 1, vocab.ops), every item of one call being
    the same Split application. Equal items are `num_outputs` (Split-18), others the `split`
    sizes input. torch's items (torch.split, torch.chunk docs): `size` long each, the last
    shorter; chunk's size is ceil(length / chunks), so it may give fewer items than `chunks`.
    When the length along dim is symbolic, or the items are more than Split's output slots in
    the op table (8), item `item` is a Slice instead; a size or count that is not a Python int
    stays opaque."""
    sizes = _split_sizes(lo, a)
    if sizes is not None and len(sizes) <= OPS.get("Split").n_outputs:
        _split(lo, a["input"], sizes, a["dim"] % lo.rank(a["input"]), a["item"])
        return
    x, dim, item = a["input"], a["dim"], a["item"]
    if "chunks" in a:
        length = lo.shape(x)[dim]
        size = -(-length // a["chunks"])
        sizes = [size] * (-(-length // size))
    elif isinstance(a["split_size"], int):
        sizes = None
    else:
        sizes = list(a["split_size"])
    if sizes is None:
        start, end = item * a["split_size"], (item + 1) * a["split_size"]
    else:
        if not all(isinstance(s, int) for s in sizes) or item >= len(sizes):
            raise Unmapped("symbolic split sizes")
        start, end = sum(sizes[:item]), sum(sizes[: item + 1])
    if not (isinstance(start, int) and isinstance(end, int) and isinstance(dim, int)):
        raise Unmapped("symbolic split")
    _slice(lo, lo.tensor(x), [(dim % lo.rank(x), slice(start, end))])


def unbind_item(lo: Lowering, a: dict) -> None:
    """Item `item` of unbind(x, dim) (torch: the slices x.select(dim, i)): output `item` of a
    Split of dim into pieces of 1, with dim squeezed (ONNX Squeeze); a Gather of index `item`
    on dim (what `select` lowers to) when the length along dim is symbolic or above Split's
    output slots (8)."""
    x, dim, item = a["input"], a["dim"], a["item"]
    sizes = _split_sizes(lo, {**a, "split_size": 1})
    if not isinstance(dim, int) or not isinstance(item, int):
        raise Unmapped("symbolic unbind")
    axis = dim % lo.rank(x)
    if sizes is None or len(sizes) > OPS.get("Split").n_outputs:
        select(lo, {"input": x, "dim": axis, "index": item})
        return
    lo.emit("Squeeze", [_split(lo, x, sizes, axis, item), lo.ints([axis])])


def _split_sizes(lo: Lowering, a: dict) -> list[int] | None:
    """The lengths of the items torch's split/chunk give along a["dim"] (see `split_item`);
    None when the length along dim, the size or the count is not a number, or is 0."""
    x, dim = a["input"], a["dim"]
    shape = lo.type(x).shape
    if not isinstance(dim, int) or not shape:
        return None
    length = shape[dim % len(shape)]
    if not _literal(length) or length == 0:
        return None
    if "chunks" in a:
        size = -(-length // a["chunks"]) if _literal(a["chunks"]) and a["chunks"] > 0 else None
    elif _literal(a["split_size"]):
        size = a["split_size"]
    else:
        sizes = list(a["split_size"])
        return sizes if all(_literal(s) for s in sizes) and sum(sizes) == length else None
    if size is None or size <= 0:
        return None
    return [min(size, length - start) for start in range(0, length, size)]


def _split(lo: Lowering, x, sizes: list[int], axis: int, item: int) -> int:
    """Output `item` of Split(x) into `sizes` along `axis` (non-negative, so that it equals the
    axis of a Concat lowered from torch.cat)."""
    op = "Split" if item == 0 else f"Split#{item}"
    if len(set(sizes)) == 1:
        return lo.emit(op, [lo.tensor(x)], {"axis": axis, "num_outputs": len(sizes)})
    return lo.emit(op, [lo.tensor(x), lo.ints(sizes)], {"axis": axis})


def first_output(lower, why: str):
    """The handler for item `item` of an op returning a tuple whose item 0 is what `lower`
    emits (native batch norm: y; max_pool2d_with_indices: values); the other items raise
    Unmapped with `why` (they have no exact canonical form)."""

    def item(lo: Lowering, a: dict) -> None:
        if a["item"] != 0:
            raise Unmapped(f"output {a['item']}: {why}")
        lower(lo, a)

    return item


def concat(lo: Lowering, a: dict) -> None:
    """cat(tensors, dim): Concat(axis=dim, non-negative) of at most the op table's slots for
    Concat's variadic input (8); the tensors and the result of one dtype and one rank (torch
    also skips 1-D empty tensors, which ONNX does not)."""
    xs = a["tensors"]
    if not isinstance(xs, (list, tuple)) or not 1 <= len(xs) <= OPS.get("Concat").arity:
        raise Unmapped("number of tensors")
    if not all(isinstance(x, fx.Node) for x in xs) or _same_dtype(lo, *xs) != lo.out_dtype:
        raise Unmapped("dtype")
    rank = lo.rank(xs[0])
    if rank == 0 or any(lo.rank(x) != rank for x in xs) or not isinstance(a["dim"], int):
        raise Unmapped("ranks differ")
    lo.emit("Concat", [lo.tensor(x) for x in xs], {"axis": a["dim"] % rank})


# ops whose result depends on their input's strides, not only its values (a view of another
# shape is written as reshape, which does not)
_LAYOUT_READERS = {
    "as_strided",
    "as_strided_",
    "view_as",
    "stride",
    "is_contiguous",
    "data_ptr",
    "storage_offset",
    "untyped_storage",
    "numpy",
    "set_",
    "resize_",
}


def contiguous(lo: Lowering, a: dict) -> None:
    """x.contiguous(): the same values (a copy in another layout, or x itself): Identity. Export
    writes `reshape`, never `view`, so no later view depends on the layout (a copied view too,
    `exporter._as_reshape`). It stays a `contiguous` call where the layout may matter: a graph
    output (the caller gets a tensor of its own, not a view of an input it could write
    through), a value that reaches one through ops that keep its layout
    (`_output_in_its_layout`), and a reader of the layout (`as_strided`, `view_as`, `stride()`, ...:
    `_LAYOUT_READERS`) or a view of another dtype."""
    if a.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        raise Unmapped("memory format")
    if any(u.op == "output" for u in lo.node.users):
        raise Unmapped("a graph output: its own memory, contiguous")
    for u in lo.node.users:  # a reader of the layout itself, a view of another dtype
        name = _target_name(u)
        given = (*u.args[1:], *u.kwargs.values())
        if set(name.split(".")) & _LAYOUT_READERS or any(isinstance(a, torch.dtype) for a in given):
            raise Unmapped(f"read by {name}, which depends on the layout")
    if _output_in_its_layout(lo.node):
        raise Unmapped("a graph output is laid out as it is: contiguous")
    lo.emit("Identity", [lo.tensor(a["input"])])


# ops whose result is laid out afresh, row-major, whatever their input's strides: the layout a
# `contiguous` before them gives reaches no caller through them. Not reshape, view or flatten
# (a view of a strided tensor where its strides allow one), nor conv or cat (they keep
# channels_last), nor reductions (their result follows the input's order): the review found
# reshape and a channels_last conv here first
_FRESH_LAYOUT = {"matmul", "mm", "bmm", "linear", "addmm", "embedding"}


def _target_name(u: fx.Node) -> str:
    """What `u` calls, as `_LAYOUT_READERS` and `_FRESH_LAYOUT` name it: an ATen overload's
    dotted name, a function's or method's name, a submodule's class (lower case)."""
    if u.op == "call_module" and u.graph.owning_module is not None:
        return type(u.graph.owning_module.get_submodule(u.target)).__name__.lower()
    if isinstance(u.target, torch._ops.OpOverload):
        return str(u.target)
    return u.target if isinstance(u.target, str) else getattr(u.target, "__name__", "")


def _output_in_its_layout(node: fx.Node, limit: int = 64) -> bool:
    """True when `node`'s value may reach a graph output through ops that keep its strides
    (torch lays an elementwise op's result out as its input): x.transpose(1, 2).contiguous()
    * 2 + 1 is contiguous in eager and had the transposed strides once the contiguous went, so
    a caller's `out.view(-1)` failed. Ops of `_FRESH_LAYOUT` stop the walk; an unknown op
    continues it, and a walk longer than `limit` nodes says True (the copy stays, as in eager)."""
    seen: set[fx.Node] = set()
    stack = [node]
    while stack:
        for u in stack.pop().users:
            if u.op == "output":
                return True
            if u in seen or set(_target_name(u).split(".")) & _FRESH_LAYOUT:
                continue
            seen.add(u)
            if len(seen) > limit:
                return True
            stack.append(u)
    return False


def repeat(lo: Lowering, a: dict) -> None:
    """x.repeat(r): Tile(x, r) when r has one entry per axis (torch also prepends axes)."""
    reps = _dims(a["repeats"])
    if len(reps) != lo.rank(a["input"]):
        raise Unmapped("repeat adds axes")
    lo.emit("Tile", [lo.tensor(a["input"]), lo.ints(reps)])


# ---- quantization: PyTorch 2 export quantization's decomposed ops ------------------------------
# `quantize_pt2e` (torchao) leaves quantized_decomposed.quantize_per_tensor / dequantize_per_tensor
# around activations and dequantize_per_channel on int8 weights. Their semantics (torch/ao/
# quantization/fx/_decomposed.py): quantize = clamp(round(x * (1 / scale)) + zero_point, quant_min,
# quant_max) in the 8-bit dtype, rounding half to even; dequantize = (q - zero_point) * scale in
# float32. ONNX QuantizeLinear divides by the scale where torch multiplies by its inverse: the
# two round apart at the rare x whose x / s lies within an ulp of a tie. The rules that rewrite a
# QuantizeLinear (patterns/quant/qdq.rules) rest on what both forms have, that it is
# non-decreasing and that Q(DQ(q)) = q, and export writes torch's op back.

_QUANT_DTYPES = (torch.uint8, torch.int8)


def _quant_dtype(a: dict) -> torch.dtype:
    """The 8-bit dtype of a quantized_decomposed op, whose quant range must be that dtype's
    whole range (ONNX saturates to the output type: a range such as [-127, 127] has no
    QuantizeLinear form)."""
    dt = a["dtype"]
    if dt not in _QUANT_DTYPES:
        raise Unmapped(f"quantized dtype {dt}")
    info = torch.iinfo(dt)
    if (a["quant_min"], a["quant_max"]) != (info.min, info.max):
        raise Unmapped("a quant range narrower than its dtype's")
    return dt


def _scale(lo: Lowering, s) -> int:
    """A scale: a Python float as a float32 constant (torch multiplies a float32 tensor by it in
    float32), or a float32 tensor."""
    if isinstance(s, float):
        return lo.constant(np.asarray(s, dtype=np.float32))
    if isinstance(s, fx.Node) and lo.dtype(s) == torch.float32:
        return lo.tensor(s)
    raise Unmapped("a scale that is not float32")


def _zero_point(lo: Lowering, z, dt: torch.dtype) -> int:
    """A zero point in the quantized dtype: a Python int as a constant, an integer tensor (int64
    in PT2E graphs) cast to it (its values lie in the quant range)."""
    np_dt = np.uint8 if dt == torch.uint8 else np.int8
    if isinstance(z, int) and not isinstance(z, bool):
        info = np.iinfo(np_dt)
        if not info.min <= z <= info.max:
            raise Unmapped("zero point outside the dtype")
        return lo.constant(np.asarray(z, dtype=np_dt))
    if isinstance(z, fx.Node) and lo.dtype(z) in (torch.int64, torch.int32):
        return lo.emit("Cast", [lo.tensor(z)], {"to": elem(dt)})
    raise Unmapped("zero point")


def _quant_op(op: str, per_channel: bool, lo: Lowering, a: dict, dt: torch.dtype) -> None:
    """Emit QuantizeLinear or DequantizeLinear of the input with the op's scale(s) and zero
    point(s) (along `axis` for the per-channel ops)."""
    scale = _scale(lo, a["scales" if per_channel else "scale"])
    zp = _zero_point(lo, a["zero_points" if per_channel else "zero_point"], dt)
    attrs = {"axis": a["axis"] % max(lo.rank(a["input"]), 1)} if per_channel else {}
    lo.emit(op, [lo.tensor(a["input"]), scale, zp], attrs)


def quantize(per_channel: bool):
    """quantize_per_tensor / quantize_per_channel: QuantizeLinear of a float32 input."""

    def lower(lo: Lowering, a: dict) -> None:
        dt = _quant_dtype(a)
        if lo.dtype(a["input"]) != torch.float32 or lo.out_dtype != dt:
            raise Unmapped("input dtype")
        _quant_op("QuantizeLinear", per_channel, lo, a, dt)

    return lower


def dequantize(per_channel: bool):
    """dequantize_per_tensor / dequantize_per_channel: DequantizeLinear to float32."""

    def lower(lo: Lowering, a: dict) -> None:
        dt = _quant_dtype(a)
        if lo.dtype(a["input"]) != dt or a.get("out_dtype") not in (None, torch.float32):
            raise Unmapped("dtypes")
        if lo.out_dtype != torch.float32:
            raise Unmapped("output dtype")
        _quant_op("DequantizeLinear", per_channel, lo, a, dt)

    return lower
