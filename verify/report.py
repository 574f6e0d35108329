"""Text of a counterexample: the drawn inputs, both sides, their outputs, the verdict."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from verify.check import EXECUTORS, Outcome
from verify.instance import Instance

_MAX_ITEMS = 24


def array_text(a) -> str:
    """`float32[2,3] [[...]]`: dtype, shape and (up to a few dozen) values."""
    a = np.asarray(a)
    values = np.array2string(
        a,
        threshold=_MAX_ITEMS,
        separator=", ",
        max_line_width=10_000,
        precision=9,
        floatmode="maxprec",
    )
    return f"{a.dtype}[{','.join(map(str, a.shape))}] {values}"


def graph_text(model: onnx.ModelProto) -> list[str]:
    """One line per node: `out = Op<attr=value>(inputs)`."""
    lines = []
    for n in model.graph.node:
        attrs = ", ".join(f"{a.name}={_attr(a)}" for a in n.attribute)
        lines.append(
            f"{', '.join(n.output)} = {n.op_type}{f'<{attrs}>' if attrs else ''}"
            f"({', '.join(n.input)})"
        )
    return lines


def _attr(a: onnx.AttributeProto) -> str:
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return repr(v.decode())
    if isinstance(v, onnx.TensorProto):
        return array_text(onnx.numpy_helper.to_array(v))
    return repr(list(v) if isinstance(v, (list, tuple)) else v)


def instance_text(inst: Instance) -> list[str]:
    """The drawn example: opset, leaves with dtype, shape, role and values; attributes."""
    ex = inst.example
    lines = [f"opset {ex.opset}"]
    width = max([len(n) for n in ex.leaves] + [1])
    for leaf in ex.leaves.values():
        if leaf.absent:
            lines.append(f"{leaf.name:<{width}}  absent")
            continue
        role = "constant" if leaf.const else "input   "
        lines.append(f"{leaf.name:<{width}}  {role}  {array_text(leaf.value)}")
    for name, value in inst.attrs.items():
        lines.append(f"@{name} = {value!r}")
    return lines


def outcome_text(out: Outcome) -> list[str]:
    """Both sides' outputs per executor, the errors and the tolerance."""
    lines = []
    for ex in EXECUTORS:
        for side in ("left", "right"):
            values = out.outputs.get((side, ex))
            if values is not None:
                shown = "; ".join(array_text(v) for v in values)
                lines.append(f"{side:<5} on {ex:<14}  {shown}")
    d = out.worst
    if out.diffs:
        lines.append(
            f"max abs error {d.max_abs:.3g}, max rel error {d.max_rel:.3g}; "
            f"tolerance: {out.tolerance or 'exact'}"
            + (f" with S = {out.scale:.3g}" if "S)" in out.tolerance else "")
        )
    lines += [f"note: {n}" for n in out.notes]
    return lines


def failure_text(check: str, reason: str, inst: Instance, out: Outcome | None, extra=()) -> str:
    """The whole counterexample of one failed check."""
    lines = [f"check: {check}", f"reason: {reason}", "counterexample (shrunk):"]
    lines += ["  " + s for s in instance_text(inst)]
    lines.append("  left side:")
    lines += ["    " + s for s in graph_text(inst.lhs)]
    if inst.rhs is not None:
        lines.append("  right side:")
        lines += ["    " + s for s in graph_text(inst.rhs)]
    lines += ["  " + s for s in extra]
    if out is not None:
        lines += ["  " + s for s in outcome_text(out)]
    return "\n".join(lines)
