"""ONNX's backend node conformance suite, passed through the optimizer.

Each case of `onnx.backend.test.case.node.collect_testcases` (one or a few nodes, `_expanded`
cases with a function body inlined as a graph) is optimized with the given rules and every
numeric class allowed. A case whose model comes back as the input itself is `unchanged`.
Otherwise the result is checked with `onnx.checker` (with strict shape inference when the input
passes it) and its outputs are compared with the case's expected outputs at the case's
tolerance (`rtol`, `atol`) under `onnx.reference`, and under onnxruntime where the original
model runs there and matches.

A changed case whose original model the reference cannot run as given (an op it lacks, a dtype
numpy lacks, expected outputs it does not reproduce) is counted as `not-runnable` with the
reason, never hidden.

    from dsl import shipped_rules_dir
    from verify.conformance import run_suite
    for r in run_suite([shipped_rules_dir()], jobs=2):
        print(r.name, r.outcome, r.detail)
"""

from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx.backend.test.runner import Runner
from onnx.reference import ReferenceEvaluator

from dsl import load_rules
from engine.optimize import FP_CLASSES
from engine.runtime import cpu_session
from frontends.onnx import optimize_model
from frontends.onnx.importer import default_opset

# outcomes, best first; the last four are failures of the optimizer
OUTCOMES = ("ok", "unchanged", "not-runnable", "crash", "invalid", "mismatch", "ort-mismatch")
FAILURES = OUTCOMES[3:]


@dataclass(frozen=True)
class CaseResult:
    """What optimizing one conformance case did.

    outcome: one of OUTCOMES. `unchanged`: the optimizer returned the input model itself (so
        there is nothing to check or run). `not-runnable`: the result changed, passed the
        checker, but the original model does not reproduce its expected outputs under
        `onnx.reference` (detail says why), so there is nothing to compare against.
    changed: the optimizer returned a different model. fired: rule name -> matches applied.
    ort: `ok` (compared under onnxruntime too), or why onnxruntime was not used.
    opset: the model's default-domain opset (0: it imports none).
    """

    name: str
    outcome: str
    detail: str = ""
    changed: bool = False
    fired: dict[str, int] = field(default_factory=dict)
    ort: str = ""
    opset: int = 0


def collect(pattern: str | None = None) -> list:
    """The node conformance cases (onnx's `TestCase` objects, `.model` a ModelProto), sorted
    by name; with `pattern`, those whose name contains it. Building them takes ~10 s."""
    from onnx.backend.test.case.node import collect_testcases

    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case builders overflow casts on purpose
        cases = collect_testcases()
    return sorted((c for c in cases if pattern is None or pattern in c.name), key=lambda c: c.name)


def run_cases(rules, cases: Iterable | None = None) -> Iterator[CaseResult]:
    """Optimize each case with `rules` (a RuleSet) under every numeric class; yield a
    CaseResult per case, in order."""
    for case in collect() if cases is None else cases:
        yield run_case(case, rules)


def run_suite(rule_paths: list, pattern: str | None = None, jobs: int = 1) -> list[CaseResult]:
    """Every case (whose name contains `pattern`) optimized with the rules of `rule_paths`
    (`.rules` files or folders), in `jobs` worker processes (each builds the cases itself:
    they are slow to pickle). Returns CaseResults sorted by case name. Raises what
    `dsl.load_rules` raises for bad rules."""
    paths = tuple(str(p) for p in rule_paths)
    if jobs <= 1:
        return _share(paths, pattern, 0, 1)
    ctx = multiprocessing.get_context("spawn")  # forking a process that ran egglog can hang
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        parts = pool.map(_share, *zip(*[(paths, pattern, k, jobs) for k in range(jobs)]))
        return sorted((r for part in parts for r in part), key=lambda r: r.name)


def _share(paths: tuple[str, ...], pattern: str | None, k: int, n: int) -> list[CaseResult]:
    """The results of every n-th case from the k-th on (one worker's share)."""
    ort.set_default_logger_severity(4)
    rules = load_rules(list(paths))
    return list(run_cases(rules, collect(pattern)[k::n]))


def run_case(case, rules) -> CaseResult:
    """Optimize one conformance case and judge the result (see the module docstring)."""

    model = case.model
    opset = default_opset(model)
    try:
        result, report = optimize_model(model, rules, fp=FP_CLASSES)
    except Exception as e:  # any exception is an optimizer bug on a valid model
        return CaseResult(case.name, "crash", _line(e), opset=opset)
    base = {"changed": result is not model, "fired": dict(report.fired), "opset": opset}
    if result is model:
        return CaseResult(case.name, "unchanged", **base)
    invalid = _checker_error(result, full=_checker_error(model, full=True) is None)
    if invalid is not None:
        return CaseResult(case.name, "invalid", invalid, **base)
    runnable = _reproduces(model, case, _run_reference)
    if runnable is not None:
        return CaseResult(case.name, "not-runnable", runnable, **base)
    wrong = _reproduces(result, case, _run_reference)
    if wrong is not None:
        return CaseResult(case.name, "mismatch", wrong, **base)
    ort_note = _reproduces(model, case, _run_ort)
    if ort_note is None:
        wrong = _reproduces(result, case, _run_ort)
        if wrong is not None:
            return CaseResult(case.name, "ort-mismatch", wrong, **base)
    return CaseResult(case.name, "ok", "", **base, ort=ort_note or "ok")


def _checker_error(model: onnx.ModelProto, full: bool) -> str | None:
    """Why `onnx.checker` rejects `model`, or None. `full` adds strict shape inference, which
    some cases fail as given (MeanVarianceNormalization's function body), so a result is held
    to the check its input passes."""
    try:
        onnx.checker.check_model(model, full_check=full)
    except Exception as e:  # ValidationError, or shape inference's InferenceError
        return _line(e)
    return None


def _reproduces(model: onnx.ModelProto, case, run) -> str | None:
    """None if `model` run by `run` gives every data set's expected outputs at the case's
    tolerance, else a one-line reason."""
    for inputs, expected in case.data_sets:
        feeds = {i.name: v for i, v in zip(model.graph.input, inputs)}
        try:
            with np.errstate(all="ignore"), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                got = run(model, feeds)
        except Exception as e:  # the executors raise numpy, onnxruntime and their own errors
            return f"does not run: {_line(e)}"
        try:
            Runner.assert_similar_outputs(list(expected), list(got), case.rtol, case.atol)
        except Exception as e:  # AssertionError, or TypeError for mismatched containers
            return f"outputs differ: {_line(e)}"
    return None


def _run_reference(model: onnx.ModelProto, feeds: dict) -> list:
    return ReferenceEvaluator(model).run(None, feeds)


def _run_ort(model: onnx.ModelProto, feeds: dict) -> list:
    return cpu_session(model, threads=1).run(None, feeds)


def _line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}"
