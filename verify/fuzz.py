"""Graph fuzzing: a random valid model (`verify.graphs.onnx_graphs`) through the optimizer,
and the result against the original.

`check_graph` optimizes a model with every numeric class allowed and judges the result: no
exception, `onnx.checker` (strict shape inference) passes, and on the same random inputs the
outputs match the original's under onnxruntime and under `onnx.reference`, at the tolerance of
the loosest numeric class among the rules that fired (`frontends.onnx.check`). An executor that
cannot run the original (no kernel for an op and dtype) is left out for that graph and named.

`Stats` counts what a fuzzing run did: graphs generated, changed, rules fired.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx.reference import ReferenceEvaluator

from frontends.onnx.check import CheckError, output_diff, random_inputs, run, tolerance_types
from rewrite.optimize import FP_CLASSES
from verify.graph_builder import edge_undefined, scatter_edges

EXECUTORS = ("onnxruntime", "onnx.reference")


class GeneratorError(AssertionError):
    """The strategy built a model that is not valid: a bug in `verify.graphs`, not in the
    optimizer."""


class OptimizerError(AssertionError):
    """The optimizer failed on a valid model: it raised, wrote an invalid model, or changed
    an output. `kind`: `crash`, `invalid` or `mismatch`."""

    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind


@dataclass(frozen=True)
class GraphResult:
    """What optimizing one graph did: changed (a different model came back), the rules fired
    (name -> matches), the executors that compared both models, and the numeric class."""

    changed: bool
    fired: dict[str, int]
    compared: tuple[str, ...]
    fp: str


@dataclass
class Stats:
    """Counts over a fuzzing run."""

    graphs: int = 0
    changed: int = 0
    nodes: int = 0
    fired: Counter = field(default_factory=Counter)
    compared: Counter = field(default_factory=Counter)

    def add(self, model: onnx.ModelProto, r: GraphResult) -> None:
        """Count one fuzzed graph (`model`, before optimization) and its result `r`."""
        self.graphs += 1
        self.changed += r.changed
        self.nodes += len(model.graph.node)
        self.fired.update(r.fired)
        self.compared.update(r.compared)


def check_graph(
    model: onnx.ModelProto, rules, fp: tuple[str, ...] = FP_CLASSES, seed: int = 0
) -> GraphResult:
    """Optimize `model` with `rules` (a RuleSet) under the numeric classes `fp` and compare
    (module docstring). Raises GeneratorError if `model` itself is invalid, OptimizerError if
    the optimizer failed on it."""
    from frontends.onnx import optimize_model

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # ValidationError, InferenceError
        raise GeneratorError(f"the generated model is invalid: {_line(e)}") from None
    try:
        result, report = optimize_model(model, rules, fp=fp)
    except Exception as e:  # any exception on a valid model is an optimizer bug
        raise OptimizerError("crash", _line(e)) from e
    if result is model:
        return GraphResult(False, dict(report.fired), (), report.fp)
    try:
        onnx.checker.check_model(result, full_check=True)
    except Exception as e:  # ValidationError, InferenceError
        raise OptimizerError("invalid", _line(e)) from None
    feeds = edge_inputs(model, random_inputs(model, seed), seed)
    compared = tuple(
        name
        for name, execute in zip(EXECUTORS, (_ort, _reference))
        if _compare(name, execute, model, result, feeds, report.fp)
    )
    return GraphResult(True, dict(report.fired), compared, report.fp)


def edge_inputs(model: onnx.ModelProto, feeds: dict, seed: int = 0) -> dict:
    """`feeds` with NaN, +-Inf and -0.0 scattered into the float inputs (`scatter_edges`) of
    graphs with an even node count (the others keep finite inputs, so that NaN spreading
    through a reduction cannot hide a wrong finite result everywhere), unless `model` has an op
    whose result on them ONNX leaves undefined (`verify.graph_builder.edge_undefined`).
    Outputs are compared by `frontends.onnx.check.output_diff`: NaN against NaN in the same
    position and an infinity against the same infinity are equal, and -0.0 equals 0.0 (the
    output check's judgement: IEEE equality; no rule's result depends on the sign of a zero
    except through 1/x or atan2-like ops, whose infinities then differ and are caught)."""
    if len(model.graph.node) % 2 or edge_undefined(model.graph.node):
        return feeds
    rng = np.random.default_rng(seed + 1)
    out = {}
    for name, a in feeds.items():
        if a.dtype.kind == "f" and a.size:
            a = a.copy()
            scatter_edges(a, rng)
        out[name] = a
    return out


def _compare(name: str, execute, model, result, feeds, fp: str) -> bool:
    """Run both models on `execute`; False if it cannot run the original. Raises
    OptimizerError if it cannot run the result, or an output differs."""
    try:
        want = execute(model, feeds)
    except Exception:  # no kernel, or an op the reference lacks: this executor sits out
        return False
    try:
        got = execute(result, feeds)
    except Exception as e:  # the original ran: the result must too
        raise OptimizerError(
            "mismatch", f"{name} runs the original but not the result: {_line(e)}"
        ) from None
    tol = tolerance_types(model)
    for out, a, b in zip(model.graph.output, got, want):
        d = output_diff(out.name, out.type.tensor_type.elem_type, a, b, fp, tol[out.name])
        if not d.ok:
            raise OptimizerError(
                "mismatch",
                f"{name}: output {out.name} ({d.dtype}) differs: max abs {d.max_abs:.3g}, "
                f"max rel {d.max_rel:.3g} > rtol {d.rtol:g} (rules of class {fp})",
            )
    return True


def _ort(model: onnx.ModelProto, feeds: dict) -> list:
    try:
        return run(model, feeds)
    except CheckError as e:
        raise RuntimeError(str(e)) from None


def _reference(model: onnx.ModelProto, feeds: dict) -> list:
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ReferenceEvaluator(model).run(None, feeds)


def _line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:400]}"


def reduce_graph(model: onnx.ModelProto, fails) -> onnx.ModelProto:
    """A smaller model on which `fails(model) -> bool` still holds (delta debugging): drop
    graph outputs and bypass nodes (a node's readers read its first input instead) one at a
    time, keeping each change under which it still fails, until none helps. Unused nodes,
    initializers and inputs are pruned after each change. Returns `model` if nothing helps."""
    changed = True
    while changed:
        changed = False
        for candidate in _smaller(model):
            try:
                ok = fails(candidate)
            except GeneratorError:  # a bypass that broke the types
                ok = False
            if ok:
                model, changed = candidate, True
                break
    return model


def _smaller(model: onnx.ModelProto):
    """Candidates one step smaller than `model`: one output fewer, or one node bypassed."""
    outputs = [o.name for o in model.graph.output]
    for i in range(len(outputs) if len(outputs) > 1 else 0):
        m = onnx.ModelProto()
        m.CopyFrom(model)
        del m.graph.output[i]
        yield _prune(m)
    for n in model.graph.node:
        if not n.input or not n.input[0] or n.output[0] in outputs:
            continue
        m = onnx.ModelProto()
        m.CopyFrom(model)
        for k in m.graph.node:
            k.input[:] = [n.input[0] if x == n.output[0] else x for x in k.input]
        yield _prune(m)


def _prune(m: onnx.ModelProto) -> onnx.ModelProto:
    g = m.graph
    need = {o.name for o in g.output}
    keep = []
    for n in reversed(list(g.node)):
        if any(o in need for o in n.output):
            keep.append(n)
            need |= set(n.input)
    g.ClearField("node")
    g.node.extend(reversed(keep))
    for field_name, items in (("initializer", list(g.initializer)), ("input", list(g.input))):
        g.ClearField(field_name)
        getattr(g, field_name).extend(i for i in items if i.name in need)
    return m
