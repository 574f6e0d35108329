"""Companion checks that run the engine itself, not only the rule's text.

A drawn left side is optimized by `frontends.onnx.optimize_model` with just the rule (or its
`:c` family), every numeric class allowed, and the engine's report says whether the rule
fired. The whole pipeline is under test: import, egglog matching, host guards, extraction,
constant folding, export.

- positive: the guards hold, so the rule must fire, and the optimized model must compute what
  the input computes (within the rule's tolerance);
- multi-use: the same, with every value inside the match also a graph output;
- commuted: the operands of the `:c` ops swapped in the graph; the family must fire;
- negative: one guard violated (all others holding); the rule must not fire.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import onnx

from dsl.ir import OpNode, Rule, RuleSet
from engine.apply import SAME_ROOTS, UnsoundRuleError
from engine.optimize import FP_CLASSES
from frontends.onnx import optimize_model
from frontends.onnx.check import run
from verify.check import Outcome, run_both, unjudged
from vocab.ops import OPS


@dataclass(frozen=True)
class EngineResult:
    """problem: None if the check passed, else what went wrong. fired: rule name -> count.
    optimized: the engine's output model (None if it raised). outcome: the comparison of the
    optimized model with the input, when one was made."""

    problem: str | None
    fired: dict
    optimized: onnx.ModelProto | None = None
    outcome: Outcome | None = None
    rejected: str = ""


def run_engine(
    model,
    feeds,
    rules: tuple[Rule, ...],
    names: set[str],
    expect_fire: bool,
    mode: str,
    fp: str,
    limit=None,
) -> EngineResult:
    """Optimize `model` with `rules` and check what `names` (rule names as the engine reports
    them) did against `expect_fire`; compare outputs if the model changed (`limit`: a `quant`
    rule's bound on the model's one output, in place of the class's tolerance)."""
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # constant folding computes NaN and Inf on purpose
            opt, report = optimize_model(
                model,
                RuleSet(tuple(rules), ()),
                fp=FP_CLASSES,
                shapes=False,
                target="onnxruntime",  # examples run on onnxruntime: its domains are there
                sums=tuple({r.sums for r in rules if r.sums}),  # the rules' own, to check them
            )
    except UnsoundRuleError as e:
        return EngineResult(f"the engine's type tripwire: {e}", {})
    except Exception as e:  # any engine error on a valid model is a finding
        if not _valid(model, feeds):  # a drawn left side ONNX refuses (a guard violated)
            return EngineResult(None, {}, rejected="not a valid ONNX model")
        return EngineResult(
            f"the engine raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", {}
        )
    fired = {n: c for n, c in report.fired.items() if c}
    count = sum(fired.get(n, 0) for n in names)
    if expect_fire and not count and _only_same_roots(report.rejected, names):
        # the drawn roots of a multi-root rule are one term (equal constants are shared):
        # not an instance of the rule the engine would rewrite
        return EngineResult(None, fired, opt, rejected=SAME_ROOTS)
    if expect_fire and not count:
        return EngineResult(
            "the engine did not apply the rule to an instance of its left side "
            f"whose guards hold (rejected: {dict(report.rejected) or 'none'})",
            fired,
            opt,
        )
    if not expect_fire and count:
        return EngineResult("the engine applied the rule although a guard is violated", fired, opt)
    if opt is model:
        return EngineResult(None, fired, opt)
    out = run_both(model, opt, feeds, mode, fp, limit, unjudged(rules))
    if out.status == "reject":
        return EngineResult(None, fired, opt, out, rejected=out.reason)
    if out.status == "fail":
        return EngineResult(
            f"the optimized model differs from its input: {out.reason}", fired, opt, out
        )
    return EngineResult(None, fired, opt, out)


def _only_same_roots(rejected: dict, names: set[str]) -> bool:
    reasons = {why for n in names for why in rejected.get(n, {})}
    return reasons == {SAME_ROOTS}


def family(rule: Rule, rules: RuleSet | None) -> tuple[Rule, ...]:
    """The rules `:c` expansion made from the same source form as `rule` (itself included)."""
    if rules is None:
        return (rule,)
    base = base_name(rule.name)
    return tuple(r for r in rules.rules if r.span == rule.span and base_name(r.name) == base) or (
        rule,
    )


def base_name(name: str) -> str:
    """A rule's name without the `-cN` suffix `:c` expansion adds."""
    head, _, tail = name.rpartition("-c")
    return head if head and tail.isdigit() else name


def commuted_positions(rule: Rule, members: tuple[Rule, ...]) -> set[int]:
    """`id()`s of the commutative nodes of `rule`'s left side whose operands some other family
    member has swapped."""
    out: set[int] = set()
    for m in members:
        if m is not rule:
            out |= _swaps(rule.lhs, m.lhs) or set()
    return out


def _swaps(a, b) -> set[int] | None:
    if not isinstance(a, OpNode) or not isinstance(b, OpNode):
        return set() if a == b else None
    if a.op != b.op or a.attrs != b.attrs or a.bind != b.bind:
        return None
    straight = _pairwise(a.args, b.args)
    if straight is not None:
        return straight
    if OPS.get(a.op).commutative and len(a.args) >= 2:
        crossed = _pairwise((a.args[1], a.args[0], *a.args[2:]), b.args)
        if crossed is not None:
            return crossed | {id(a)}
    return None


def _pairwise(xs, ys) -> set[int] | None:
    acc: set[int] = set()
    for x, y in zip(xs, ys):
        s = _swaps(x, y)
        if s is None:
            return None
        acc |= s
    return acc


def _valid(model, feeds) -> bool:
    """True if `model` passes onnx's checker and onnxruntime runs it on `feeds` (a drawn
    example that violates a guard may not: a per-axis scale of the wrong length, which the
    checker lets through, say)."""
    try:
        onnx.checker.check_model(model, full_check=True)
        run(model, feeds)
    except Exception:  # ValidationError, InferenceError, CheckError
        return False
    return True
