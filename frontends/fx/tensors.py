"""Tensors between torch and the engine: dtypes, types from example values, array conversion.

The engine speaks ONNX element types (`onnx.TensorProto.FLOAT`, ...) and numpy arrays; torch
speaks `torch.dtype` and tensors. bfloat16 has no numpy dtype of its own; `ml_dtypes.bfloat16`
(an onnx dependency) stands in, bit for bit.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
from onnx import TensorProto

from vocab.types import UNKNOWN, TensorType

_TO_ONNX = {
    torch.float32: TensorProto.FLOAT,
    torch.float64: TensorProto.DOUBLE,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
    torch.int8: TensorProto.INT8,
    torch.int16: TensorProto.INT16,
    torch.int32: TensorProto.INT32,
    torch.int64: TensorProto.INT64,
    torch.uint8: TensorProto.UINT8,
    torch.bool: TensorProto.BOOL,
}
_TO_TORCH = {v: k for k, v in _TO_ONNX.items()}
FLOATS = {torch.float32, torch.float64, torch.float16, torch.bfloat16}


def onnx_elem(dtype: torch.dtype) -> int:
    """ONNX element type of a torch dtype; 0 (unknown) for dtypes ONNX lacks (complex, ...)."""
    return _TO_ONNX.get(dtype, 0)


def torch_dtype(elem: int) -> torch.dtype:
    """torch dtype of an ONNX element type. Raises KeyError for types torch lacks."""
    return _TO_TORCH[elem]


def type_of(value) -> TensorType:
    """TensorType of an example value (tensor or fake tensor); UNKNOWN for anything else.

    Symbolic dimensions (SymInt, from dynamic shapes) become strings such as "s0".
    """
    if not isinstance(value, torch.Tensor):
        return UNKNOWN
    dims = tuple(int(d) if isinstance(d, int) or _static(d) else str(d) for d in value.shape)
    return TensorType(onnx_elem(value.dtype), dims)


def _static(d) -> bool:
    """Is `d` a plain int? Never `int(d)` a SymInt that is not a constant: that guards on its
    example value and so specializes the symbol in the program's shape environment (every
    later reader of the graph's metadata then sees the example size)."""
    return not isinstance(d, torch.SymInt) or d.node.is_constant()


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A numpy view (or CPU copy) of a tensor, bfloat16 as ml_dtypes.bfloat16. Grad is dropped."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A tensor with the array's values and dtype (a copy; ml_dtypes.bfloat16 -> bfloat16)."""
    a = np.asarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(a).view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True))


def scalar_array(value, dtype: torch.dtype) -> np.ndarray:
    """A 0-d array holding a Python scalar in `dtype` (as torch would convert it)."""
    return to_numpy(torch.tensor(value, dtype=dtype))
