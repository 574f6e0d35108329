"""ONNX's backend node conformance suite through the optimizer (`verify.conformance`), and the
bugs it found, each as a small regression test."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx.reference import ReferenceEvaluator

from dsl import load_rules, shipped_rules_dir
from engine.optimize import FP_CLASSES
from frontends.onnx import optimize_model
from frontends.onnx.importer import default_opset

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def rules():
    return load_rules([shipped_rules_dir()])


def test_constant_read_only_by_a_subgraph_is_kept(rules):
    """A constant that only an If branch reads (by name, from the outer graph) stays in the
    output after a rewrite elsewhere (the `_expanded` AffineGrid and LinearAttention cases
    came out reading a value that no longer existed)."""
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[2,3] x, bool c) => (float[2,3] y, float[2] z) {
        k = Constant <value = float[2] {1.5, -2.0}> ()
        t = Transpose <perm = [1, 0]> (x)
        y = Transpose <perm = [1, 0]> (t)
        z = If (c) <
            then_branch = g1 () => (float[2] a) { a = Identity (k) },
            else_branch = g2 () => (float[2] b) { b = Neg (k) }
        >
    }
    """
    model = onnx.parser.parse_model(text)
    result, report = optimize_model(model, rules, fp=FP_CLASSES)
    assert sorted(n.op_type for n in result.graph.node) == ["Identity", "If"]  # y = x
    onnx.checker.check_model(result, full_check=True)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c)}
        want = ReferenceEvaluator(model).run(None, feeds)
        got = ReferenceEvaluator(result).run(None, feeds)
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


ML_ONLY = """
<ir_version: 10, opset_import: ["ai.onnx.ml" : 1]>
g (float[4] x) => (float[4] y) { y = ai.onnx.ml.Binarizer <threshold = 0.5> (x) }
"""


def test_no_default_opset_comes_back_unchanged(rules):
    """A model of ai.onnx.ml ops only imports no default-domain opset: it is valid, nothing
    applies, and the input itself comes back (it was refused)."""
    model = onnx.parser.parse_model(ML_ONLY)
    onnx.checker.check_model(model, full_check=True)
    assert default_opset(model) == 0
    result, report = optimize_model(model, rules, fp=FP_CLASSES)
    assert result is model and not report.changed and not report.fired


def test_no_default_opset_cli(tmp_path):
    src, dst = tmp_path / "ml.onnx", tmp_path / "out.onnx"
    onnx.save(onnx.parser.parse_model(ML_ONLY), str(src))
    r = subprocess.run(
        [sys.executable, "-m", "rewrite.cli", "optimize", str(src), str(dst)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert dst.read_bytes() == src.read_bytes()


@pytest.mark.slow
def test_node_conformance_suite():
    """Every node conformance case (`_expanded` ones too), optimized with every numeric
    class: no crash, no invalid model, no wrong output; models without a default-domain
    opset come back unchanged. Cases that cannot run as given are printed with the reason."""
    from verify.conformance import FAILURES, run_suite

    results = run_suite([shipped_rules_dir()], jobs=2)
    by_name = {r.name: r for r in results}
    assert len(results) == len(by_name) > 1800  # onnx 1.23 has 1,884
    failures = [f"{r.outcome} {r.name}: {r.detail}" for r in results if r.outcome in FAILURES]
    assert not failures, "\n".join(failures)
    changed = [r for r in results if r.changed]
    assert sum(r.outcome == "ok" for r in changed) > 300  # the comparisons did run
    assert any(r.name.endswith("_expanded") and r.outcome == "ok" for r in changed)
    not_runnable = [r for r in results if r.outcome == "not-runnable"]
    print(f"\n{len(not_runnable)} changed cases cannot run as given under onnx.reference:")
    for r in not_runnable:
        print(f"  {r.name}: {r.detail}")
    ml_only = [r for r in results if r.opset == 0]
    assert len(ml_only) >= 15 and all(r.outcome == "unchanged" for r in ml_only)
