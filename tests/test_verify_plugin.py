"""The pytest plugin: `pytest --rules PATH` makes each rule a test item named after the rule,
fails a wrong one with its counterexample, and works in a checkout that is not installed
(`-p verify.pytest_plugin`) as well as through the `pytest11` entry point."""

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from dsl import load_rules
from verify.defaults import DEFAULT_EXAMPLES

ROOT = Path(__file__).resolve().parent.parent
WRONG = ROOT / "tests" / "wrong_rules" / "arith.rules"
GOOD = ROOT / "patterns" / "algebra" / "logic.rules"


def run_pytest(tmp_path, *args: str, plugin=("-p", "verify.pytest_plugin"), path=()):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *map(str, path)])}
    cmd = [sys.executable, "-m", "pytest", *plugin, "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env, check=False)


def test_rules_are_collected_as_items_named_after_the_rules(tmp_path):
    r = run_pytest(tmp_path, "--rules", str(GOOD), "--collect-only", "-q")
    assert r.returncode == 0, r.stdout + r.stderr
    ids = [line.split("::")[-1] for line in r.stdout.splitlines() if "::" in line]
    assert ids[:3] == ["not-not", "and-self", "or-self"] and "de-morgan-and" in ids


@pytest.mark.slow
def test_a_wrong_rule_fails_with_its_counterexample(tmp_path):
    # the default budget: under the derandomized `ci` profile Hypothesis draws other examples
    # for other budgets, and at 20 none of mul-zero's had a NaN or an infinity (at 50 the
    # seventh has)
    r = run_pytest(
        tmp_path,
        "--rules",
        str(WRONG),
        "--rules-examples",
        str(DEFAULT_EXAMPLES),
        "-q",
        "-k",
        "sub-one-dropped or mul-zero",
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "2 failed" in r.stdout and "FAIL: sub-one-dropped" in r.stdout
    assert "counterexample (shrunk)" in r.stdout
    assert re.search(r"reproduce: (CI=1 )?rewrite verify", r.stdout)


@pytest.mark.slow
def test_verified_rules_pass(tmp_path):
    r = run_pytest(
        tmp_path, "--rules", str(GOOD), "--rules-examples", "10", "-q", "-k", "not-not or and-self"
    )
    assert r.returncode == 0 and "2 passed" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("also_p", [False, True], ids=["entry-point", "entry-point-and-p"])
def test_the_entry_point_loads_the_plugin_once(tmp_path, also_p):
    # what `pip install -e .` writes, without installing anything
    dist = tmp_path / "site" / "rewrite-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: rewrite\nVersion: 0.1\n")
    entry = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    lines = [f"{k} = {v}" for k, v in entry["pytest11"].items()]
    (dist / "entry_points.txt").write_text("[pytest11]\n" + "\n".join(lines) + "\n")
    plugin = ("-p", "verify.pytest_plugin") if also_p else ()
    r = run_pytest(
        tmp_path,
        "--rules",
        str(GOOD),
        "--collect-only",
        "-q",
        plugin=plugin,
        path=[tmp_path / "site"],
    )
    n = len(load_rules([GOOD]).rules) + 1  # each rule, and the file's lint item
    assert r.returncode == 0 and f"{n} tests collected" in r.stdout, r.stdout + r.stderr


def test_the_entry_point_and_the_library_collection_are_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["entry-points"]["pytest11"] == {
        "verify.pytest_plugin": "verify.pytest_plugin"
    }
    ini = project["tool"]["pytest"]["ini_options"]
    assert "patterns" in ini["testpaths"] and ini["rules_paths"] == ["patterns"]
