"""The `rewrite` command line: summaries, one-line errors, exit codes, nothing half-written."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

from rewrite.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "resnet.onnx"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a user would (catches tracebacks on stderr too)."""
    return subprocess.run(
        [sys.executable, "-m", "rewrite.cli", *args], capture_output=True, text=True, cwd=ROOT
    )


def small_model(path: Path) -> Path:
    text = '<ir_version: 10, opset_import: ["" : 18]> g (float[2,3] x) => (float[2,3] y) { t = Identity(x) y = Relu(t) }'
    onnx.save(onnx.parser.parse_model(text), str(path))
    return path


def test_optimize_writes_model_and_report(tmp_path):
    out, rep = tmp_path / "out.onnx", tmp_path / "r.json"
    r = run_cli("optimize", str(EXAMPLE), str(out), "--report", str(rep), "--allow", "reassoc")
    assert r.returncode == 0, r.stderr
    assert (
        "BatchNormalization" in r.stdout
        and "saturated" in r.stdout
        and "fold-batchnorm" in r.stdout
    )
    assert "rtol 0.001, atol 0.0001" in r.stdout  # the tolerance is stated
    model = onnx.load(str(out))
    onnx.checker.check_model(model, full_check=True)
    data = json.loads(rep.read_text())
    assert (
        data["nodes_before"] == 21
        and data["nodes_after"] == 15
        and data["stop_reason"] == "saturated"
    )
    assert all(c["ok"] for c in data["check"])


def test_optimize_exact_only_by_default(tmp_path):
    out = tmp_path / "out.onnx"
    assert main(["optimize", str(EXAMPLE), str(out)]) == 0
    assert sum(n.op_type == "BatchNormalization" for n in onnx.load(str(out)).graph.node) == 6


@pytest.mark.parametrize(
    "make_input, message",
    [
        (lambda d: d / "missing.onnx", "missing.onnx: no such file"),
        (
            lambda d: (d / "junk.onnx").write_bytes(b"\x00\xffnot a model") and d / "junk.onnx",
            "not an ONNX model",
        ),
        (lambda d: d, "not a file"),
    ],
    ids=["missing", "not-onnx", "directory"],
)
def test_bad_model_one_line_error(tmp_path, make_input, message):
    out = tmp_path / "out.onnx"
    r = run_cli("optimize", str(make_input(tmp_path)), str(out))
    assert r.returncode == 1
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "Traceback" not in r.stderr and not out.exists()


def test_checker_rejected_model(tmp_path):
    bad = small_model(tmp_path / "bad.onnx")
    m = onnx.load(str(bad))
    m.graph.node[1].input[0] = "nowhere"  # a dangling input
    onnx.save(m, str(bad))
    out = tmp_path / "out.onnx"
    r = run_cli("optimize", str(bad), str(out))
    assert r.returncode == 1 and "rejected by onnx.checker" in r.stderr and not out.exists()
    assert len(r.stderr.strip().splitlines()) == 1


def test_rules_syntax_error_located(tmp_path):
    rules = tmp_path / "bad.rules"
    rules.write_text("(simplify oops\n  (Identity @x)\n")
    out = tmp_path / "out.onnx"
    r = run_cli("optimize", str(small_model(tmp_path / "m.onnx")), str(out), "--rules", str(rules))
    assert (
        r.returncode == 1
        and f"{rules}:" in r.stderr
        and "^" in r.stderr
        and "Traceback" not in r.stderr
    )
    assert not out.exists()


def test_output_onto_input(tmp_path):
    """OUT may be IN: the input is read whole first and replaced only by a checked result."""
    m = small_model(tmp_path / "m.onnx")
    r = run_cli("optimize", str(m), str(m))
    assert r.returncode == 0, r.stderr
    assert [n.op_type for n in onnx.load(str(m)).graph.node] == ["Relu"]
    assert [p.name for p in tmp_path.iterdir()] == ["m.onnx"]  # no temporary file left


def test_output_onto_input_intact_on_failure(tmp_path):
    m = small_model(tmp_path / "m.onnx")
    before = m.read_bytes()
    wrong = tmp_path / "wrong.rules"
    wrong.write_text("(ruleset wrong)\n(simplify relu-as-identity (Relu @x) @x)\n")
    r = run_cli("optimize", str(m), str(m), "--rules", str(wrong))
    assert r.returncode == 1 and "output check failed" in r.stderr, r.stdout + r.stderr
    assert m.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "wrong.rules"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_output_mode_follows_umask(tmp_path, umask):
    """The output gets a new file's mode under the user's umask (not a temporary file's 0600),
    also when it replaces an existing file."""
    m = small_model(tmp_path / "m.onnx")
    out = tmp_path / "out.onnx"
    for _ in range(2):  # created, then replaced
        r = subprocess.run(
            [sys.executable, "-m", "rewrite.cli", "optimize", str(m), str(out)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            preexec_fn=lambda: os.umask(umask),
        )
        assert r.returncode == 0, r.stderr
        assert stat.S_IMODE(out.stat().st_mode) == 0o666 & ~umask


def test_existing_output_untouched_on_failure(tmp_path):
    out = tmp_path / "out.onnx"
    out.write_bytes(b"precious")
    r = run_cli("optimize", str(tmp_path / "missing.onnx"), str(out))
    assert r.returncode == 1 and out.read_bytes() == b"precious"


def test_check_summary_and_errors(tmp_path, capsys):
    assert main(["check", str(ROOT / "patterns")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == len(list((ROOT / "patterns").rglob("*.rules")))
    assert all(": ok, " in line for line in lines)
    bad = tmp_path / "bad.rules"
    bad.write_text("(simplify x (Idenity @x) @x)\n")
    assert main(["check", str(bad)]) == 1
    assert "Identity" in capsys.readouterr().err  # "did you mean"


def test_emit_shows_each_rule_with_its_location(capsys):
    assert main(["emit", str(ROOT / "patterns" / "cleanup" / "transpose.rules")]) == 0
    text = capsys.readouterr().out
    assert ";; transpose-transpose  (" in text and "transpose.rules:" in text
    assert "(relation match-transpose-transpose (Term Term String String))" in text
    assert text.strip().endswith(")")


def test_help_explains_options():
    r = run_cli("optimize", "--help")
    assert r.returncode == 0
    for opt in (
        "--rules",
        "--no-check",
        "--report",
        "--max-iterations",
        "--max-nodes",
        "--timeout",
        "--allow",
    ):
        assert opt in r.stdout


def test_explain_says_why_rules_did_not_fire(tmp_path):
    r = run_cli("optimize", str(EXAMPLE), str(tmp_path / "o.onnx"), "--explain")
    assert r.returncode == 0, r.stderr
    assert "guard (negative-zeros @zero) failed" in r.stdout  # add-zero matched residual Adds
    assert "fold-batchnorm-into-conv (numeric class reassoc not allowed)" in r.stdout


def test_output_check_scales_with_the_output():
    """A few ulps off an element near zero pass when the output's magnitude is large (a
    correct MatMul+Add -> Gemm on Whisper was refused elementwise); a real error does not."""
    from onnx import TensorProto

    from frontends.onnx.check import TOLERANCES, _diff

    want = np.array([1.0, -2.0, 1e-7, 3.0], np.float32)
    near = want.copy()
    near[2] += 2.2e-6  # 22x the element, 1e-6 of the output's scale
    assert _diff("y", TensorProto.FLOAT, near, want, TOLERANCES["exact"]).ok
    far = want.copy()
    far[0] += 1e-3
    assert not _diff("y", TensorProto.FLOAT, far, want, TOLERANCES["exact"]).ok
    nan = want.copy()
    nan[1] = np.nan
    assert not _diff("y", TensorProto.FLOAT, nan, want, TOLERANCES["exact"]).ok


def test_wrong_rule_on_a_real_model_is_refused(tmp_path):
    """A wrong rule (Erf(x) as x, inside GELU) among the shipped ones, on a real BERT export:
    the output check refuses the result, nothing is written."""
    sys.path.insert(0, str(ROOT / "examples"))
    import make_models

    src = tmp_path / "bert.onnx"
    make_models.bert(src, exporter="torchscript")
    wrong = tmp_path / "wrong.rules"
    wrong.write_text("(ruleset wrong)\n(simplify erf-as-identity (Erf @x) @x)\n")
    out = tmp_path / "out.onnx"
    r = run_cli("optimize", str(src), str(out), "--rules", str(ROOT / "patterns"), str(wrong))
    assert r.returncode == 1 and "output check failed" in r.stderr, r.stdout + r.stderr
    assert "erf-as-identity" in r.stdout and not out.exists()
    r = run_cli("optimize", str(src), str(out))  # the shipped rules alone pass the same check
    assert r.returncode == 0 and out.exists(), r.stderr
