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
from dataclasses import dataclass, field, replace

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx.reference import ReferenceEvaluator

from engine.optimize import FP_CLASSES
from frontends.onnx import optimize_model
from frontends.onnx.check import CheckError, output_diff, random_inputs, run, tolerance_types
from verify.graph_builder import edge_undefined, finite_model, has_edges, scatter_edges

# the classes a fuzzed graph is optimized under: all but `quant`, whose rules change results by
# design and are checked against their own error bounds by `verify` (the fuzzer's oracle
# compares at a class tolerance, and quant's, 10% of an output, would hide other rules' bugs)
FUZZ_CLASSES = tuple(c for c in FP_CLASSES if c != "quant")


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
    split: bool = False  # checked as exact-on-edges plus all-classes-on-finite (check_graph)


@dataclass
class Stats:
    """Counts over a fuzzing run."""

    graphs: int = 0
    changed: int = 0
    nodes: int = 0
    fired: Counter = field(default_factory=Counter)
    compared: Counter = field(default_factory=Counter)
    split: int = 0  # graphs checked as two cases (check_graph)

    def add(self, model: onnx.ModelProto, r: GraphResult) -> None:
        """Count one fuzzed graph (`model`, before optimization) and its result `r`."""
        self.graphs += 1
        self.changed += r.changed
        self.nodes += len(model.graph.node)
        self.fired.update(r.fired)
        self.compared.update(r.compared)
        self.split += r.split


def check_graph(
    model: onnx.ModelProto, rules, fp: tuple[str, ...] = FUZZ_CLASSES, seed: int = 0
) -> GraphResult:
    """Optimize `model` with `rules` (a RuleSet) under the numeric classes `fp` and compare
    (module docstring). Raises GeneratorError if `model` itself is invalid, OptimizerError if
    the optimizer failed on it.

    Non-finite values and the non-exact classes: a `reassoc` or `approx` rule may change how a
    value rounds, and a rounding residue that meets an infinity decides the result's sign or
    NaN-ness (a LayerNormalization fused over a constant row: the original's `x - mean` is
    +-1e-7 of noise, then `* -inf`, then `Relu`: inf in one model, 0 in the other). Like GCC's
    `-fassociative-math`, which comes with `-ffinite-math-only`, these classes hold on finite
    data only. So when such a result differs on a graph with NaN/Inf in its constants or
    inputs, the graph is checked as two cases that must both pass: optimized with the exact
    rules only (`fp` without the non-exact classes), on the same data with its edge values;
    and with every class, with the edge values replaced by finite ones (`finite_model`)."""
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # ValidationError, InferenceError
        raise GeneratorError(f"the generated model is invalid: {_line(e)}") from None
    feeds = edge_inputs(model, random_inputs(model, seed), seed)

    def one(m: onnx.ModelProto, classes: tuple[str, ...], data: dict) -> GraphResult:
        try:
            result, report = optimize_model(m, rules, fp=classes)
        except Exception as e:  # any exception on a valid model is an optimizer bug
            raise OptimizerError("crash", _line(e)) from e
        if result is m:
            return GraphResult(False, dict(report.fired), (), report.fp)
        try:
            onnx.checker.check_model(result, full_check=True)
        except Exception as e:  # ValidationError, InferenceError
            raise OptimizerError("invalid", _line(e)) from None
        compared = tuple(
            name
            for name, execute in zip(EXECUTORS, (_ort, _reference))
            if _compare(name, execute, m, result, data, report.fp)
        )
        return GraphResult(True, dict(report.fired), compared, report.fp)

    try:
        return one(model, fp, feeds)
    except OptimizerError as e:
        exact = tuple(c for c in fp if c == "exact")
        if e.kind != "mismatch" or exact == fp or not has_edges(model, feeds):
            raise
    finite = {k: np.nan_to_num(a, nan=0.0, posinf=3.0, neginf=-3.0) for k, a in feeds.items()}
    one(model, exact, feeds)
    return replace(one(finite_model(model), fp, finite), split=True)


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
    noise = None
    for i, (out, a, b) in enumerate(zip(model.graph.output, got, want)):
        elem = out.type.tensor_type.elem_type
        d = output_diff(out.name, elem, a, b, fp, tol[out.name])
        if not d.ok and fp != "exact" and elem == TensorProto.FLOAT:
            noise = _rounding_noise(model, feeds, want) if noise is None else noise
            d = output_diff(out.name, elem, a, b, fp, tol[out.name], d.atol + 2 * noise[i])
        if not d.ok:
            raise OptimizerError(
                "mismatch",
                f"{name}: output {out.name} ({d.dtype}) differs: max abs {d.max_abs:.3g}, "
                f"max rel {d.max_rel:.3g} > rtol {d.rtol:g} (rules of class {fp})",
            )
    return True


def _rounding_noise(model: onnx.ModelProto, feeds: dict, want: list) -> list[float]:
    """For each output of `model`: the largest difference, over the positions where both are
    finite, between its float32 values `want` and the same model run in float64
    (`float64_model`, under onnx.reference): the rounding error the original itself carries.
    0.0 for every output if the float64 model cannot run.

    A non-exact rule may round differently from the original, and where the original's output
    is mostly rounding (a LayerNormalization over a row of equal values: `x - mean` is 1e-7
    of noise, then divided by `sqrt(eps)`), the rewritten model's output is other noise of the
    same size. `_compare` then allows twice the original's own rounding error beyond the
    class's tolerance: it judges the rewrite, not the original's conditioning."""
    try:
        got64 = _reference(
            float64_model(model),
            {k: a.astype(np.float64) if a.dtype == np.float32 else a for k, a in feeds.items()},
        )
    except Exception:  # an op the reference lacks in float64
        return [0.0] * len(want)
    out = []
    for w, w64 in zip(want, got64):
        w, w64 = np.asarray(w), np.asarray(w64)
        if w.dtype != np.float32 or w.shape != w64.shape:
            out.append(0.0)
            continue
        both = np.isfinite(w) & np.isfinite(w64)
        diff = np.abs(w.astype(np.float64)[both] - w64.astype(np.float64)[both])
        out.append(float(diff.max()) if diff.size else 0.0)
    return out


def float64_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` that computes in float64 where it computes in float32: float32
    initializers, Constant/ConstantOfShape values, graph inputs, outputs and value_info, and
    `to`/`dtype` attributes naming float32, all become float64 (main graph only)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    F, D = TensorProto.FLOAT, TensorProto.DOUBLE

    def widen(t: onnx.TensorProto) -> None:
        if t.data_type == F:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    for t in g.initializer:
        widen(t)
    for v in [*g.input, *g.output, *g.value_info]:
        if v.type.tensor_type.elem_type == F:
            v.type.tensor_type.elem_type = D
    for n in g.node:
        for a in n.attribute:
            if a.type == onnx.AttributeProto.TENSOR:
                widen(a.t)
            elif a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT and a.i == F:
                a.i = D
    return out


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
