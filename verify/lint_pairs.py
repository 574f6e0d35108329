"""Critical pairs checked numerically: do two overlapping rules agree on their witness?

An overlap (`dsl.unify.Overlap`) is turned into two synthetic rules over one left side, the
witness, with both rules' guards: `witness -> result A` and `witness -> result B`. The
verifier draws examples of the witness that satisfy every guard (its hints steer the draws),
binds each one like an engine match (`verify.instance.instantiate`), builds both results on
the same example and runs them against each other on onnxruntime and onnx.reference
(`verify.check.run_both`, result A in the left side's place). Under saturation both results
end up in the witness's e-class, so they must compute the same value: a difference is a bug in
one of the two rules.

Two `quant` rules over one term (4-bit and 8-bit weights of one MatMul) are two
approximations, each verified against its own bound (`rewrite verify`): their results differ
by design, by at most the two bounds together, and under saturation the cost model (or the
user's mode) picks one. Such a pair is counted as `approximate`, not compared.

An example on which both results are all zeros (typically the all-zero draw Hypothesis tries
first, e.g. `relu(|0|)` against `-|0|`) tells nothing and is not counted. The time bound is
checked between examples, never by an asynchronous signal: an exception raised inside
Hypothesis's own code makes it report a flaky failure that is not there.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np
import onnx
from hypothesis import reject

from dsl.ir import Absent, Call, Capture, OpNode, Rule
from dsl.unify import NoOverlap, Overlap, apart, overlap, subterms
from engine.optimize import FP_CLASSES
from verify.check import run_both
from verify.execute import ExecError, run_ort
from verify.findings import Finding, contradiction, source_name
from verify.instance import NotAMatch, instantiate, lowest_opset, op_names
from verify.node import sampler_of
from verify.runner import _Checker

PAIR_SECONDS = 5.0  # wall-clock bound of one pair's check, checked before each example


class _OutOfTime(BaseException):
    """Raised before an example once the pair's time is spent; a BaseException so that the
    verifier's handlers, and Hypothesis's, let it through."""


@dataclass(frozen=True)
class PairVerdict:
    """`status`: `agree` (every checked example agreed), `differ` (a counterexample, in
    `detail`), `unsat` (no drawn example satisfied both rules' guards), `degenerate` (every
    example that did gave all-zero outputs on both sides), `unsupported` (an op has no example
    generator) or `timeout`. `examples`: examples compared."""

    status: str
    examples: int = 0
    detail: str = ""
    counterexample: str = ""  # the verifier's text of the shrunk counterexample, for `differ`


def synthetic_rules(o: Overlap) -> tuple[Rule, Rule]:
    """The two rules `witness -> result` of an overlap (see module doc), named after the
    pair, with the looser numeric class of the two and both rules' guards."""
    fp = max(o.first.fp, o.second.fp, key=FP_CLASSES.index)
    terms, attrs = _captures(o.witness)
    base = Rule(
        name=f"{o.first.name}/{o.second.name}",
        kind="simplify",
        lhs=o.witness,
        rhs=o.results[0],
        guards=o.guards,
        ruleset="lint",
        fp=fp,
        span=o.second.span,
        term_captures=terms,
        attr_captures=attrs,
    )
    return base, dataclasses.replace(base, rhs=o.results[1])


def _runs(model: onnx.ModelProto, feeds: dict) -> bool:
    """True if onnxruntime runs `model` on `feeds`: a witness it refuses (an input of a shape
    its kernel rejects, which the rules' guards do not look at) is no evidence against either
    rule; each rule's own `verify` draws valid inputs for its left side."""
    try:
        run_ort(model, feeds)
    except ExecError:
        return False
    return True


def check_pair(
    o: Overlap, examples: int = 3, seed: int = 0, seconds: float | None = PAIR_SECONDS
) -> PairVerdict:
    """Compare the two results of overlap `o` on `examples` drawn witnesses whose outputs are
    not all zero (at most `4 * examples` draws; no new example is started after `seconds` of
    wall clock, None for no bound). Never raises for a disagreement: it is the verdict."""
    first, second = synthetic_rules(o)
    missing = sorted(op for op in op_names(first.lhs) if sampler_of(op) is None)
    computed = needs_computed_value(o)
    if computed:
        return PairVerdict("unsat", 0, computed)
    if missing:
        return PairVerdict("unsupported", 0, f"no example generator for {', '.join(missing)}")
    checker = _Checker(first, (first,), seed)
    checker.lo = max(lowest_opset(first), lowest_opset(second))  # both results must run
    deadline = None if seconds is None else time.monotonic() + seconds
    zeros = 0

    def compare(inst, res) -> None:
        nonlocal zeros
        if deadline is not None and time.monotonic() > deadline and res.failure is None:
            raise _OutOfTime()
        try:
            other = instantiate(second, inst.example)
        except NotAMatch:
            reject()
        if other.rhs is None:
            reject()
        a, b = (typed_like(m, inst.lhs) for m in (inst.rhs, other.rhs))
        out = run_both(a, b, inst.feeds, checker.mode, first.fp)
        if out.status == "reject":
            reject()
        if out.status == "ok" and all_zero(out.outputs.values()):
            zeros += 1
            return
        checker.count(res, out)
        if out.status == "fail" and not _runs(inst.lhs, inst.feeds):
            reject()  # the witness itself is not a model onnxruntime runs (e.g. 2-D pads)
        if out.status == "fail":
            checker.found(res, f"the two results differ: {out.reason}", inst, out)

    try:
        res = checker.hypothesis("critical pair", checker.positive, compare, examples, 4 * examples)
    except _OutOfTime:
        return PairVerdict("timeout", 0, f"no verdict within {seconds:g} s")
    if res.failure is not None:
        f = res.failure
        worst = (
            f" (max abs {f.max_abs:.3g}, max rel {f.max_rel:.3g})" if f.max_abs is not None else ""
        )
        return PairVerdict("differ", res.examples, f.reason + worst, f.text)
    if res.examples == 0 and zeros:
        return PairVerdict(
            "degenerate", 0, f"all {zeros} witnesses gave all-zero outputs on both sides"
        )
    if res.examples == 0:
        return PairVerdict("unsat", 0, "no drawn witness satisfied both rules' guards")
    return PairVerdict("agree", res.examples)


def typed_like(result: onnx.ModelProto, witness: onnx.ModelProto) -> onnx.ModelProto:
    """`result` with the element types of `witness`'s outputs declared on its own outputs,
    which a built result leaves unset: the comparison's tolerance comes from them (an output
    without a float type is compared exactly)."""
    out = onnx.ModelProto()
    out.CopyFrom(result)
    for o, w in zip(out.graph.output, witness.graph.output):
        if not o.type.tensor_type.elem_type:
            o.type.tensor_type.elem_type = w.type.tensor_type.elem_type
    return out


def all_zero(outputs) -> bool:
    """Whether every array of every output list in `outputs` is all zero (or empty)."""
    return all(not np.any(a) for arrays in outputs for a in arrays)


# ---- critical pairs ------------------------------------------------------------------------


def overlaps(directed: list[Rule], subterm: bool = False):
    """Every critical pair (`dsl.unify.Overlap`) of the directed rules: root overlaps of rules
    from different source forms, then (with `subterm`) overlaps below the root."""
    parts = [(apart(r, "a"), apart(r, "b")) for r in directed]
    for (i, (a, _)), (j, (_, b)) in itertools.product(enumerate(parts), repeat=2):
        if j > i and directed[i].span != directed[j].span and a.lhs.op == b.lhs.op:
            try:
                yield overlap(a, b)
            except NoOverlap:
                pass
    if subterm:
        for (a, _), (_, b) in itertools.product(parts, repeat=2):
            for path, node in subterms(a.lhs):
                if node.op == b.lhs.op:
                    try:
                        yield overlap(a, b, path)
                    except NoOverlap:
                        pass


def critical_pairs(directed, counts: Counter, numeric, max_pairs, examples, subterm, seed):
    """`critical-pair` findings (see module doc); fills `counts` (see `LintReport.pairs`)."""
    for key in (
        "overlaps",
        "trivial",
        "checked",
        "agree",
        "differ",
        "unsat",
        "degenerate",
        "unsupported",
        "timeout",
        "unchecked",
        "infeasible",
        "approximate",
    ):
        counts[key] = 0
    todo = []
    for o in overlaps(directed, subterm):
        counts["overlaps"] += 1
        if o.results[0] == o.results[1]:
            counts["trivial"] += 1
        elif o.first.fp == "quant" and o.second.fp == "quant":
            counts["approximate"] += 1  # two bounded approximations (see module doc)
        elif contradiction(o.guards) or needs_computed_value(o):
            counts["infeasible"] += 1
        else:
            todo.append(o)
    random.Random(seed).shuffle(todo)  # the budget samples every file, the seed says which
    budget = max_pairs if numeric else 0
    counts["unchecked"] = max(0, len(todo) - budget)
    out = []
    for o in todo[:budget]:
        counts["checked"] += 1
        v = check_pair(o, examples, seed)
        counts[v.status] += 1
        if v.status == "differ":
            a, b = source_name(o.first), source_name(o.second)
            where = f" below the root at {list(o.position)}" if o.position else ""
            out.append(
                Finding(
                    "critical-pair",
                    b,
                    o.second.span,
                    f"{a} ({o.first.span}) and {b} match one term{where} and their "
                    f"results differ: {v.detail}; witness {witness_text(o.witness)}",
                    other=a,
                )
            )
    return out


def witness_text(t) -> str:
    """A term in the rules' own syntax (binds left out)."""
    if isinstance(t, OpNode):
        args = [witness_text(a) for a in t.args if type(a).__name__ != "Absent"]
        return f"({' '.join([t.op, *args])})"
    return f"@{t.name}" if hasattr(t, "name") else "_"


# guards that hold only on a value known at compile time: the verifier knows the values of
# drawn constants, never of an operator's output
VALUE_GUARDS = frozenset(
    {
        "all-equal",
        "all-equal-into",
        "negative-zeros",
        "positive-zeros",
        "is-constant",
        "one-element",
        "same-values",
        "normal-product",
        "finite-sum",
        "no-zero-dims",
    }
)


def needs_computed_value(o: Overlap) -> str:
    """Why the overlap's witness cannot be drawn ("" if it can): a value guard (not negated)
    on an operator node of the witness, such as x * 1 -> x on ((a - b) / c) * w, or a guard
    or builder asked about an input the other rule requires to be absent (the engine hands
    it an e-class with no facts; the verifier has no value to hand it)."""
    nodes = set(_captures(o.witness)[0]) - set(_leaves(o.witness))
    for g in o.guards + tuple(_calls(o.results[0])) + tuple(_calls(o.results[1])):
        if any(isinstance(a, Absent) for a in g.args):
            return f"({g.fn} ...) is asked about an absent optional input"
    for g in o.guards:
        if g.fn in VALUE_GUARDS and not g.negate:
            for a in g.args:
                if isinstance(a, Capture) and a.name in nodes:
                    return f"({g.fn} @{a.name}) asks for the value of an operator's output"
    return ""


def _calls(t):
    if isinstance(t, OpNode):
        for _, v in t.attrs:
            yield from _calls(v)
        for a in t.args:
            yield from _calls(a)
    elif isinstance(t, Call):
        yield t
        for a in t.args:
            yield from _calls(a)


def _leaves(t):
    if isinstance(t, OpNode):
        for a in t.args:
            yield from _leaves(a)
    elif isinstance(t, Capture):
        yield t.name


def _captures(t, terms=None, attrs=None):
    terms, attrs = ([] if terms is None else terms), ([] if attrs is None else attrs)
    if isinstance(t, OpNode):
        if t.bind and t.bind not in terms:
            terms.append(t.bind)
        for a in t.args:
            if isinstance(a, Capture) and a.name not in terms:
                terms.append(a.name)
            _captures(a, terms, attrs)
        for _, v in t.attrs:
            if isinstance(v, Capture) and v.name not in attrs:
                attrs.append(v.name)
    return tuple(terms), tuple(attrs)
