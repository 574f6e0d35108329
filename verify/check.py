"""Run a left side and a right side on both executors and decide.

The verdict of one example (`Outcome.status`):

- `reject`: the left side is not a valid computation on these values: onnxruntime, which
  checks models strictly, rejects it, or it divides an integer by zero. The example is
  dropped. onnxruntime having no kernel for an (op, dtype) is not a reason: that example is
  compared on `onnx.reference` alone, with a note; likewise a left side only the reference
  cannot run (it has no negative pads, for one) is compared on onnxruntime alone.
- `fail`: the sides differ on every executor that ran both, or the right side cannot run
  (or divides by zero) where the left side can. This is a wrong rule.
- `ok`: the sides agree on at least one executor. If another executor says they differ, or
  the executors disagree about the left side itself, that is an executor bug and is kept as
  a note, not as a rule failure. A `quant` rule's bound must hold on every executor that ran
  both sides: runtimes' integer kernels differ (onnxruntime's saturate on some CPUs), and
  where they break the bound the rule is wrong for that runtime.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from verify.compare import FLOAT_TYPES, Diff, Tolerance, compare, scale_of, tolerance, worst
from verify.execute import ExecError, hazard, is_random, run_ort, run_reference
from vocab.registry import int8_sums_in_int32

EXECUTORS = ("onnxruntime", "onnx.reference")
# the note of an example whose sides differ on some executors only (`verify.cli` shows it)
ALONE_SEES, ALONE_SEES_END = "executors disagree: only ", " sees the sides differ"


@dataclass
class Outcome:
    """One example's verdict (see module doc). outputs: (side, executor) -> output arrays;
    diffs: executor -> worst Diff of the sides; notes: executor problems seen."""

    status: str
    reason: str = ""
    diffs: dict[str, Diff] = field(default_factory=dict)
    outputs: dict[tuple[str, str], list[np.ndarray]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tolerance: str = ""
    scale: float = 0.0
    left_values: dict = field(default_factory=dict)  # the reference's values on the left side
    right_values: dict = field(default_factory=dict)  # and on the right side

    @property
    def worst(self) -> Diff:
        """The diff with the largest error over all outputs and executors (a failing one first,
        see `verify.compare.worst`)."""
        return worst(list(self.diffs.values()))


def run_both(
    lhs: onnx.ModelProto,
    rhs: onnx.ModelProto,
    feeds: dict,
    mode: str,
    fp: str,
    limit: np.ndarray | dict | None = None,
    unjudged: dict[str, str] | None = None,
) -> Outcome:
    """Run both sides on both executors and compare (`mode`: `bitwise` or `scaled`, see
    `verify.compare`; `fp`: the rule's numeric class; `limit`: a `quant` rule's bound (or a
    dict of it by output name, the other outputs compared at the class's tolerance), the
    largest |lhs - rhs| per element of its one output, in place of the class's tolerance;
    `unjudged`: executor -> why its comparison is a note, not a verdict (`unjudged`))."""
    out = Outcome("ok")
    if is_random(lhs):
        return Outcome("reject", "the left side is random (Dropout in training mode)")
    if is_random(rhs):
        return _fail(
            out, "the right side is random (Dropout in training mode) where the left side is not"
        )
    values: list[dict] = [feeds]
    why = _left(out, lhs, feeds, values)
    if why:
        return Outcome("reject", f"left side: {why}")
    why = _right(out, rhs, feeds, values)
    if why:
        return _fail(out, why)
    out.scale = scale_of(*values)
    return _judge(out, lhs, mode, fp, limit, unjudged)


def _left(out: Outcome, lhs: onnx.ModelProto, feeds: dict, values: list) -> str | None:
    """Run the left side where it runs; the reason it is not a valid example, or None.

    onnxruntime checks models strictly, so an error there (other than a missing kernel)
    makes the example invalid; an error of the reference alone is the reference's limit
    (e.g. negative pads), and the example is compared on onnxruntime only."""
    try:
        out.outputs[("left", "onnx.reference")], left_values = run_reference(lhs, feeds)
        values.append(left_values)
        out.left_values = left_values
        why = hazard(lhs, left_values)
        if why:
            return why
    except ExecError as e:
        if any(n.op_type in ("Div", "Mod", "ReduceMean") for n in lhs.graph.node):
            return f"{e} (and no intermediate values to rule out an integer division by zero)"
        out.notes.append(f"left side not run on {e}")
    try:
        out.outputs[("left", "onnxruntime")] = run_ort(lhs, feeds)
    except ExecError as e:
        if e.kind != "no-kernel" or ("left", "onnx.reference") not in out.outputs:
            return str(e)
        out.notes.append(f"left side not run on {e}")
    return None


def _right(out: Outcome, rhs: onnx.ModelProto, feeds: dict, values: list) -> str | None:
    """Run the right side on the executors that ran the left side (the reference first, so
    that its values rule out a division by zero before onnxruntime runs); why the rule is
    wrong, or None."""
    risky = _integer_division(rhs)
    if ("left", "onnx.reference") in out.outputs:
        try:
            out.outputs[("right", "onnx.reference")], right_values = run_reference(rhs, feeds)
            values.append(right_values)
            out.right_values = right_values
            why = hazard(rhs, right_values)
            if why:
                return f"the right side has an {why} where the left side has none"
        except ExecError as e:
            out.notes.append(f"right side not run on {e}")
    checked = ("right", "onnx.reference") in out.outputs or not risky
    if ("left", "onnxruntime") in out.outputs and checked:
        try:
            out.outputs[("right", "onnxruntime")] = run_ort(rhs, feeds)
        except ExecError as e:
            if e.kind != "no-kernel":
                return f"onnxruntime cannot run the right side, only the left: {e.message}"
            out.notes.append(f"right side not run on {e}")
    if not any(side == "right" for side, _ in out.outputs):
        return "no executor runs the right side where the left side runs"
    return None


def _integer_division(model: onnx.ModelProto) -> bool:
    """True if `model` may divide integers (Div, Mod or ReduceMean of a non-float or unknown
    type, by ONNX shape inference): onnxruntime dies of SIGFPE on an integer division by zero,
    so such a side runs there only after the reference has ruled it out."""
    ops = ("Div", "Mod", "ReduceMean")
    if not any(n.op_type in ops for n in model.graph.node):
        return False
    try:
        g = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # any inference failure: assume the worst
        return True
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.value_info, *g.output, *g.input)}
    return any(
        n.op_type in ops and types.get(n.output[0]) not in FLOAT_TYPES for n in model.graph.node
    )


def unjudged(rules) -> dict[str, str]:
    """Executors whose comparison does not decide for `rules` on this machine, and why: a
    ruleset with `:sums int32` is for runtimes that sum uint8-by-int8 products in int32, which
    onnxruntime on an x86 CPU without VNNI does not (`vocab.registry.int8_sums_in_int32`);
    there its results are checked on onnx.reference (exact int32 sums) alone."""
    if any(r.sums == "int32" for r in rules) and not int8_sums_in_int32():
        return {
            "onnxruntime": "its uint8-by-int8 kernels add int16 pairs on this CPU (no VNNI); "
            "the rule is for CPUs that sum in int32 (:sums int32)"
        }
    return {}


def _judge(
    out: Outcome, lhs: onnx.ModelProto, mode: str, fp: str, limit=None, unjudged=None
) -> Outcome:
    elem = [o.type.tensor_type.elem_type for o in lhs.graph.output]
    names = [o.name for o in lhs.graph.output]
    limits = limit if isinstance(limit, dict) else dict.fromkeys(names, limit)
    tols = [
        tolerance(mode, fp, t) if limits.get(n) is None else Tolerance(limit=limits[n])
        for n, t in zip(names, elem)
    ]
    out.tolerance = "; ".join(sorted({str(t) for t in tols}))
    for ex in EXECUTORS:
        left, right = out.outputs.get(("left", ex)), out.outputs.get(("right", ex))
        if left is not None and right is not None:
            if len(left) != len(right):
                return _fail(out, f"{len(right)} outputs on the right, {len(left)} on the left")
            out.diffs[ex] = worst(
                [compare(r, lv, t, out.scale) for lv, r, t in zip(left, right, tols)]
            )
    for ex, why in (unjudged or {}).items():
        d = out.diffs.pop(ex, None)
        if d is not None and not d.ok:
            out.notes.append(f"{ex} not judged: {why}")
    bad = [ex for ex, d in out.diffs.items() if not d.ok]
    if bad and limit is not None:  # a bound holds on every runtime: integer kernels differ
        return _fail(out, f"beyond the rule's bound on {', '.join(bad)}" + _why(out.diffs[bad[0]]))
    if bad and len(bad) == len(out.diffs):
        return _fail(out, "the two sides differ" + _why(out.diffs[bad[0]]))
    if bad:
        out.notes.append(f"{ALONE_SEES}{', '.join(bad)}{ALONE_SEES_END}")
    lo, lr = out.outputs.get(("left", "onnxruntime")), out.outputs.get(("left", "onnx.reference"))
    if lo is not None and lr is not None:
        across = worst([compare(a, b, t, out.scale) for a, b, t in zip(lo, lr, tols)])
        if not across.ok:
            out.notes.append("onnxruntime and onnx.reference disagree on the left side")
    return out


def _why(d: Diff) -> str:
    return f" ({d.reason})" if d.reason and d.reason != "values differ" else ""


def _fail(out: Outcome, reason: str) -> Outcome:
    out.status, out.reason = "fail", reason
    return out
