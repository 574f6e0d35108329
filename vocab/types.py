"""Tensor types and per-e-class facts shared by the engine, guards and cost model.

A `TensorType` is an ONNX element type (`onnx.TensorProto.FLOAT`, ...) plus a shape whose
dimensions are ints (static), strings (symbolic) or None (unknown); `shape is None` means even
the rank is unknown. A `ClassInfo` is what a guard sees of an e-class: its type and, for a
constant, its value.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

Dim = int | str | None


@dataclass(frozen=True)
class TensorType:
    """dtype: ONNX TensorProto element type (0 when unknown). shape: dims, or None if unknown."""

    dtype: int = 0
    shape: tuple[Dim, ...] | None = None

    @property
    def rank(self) -> int | None:
        """Number of dimensions, or None if the shape is unknown."""
        return None if self.shape is None else len(self.shape)

    @property
    def static(self) -> bool:
        """True when every dimension is a known int."""
        return self.shape is not None and all(isinstance(d, int) for d in self.shape)

    @property
    def numel(self) -> int | None:
        """Number of elements, or None if the shape is not static."""
        return math.prod(self.shape) if self.static else None

    @property
    def itemsize(self) -> int:
        """Bytes per element (4 when the dtype is unknown)."""
        return _itemsize(self.dtype) if self.dtype else 4

    @property
    def nbytes(self) -> int | None:
        """Size in bytes (numel * itemsize), or None if the shape is not static."""
        n = self.numel
        return None if n is None else n * self.itemsize

    def __str__(self) -> str:
        name = onnx.TensorProto.DataType.Name(self.dtype).lower() if self.dtype else "?"
        dims = (
            "?"
            if self.shape is None
            else ",".join("?" if d is None else str(d) for d in self.shape)
        )
        return f"{name}[{dims}]"


UNKNOWN = TensorType()


@functools.cache
def _itemsize(elem_type: int) -> int:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).itemsize
    except (KeyError, TypeError):  # e.g. string tensors
        return 4


@dataclass(frozen=True, eq=False)
class ClassInfo:
    """What a guard or builder sees of a captured e-class.

    type: the class's tensor type (every e-node of a class has the same type).
    value: the constant's value (numpy array) when the class holds an imported constant
        (or a 2-D Transpose of one, a read-only view: a bias-less Gemm's transB = 1 weight as
        its MatMul reads it), else None. Other computed constants (e.g. a folded BatchNorm
        weight) have no value until constant folding runs after extraction.
    """

    type: TensorType
    value: np.ndarray | None = None

    @property
    def is_constant(self) -> bool:
        """True when the class holds an imported constant, i.e. `value` is known."""
        return self.value is not None


def np_dtype(elem_type: int) -> np.dtype:
    """numpy dtype of an ONNX element type."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def onnx_dtype(dtype: np.dtype) -> int:
    """ONNX element type of a numpy dtype."""
    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def tensor_type(tp: onnx.TypeProto) -> TensorType:
    """TensorType of an ONNX TypeProto (unknown for non-tensor types)."""
    if not tp.HasField("tensor_type"):
        return TensorType()
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return TensorType(tt.elem_type, None)
    dims = []
    for d in tt.shape.dim:
        if d.HasField("dim_value"):
            dims.append(int(d.dim_value))
        elif d.HasField("dim_param"):
            dims.append(d.dim_param)
        else:
            dims.append(None)
    return TensorType(tt.elem_type, tuple(dims))


def keep_input_dims(t: TensorType, inputs) -> TensorType:
    """`t` (inferred by ONNX shape inference on a small model built for it) with every
    dimension name that no type in `inputs` carries made unknown: a name ONNX made up
    (unk__0, ...) is fresh in that one model only, and means another size elsewhere."""
    if t.shape is None:
        return t
    known = {d for i in inputs if i is not None and i.shape for d in i.shape if isinstance(d, str)}
    return TensorType(
        t.dtype, tuple(None if isinstance(d, str) and d not in known else d for d in t.shape)
    )
