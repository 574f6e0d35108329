"""The `rewrite` command line: summaries, one-line errors, exit codes, nothing half-written."""

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest

from dsl import load_rules
from rewrite.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "resnet.onnx"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess, as a user would (catches tracebacks on stderr too)."""
    return subprocess.run(
        [sys.executable, "-m", "rewrite.cli", *args], capture_output=True, text=True, cwd=ROOT
    )


def small_model(path: Path) -> Path:
    text = (
        '<ir_version: 10, opset_import: ["" : 18]> g (float[2,3] x) => (float[2,3] y) '
        "{ t = Identity(x) y = Relu(t) }"
    )
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
        "--skip",
        "--only",
        "--input-shape",
        "--atol",
        "--rtol",
        "--external-data",
        "--no-external-data",
        "--explain",
        "--quiet",
        "--verbose",
    ):
        assert opt in r.stdout
    # every option has a help text: no option line of --help stands alone
    lines = r.stdout.split("options:")[1].splitlines()
    for i, line in enumerate(lines):
        if line.startswith("  -") and len(line.split()) <= 2 and "," not in line:
            assert lines[i + 1].startswith(" " * 10), line


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
    r = run_cli("optimize", str(src), str(out), "--rules", f"{ROOT / 'patterns'},{wrong}")
    assert r.returncode == 1 and "output check failed" in r.stderr, r.stdout + r.stderr
    assert "erf-as-identity" in r.stdout and not out.exists()
    r = run_cli("optimize", str(src), str(out))  # the shipped rules alone pass the same check
    assert r.returncode == 0 and out.exists(), r.stderr


# ---- issue 18, point 3: options as onnxsim/onnxslim have them ------------------------------


def cli_in_process(capsys, *args) -> tuple[int, str, str]:
    """Run `rewrite ARGS...` in this process: (status, stdout, stderr)."""
    status = main([str(a) for a in args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


DYNAMIC = """<ir_version: 10, opset_import: ["" : 18]>
g (int64[batch, seq] input_ids, float[batch, seq] mask) => (float[batch, seq, 4] y)
  <float[10, 4] emb = {0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 0., 1., 2., 3., 4., 5., 6., 7.,
   8., 9., 0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 0., 1., 2., 3., 4., 5., 6., 7., 8., 9.}> {
    e = Gather(emb, input_ids)
    m = Unsqueeze(mask, [-1])
    t = Mul(e, m)
    i = Identity(t)
    y = Relu(i) }"""


def dynamic_model(path: Path) -> Path:
    text = DYNAMIC.replace("Unsqueeze(mask, [-1])", "Unsqueeze(mask, axes)")
    text = text.replace("8., 9.}>", "8., 9.}, int64[1] axes = {-1}>")
    onnx.save(onnx.parser.parse_model(text), str(path))
    return path


def test_positional_after_allow_is_not_taken(tmp_path, capsys):
    out = tmp_path / "out.onnx"
    status, stdout, stderr = cli_in_process(
        capsys, "optimize", "--allow", "reassoc", small_model(tmp_path / "m.onnx"), out
    )
    assert status == 0, stderr
    assert out.exists() and "wrote" in stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--only", "identity,idempotent-relu"],
        ["--only", "identity", "--only", "idempotent-relu"],
        ["--skip", "idempotent-relu,transpose-transpose", "--allow", "reassoc,approx,quant"],
    ],
)
def test_comma_separated_and_repeated_values(tmp_path, capsys, args):
    rule = "identity"
    out, rep = tmp_path / "out.onnx", tmp_path / "r.json"
    status, _, stderr = cli_in_process(
        capsys, "optimize", small_model(tmp_path / "m.onnx"), out, *args, "--report", rep
    )
    assert status == 0, stderr
    skipped = json.loads(rep.read_text())["skipped"]
    if "--only" in args:
        assert rule not in skipped and "idempotent-relu" not in skipped
        assert skipped["transpose-transpose"] == "not in --only"
    else:
        assert skipped["idempotent-relu"].startswith("--skip")
        assert skipped["transpose-transpose"].startswith("--skip")
        assert not any("numeric class" in why for why in skipped.values())


@pytest.mark.parametrize("command", ["optimize", "quantize"])
def test_excluded_rules_count_out_of_every_rule_loaded(tmp_path, capsys, command):
    """ "excluded N of the M rules loaded" gives the same M whatever the patterns and the
    command (the black-box tester saw 303, 346 and 347 on one model: the rules kept plus
    those the patterns left out, which moved with the patterns, and not the quantization
    modes' rulesets optimize leaves out), and the report says why those did not run."""
    loaded = len(load_rules(ROOT / "patterns").rules)
    model = small_model(tmp_path / "m.onnx")
    totals = set()
    quant = "quantize-*," if command == "quantize" else ""  # (quantizing needs its rules)
    for args in (
        ["--skip", "ruleset:cleanup"],
        ["--only", f"{quant}transpose-*"],
        ["--only", f"{quant}identity"],
    ):
        rep = tmp_path / "r.json"
        status, _, stderr = cli_in_process(
            capsys, command, model, tmp_path / "o.onnx", *args, "--report", rep
        )
        assert status == 0, stderr
        line = next(x for x in stderr.splitlines() if "--skip/--only excluded" in x)
        totals.add(int(line.split(" of the ")[1].split()[0]))
        skipped = json.loads(rep.read_text())["skipped"]
        why = skipped.get("quantize-matmul-weight-4bit")
        if command == "optimize" and args[0] == "--skip":
            assert (
                why == "ruleset quant-weight-only-4bit runs only when quantizing (rewrite quantize)"
            )
    assert totals == {loaded}, (totals, loaded)


def test_unknown_numeric_class_is_one_usage_line(tmp_path, capsys):
    status, _, stderr = cli_in_process(
        capsys, "optimize", small_model(tmp_path / "m.onnx"), tmp_path / "o.onnx", "--allow", "x"
    )
    assert status == 2 and len(stderr.strip().splitlines()) == 1
    assert stderr.startswith("error: rewrite optimize: argument --allow") and "'x'" in stderr


def test_missing_rules_file_is_one_error_line(tmp_path, capsys):
    missing = tmp_path / "nope.rules"
    for cmd in (
        ["optimize", small_model(tmp_path / "m.onnx"), tmp_path / "o.onnx", "--rules", missing],
        ["check", missing],
        ["bisect", tmp_path / "m.onnx", "--rules", missing],
    ):
        status, _, stderr = cli_in_process(capsys, *cmd)
        assert status == 1, cmd
        assert stderr.strip().splitlines() == [
            f"error: --rules {missing}: no such file or directory"
            if cmd[0] == "optimize"
            else f"error: rules: {missing}: no such file or directory"
        ]
    assert not (tmp_path / "o.onnx").exists()


def test_unclosed_paren_names_its_line_and_column(tmp_path, capsys):
    rules = tmp_path / "open.rules"
    rules.write_text(";; header\n\n\n(simplify relu-relu\n  (Relu (Relu @x))\n  (Relu @x)\n")
    status, _, stderr = cli_in_process(capsys, "check", rules)
    assert status == 1
    assert stderr.splitlines()[0] == (
        f"{rules}:4:1: error: '(' is never closed: the file ends at 6:12"
    )


def test_quiet_prints_nothing_on_stdout(tmp_path, capsys):
    out = tmp_path / "out.onnx"
    status, stdout, stderr = cli_in_process(
        capsys, "optimize", small_model(tmp_path / "m.onnx"), out, "--quiet"
    )
    assert status == 0 and stdout == "" and stderr == "" and out.exists()


def test_verbose_prints_iterations_and_stage_times(tmp_path, capsys):
    status, stdout, stderr = cli_in_process(
        capsys, "optimize", small_model(tmp_path / "m.onnx"), tmp_path / "o.onnx", "-v"
    )
    assert status == 0
    assert "iteration 1:" in stdout and "not run:" in stdout
    assert "optimizing (import, saturate, extract, fold): " in stderr


def test_version(capsys):
    import rewrite

    status, stdout, _ = cli_in_process(capsys, "--version")
    assert status == 0 and stdout.strip() == f"rewrite {rewrite.__version__}"
    assert rewrite.__version__[0].isdigit()


def test_input_shape_fixes_dims_and_optimizes(tmp_path, capsys):
    src, out = dynamic_model(tmp_path / "d.onnx"), tmp_path / "o.onnx"
    status, stdout, stderr = cli_in_process(
        capsys, "optimize", src, out, "--input-shape", "input_ids:1,128"
    )
    assert status == 0, stderr
    model = onnx.load(str(out))
    dims = {
        i.name: [d.dim_value or d.dim_param for d in i.type.tensor_type.shape.dim]
        for i in [*model.graph.input, *model.graph.output]
    }
    # batch and seq are fixed wherever they appear: the mask shares them with the ids
    assert dims == {"input_ids": [1, 128], "mask": [1, 128], "y": [1, 128, 4]}
    assert "Identity" not in [n.op_type for n in model.graph.node]
    assert "y " in stdout and "ok" in stdout  # the output check ran on the fixed shapes


def test_input_shape_leaves_other_symbols(tmp_path):
    from frontends.onnx.api import fix_input_shapes

    model = onnx.load(str(dynamic_model(tmp_path / "d.onnx")))
    fixed = fix_input_shapes(model, {"mask": (3, 7)})
    dims = [d.dim_value for d in fixed.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [3, 7]
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "other"
    fixed = fix_input_shapes(model, {"mask": (3, 7)})
    ids = [d.dim_value or d.dim_param for d in fixed.graph.input[0].type.tensor_type.shape.dim]
    assert ids == [3, "seq"]


@pytest.mark.parametrize(
    "value,message",
    [
        ("nope:1,2", "error: input shape: the model has no input 'nope' (inputs: input_ids, mask)"),
        ("input_ids:1", "error: input shape: input_ids has rank 2, got 1 dims [1]"),
        (
            "input_ids=1,2",
            "error: input shape 'input_ids=1,2': expected NAME:DIMS with positive integer dims, "
            "e.g. input_ids:1,128",
        ),
        (
            "input_ids:1,x",
            "error: input shape 'input_ids:1,x': expected NAME:DIMS with positive integer dims, "
            "e.g. input_ids:1,128",
        ),
    ],
)
def test_input_shape_errors_are_one_line(tmp_path, capsys, value, message):
    src, out = dynamic_model(tmp_path / "d.onnx"), tmp_path / "o.onnx"
    status, _, stderr = cli_in_process(capsys, "optimize", src, out, "--input-shape", value)
    assert status == 1 and stderr.strip().splitlines() == [message]
    assert not out.exists()


def test_atol_rtol_reach_the_check(tmp_path, capsys):
    src = small_model(tmp_path / "m.onnx")
    status, stdout, _ = cli_in_process(capsys, "optimize", src, tmp_path / "a.onnx")
    assert status == 0 and "with rtol 1e-05, atol 1e-06" in stdout  # the defaults, printed
    status, stdout, _ = cli_in_process(
        capsys, "optimize", src, tmp_path / "b.onnx", "--atol", "0.5", "--rtol", "0.25"
    )
    assert status == 0
    assert "(--atol/--rtol): |a-b| <= atol + rtol*max|b| with rtol 0.25, atol 0.5" in stdout
    rep = tmp_path / "r.json"
    cli_in_process(capsys, "optimize", src, tmp_path / "c.onnx", "--atol", "0.5", "--report", rep)
    (check,) = json.loads(rep.read_text())["check"]
    assert (check["atol"], check["rtol"]) == (0.5, 1e-5)


def test_tolerance_decides_the_check(tmp_path):
    """A wrong rule whose error is small: refused at the default tolerance, accepted with a
    larger --atol (the check uses what it is given)."""
    from frontends.onnx.check import compare

    a = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 18]> g (float[2,3] x) => (float[2,3] y) '
        "<float[1] c = {0.001}> { y = Add(x, c) }"
    )
    b = onnx.parser.parse_model(
        '<ir_version: 10, opset_import: ["" : 18]> g (float[2,3] x) => (float[2,3] y) '
        "{ y = Identity(x) }"
    )
    assert not compare(a, b)[0].ok
    assert compare(a, b, atol=0.01)[0].ok
    assert not compare(a, b, atol=0.0001)[0].ok


def test_explain_says_what_the_rule_did(tmp_path, capsys):
    src = tmp_path / "z.onnx"
    onnx.save(
        onnx.parser.parse_model(
            '<ir_version: 10, opset_import: ["" : 18]> g (float[4,3] x, float[3,4] w) => '
            "(float[4,4] y) <float[1] z = {-0.0}> "
            "{ m = MatMul(x, w)  node_linear = Add(m, z)  y = Relu(node_linear) }"
        ),
        str(src),
    )
    status, stdout, _ = cli_in_process(capsys, "optimize", src, tmp_path / "o.onnx", "--explain")
    assert status == 0
    line = next(x for x in stdout.splitlines() if x.startswith("add-zero"))
    assert line.startswith("add-zero: removed Add node_linear, whose value MatMul m computes (")
    assert line.endswith(": (Add @x @zero) -> @x)")


def test_input_shape_on_an_exported_gpt2(tmp_path, capsys):
    """A model we did not write (transformers' GPT-2, two layers, TorchScript exporter, batch
    and seq dynamic): `--input-shape input_ids:1,128` fixes both inputs (the mask shares the
    symbols), the check runs at that shape, and fixed shapes let more fold than symbolic ones."""
    sys.path.insert(0, str(ROOT / "examples"))
    import make_models

    src = tmp_path / "gpt2.onnx"
    onnx.save(make_models.dynamic("gpt2", layers=2, hidden=128), str(src))
    fixed, dynamic = tmp_path / "fixed.onnx", tmp_path / "dynamic.onnx"
    status, stdout, stderr = cli_in_process(
        capsys, "optimize", src, fixed, "--input-shape", "input_ids:1,128", "--allow", "reassoc"
    )
    assert status == 0, stderr
    assert "last_hidden_state" in stdout and "FAIL" not in stdout
    model = onnx.load(str(fixed))
    shapes = {
        i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input
    }
    assert shapes == {"input_ids": [1, 128], "attention_mask": [1, 128]}
    assert cli_in_process(capsys, "optimize", src, dynamic, "--allow", "reassoc", "-q")[0] == 0
    n_fixed, n_dynamic = (len(onnx.load(str(p)).graph.node) for p in (fixed, dynamic))
    assert n_fixed < n_dynamic < len(onnx.load(str(src)).graph.node)


def test_model_that_cannot_run_is_one_error_line(tmp_path, capsys, monkeypatch):
    import frontends.onnx.api as api
    from frontends.onnx.check import CheckError

    def broken(*args, **kwargs):
        raise CheckError("onnxruntime cannot load the optimized model: boom")

    monkeypatch.setattr(api, "check_outputs", broken)
    out = tmp_path / "o.onnx"
    status, stdout, stderr = cli_in_process(
        capsys, "optimize", small_model(tmp_path / "m.onnx"), out, "--no-bisect"
    )
    assert status == 1 and stdout == "" and not out.exists()
    assert stderr.strip().splitlines() == [
        "error: output check: onnxruntime cannot load the optimized model: boom"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]  # nothing staged is left


@pytest.mark.parametrize("constant", [False, True])
def test_a_model_no_rule_improves_is_said_to_be_the_input_or_its_graph(tmp_path, capsys, constant):
    """Nothing cheaper found: the file is the input's graph, written anew; a Constant node
    becomes an initializer there, which the summary says instead of "the input unchanged"
    beside two node counts that differ."""
    two = (
        "c = Constant <value = float[1] {2.0}> ()\n        y = Mul (x, c)"
        if constant
        else "y = Relu (x)"
    )
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[4] x) => (float[4] y) {{
        {two}
    }}"""
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(onnx.parser.parse_model(text), src)
    assert main(["optimize", str(src), str(dst)]) == 0
    said = capsys.readouterr().out.split("wrote ")[-1].strip()
    if constant:
        assert said.endswith(
            "(2 -> 1 nodes; no rewrite made it cheaper, so it is the input's graph, its 1 "
            "Constant nodes as initializers)"
        )
    else:
        assert said.endswith(
            "(1 -> 1 nodes; no rewrite made it cheaper, so it is the input unchanged)"
        )


def test_a_bfloat16_model_is_optimized_and_checked_as_float(tmp_path, capsys):
    """bfloat16 constants crashed shape inference of new terms ("Unable to convert type
    dtype('V2')": a cache key kept the dtype's str, which for ml_dtypes' bfloat16 is void),
    and bfloat16 outputs were compared as integers."""
    import ml_dtypes
    from onnx import helper, numpy_helper

    def bf(name, a):
        return numpy_helper.from_array(np.asarray(a, np.float32).astype(ml_dtypes.bfloat16), name)

    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["y"])],
        "bf16",
        [helper.make_tensor_value_info("x", onnx.TensorProto.BFLOAT16, ["batch", 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.BFLOAT16, ["batch", 4])],
        [bf("w", rng.standard_normal((4, 4))), bf("b", rng.standard_normal(4))],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), str(dst)]) == 0
    out = capsys.readouterr().out
    assert "tolerance for bfloat16 (exact rules fired): |a-b| <= atol + rtol*max|b|" in out
    assert [n.op_type for n in onnx.load(dst).graph.node] == ["Gemm"]


def test_sequence_inputs_and_outputs_are_drawn_and_compared(tmp_path, capsys):
    """The output check drew only tensors (a sequence input: KeyError 0) and compared only
    arrays (a sequence output of tensors of two shapes: numpy's inhomogeneous-shape error)."""
    text = """
    <ir_version: 9, opset_import: ["" : 17]>
    g (seq(float[3]) s, float[5, 3] x) => (seq(float[?, 3]) parts, int64 n) {
        y = Relu (x)
        r = Relu (y)
        split = Constant <value = int64[2] {2, 3}> ()
        parts = SplitToSequence <axis = 0> (r, split)
        n = SequenceLength (s)
    }"""
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(onnx.parser.parse_model(text), src)
    assert main(["optimize", str(src), str(dst)]) == 0
    out = capsys.readouterr().out
    assert "parts" in out and "wrote" in out
    assert [n.op_type for n in onnx.load(dst).graph.node].count("Relu") == 1


@pytest.mark.parametrize("opset", [18, 22])
def test_outputs_of_random_draws_are_compared_on_shared_draws_or_not_at_all(
    tmp_path, capsys, opset
):
    """Two runs of one model differ where a random op draws (onnx.reference draws anew on each
    run; at opset 22 onnxruntime has no RandomNormalLike and the check falls back to it): y
    failed the check. Where onnxruntime runs the draw (opset 18) both models read the
    original's draws now and y is compared; where it cannot (22) y is not compared. z, from
    no draw, is compared either way."""
    text = f"""
    <ir_version: 10, opset_import: ["" : {opset}]>
    g (float[3, 4] x) => (float[3, 4] y, float[3, 4] z) {{
        t1 = Transpose <perm = [1, 0]> (x)
        t2 = Transpose <perm = [1, 0]> (t1)
        z = Relu (t2)
        n = RandomNormalLike (x)
        s = Shape (n)
        e = Expand (z, s)
        y = Add (e, n)
    }}"""
    src, dst, report = tmp_path / "m.onnx", tmp_path / "o.onnx", tmp_path / "r.json"
    onnx.save(onnx.parser.parse_model(text), src)
    assert main(["optimize", str(src), str(dst), "--report", str(report)]) == 0
    out = capsys.readouterr().out
    checks = {d["name"]: d for d in json.loads(report.read_text())["check"]}
    if opset == 22:
        assert "y      │ float │ -           │ -                │ not compared: random draws" in out
        assert checks["y"]["random"] and checks["y"]["max_rel"] is None
    else:
        assert not checks["y"]["random"] and checks["y"]["max_rel"] == 0.0
    assert not checks["z"]["random"] and checks["z"]["max_rel"] == 0.0
    assert "Transpose" not in [n.op_type for n in onnx.load(dst).graph.node]
    # a Shape of a draw is not random
    from frontends.onnx.check import random_outputs

    shaped = text.replace("y = Add (e, n)", "y = Add (e, e)")
    assert random_outputs(onnx.parser.parse_model(shaped)) == set()


_TAKES_4 = {
    # the fixed shape fails onnx's strict shape inference of the input itself
    "inferred": (
        "float[1, n] y",
        """p = Constant <value = float[1, 4] {1.0, 2.0, 3.0, 4.0}> ()
        s = Shape (x)
        e = Expand (p, s)
        y = Add (x, e)""",
        "error: the model does not take the input shapes given (--input-shape x:1,6): onnx's",
    ),
    # ... or only the run: a Gather of position rows 0..n-1 from a table of 4
    "run": (
        "float[1, n, 2] y",
        """table = Constant <value = float[4, 2] {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}> ()
        s = Shape <start = 1> (x)
        n = Squeeze (s)
        zero = Constant <value = int64 {0}> ()
        one = Constant <value = int64 {1}> ()
        pos = Range (zero, n, one)
        rows = Gather (table, pos)
        xu = Unsqueeze (x, one)
        xt = Transpose <perm = [0, 2, 1]> (xu)
        y = Mul (xt, rows)""",
        "error: output check: with the input shapes given (--input-shape), the original model "
        "does not run on the check's random inputs",
    ),
}


@pytest.mark.parametrize("where", _TAKES_4)
def test_an_input_shape_the_model_does_not_take_is_named(tmp_path, capsys, where):
    """An --input-shape beyond what the model's own shapes allow (a sequence longer than
    BERT's position table) failed with onnx's raw InferenceError as "optimization failed", or
    as a model that does not run on the check's random inputs."""
    out, body, said = _TAKES_4[where]
    text = f"""
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[1, n] x) => ({out}) {{
        {body}
    }}"""
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(onnx.parser.parse_model(text), src)
    assert main(["optimize", str(src), str(dst), "--input-shape", "x:1,6"]) == 1
    assert capsys.readouterr().err.replace("\n", " ").startswith(said) and not dst.exists()
    assert main(["optimize", str(src), str(dst), "--input-shape", "x:1,4"]) == 0


def _squeeze_by_input(tmp_path, rows: int):
    """m.onnx in `tmp_path`: y = Relu(Relu(Squeeze(x[rows, 3], axes))), axes a graph input
    (y as a valid squeeze gives it: x's shape when no axis has size 1)."""
    y = "3" if rows == 1 else f"{rows}, 3"
    text = f"""
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[{rows}, 3] x, int64[1] axes) => (float[{y}] y) {{
        s = Squeeze (x, axes)
        r = Relu (s)
        y = Relu (r)
    }}"""
    src = tmp_path / "m.onnx"
    onnx.save(onnx.parser.parse_model(text), src)
    return src


def test_an_original_that_cannot_run_on_the_checks_inputs_is_said_so_and_not_bisected(
    tmp_path, capsys
):
    """An input of axes (or a shape) drawn as 0 or 1 can make the given model fail before
    any rewrite: the error named the fallback executor alone and bisected the rules."""
    src, dst = _squeeze_by_input(tmp_path, rows=3), tmp_path / "o.onnx"  # no axis has size 1
    assert main(["optimize", str(src), str(dst)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "error: output check: the original model does not run on the check's random inputs "
        "(onnxruntime could not run the model: "
    )
    assert err[0].endswith("; --no-check writes the output unchecked") and "bisect" not in err[0]
    assert not dst.exists()


def test_check_inputs_are_the_inputs_the_output_check_runs_on(tmp_path, capsys):
    """A model whose integer input is an axis cannot run on the check's random draws (0 or
    1); --check-inputs gives the check inputs it can run on, and a bad file is one line."""
    src, dst = _squeeze_by_input(tmp_path, rows=1), tmp_path / "o.onnx"
    assert main(["optimize", str(src), str(dst), "-q"]) == 1
    assert "the original model does not run on the check's random inputs" in capsys.readouterr().err
    inputs = tmp_path / "in.npz"
    rng = np.random.default_rng(0)
    np.savez(
        inputs, x=rng.standard_normal((4, 1, 3)).astype(np.float32), axes=np.zeros((4, 1), np.int64)
    )
    assert main(["optimize", str(src), str(dst), "--check-inputs", str(inputs)]) == 0
    out = capsys.readouterr().out
    assert "output check (onnxruntime, the --check-inputs inputs)" in out
    assert [n.op_type for n in onnx.load(dst).graph.node] == ["Squeeze", "Relu"]
    np.savez(inputs, x=rng.standard_normal((4, 1, 3)).astype(np.float32))
    assert main(["optimize", str(src), str(dst), "--check-inputs", str(inputs)]) == 1
    err = capsys.readouterr().err
    assert "check-inputs file" in err and "no array for input 'axes'" in err
    assert len(err.splitlines()) == 1


_INTERRUPTED_IMPORT = """
import sys
class Stop:  # the user's Ctrl-C while the CLI's modules load
    def find_spec(self, name, path=None, target=None):
        if name == "rewrite.cli":
            raise KeyboardInterrupt
sys.meta_path.insert(0, Stop())
from rewrite.launch import main
main()
"""


def test_ctrl_c_while_the_cli_loads_is_one_line_and_a_death_by_sigint():
    """Ctrl-C in the command's first tenths of a second (its imports) printed a traceback of
    the import under way."""
    p = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_IMPORT], capture_output=True, text=True, timeout=60
    )
    assert p.stderr == "error: interrupted\n" and p.returncode == -signal.SIGINT


@pytest.mark.parametrize(
    "status, returncode", [(130, -signal.SIGINT), (143, -signal.SIGTERM), (1, 1), (0, 0)]
)
def test_an_interrupted_or_terminated_command_ends_by_its_signal(status, returncode):
    """The console script exited 143 after SIGTERM (130 after Ctrl-C): a parent's wait saw an
    exit, not the signal; the output's cleanup is done by then (main returned)."""
    code = f"import rewrite.cli as c; c.main = lambda: {status}; c.run()"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert p.returncode == returncode


@pytest.mark.parametrize("shapes", [[], ["--input-shape", "x:2,3"]])
def test_a_rule_that_writes_invalid_onnx_is_bisected_and_named(tmp_path, capsys, shapes):
    """A wrong rule whose result fails onnx's strict shape inference (a Reshape dropped whose
    0 copied the intermediate's dimension) ended in "optimization failed: InferenceError",
    no rule named; with --input-shape it was put down to the shapes (they passed the check at
    load) and nothing was bisected."""
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[2, 3] x) => (float[6, 1] y) <int64[2] s1 = {6, 1}, int64[2] s2 = {0, -1}> {
        r = Reshape (x, s1)
        y = Reshape (r, s2)
    }"""
    rules = tmp_path / "mine.rules"
    rules.write_text(
        "(simplify reshape-reshape-unguarded (Reshape (Reshape @x @s1) @s2) (Reshape @x @s2))\n"
    )
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(onnx.parser.parse_model(text), src)
    assert main(["optimize", str(src), str(dst), "--rules", str(rules), *shapes]) == 1
    report = capsys.readouterr().err
    # (it said the matches were on terms other rewrites built: the run raised, no report)
    assert "site: not isolated: optimizing raised, so the sites it fired at are not known" in report
    err = report.strip().splitlines()[-1]
    assert err.startswith(
        "error: the optimized model fails onnx's full check: [ShapeInferenceError]"
    )
    assert err.endswith(f"culprit: rule reshape-reshape-unguarded ({rules}:1)") and not dst.exists()


def test_add_rules_runs_a_users_rules_beside_the_library(tmp_path, capsys):
    """--rules mine.rules replaces the library; adding to it needed the library's path
    (`--rules patterns,mine.rules` works from the repository's root only)."""
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[2, 3] x) => (float[2, 3] y) {
        n = Neg (x)
        m = Neg (n)
        s = Softsign (m)
        y = Softsign (s)
    }"""
    mine = tmp_path / "mine.rules"  # not in the library: Softsign(Softsign(x)) is not exact
    mine.write_text("(simplify softsign-twice-sketch (Softsign (Softsign @x)) (Softsign @x))\n")
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(onnx.parser.parse_model(text), src)

    def fired(*flags):
        assert main(["optimize", str(src), str(dst), "--no-check", *flags]) == 0
        return [n.op_type for n in onnx.load(dst).graph.node]

    assert fired() == ["Softsign", "Softsign"]  # the library: the Negs cancel
    assert fired("--rules", str(mine)) == ["Neg", "Neg", "Softsign"]  # mine alone
    assert fired("--add-rules", str(mine)) == ["Softsign"]  # both
    capsys.readouterr()


def test_bisection_reads_the_same_draws_as_the_check(tmp_path, capsys):
    """The output check left out the random output y, the bisection did not: each of its
    runs failed on y, and it named the harmless rule it tried first (a reviewer's case). Both
    feed the original's draws now; and y, the draw plus the broken Negs, is caught too."""
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[3, 4] x) => (float[3, 4] y, float[3, 4] z) {
        a1 = Relu (x)
        a = Relu (a1)
        n1 = Neg (a)
        z = Neg (n1)
        y = RandomNormalLike (x)
    }"""
    rules = tmp_path / "two.rules"
    rules.write_text(
        "(simplify relu-relu (Relu (Relu @x)) (Relu @x))\n"
        "(simplify neg-neg-wrong (Neg (Neg @x)) (Neg @x))\n"
    )
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(onnx.parser.parse_model(text), src)
    assert main(["optimize", str(src), str(dst), "--rules", str(rules)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: output check failed for z; nothing written; culprit: rule")
    assert f"culprit: rule neg-neg-wrong ({rules}:2)" in err
    # a draw with the deterministic part added: compared on the shared draws, and caught
    mixed = text.replace("y = RandomNormalLike (x)", "r = RandomNormalLike (x)\n y = Add (z, r)")
    onnx.save(onnx.parser.parse_model(mixed), src)
    assert main(["optimize", str(src), str(dst), "--rules", str(rules)]) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: output check failed for y, z; nothing written; culprit: rule")
    assert f"culprit: rule neg-neg-wrong ({rules}:2)" in err


def test_a_check_that_compared_no_output_is_warned_of(tmp_path, capsys):
    # (opset 22: onnxruntime has no RandomNormalLike-22, so the draws cannot be shared)
    text = """
    <ir_version: 10, opset_import: ["" : 22]>
    g (float[3, 4] x) => (float[3, 4] y) {
        n1 = Neg (x)
        a = Neg (n1)
        r = RandomNormalLike <scale: float = 0.001> (x)
        y = Add (a, r)
    }"""
    src, dst = tmp_path / "m.onnx", tmp_path / "o.onnx"
    onnx.save(onnx.parser.parse_model(text), src)
    assert main(["optimize", str(src), str(dst), "-q"]) == 0
    assert capsys.readouterr().err == (
        "warning: the output check compared no output: each is computed from a random op's "
        "draws, which differ from run to run, so the rewrites are unchecked\n"
    )


def test_a_random_value_a_branch_reads_from_outside_makes_its_output_random():
    from frontends.onnx.check import random_outputs

    then = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["r"], ["t"])],
        "then",
        [],
        [onnx.helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [3])],
    )
    g = onnx.helper.make_graph(
        [
            onnx.helper.make_node("RandomNormalLike", ["x"], ["r"]),
            onnx.helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=then),
        ],
        "g",
        [
            onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3]),
            onnx.helper.make_tensor_value_info("c", onnx.TensorProto.BOOL, []),
        ],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [3])],
    )
    assert random_outputs(onnx.helper.make_model(g)) == {"y"}


def test_onnxruntime_logs_nothing_beside_the_error_line(tmp_path):
    """A model the check's random inputs cannot run (an int64 input that is a Reshape's
    shape): the error is the one line, without onnxruntime's own coloured error log before it
    (the check's sessions logged at error level)."""
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 6])
    s = onnx.helper.make_tensor_value_info("s", onnx.TensorProto.INT64, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 6])
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Reshape", ["x", "s"], ["y"])], "g", [x, s], [y]
    )
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=9
    )
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    r = run_cli("optimize", str(src), str(tmp_path / "o.onnx"))
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: output check:"), r.stderr
