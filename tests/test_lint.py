"""`rewrite lint`: each kind of finding on a tiny rules file, acknowledgements, exit codes, and
the shipped library is clean."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dsl import load_rules, shipped_rules_dir
from dsl.unify import NoOverlap, apart, overlap
from verify.lint import LintInputError, contradiction, lint

ROOT = Path(__file__).resolve().parent.parent


def rules_file(tmp_path, text: str) -> Path:
    p = tmp_path / "t.rules"
    p.write_text(text)
    return p


def kinds(report) -> list[tuple[str, str]]:
    return sorted((f.kind, f.rule) for f in report.open)


def test_duplicate_up_to_renaming(tmp_path):
    p = rules_file(
        tmp_path,
        """
;; -(-x) -> x
(simplify neg-neg (Neg (Neg @x)) @x)
;; the same, other names
(simplify neg-neg-again (Neg (Neg @y)) @y)
""",
    )
    r = lint([p], numeric=False)
    assert kinds(r) == [("duplicate", "neg-neg-again")]
    assert r.open[0].line().startswith(f"{p}:5: duplicate: neg-neg-again: ")


def test_shadowed_instance_with_same_guards_and_result(tmp_path):
    p = rules_file(
        tmp_path,
        """
(simplify relu-relu (Relu (Relu @x)) (Relu @x))
(simplify relu-relu-abs (Relu (Relu (Abs @y))) (Relu (Abs @y)))
(simplify relu-relu-exp (Relu (Relu (Exp @y))) (Exp @y))
""",
    )
    r = lint([p], numeric=False)
    assert kinds(r) == [("shadowed", "relu-relu-abs")]  # the Exp one does something else


def test_never_fires(tmp_path):
    p = rules_file(
        tmp_path,
        """
(simplify pad-mirror (Pad @x @p _ _ :mode "mirror") @x)
(simplify two-ranks (Relu @x) (if (rank @x 2) (rank @x 3)) @x)
(simplify float-and-not (Abs @x) (if (is-float @x) (not (is-float @x))) @x)
""",
    )
    r = lint([p], numeric=False)
    assert kinds(r) == [("never-fires", n) for n in ("float-and-not", "pad-mirror", "two-ranks")]
    reasons = " ".join(f.reason for f in r.open)
    assert "'mirror' is not a value ONNX allows" in reasons
    assert "(rank @x 2) and (rank @x 3)" in reasons


def test_contradiction_of_guards():
    rules = load_rules(shipped_rules_dir())
    assert not any(contradiction(r.guards) for r in rules.rules)


def test_grows_alone_and_in_pairs(tmp_path):
    p = rules_file(
        tmp_path,
        """
(simplify relu-sin (Relu @x) (Relu (Sin @x)))
(simplify abs-to-exp (Abs @x) (Exp (Cos @x)))
(simplify exp-to-abs (Exp @x) (Abs (Sin @x)))
""",
    )
    r = lint([p], numeric=False)
    assert kinds(r) == [("grows", "exp-to-abs"), ("grows", "relu-sin")]
    pair = next(f for f in r.open if f.rule == "exp-to-abs")
    assert "together with abs-to-exp" in pair.reason and "iteration-limit" in pair.reason


def test_commutativity_and_associativity_of_one_op_grow_together(tmp_path):
    """Each alone, and the pair on its own small patterns, saturate; nested, they enumerate
    every bracketing and order. lint passed the pair, and optimize stopped at the node limit
    (479,370 e-nodes) on a 14-operand Add chain (the black-box rule author's finding)."""
    p = rules_file(
        tmp_path,
        """
(equal add-comm (Add @a @b) (Add @b @a))
(equal add-assoc (Add (Add @a @b) @c) (Add @a (Add @b @c)))
""",
    )
    (f,) = lint([p], numeric=False).open
    assert (f.kind, f.rule, f.other) == ("grows", "add-assoc", "add-comm")
    assert "nested in itself" in f.reason


WRONG_PAIR = """
;; relu(|x|) -> |x|
(simplify relu-abs (Relu (Abs @x)) (Abs @x))
;; a wrong one on the same term
(simplify relu-abs-wrong (Relu (Abs @y)) (Neg (Abs @y)))
"""


@pytest.fixture(params=["default", "ci"])
def hypothesis_profile(request):
    """Run under Hypothesis's default profile and its derandomized `ci` one (which CI loads):
    the first examples of the `ci` profile are all-zero draws, on which relu(|x|) and -|x|
    agree."""
    from hypothesis import settings

    before = settings.get_current_profile_name()
    settings.load_profile(request.param)
    yield request.param
    settings.load_profile(before)


def test_critical_pair_that_disagrees(tmp_path, hypothesis_profile):
    p = rules_file(tmp_path, WRONG_PAIR)
    r = lint([p], examples=2)
    assert kinds(r) == [("critical-pair", "relu-abs-wrong")]
    assert "witness (Relu (Abs @" in r.open[0].reason and "differ" in r.open[0].reason
    assert r.pairs["overlaps"] == 1 and r.pairs["differ"] == 1


def _overlap(rules, a: str, b: str):
    from verify.lint import directions
    from verify.lint_pairs import overlaps

    return next(o for o in overlaps(directions(rules)) if {o.first.name, o.second.name} == {a, b})


def test_pair_out_of_time_is_a_verdict_not_a_finding(tmp_path):
    """The time bound is checked between examples: a pair without time left is `timeout`."""
    from verify.lint_pairs import check_pair

    o = _overlap(load_rules(rules_file(tmp_path, WRONG_PAIR)), "relu-abs", "relu-abs-wrong")
    assert check_pair(o, examples=2, seconds=0.0).status == "timeout"
    assert check_pair(o, examples=2, seconds=None).status == "differ"


def test_pair_compared_at_the_looser_rules_tolerance(hypothesis_profile):
    """x*rsqrt(mean(x^2)+eps)*w with w = -1: RMSNormalization (a reassoc rule) against Neg of
    the rest (an exact one) differ in the last float16 bit; the pair is compared at the
    reassoc tolerance, which comes from the witness's output type. A witness of both guards
    is rare (1 draw in 16 or fewer, depending on the derandomized seed), so 6 examples (24
    draws) are asked for."""
    from verify.lint_pairs import check_pair

    o = _overlap(load_rules(shipped_rules_dir()), "mul-minus-one", "rmsnorm-rsqrt")
    v = check_pair(o, examples=6, seconds=None)
    assert v.status == "agree" and v.examples >= 1, v.detail


def test_two_quant_rules_over_one_term_are_approximations_not_compared():
    """The 4-bit and 8-bit weight-only rules match the same MatMul and differ by design (each
    within its bound, which verify checks): the pair is counted `approximate`, with no
    finding. Comparing them once found a 14.3 difference, under a saved Hypothesis example."""
    path = shipped_rules_dir() / "quant" / "weight_only.rules"
    r = lint([path], examples=2, numeric=True)
    assert r.pairs["approximate"] >= 1 and "critical-pair" not in {f.kind for f in r.open}
    assert "between two quant rules" in r.summary()


def test_all_zero_outputs():
    import numpy as np

    from verify.lint_pairs import all_zero

    assert all_zero([[np.zeros(3), np.array(-0.0)], [np.zeros((0, 2))]])
    assert not all_zero([[np.zeros(3)], [np.array([0.0, 1e-30])]])
    assert not all_zero([[np.array([np.nan])]])


def test_overlap_unifies_and_names_the_witness():
    rules = load_rules(shipped_rules_dir() / "algebra" / "arith.rules")
    by = {r.name: r for r in rules.rules}
    o = overlap(apart(by["idempotent-abs"], "a"), apart(by["abs-neg"], "b"), (0,))
    assert o.witness.op == "Abs" and o.witness.args[0].op == "Abs"
    assert o.witness.args[0].args[0].op == "Neg"
    with pytest.raises(NoOverlap):
        overlap(apart(by["neg-neg"], "a"), apart(by["abs-neg"], "b"))


def test_acknowledged_findings_do_not_fail(tmp_path):
    p = rules_file(
        tmp_path,
        """
(simplify neg-neg (Neg (Neg @x)) @x)
;; kept twice on purpose
;; lint: allow duplicate because the test says so
(simplify neg-neg-again (Neg (Neg @y)) @y)
""",
    )
    r = lint([p], numeric=False)
    assert not r.open and r.findings[0].allowed == "the test says so"
    assert "(allowed: the test says so)" in r.findings[0].line()


def test_malformed_acknowledgement(tmp_path):
    p = rules_file(tmp_path, ";; lint: allow dupes\n(simplify neg-neg (Neg (Neg @x)) @x)\n")
    with pytest.raises(LintInputError, match=r"t.rules:1: malformed acknowledgement"):
        lint([p], numeric=False)


def cli(capsys, *args) -> tuple[int, str, str]:
    from rewrite.cli import main

    code = main(["lint", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_exit_codes(tmp_path, capsys):
    clean = rules_file(tmp_path, "(simplify neg-neg (Neg (Neg @x)) @x)\n")
    code, out, err = cli(capsys, str(clean), "--no-numeric")
    assert code == 0 and "1 rules in 1 files: no findings" in out, err
    dup = tmp_path / "dup.rules"
    dup.write_text("(simplify a (Neg (Neg @x)) @x)\n(simplify b (Neg (Neg @y)) @y)\n")
    code, out, _ = cli(capsys, str(dup), "--no-numeric")
    assert code == 1 and f"{dup}:2: duplicate: b: " in out
    bad = tmp_path / "bad.rules"
    bad.write_text("(simplify a (Nope @x) @x)\n")
    code, _, err = cli(capsys, str(bad))
    assert code == 2 and err.count("\n") == 1 and "Nope" in err
    assert err.startswith(f"{bad}:1:") and err.count("error:") == 1  # located, said once
    # a negative budget was taken, and every pair counted twice (also "over the budget")
    code, out, err = cli(capsys, str(clean), "--max-pairs", "-1")
    assert code == 2 and not out and err.startswith("error: lint: --max-pairs")


def test_cli_bad_input_is_one_line(tmp_path):
    cmd = [sys.executable, "-m", "rewrite.cli", "lint", str(tmp_path / "missing.rules")]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: lint:")


def test_shipped_library_is_clean():
    """Static checks, growth, and a bounded sample of critical pairs (the CLI checks more)."""
    r = lint([shipped_rules_dir()], max_pairs=10, examples=2)
    assert not r.open, "\n".join(f.line() for f in r.open)
    assert r.rules > 200 and r.pairs["overlaps"] > 500 and r.pairs["checked"] == 10


def test_plugin_lint_item_per_file(tmp_path):
    dup = tmp_path / "dup.rules"
    dup.write_text("(simplify a (Neg (Neg @x)) @x)\n(simplify b (Neg (Neg @y)) @y)\n")
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "verify.pytest_plugin",
        "-p",
        "no:cacheprovider",
        "--rules",
        str(dup),
        "-q",
        "-k",
        "lint",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 1 and "1 failed" in r.stdout, r.stdout + r.stderr
    assert "dup.rules:2: duplicate: b: same pattern, guards and result as a" in r.stdout
