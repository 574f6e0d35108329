"""The `every value` checks of quantization rules: 8-bit (and 4-bit) inputs of every value,
rounding ties, saturation.

A drawn example of a rule that quantizes (an op of `vocab.ops.FAMILIES["QUANTIZED"]` on
either side) is run on a series of feeds instead of one (`sweep_feeds`):

- every int8 / uint8 graph input takes each of the 256 values of its type at least once
  (element j of step i holds value number (i * size + j) mod 256, so a 1-element input
  needs 256 steps, a 64-element one 4); an int4 / uint4 input each of its 16 (the `every
  4-bit value` check, whose examples draw 4-bit types where the schemas allow them, from
  opset 21: onnxruntime's Python API takes no int4 input, so onnx.reference alone runs them);
- every float graph input runs through the grid k / 4 for k in [-512, 512), in a strided
  order (a 1-element input's 256 steps spread over the whole grid): with the
  scales the `grid` value mode draws (powers of two from 2^-4 to 2^4, `verify.values`),
  x / s lands on every half-integer of the 8-bit range and beyond it, so QuantizeLinear
  rounds ties (half to even, ONNX QuantizeLinear-21) and saturates at both ends.

The model is the drawn one throughout (only the inputs change): constants (zero points,
per-tensor scales) vary between Hypothesis's examples instead. `quantize_events` counts,
from the reference's intermediate values of the side that quantizes (the left side, else the
right), the ties and saturated elements each QuantizeLinear saw, so that the check can show
they happened.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnx.numpy_helper
from onnx import TensorProto as TP

from verify.dtypes import FLOATS, FOUR_BIT, int_bounds_of, np_type

GRID = 1024  # float grid points: k / 4 for k in [-512, 512)
MAX_STEPS = 256
_STRIDE = 389  # odd, so k -> k * _STRIDE mod GRID is a permutation of the grid
# swept dtype -> (its lowest value, how many values it has)
_SWEPT_INTS = {TP.INT8: (-128, 256), TP.UINT8: (0, 256), TP.INT4: (-8, 16), TP.UINT4: (0, 16)}
# the dtypes a sweep varies: what a `grid` draw picks wherever the schemas allow (`verify.draw`)
SWEPT_DTYPES = frozenset({TP.INT8, TP.UINT8}) | FLOATS
SWEPT_4BIT = frozenset(FOUR_BIT) | FLOATS  # the same for a `grid4` draw
FOUR_BIT_OPSET = 21  # the first opset whose QuantizeLinear / DequantizeLinear take int4


def sweepable(leaves: dict, feeds: dict[str, np.ndarray]) -> bool:
    """True if the example has something to sweep: a non-empty 8-bit (or 4-bit) integer or
    float graph input (an example whose inputs are all constants, empty or indices sweeps
    nothing)."""
    return any(
        v.size
        and not leaves[n].const
        and (leaves[n].dtype in _SWEPT_INTS or leaves[n].dtype in FLOATS)
        for n, v in feeds.items()
        if n in leaves
    )


def sweep_feeds(leaves: dict, feeds: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The feeds of one swept example (see module doc). `leaves`: the example's leaves
    (`verify.node.Leaf`: name, dtype, shape, const); `feeds`: its drawn feeds, which the
    steps start from. At most `MAX_STEPS` steps; at least one."""
    ints, floats = [], []
    for name, v in feeds.items():
        leaf = leaves.get(name)
        if leaf is None or leaf.const or v.size == 0:
            continue
        if leaf.dtype in _SWEPT_INTS:
            ints.append(name)
        elif leaf.dtype in FLOATS:
            floats.append(name)
    steps = max(
        [math.ceil(_SWEPT_INTS[leaves[n].dtype][1] / feeds[n].size) for n in ints], default=1
    )
    if not ints and floats:
        steps = max(math.ceil(GRID / feeds[n].size) for n in floats)
    steps = min(steps, MAX_STEPS)
    out = []
    for i in range(steps):
        step = dict(feeds)
        for k, name in enumerate(ints):
            v = feeds[name]
            lo, levels = _SWEPT_INTS[leaves[name].dtype]
            idx = (i * v.size + np.arange(v.size) + 37 * k) % levels
            step[name] = (idx + lo).astype(v.dtype).reshape(v.shape)
        for k, name in enumerate(floats):
            v = feeds[name]
            # an odd stride: any run of steps spreads over the whole grid
            idx = ((i * v.size + np.arange(v.size) + 101 * k) * _STRIDE) % GRID
            step[name] = ((idx - GRID // 2) / 4).astype(v.dtype).reshape(v.shape)
        out.append(step)
    return out


def quantize_events(model: onnx.ModelProto, values: dict) -> tuple[int, int]:
    """(rounding ties, saturated elements) of the QuantizeLinear nodes of `model`, from the
    reference's values of every name (`values`). A tie is an x / s exactly halfway between
    two integers; an element saturates when round(x / s) + zero point is outside its type's
    range (ONNX QuantizeLinear-21). Nodes whose values are missing (the reference did not
    run), float8 or blocked quantizations are not counted."""
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    ties = saturated = 0
    for n in model.graph.node:
        if n.op_type != "QuantizeLinear" or n.domain not in ("", "ai.onnx"):
            continue
        got = [values.get(name, inits.get(name)) if name else None for name in n.input]
        got += [None] * (3 - len(got))
        x, s, zp = got
        if x is None or s is None:
            continue
        x, s = np.asarray(x, np.float64), np.asarray(s, np.float64)
        zp = np.zeros((), np.uint8) if zp is None else np.asarray(zp)
        bounds = int_bounds_of(zp.dtype)
        if bounds is None or zp.dtype.itemsize != 1:
            continue
        axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
        if s.ndim == 1 and x.ndim:  # per-axis: s runs along `axis`
            shape = [1] * x.ndim
            shape[axis % x.ndim] = s.size
            s, zp = s.reshape(shape), zp.reshape(shape)
        with np.errstate(all="ignore"):
            r = x / s
            finite = np.isfinite(r)
            ties += int(np.sum(finite & (np.abs(r - np.floor(r) - 0.5) == 0)))
            q = np.rint(np.where(finite, r, 0)) + zp.astype(np.float64)
        saturated += int(np.sum(finite & ((q < bounds[0]) | (q > bounds[1]))))
    return ties, saturated


def swept_text(step: dict[str, np.ndarray], leaves: dict) -> list[str]:
    """Lines naming the swept inputs of a failing step, for the counterexample."""
    lines = ["swept inputs (the `every value` check's failing step):"]
    for name, v in step.items():
        leaf = leaves.get(name)
        if leaf is not None and not leaf.const:
            flat = np.asarray(v).reshape(-1)
            lines.append(f"  {name}: {np_type(leaf.dtype).name}{list(v.shape)} = {flat.tolist()}")
    return lines
