"""`rewrite verify`: the table, the counterexample with its reproduction command, exit codes."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
WRONG = ROOT / "tests" / "wrong_rules"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rewrite.cli", "verify", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


@pytest.mark.slow
def test_a_wrong_rule_exits_1_with_its_counterexample():
    r = run_cli(str(WRONG / "arith.rules"), "--rule", "sub-one-dropped", "--jobs", "1")
    assert r.returncode == 1, r.stderr
    assert "FAIL: sub-one-dropped" in r.stdout and "counterexample (shrunk)" in r.stdout
    assert (
        re.search(r"reproduce: (CI=1 )?rewrite verify", r.stdout)
        and "--rule sub-one-dropped --seed 0" in r.stdout
    )
    assert (
        "arith.rules:8" in r.stdout and "caught after" in r.stdout and "Traceback" not in r.stderr
    )


@pytest.mark.slow
def test_verified_rules_exit_0_with_a_table():
    r = run_cli("--rule", "add-zero", "--rule", "neg-neg", "--examples", "10", "--jobs", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    for col in ("rule", "file:line", "examples", "max abs err", "max rel err", "status"):
        assert col in r.stdout
    assert "add-zero-c1" in r.stdout  # a :c variant comes with its rule
    assert "patterns/algebra/arith.rules:28" in r.stdout and "3 rules, 3 verified" in r.stdout


def test_usage_errors_exit_2():
    r = run_cli("--rule", "no-such-rule")
    assert r.returncode == 2 and "no rule named no-such-rule" in r.stderr
    assert run_cli("--examples", "0").returncode == 2


def test_a_rules_error_is_one_line_and_exit_1(tmp_path):
    bad = tmp_path / "bad.rules"
    bad.write_text("(simplify x (Nope @a) @a)\n")
    r = run_cli(str(bad))
    assert (
        r.returncode == 1 and "unknown operator 'Nope'" in r.stderr and "Traceback" not in r.stderr
    )


@pytest.mark.parametrize("what", ["file", "folder"])
def test_no_rules_to_verify_is_one_line(tmp_path, what):
    """An empty rules file crashed verify's worker pool ("max_workers must be greater than
    0", a traceback); a folder without a .rules file ran on nothing."""
    path = tmp_path / "empty.rules" if what == "file" else tmp_path / "none"
    if what == "file":
        path.write_text(";; nothing yet\n")
        said = f"error: no rules in {path}: nothing to verify\n"
    else:
        path.mkdir()
        said = f"error: rules: {path}: no .rules file in it\n"
    r = run_cli(str(path))
    assert r.returncode == 1 and r.stderr == said


def test_a_rule_only_onnxruntime_sees_differ_is_not_a_plain_pass():
    """A rule whose sides differ on onnxruntime alone (its Clip ignores a NaN bound, which the
    spec's Min and Max propagate) was listed `pass` beside an error of inf; optimize's output
    check, on onnxruntime, then refused its model and named it."""
    from collections import Counter

    from rich.console import Console

    from dsl import check, parse
    from verify.cli import _table
    from verify.runner import CheckResult, RuleResult

    rule = check(parse("(simplify r (Neg (Neg @x)) @x)", file="t.rules"))[0]
    notes = Counter({"executors disagree: only onnxruntime sees the sides differ": 3})
    result = RuleResult(rule, "pass", [CheckResult("numeric", 50, notes=notes)], 0.1)
    console = Console(width=200, record=True)
    console.print(_table([result]))
    assert "pass (onnxruntime: the sides differ)" in console.export_text()
