"""The rule verifier's parts: dtype plans, guard hints, comparison, executors, drawing,
verdicts, and the engine fixes it led to. (The shipped library itself is verified rule by
rule by the pytest plugin: see `rules_paths` in pyproject.toml.)"""

import dataclasses
import os
import subprocess
import sys

import numpy as np
import onnx
import onnx.parser
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP

from dsl import load_rules, parse
from dsl.check import check
from frontends.onnx import optimize_model
from verify import check as vcheck
from verify import hints as H
from verify.check import run_both
from verify.compare import Tolerance, compare, mode_of, tolerance
from verify.draw import Gen
from verify.dtypes import np_type, plan_dtypes
from verify.execute import NO_KERNEL, ExecError, hazard, run_ort, run_reference
from verify.instance import instantiate, lowest_opset
from verify.node import SAMPLERS, Leaf
from verify.runner import every_value, verify_rule
from verify.sweep import sweep_feeds
from vocab.ops import OPS

RULES = load_rules()


def rules(text: str):
    return check(parse(text, file="t.rules"))


def rule(text: str):
    return rules(text)[0]


def model(text: str, opset: int = 18) -> onnx.ModelProto:
    return onnx.parser.parse_model(f'<ir_version: 10, opset_import: ["" : {opset}]> g {text}')


# ---- dtypes -------------------------------------------------------------------------------


def test_dtype_plan_follows_schemas_and_captures():
    r = rule("(simplify t (Where (Less @a @b) @a @c) @c)")
    plan, _ = plan_dtypes(r.lhs, 18)
    a, b, c = (plan.var_of(n) for n in "abc")
    assert a == b and a == c  # Less ties a and b; Where's X and Y tie a and c
    assert TP.BOOL not in plan.allowed[a]  # Less takes no bools (ONNX Less-13)


def test_cast_to_is_the_output_dtype():
    r = rule("(simplify t (Cast @x :to @to) (if (has-dtype @x @to)) @x)")
    plan, _ = plan_dtypes(r.lhs, 18)
    assert plan.var_of("to") is not None and plan.var_of("to") != plan.var_of("x")


# ---- hints --------------------------------------------------------------------------------


def test_hints_steer_towards_and_away_from_a_guard():
    r = rule("(simplify t (Add @x @z) (if (all-equal @z 0) (broadcasts-into @z @x)) @x)")
    holds = H.requests(r.guards)
    assert H.Fill("z", 0) in holds and H.Within("z", "x") in holds
    violate = H.requests(r.guards, violate=1)
    assert (
        H.Fill("z", 0) in violate
        and H.Beyond("z", "x") in violate
        and H.Within("z", "x") not in violate
    )


def test_a_negated_guard_is_satisfied_by_the_violation():
    r = rule("(simplify t (Identity @x) (if (not (is-float @x))) @x)")
    (req,) = H.requests(r.guards)
    assert isinstance(req, H.DtypeIn) and not req.dtypes & {TP.FLOAT, TP.FLOAT16, TP.DOUBLE}


def test_every_shipped_guard_has_a_hint():
    used = {g.fn for r in RULES.rules for g in r.guards}
    assert used <= set(H.HINTS), used - set(H.HINTS)


# ---- comparison ---------------------------------------------------------------------------


def test_exact_comparison_equates_nans_only_and_keeps_the_sign_of_zero():
    """-0.0 was taken for +0.0, so `x + (+0.0) -> x` (class exact) passed `verify` and
    `optimize` wrote models whose zeros changed sign (1 / x: -inf against +inf)."""
    a = np.array([np.nan, -0.0, 1.0], np.float32)
    assert compare(a, np.array([np.nan, -0.0, 1.0], np.float32), Tolerance()).ok
    d = compare(a, np.array([np.nan, 0.0, 1.0], np.float32), Tolerance())
    assert not d.ok and d.reason == "the sign of a zero differs (-0.0 against +0.0)"
    assert compare(a, np.array([np.nan, 0.0, 1.0], np.float32), Tolerance(1e-6, 1e-6)).ok
    assert not compare(a, np.array([np.nan, -0.0, np.nextafter(np.float32(1), 2)]), Tolerance()).ok
    assert not compare(np.array([np.inf]), np.array([np.nan]), Tolerance()).ok


def test_shape_and_integer_mismatches_are_exact():
    assert compare(np.zeros((2, 1)), np.zeros((2,)), Tolerance()).reason == "shape (2, 1) != (2,)"
    big = np.array([2**53 + 1], np.int64)
    d = compare(big, big - 1, tolerance("scaled", "reassoc", TP.INT64))
    assert not d.ok and d.max_abs == 1


def test_scaled_tolerance_is_relative_to_the_computation():
    tol = tolerance("scaled", "reassoc", TP.FLOAT)
    got, want = np.array([1e-3], np.float32), np.array([0.0], np.float32)
    assert not compare(got, want, tol).ok
    assert compare(got, want, tol, scale=100.0).ok  # 1e-3 <= 1e-4 + 1e-3 * 100


def test_mode_is_bitwise_unless_an_op_sums_in_any_order():
    by_name = {r.name: r for r in RULES.rules}
    assert mode_of(by_name["add-zero"]) == "bitwise"
    assert mode_of(by_name["matmul-add-to-gemm"]) == "scaled"  # exact class, but a matrix product
    assert mode_of(by_name["scale-through-add"]) == "scaled"  # reassoc


# ---- executors ----------------------------------------------------------------------------


def test_integer_division_by_zero_is_a_hazard_not_a_crash():
    m = model("(int64[2] x, int64[2] y) => (int64[2] z) { z = Div(x, y) }")
    feeds = {"x": np.array([1, 2]), "y": np.array([1, 0])}
    _, values = run_reference(m, feeds)
    assert hazard(m, values) == "integer Div by zero"


def test_missing_kernels_are_recorded_with_the_message():
    m = model("(int64[2,2] a, int64[2,2] b) => (int64[2,2] y) { y = Gemm(a, b) }")
    with pytest.raises(ExecError):
        run_ort(m, {"a": np.eye(2, dtype=np.int64), "b": np.eye(2, dtype=np.int64)})
    assert "Could not find an implementation" in NO_KERNEL[("Gemm", "T", TP.INT64)]


def test_an_unjudged_executor_disagreeing_is_a_note_not_a_failure(monkeypatch):
    # a `:sums int32` rule on a CPU whose onnxruntime adds int16 pairs (simulated: the right
    # side one off on onnxruntime alone): beyond the bound there is a failure, unless
    # onnxruntime is unjudged, when it is a note and onnx.reference decides
    lhs = model("(float[2] x) => (float[2] y) { y = Relu(x) }")
    rhs = model("(float[2] x) => (float[2] y) { y = Relu(x) }")
    feeds = {"x": np.array([-1.0, 2.0], np.float32)}
    real_ort = vcheck.run_ort
    monkeypatch.setattr(
        vcheck,
        "run_ort",
        lambda m, f: [o + 1 for o in real_ort(m, f)] if m is rhs else real_ort(m, f),
    )
    limit = np.full(2, 0.5)
    out = run_both(lhs, rhs, feeds, "bitwise", "quant", limit)
    assert out.status == "fail" and "beyond the rule's bound on onnxruntime" in out.reason
    why = {"onnxruntime": "its kernels add int16 pairs here"}
    out = run_both(lhs, rhs, feeds, "bitwise", "quant", limit, why)
    assert out.status == "ok"
    assert "onnxruntime not judged: its kernels add int16 pairs here" in out.notes
    # which rules: those whose ruleset says :sums int32, on a CPU without int32 sums
    rule = check(parse("(ruleset w :sums int32) (simplify a (Relu @x) @x)", "f.rules"))[0]
    monkeypatch.setattr(vcheck, "int8_sums_in_int32", lambda: True)
    assert vcheck.unjudged([rule]) == {}
    monkeypatch.setattr(vcheck, "int8_sums_in_int32", lambda: False)
    assert set(vcheck.unjudged([rule])) == {"onnxruntime"}
    assert vcheck.unjudged([dataclasses.replace(rule, sums="")]) == {}


def test_the_right_side_not_running_is_a_failure():
    lhs = model("(float[2] x) => (float[2] y) { y = Relu(x) }")
    rhs = model("(float[2] x) => (float[3] y) { y = Reshape(x, x) }")
    out = run_both(lhs, rhs, {"x": np.ones(2, np.float32)}, "bitwise", "exact")
    assert out.status == "fail" and "right side" in out.reason


# ---- drawing ------------------------------------------------------------------------------

_OPS = sorted(op for op in SAMPLERS if OPS.get(op) is not None)


@pytest.mark.parametrize("op", _OPS)
def test_every_sampler_draws_valid_nodes(op):
    spec = OPS.get(op)
    args = " ".join(f"@a{i}" for i in range(spec.n_required))
    declare = f"(ruleset t :domain {spec.domain})" if spec.domain not in ("", "ai.onnx") else ""
    r = rule(
        f"{declare}(simplify t ({op} {args} :attrs @rest) (Identity ({op} {args} :attrs @rest)))"
    )
    seen = []

    @settings(
        max_examples=8,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def draw(data):
        inst = instantiate(r, Gen(data, r.lhs, [], "full", lowest_opset(r)).example())
        out = run_both(inst.lhs, inst.rhs, inst.feeds, "bitwise", "exact")
        seen.append(out.status)

    draw()
    assert seen.count("ok") >= len(seen) // 2, seen  # mostly valid: few rejected draws


def test_guards_are_evaluated_on_the_engines_facts():
    r = rule("(simplify t (Transpose @x :perm @p) (if (identity-perm @p)) @x)")

    @settings(
        max_examples=20,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def draw(data):
        inst = instantiate(r, Gen(data, r.lhs, H.requests(r.guards), "full", 13).example())
        rank = len(inst.example.leaves["x"].shape)
        assert inst.attrs["p"] == tuple(range(rank)) and inst.guards == (True,)

    draw()


# ---- verdicts -----------------------------------------------------------------------------


def test_a_wrong_rule_fails_with_a_reproducible_counterexample():
    r = rule("(simplify sub-as-add (Sub @a @b) (Add @a @b))")
    first, again = verify_rule(r, examples=20), verify_rule(r, examples=20)
    assert first.status == "FAIL" and first.failure.check == "numeric"
    text = first.failure.text
    assert "counterexample" in text and "left side:" in text and "right side:" in text
    assert "onnxruntime" in text and "onnx.reference" in text and "opset" in text
    ci = "CI=1 " if os.environ.get("CI") else ""  # the CI profile is part of the command
    assert first.repro == f"{ci}rewrite verify t.rules --rule sub-as-add --seed 0 --examples 20"
    assert again.failure.text == text  # the same seed shrinks to the same counterexample


def test_a_rule_the_engine_never_applies_fails_the_engine_check():
    # two Transposes without perm: the importer writes the perm out, so this never matches
    r = rule("(simplify reverse-reverse (Transpose (Transpose @x)) @x)")
    res = verify_rule(r, examples=10)
    assert res.status == "FAIL" and res.failure.check == "engine"
    assert "did not apply the rule" in res.failure.reason


def test_a_rule_of_a_ruleset_with_an_opset_is_drawn_at_that_opset_or_later():
    """The engine check drew opset 13 under `(ruleset r :opset 18)`, the engine rightly did
    not run the rule there, and verify blamed the rule (a tester's two correct rules)."""
    r = rule("(ruleset r18 :opset 18) (simplify neg-neg-18 (Neg (Neg @x)) @x)")
    res = verify_rule(r, examples=20)
    assert res.status == "pass", res.failure and res.failure.text


def test_dimensions_past_a_rules_integer_constants_are_drawn_too():
    from verify.draw import long_dims

    r = rule(
        "(simplify r (ReduceMax (Slice @x @s @e @ax) @ax :keepdims 1)"
        " (if (all-equal @s 0) (all-equal @e 8)) (ReduceMax @x @ax :keepdims 1))"
    )
    assert long_dims(r) == (9,)
    assert (
        long_dims(rule("(simplify t (Transpose (Transpose @x :perm (1 0)) :perm (1 0)) @x)")) == ()
    )
    # a literal list's items count, and 64 is the longest
    assert long_dims(rule("(simplify t (Transpose @x :perm (0 1 2 3 4 5 6)) @x)")) == (6, 7)
    assert long_dims(rule("(simplify u (Relu @x) (if (all-equal @x 1000)) @x)")) == ()


@pytest.mark.parametrize(
    "op",
    [
        *("Elu", "Selu", "Celu", "ThresholdedRelu", "IsNaN", "Hardmax", "ArgMax", "ArgMin"),
        *("CumSum", "TopK", "TopK#1"),
    ],
)
def test_these_ops_have_example_generators(op):
    """Rules over them came back `unsupported` (a tester's Elu(x) -> Elu(x, alpha=1.0))."""
    args = "@x @a" if op in ("CumSum", "TopK", "TopK#1") else "@x"  # (an axis or k input)
    res = verify_rule(rule(f"(simplify r (Identity ({op} {args})) ({op} {args}))"), examples=10)
    assert res.status == "pass", res.detail or (res.failure and res.failure.text)


@pytest.mark.parametrize("op", ["ArgMax", "CumSum"])
def test_an_axis_op_over_another_ops_output_draws_a_valid_axis(op):
    """ArgMax(Identity(x)) with its axis captured: Identity's output, drawn first, may be a
    scalar, and drawing an axis of it raised Hypothesis's InvalidArgument (the black-box rule
    author's correct rule came back FAIL with a traceback)."""
    args, attrs = ("@x @a", "") if op == "CumSum" else ("@x", " :axis @a")
    text = (
        f"(simplify r ({op} (Identity {args.split()[0]}) {args[3:]}{attrs}) ({op} {args}{attrs}))"
    )
    res = verify_rule(rule(text), examples=30)
    assert res.status == "pass", res.detail or (res.failure and res.failure.text)


def test_a_rule_over_a_dtype_verify_does_not_draw_is_unsupported_not_unsat():
    """A bfloat16 round trip came back `unsat` ("no valid example"), as if its guards could
    not hold."""
    r = rule("(simplify r (Cast (Cast @x :to 16) :to 1) (if (has-dtype @x 1)) @x)")
    res = verify_rule(r, examples=10)
    assert res.status == "unsupported"
    assert res.detail == "no example: the rule's types need bfloat16, which verify does not draw"


def test_a_rule_without_a_generator_is_unsupported():
    r = rule("(simplify range-identity (Identity (Range @a @b @c)) (Range @a @b @c))")
    res = verify_rule(r)
    assert res.status == "unsupported" and "Range" in res.detail


def test_shipped_rule_checks_include_the_companions():
    res = verify_rule(next(r for r in RULES.rules if r.name == "add-zero"), RULES, examples=10)
    names = [c.name for c in res.checks]
    assert (
        names[:3] == ["numeric", "engine", "commuted"]
        and "negative: negative-zeros (guard 1)" in names
    )
    assert res.status == "pass"


def test_quantization_rules_are_checked_on_every_8_bit_value_with_ties_and_saturation():
    # Q(Relu(y)) -> Q(y): y runs through the grid of quarters (x / s meets halves), the
    # uint8 output saturates at 255
    r = next(r for r in RULES.rules if r.name == "quantize-of-relu")
    res = verify_rule(r, RULES, examples=5)
    (sweep,) = [c for c in res.checks if c.name == "every value"]
    assert res.status == "pass" and sweep.examples == 256
    assert sweep.ties > 0 and sweep.saturated > 0
    # DQ(q) moved after a Transpose: q, int8 or uint8, takes each of its 256 values
    r = next(r for r in RULES.rules if r.name == "transpose-before-dequantize")
    (sweep,) = [c for c in verify_rule(r, RULES, examples=5).checks if c.name == "every value"]
    assert sweep.examples >= 1 and not sweep.failure and not sweep.unsat


def test_quantization_rules_are_checked_on_every_4_bit_value_on_the_reference():
    # DQ(q) moved after a Transpose, q int4 or uint4 (opset 21): onnxruntime cannot be fed
    # int4 from Python, so onnx.reference runs both sides on each of the 16 values
    r = next(r for r in RULES.rules if r.name == "transpose-before-dequantize")
    checks = {c.name: c for c in verify_rule(r, RULES, examples=5).checks}
    four = checks["every 4-bit value"]
    assert four.examples >= 1 and not four.failure
    sweep = every_value(r, four_bit=True)
    assert 1 <= sweep.examples <= 16 and not sweep.failure
    # a rule whose guards ask for 8 bits has no 4-bit check
    r = next(r for r in RULES.rules if r.name == "maxpool-before-dequantize")
    assert "every 4-bit value" not in {c.name for c in verify_rule(r, RULES, examples=5).checks}


def test_sweep_feeds_run_a_4_bit_input_through_its_16_values():
    for dtype, lo in ((TP.INT4, -8), (TP.UINT4, 0)):
        leaf = Leaf("x", dtype, (3,))
        feeds = {"x": np.zeros(3, np_type(dtype))}
        steps = sweep_feeds({"x": leaf}, feeds)
        seen = sorted({int(v) for step in steps for v in step["x"].astype(np.int64)})
        assert len(steps) == 6 and seen == list(range(lo, lo + 16))


def test_every_value_catches_rounding_half_up_where_onnx_rounds_half_to_even():
    # QuantizeLinear rounds ties to even (ONNX QuantizeLinear-21); Floor(x / s + 0.5) rounds
    # them up: wrong on x / s = 0.5, 2.5, ... only
    r = rule(
        """(simplify quantize-half-up
             (QuantizeLinear @x @s @z)
             (if (positive-scale @s) (zero-point-at-min @z))
             (Cast (Clip (Floor (Add (Div @x @s) (Constant :value_float 0.5)))
                         (Constant :value_float 0.0) (Constant :value_float 255.0))
                   :to 2))"""
    )
    res = every_value(r)
    assert res.failure is not None and "swept inputs" in res.failure.text


# ---- engine fixes found by the verifier ---------------------------------------------------


def test_a_scalar_transpose_is_optimized_without_crashing():
    # a rank-0 Transpose has perm (); the exporter and shape inference wrote it untyped
    m = model("(float x) => (float y) { t = Transpose(x) y = Relu(t) }")
    out, _ = optimize_model(m, RULES)
    assert [n.op_type for n in out.graph.node] == ["Relu"]


def test_a_training_dropout_of_constants_is_not_folded():
    # Dropout with training_mode true drops at random: folding it bakes one draw into the model
    m = model(
        "(float[2] y) => (float[4] z) "
        "<float[4] x = {1., 2., 3., 4.}, float r = {0.5}, bool t = {1}> "
        "{ d = Dropout(x, r, t) z = Add(d, d) }"
    )
    out, report = optimize_model(m, RULES)
    assert [n.op_type for n in out.graph.node] == ["Dropout", "Add"] and not report.changed


_WHAT_IS_DRAWN = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
import dsl
from verify.runner import verify_rule
rules = dsl.load_rules(["tests/wrong_rules/shapes.rules"])
rule = next(r for r in rules.rules if r.name == "reshape-reshape-any-target")
res = verify_rule(rule, rules, examples=50, seed=0)
print(res.status, res.examples)
"""


@pytest.mark.parametrize("ci", ["", "1"])
def test_what_verify_draws_does_not_depend_on_the_modules_imported_before(ci):
    # Hypothesis mixes constants from the source of the local modules loaded so far into its
    # draws; verify leaves them out (runner._no_local_constants), so a seed draws the same
    # examples whatever was imported: the planted rule is caught at the same example
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": ci} if ci else {})
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    outs = [
        subprocess.run(
            [sys.executable, "-c", _WHAT_IS_DRAWN, *extra],
            capture_output=True,
            text=True,
            cwd=root,
            env=env,
            timeout=300,
        ).stdout.split()
        for extra in ([], ["frontends.onnx.quantize", "rewrite.cli"])
    ]
    assert outs[0] == outs[1] and outs[0][0] == "FAIL"
