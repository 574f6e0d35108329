"""Verify rules: one Hypothesis run per check of a rule, and the results.

For each direction of a rule (two for an `equal` rule):

| check        | examples (checked, drawn at most) | what must hold                            |
|--------------|-----------------------------------|-------------------------------------------|
| `numeric`    | `examples` (default 50), -        | both sides agree (`verify.check`)         |
| `engine`     | 2, 10                             | the engine fires on the left side, and    |
|              |                                   | its output agrees with its input          |
| `multi-use`  | 1, 6 (if the match has inner ops) | the same, inner values also graph outputs |
| `commuted`   | 1, 6 (for `:c` rules)             | the `:c` family fires on swapped operands |
| `negative G` | 1, 12 per guard G                 | with only G violated, no firing           |
| `every value`| 1, 32 (rules of quantization ops) | `numeric` on 8-bit inputs of every value, |
|              |                                   | rounding ties and saturation              |
| `every 4-bit value` | 1, 32 (the same, if a 4-bit type can be drawn) | the same on 4-bit inputs |

A failing check is shrunk by Hypothesis to a minimal counterexample. The seed makes a run
reproducible; under Hypothesis's `ci` profile (loaded when `CI` is set) runs are
derandomized instead. A negative check that draws no example violating only its guard (the
guards may imply each other) is a note, not a failure. The `every value` check
(`verify.sweep`) runs one drawn example on a series of inputs: every int8 / uint8 input takes
all 256 values, float inputs a grid on which QuantizeLinear meets rounding ties and saturates;
the ties and saturated elements it saw are counted in its result. Its examples are drawn at
opset 19 or later, with 8-bit integer dtypes wherever the schemas allow them. The `every 4-bit
value` check does the same with int4 / uint4 (16 values each) from opset 21, run by
onnx.reference alone (onnxruntime's Python API takes no int4 input); a rule none of whose
slots takes a 4-bit type has no such check.
"""

from __future__ import annotations

import contextlib
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

from hypothesis import HealthCheck, Phase, Verbosity, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable, UnsatisfiedAssumption
from onnx import TensorProto

try:  # Hypothesis's internals (`_no_local_constants`); absent in another version, left alone
    from hypothesis.internal.conjecture import providers as hypothesis_providers
except ImportError:  # pragma: no cover
    hypothesis_providers = None

from dsl import shipped_rules_dir
from dsl.ir import Literal, OpNode, Rule, RuleSet
from dsl.lists import concrete, max_items
from verify.check import run_both, unjudged
from verify.compare import mode_of
from verify.defaults import DEFAULT_EXAMPLES  # re-exported
from verify.draw import Gen, long_dims
from verify.dtypes import CANDIDATES, FOUR_BIT
from verify.engine import commuted_positions, family, run_engine
from verify.hints import requests
from verify.instance import NotAMatch, instantiate, lhs_model, lowest_opset, op_names, reversed_rule
from verify.node import sampler_of
from verify.report import failure_text, graph_text
from verify.sweep import FOUR_BIT_OPSET, quantize_events, sweep_feeds, sweepable, swept_text
from verify.values import ints
from vocab.ops import FAMILIES
from vocab.registry import BOUNDS

# (examples checked, examples drawn at most) of the companion checks
ENGINE, COMPANION, NEGATIVE, SWEEP = (2, 10), (1, 6), (1, 12), (1, 32)


@dataclass
class Failure:
    """A failed check: its name, why, the counterexample text, and after how many valid
    examples it was first seen (before shrinking)."""

    check: str
    reason: str
    text: str
    caught_after: int | None = None
    max_abs: float | None = None  # errors of the counterexample, None if nothing compared
    max_rel: float | None = None


@dataclass
class CheckResult:
    """One check of one direction of a rule."""

    name: str
    examples: int = 0
    invalid: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    failure: Failure | None = None
    unsat: bool = False
    notes: Counter = field(default_factory=Counter)
    ties: int = 0  # the `every value` check: rounding ties and saturated elements it saw
    saturated: int = 0


@dataclass
class RuleResult:
    """The verdict on one rule: `pass`, `FAIL`, `unsat` (no valid example could be drawn) or
    `unsupported` (an op has no example generator); `repro` is the command to rerun it."""

    rule: Rule
    status: str
    checks: list[CheckResult]
    seconds: float
    repro: str = ""
    detail: str = ""

    @property
    def examples(self) -> int:
        """Number of valid examples the numeric checks ran."""
        return sum(c.examples for c in self.checks if c.name.startswith("numeric"))

    @property
    def max_abs(self) -> float:
        """The largest absolute error over all checks (0.0 if nothing was compared)."""
        return max((c.max_abs for c in self.checks), default=0.0)

    @property
    def max_rel(self) -> float:
        """The largest relative error over all checks (0.0 if nothing was compared)."""
        return max((c.max_rel for c in self.checks), default=0.0)

    @property
    def failure(self) -> Failure | None:
        """The first check's failure, or None if every check passed."""
        return next((c.failure for c in self.checks if c.failure), None)

    @property
    def notes(self) -> Counter:
        """The notes (why drawn examples were dropped, ...) of all checks, summed."""
        total = Counter()
        for c in self.checks:
            total.update(c.notes)
        return total


class _Found(Exception):
    def __init__(self, failure: Failure):
        super().__init__(failure.reason)
        self.failure = failure


def verify_rule(
    rule: Rule, rules: RuleSet | None = None, examples: int = DEFAULT_EXAMPLES, seed: int = 0
) -> RuleResult:
    """Run every check of `rule` (`rules`: the rule set it came from, for its `:c` family).
    Never raises for a wrong rule: the verdict is in the result."""
    start = time.perf_counter()
    repro = repro_command(rule, seed, examples)
    missing = sorted(
        op
        for op in op_names(rule.lhs) | op_names(rule.rhs if rule.kind == "equal" else None)
        if sampler_of(op) is None
    )
    if missing:
        return RuleResult(
            rule, "unsupported", [], 0.0, repro, f"no example generator for {', '.join(missing)}"
        )
    checks: list[CheckResult] = []
    directions = [rule, reversed_rule(rule)] if rule.kind == "equal" else [rule]
    members = family(rule, rules)
    for d in directions:
        checks += _Checker(d, members, seed).run_all(examples)
        if any(c.failure for c in checks):
            break
    status = "FAIL" if any(c.failure for c in checks) else "pass"
    if status == "pass" and any(c.unsat for c in checks if c.name.startswith("numeric")):
        status = "unsat"
        undrawn = undrawn_dtypes(rule)
        if undrawn:  # no example for want of a dtype verify draws, not of the guards
            need = ", ".join(undrawn)
            detail = f"no example: the rule's types need {need}, which verify does not draw"
            return RuleResult(
                rule, "unsupported", checks, time.perf_counter() - start, repro, detail
            )
    return RuleResult(rule, status, checks, time.perf_counter() - start, repro)


def undrawn_dtypes(rule: Rule) -> list[str]:
    """The ONNX element types a rule names (a Cast's `:to`, a `has-dtype` guard's literal) that
    verify draws no example of (`verify.dtypes.CANDIDATES`, the 4-bit ones), by name."""
    codes: set[int] = set()

    def walk(t) -> None:
        if isinstance(t, OpNode):
            for name, a in t.attrs:
                if name in ("to", "dtype") and isinstance(getattr(a, "value", None), int):
                    codes.add(a.value)
            for x in t.args:
                walk(x)

    for t in (rule.lhs, rule.rhs):
        walk(t)
    for g in rule.guards:
        if g.fn == "has-dtype" and len(g.args) == 2 and isinstance(g.args[1], Literal):
            codes.add(int(g.args[1].value))
    drawn = set(CANDIDATES) | set(FOUR_BIT)
    return sorted(TensorProto.DataType.Name(c).lower() for c in codes - drawn if c in _DTYPE_NAMES)


_DTYPE_NAMES = set(TensorProto.DataType.values())


def verify_rules(
    rules: RuleSet,
    examples: int = DEFAULT_EXAMPLES,
    seed: int = 0,
    names: set[str] | None = None,
    on_result=None,
) -> list[RuleResult]:
    """Verify every rule of `rules` (only those in `names`, if given), in order; calls
    `on_result(result)` after each."""
    out = []
    for r in rules.rules:
        if names is None or r.name in names:
            out.append(verify_rule(r, rules, examples, seed))
            if on_result:
                on_result(out[-1])
    return out


def every_value(rule: Rule, seed: int = 0, four_bit: bool = False) -> CheckResult:
    """Only the `every value` check of `rule` (a directed rule; see `verify.sweep`), or with
    `four_bit` its `every 4-bit value` check: its result holds the steps run (`examples`),
    the ties and saturated elements seen, and the shrunk counterexample if the rule is
    wrong."""
    c = _Checker(rule, (), seed)
    if four_bit:
        return c.hypothesis("every 4-bit value", c.swept4, c.every_value, *SWEEP)
    return c.hypothesis("every value", c.swept, c.every_value, *SWEEP)


def repro_command(rule: Rule, seed: int, examples: int) -> str:
    """The shell command that reruns this rule's verification."""
    file = rule.span.file
    shipped = (
        file.startswith("patterns/") and (shipped_rules_dir() / file[len("patterns/") :]).exists()
    )
    where = "" if shipped else f"{file} "
    ci = "CI=1 " if settings.default.derandomize else ""
    return f"{ci}rewrite verify {where}--rule {rule.name} --seed {seed} --examples {examples}"


_QUANTIZED = frozenset(FAMILIES["QUANTIZED"])
SWEPT_OPSET = 19  # the `every value` check's lowest opset
MAX_LIST_ITEMS = 4  # items drawn per list capture: 0 to 4 (or fewer slots), at random


class _Checker:
    """The checks of one direction of a rule."""

    def __init__(self, rule: Rule, members: tuple[Rule, ...], seed: int):
        self.rule, self.members, self.seed = rule, members, seed
        self.mode = mode_of(rule)
        self.values = "full" if self.mode == "bitwise" else "bounded"
        if rule.fp == "quant":  # quantization assumes finite values (its scales are ranges)
            self.values = "finite"
        self.lo = lowest_opset(rule)
        self.suffix = " (reverse)" if rule.name.endswith(" (reverse)") else ""
        self._enough = lambda: False  # set by `hypothesis` for the check being run

    def run_all(self, examples: int) -> list[CheckResult]:
        positive = self.positive
        out = [self.hypothesis("numeric", positive, self.numeric, examples)]
        if out[0].failure:
            return out
        if op_names(self.rule.lhs) & _QUANTIZED or op_names(self.rule.rhs) & _QUANTIZED:
            out.append(self.hypothesis("every value", self.swept, self.every_value, *SWEEP))
            if out[-1].failure:
                return out
            four = self.hypothesis("every 4-bit value", self.swept4, self.every_value, *SWEEP)
            if four.examples or four.failure:  # none drawn: the rule takes no 4-bit type
                out.append(four)
            if four.failure:
                return out
        out.append(self.hypothesis("engine", positive, self.engine(False, frozenset()), *ENGINE))
        if any(isinstance(a, OpNode) for a in self.rule.lhs.args):
            out.append(
                self.hypothesis("multi-use", positive, self.engine(True, frozenset()), *COMPANION)
            )
        swaps = (
            frozenset(commuted_positions(self.rule, self.members))
            if not self.suffix
            else frozenset()
        )
        if swaps:
            out.append(self.hypothesis("commuted", positive, self.engine(False, swaps), *COMPANION))
        for i, g in enumerate(self.rule.guards):
            name = f"negative: {'not ' if g.negate else ''}{g.fn} (guard {i + 1})"
            out.append(self.hypothesis(name, self.violating(i), self.negative, *NEGATIVE))
        for c in out[1:]:  # a companion without a valid example is a note, not a failure
            if c.unsat:
                why = "violates only this guard" if c.name.startswith("negative") else "was valid"
                c.notes[f"{c.name}: no drawn example {why}"] += 1
        return out

    # ---- one Hypothesis run --------------------------------------------------------------------

    def hypothesis(
        self, name: str, draw, check, n: int, attempts: int | None = None
    ) -> CheckResult:
        """Run `check(draw(data))` under Hypothesis until `n` valid examples were checked.

        With `attempts` (the companion checks), Hypothesis draws at most that many examples:
        an invalid one counts as a passing attempt instead of a rejection (else Hypothesis
        tries hundreds of times when no example can be valid), and valid ones beyond the first
        `n` are drawn but not checked. What is drawn depends on Hypothesis's data alone, never
        on what was learnt while running, so a failure replays and shrinks."""
        res = CheckResult(name + self.suffix)

        def enough() -> bool:
            return bool(attempts) and res.failure is None and res.examples >= n

        # a companion check with its examples builds no more instances (a Conv's costs a
        # model import and its guards): its remaining attempts are drawn, so that Hypothesis
        # sees the same data, and pass at once
        self._enough = enough

        @settings(
            max_examples=attempts or n,
            deadline=None,
            database=None,
            verbosity=Verbosity.quiet,
            phases=(Phase.explicit, Phase.generate, Phase.shrink),
            print_blob=False,
            report_multiple_bugs=False,
            suppress_health_check=list(HealthCheck),
        )
        @given(_drawn(draw))
        def test(inst):
            if inst is _DONE:
                return
            if inst is _INVALID:
                res.invalid += 1
                if not attempts:
                    reject()
                return
            if not enough():
                check(inst, res)

        if not settings.default.derandomize:
            test = hypothesis_seed(self.seed)(test)
        try:
            with _no_local_constants():
                test()
        except _Found as e:
            res.failure = e.failure
        except Unsatisfiable:
            res.unsat = True
        except Exception as e:  # e.g. a flaky failure: report it, never hide it
            found = _found_in(e)
            if found is not None:
                res.failure = found
                found.reason = (
                    f"{found.reason} (flaky: {type(e).__name__}, it did not fail again on replay)"
                )
            else:
                text = "".join(traceback.format_exception(e)[-12:])
                res.failure = Failure(
                    res.name, f"{type(e).__name__}: {str(e).strip()}", text, res.examples
                )
        if res.examples == 0 and not res.failure:
            res.unsat = True
        return res

    def found(self, res: CheckResult, reason: str, inst, out, extra=()) -> None:
        d = out.worst if out is not None and out.diffs else None
        text = failure_text(res.name, reason, inst, out, extra)
        res.failure = Failure(
            res.name, reason, text, res.examples, d and d.max_abs, d and d.max_rel
        )
        raise _Found(res.failure)

    def count(self, res: CheckResult, out) -> None:
        """Count a checked example (only until the first failure: not while shrinking)."""
        if res.failure is None:
            res.examples += 1
            if out is not None and out.status == "ok":
                d = out.worst
                res.max_abs, res.max_rel = max(res.max_abs, d.max_abs), max(res.max_rel, d.max_rel)
                res.notes.update(out.notes)

    # ---- drawing -------------------------------------------------------------------------------

    def instance(self, data, violate: int | None = None, build_rhs: bool = True):
        """A drawn instance of the rule (of a rule with list captures: at drawn item counts,
        `dsl.lists.concrete`), steered to make every guard hold but guard `violate`."""
        rule = self.rule
        if rule.lists:
            counts = {
                name: data.draw(ints(0, min(most, MAX_LIST_ITEMS)), label=f"@{name}...")
                for name, most in max_items(rule).items()
            }
            rule = concrete(rule, counts)
            if rule is None:  # more inputs than the op's slots, or too few for it
                reject()
        reqs = requests(rule.guards, violate)
        gen = Gen(data, rule.lhs, reqs, self.values, self.lo, rule.roots, long_dims(rule))
        try:
            example = gen.example()
            if self._enough():
                return _DONE
            return instantiate(rule, example, build_rhs)
        except NotAMatch:
            reject()

    def positive(self, data):
        """An instance whose guards all hold."""
        inst = self.instance(data)
        if inst is _DONE:
            return inst
        if not all(inst.guards) or inst.rhs is None:
            reject()
        return inst

    def swept(self, data, mode: str = "grid", opset: int = SWEPT_OPSET):
        """An instance whose guards all hold, its values from the `grid` mode
        (`verify.values`: quarters, power-of-two scales), for the `every value` check."""
        values, lo = self.values, self.lo
        # onnx.reference has QuantizeLinear and DequantizeLinear from opset 19 only
        self.values, self.lo = mode, max(self.lo, opset)
        try:
            inst = self.positive(data)
        finally:
            self.values, self.lo = values, lo
        if inst is not _DONE and not sweepable(inst.example.leaves, inst.feeds):
            reject()
        return inst

    def swept4(self, data):
        """`swept` with 4-bit integer types wherever the schemas allow them (`grid4`, from
        opset 21), for the `every 4-bit value` check; an instance without a 4-bit graph input
        is rejected."""
        inst = self.swept(data, "grid4", FOUR_BIT_OPSET)
        leaves = () if inst is _DONE else inst.example.leaves.values()
        if inst is not _DONE and not any(x.dtype in FOUR_BIT and not x.const for x in leaves):
            reject()
        return inst

    def violating(self, i: int):
        """Draws an instance whose guard i fails and whose other guards hold."""

        def draw(data):
            inst = self.instance(data, violate=i, build_rhs=False)
            if inst is _DONE:
                return inst
            if inst.guards[i] or not all(v for j, v in enumerate(inst.guards) if j != i):
                reject()
            return inst

        return draw

    # ---- the checks ----------------------------------------------------------------------------

    def numeric(self, inst, res: CheckResult) -> None:
        limit = _limit(self.rule, inst)
        out = run_both(
            inst.lhs, inst.rhs, inst.feeds, self.mode, self.rule.fp, limit, unjudged([self.rule])
        )
        if out.status == "reject":
            reject()
        self.count(res, out)
        if out.status == "fail":
            self.found(res, out.reason, inst, out)

    def every_value(self, inst, res: CheckResult) -> None:
        """`numeric` on each step of `verify.sweep.sweep_feeds` (each step counts as an
        example; the bound, if any, is evaluated on each step's values); steps the left side
        is not valid on are skipped."""
        leaves = inst.example.leaves
        # QuantizeLinear's events are counted on the left side, else on the right
        right = not any(n.op_type == "QuantizeLinear" for n in inst.lhs.graph.node)
        side = inst.rhs if right else inst.lhs
        checked = 0
        for step in sweep_feeds(leaves, inst.feeds):
            values = {name: step.get(name, leaf.value) for name, leaf in leaves.items()}
            limit = _limit(self.rule, inst, values)
            out = run_both(
                inst.lhs, inst.rhs, step, self.mode, self.rule.fp, limit, unjudged([self.rule])
            )
            if out.status == "reject":
                continue
            checked += 1
            self.count(res, out)
            if out.status == "fail":
                self.found(res, out.reason, inst, out, swept_text(step, leaves))
            if res.failure is None:
                ties, saturated = quantize_events(
                    side, out.right_values if right else out.left_values
                )
                res.ties, res.saturated = res.ties + ties, res.saturated + saturated
        if not checked:
            reject()

    def engine(self, multi_use: bool, swaps: frozenset):
        rules = self.members if swaps else (self.rule,)
        names = {r.name + self.suffix for r in rules}

        def check(inst, res: CheckResult) -> None:
            swap = frozenset(inst.example.output_of[i] for i in swaps)
            model = lhs_model(inst.example, extra_outputs=multi_use, swap=swap)
            # the bound is on the root's output (the multi-use model's inner values, outputs
            # too, are compared at the class's tolerance)
            limit = _limit(self.rule, inst)
            limit = {inst.example.root: limit} if multi_use and limit is not None else limit
            got = run_engine(
                model, inst.feeds, tuple(rules), names, True, self.mode, self.rule.fp, limit
            )
            if got.rejected:
                reject()
            self.count(res, got.outcome)
            if got.problem:
                self.found(res, got.problem, inst, got.outcome, _engine_extra(model, got))

        return check

    def negative(self, inst, res: CheckResult) -> None:
        got = run_engine(
            inst.lhs, inst.feeds, (self.rule,), {self.rule.name}, False, self.mode, self.rule.fp
        )
        self.count(res, None)
        if got.problem:
            self.found(res, got.problem, inst, got.outcome, _engine_extra(inst.lhs, got))


def _limit(rule: Rule, inst, values: dict | None = None):
    """A `quant` rule's bound on this instance: its `vocab.registry.BOUNDS` function over the
    drawn values of its captures (leaves of the pattern; `values`, by name, in place of the
    drawn ones), None for other rules."""
    if rule.bound is None:
        return None
    leaves = inst.example.leaves
    got = values or {name: leaf.value for name, leaf in leaves.items()}
    return BOUNDS[rule.bound.fn].fn(*(got[a.name] for a in rule.bound.args))


_INVALID = object()  # a drawn instance that is not valid (a rejection while drawing)
_DONE = object()  # not instantiated: the companion check already has its examples


@contextlib.contextmanager
def _no_local_constants():
    """While it is open, Hypothesis draws none of the constants it collects from the source of
    the local modules loaded so far (`hypothesis.internal.conjecture.providers`, Hypothesis
    6.13x+: a twentieth of its draws may take one): what `verify` draws at a seed then does not
    depend on which of this project's modules were imported before (a planted wrong rule went
    uncaught at seed 0 after `frontends.onnx.quantize` was imported, and was caught without
    it). Its global constants (0, 1, infinities, ...) stay. Nothing happens on a Hypothesis
    without these internals."""
    get = getattr(hypothesis_providers, "_get_local_constants", None)
    cache = getattr(getattr(hypothesis_providers, "CONSTANTS_CACHE", None), "cache", None)
    empty = getattr(hypothesis_providers, "Constants", None)  # its pool type, empty when called
    if get is None or cache is None or empty is None:
        yield
        return
    cache.clear()  # entries made with the local constants
    hypothesis_providers._get_local_constants = empty
    try:
        yield
    finally:
        hypothesis_providers._get_local_constants = get
        cache.clear()


class _Draws:
    """What `verify.draw.Gen` draws from: a composite strategy's `draw` (Hypothesis's own
    `ConjectureData.draw`), without `st.data()`'s per-draw bookkeeping (a copy of the random
    module's state and a note per draw: a third of the drawing time). The labels name the
    draws for a reader of the sampler code; nothing prints them."""

    def __init__(self, draw):
        self._draw = draw

    def draw(self, strategy, label: str | None = None):
        """A value of Hypothesis `strategy`."""
        return self._draw(strategy)


def _drawn(draw):
    """The strategy of `draw(data)`'s instances, `_INVALID` where the draw rejects (so that a
    companion check can count an invalid draw as an attempt)."""

    @st.composite
    def instances(d):
        try:
            return draw(_Draws(d))
        except UnsatisfiedAssumption:
            return _INVALID

    return instances()


def _found_in(e: BaseException) -> Failure | None:
    """The first counterexample inside `e` (Hypothesis groups them in a flaky failure)."""
    if isinstance(e, _Found):
        return e.failure
    for inner in getattr(e, "exceptions", ()):
        found = _found_in(inner)
        if found is not None:
            return found
    return None


def _engine_extra(model, got) -> list[str]:
    lines = [f"rules fired: {got.fired or 'none'}"]
    if got.optimized is not None and got.optimized is not model:
        lines += ["optimized model:"] + ["  " + s for s in graph_text(got.optimized)]
    return lines
