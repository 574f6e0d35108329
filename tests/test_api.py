"""The short Python API: `rewrite.optimize_model(model)` (a ModelProto or a path, the CLI's
options as keywords) and `rewrite.optimize_fx(..., allow=...)`, with the same names."""

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import pytest
from onnx import numpy_helper

import rewrite
from frontends.onnx.api import OptionError, Options, OutputMismatch

ROOT = Path(__file__).resolve().parent.parent
RESNET = ROOT / "examples" / "resnet.onnx"

CHAIN = """<ir_version: 10, opset_import: ["" : 18]>
g (float[N,3] x) => (float[N,3] y) { t = Identity(x)  y = Relu(t) }"""


def test_import_rewrite_stays_light():
    code = "import sys, rewrite; print('onnx' in sys.modules, 'torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.stdout.split() == ["False", "False"], r.stderr


def test_optimize_model_on_a_model_proto():
    model = onnx.parser.parse_model(CHAIN)
    optimized, report = rewrite.optimize_model(model)
    assert [n.op_type for n in optimized.graph.node] == ["Relu"]
    assert report.nodes_before == 2 and report.nodes_after == 1 and report.changed
    (check,) = report.extra["check"]
    assert check["name"] == "y" and check["ok"]


def test_optimize_model_on_a_path_with_options():
    optimized, report = rewrite.optimize_model(
        str(RESNET), allow=["reassoc"], skip="transpose-transpose", max_iterations=10
    )
    ops = report.ops_after
    assert "BatchNormalization" not in ops and report.nodes_after < report.nodes_before
    assert report.skipped["transpose-transpose"].startswith("--skip")
    onnx.checker.check_model(optimized)
    _, exact = rewrite.optimize_model(RESNET, check=False)
    assert "BatchNormalization" in exact.ops_after  # exact rules only by default


def test_optimize_model_path_with_external_data_returns_the_weights(tmp_path):
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    text = """<ir_version: 10, opset_import: ["" : 18]>
    g (float[2,3] x) => (float[2,4] y) { m = MatMul(x, w) i = Identity(m) y = Relu(i) }"""
    model = onnx.parser.parse_model(text)
    model.graph.initializer.append(numpy_helper.from_array(np.tile(w, (1, 100))[:, :4], "w"))
    path = tmp_path / "m.onnx"
    onnx.save_model(model, str(path), save_as_external_data=True, size_threshold=0)
    optimized, _ = rewrite.optimize_model(path)
    (t,) = optimized.graph.initializer
    assert t.data_location != onnx.TensorProto.EXTERNAL
    np.testing.assert_array_equal(numpy_helper.to_array(t), np.tile(w, (1, 100))[:, :4])


def test_unknown_keyword_is_a_type_error_naming_it():
    with pytest.raises(TypeError) as e:
        rewrite.optimize_model(onnx.parser.parse_model(CHAIN), alow=["reassoc"])
    msg = str(e.value)
    assert "'alow'" in msg and "accepted: rules, allow, skip, only, check" in msg


@pytest.mark.parametrize(
    "kw,text",
    [
        ({"allow": ["fast"]}, "allow: unknown numeric class 'fast'"),
        ({"max_nodes": 0}, "max-nodes must be a positive integer, not 0"),
        ({"max_iterations": 2.5}, "max-iterations must be a positive integer, not 2.5"),
        ({"timeout": "10"}, "timeout must be a positive number of seconds, not '10'"),
        ({"atol": "big"}, "atol must be a number >= 0, not 'big'"),
        ({"check": False, "check_inputs": "x.npz"}, "check-inputs are for the output check"),
        (
            {"quantize": "dynamic", "calibration": "x.npz", "check": False},
            "calibration inputs are used in mode dynamic .* by the output check only",
        ),
        ({"quantize": "dynamic", "smooth": "0.5"}, "smooth must be a number, not '0.5'"),
        ({"quantize": "dynamic", "error_budget": "5%"}, "error-budget must be a number, not '5%'"),
        ({"quantize": "weight-only", "bits": "4"}, "bits: mode weight-only takes 4 or 8, not '4'"),
        ({"input_shapes": {"nope": (1, 3)}}, "no input 'nope'"),
        ({"input_shapes": ["x:1;3"]}, "expected NAME:DIMS"),
        ({"rules": "no/such.rules"}, "rules: no/such.rules: no such file or directory"),
    ],
)
def test_bad_values_are_option_errors(kw, text):
    with pytest.raises(OptionError, match=text.replace("(", r"\(")):
        rewrite.optimize_model(onnx.parser.parse_model(CHAIN), **kw)


def test_input_shapes_keyword():
    optimized, _ = rewrite.optimize_model(onnx.parser.parse_model(CHAIN), input_shapes=["x:5,3"])
    dims = [d.dim_value for d in optimized.graph.input[0].type.tensor_type.shape.dim]
    assert dims == [5, 3]
    assert [d.dim_value for d in optimized.graph.output[0].type.tensor_type.shape.dim] == [5, 3]
    # an output whose dims are symbols of their own (TorchScript names each one), which fixing
    # the input's symbols leaves as they were: the analyzed sizes are written
    model = onnx.parser.parse_model(CHAIN)
    for d, name in zip(model.graph.output[0].type.tensor_type.shape.dim, ("out_0", "out_1")):
        d.dim_param = name
    optimized, _ = rewrite.optimize_model(model, input_shapes=["x:5,3"])
    assert [d.dim_value for d in optimized.graph.output[0].type.tensor_type.shape.dim] == [5, 3]


def test_failed_check_raises_output_mismatch(tmp_path):
    wrong = tmp_path / "wrong.rules"
    wrong.write_text("(simplify relu-as-identity (Relu @x) @x)\n")
    with pytest.raises(OutputMismatch, match="output check failed for y") as e:
        rewrite.optimize_model(onnx.parser.parse_model(CHAIN), rules=wrong)
    assert not e.value.run.diffs[0].ok
    optimized, _ = rewrite.optimize_model(onnx.parser.parse_model(CHAIN), rules=wrong, check=False)
    assert "Relu" not in [n.op_type for n in optimized.graph.node]


def test_atol_reaches_the_check(tmp_path):
    wrong = tmp_path / "wrong.rules"
    wrong.write_text("(simplify relu-as-identity (Relu @x) @x)\n")
    # a Relu of values >= 100 is the identity: right at any tolerance
    model = onnx.parser.parse_model(
        """<ir_version: 10, opset_import: ["" : 18]>
        g (float[2,3] x) => (float[2,3] y) <float[1] c = {100.0}> { a = Abs(x) b = Add(a, c)
        y = Relu(b) }"""
    )
    rewrite.optimize_model(model, rules=wrong)
    model.graph.initializer[0].float_data[0] = -0.5  # now some Relu inputs are negative
    with pytest.raises(OutputMismatch):
        rewrite.optimize_model(model, rules=wrong)
    _, report = rewrite.optimize_model(model, rules=wrong, atol=10.0)
    assert report.extra["check"][0]["atol"] == 10.0


def test_optimize_fx_takes_allow():
    torch = pytest.importorskip("torch")
    from torch import nn

    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    x = torch.randn(1, 3, 8, 8)
    gm = torch.fx.symbolic_trace(module)
    _, exact = rewrite.optimize_fx(gm, (x,))
    assert "BatchNorm2d" in exact.ops_after
    out, report = rewrite.optimize_fx(gm, (x,), allow=("reassoc",), rtol=1e-3, atol=1e-4)
    assert "BatchNorm2d" not in report.ops_after and report.fp == "reassoc"
    torch.testing.assert_close(out(x), module(x), rtol=1e-3, atol=1e-4)
    _, same = rewrite.optimize_fx(gm, (x,), allow="reassoc")
    assert same.ops_after == report.ops_after
    with pytest.raises(TypeError, match=r"'fp'.*accepted: allow, skip, only"):
        rewrite.optimize_fx(gm, (x,), fp=("exact", "reassoc"))
    # the module itself, not traced: said so (it was an AttributeError: no attribute 'graph')
    with pytest.raises(TypeError, match=r"GraphModule or a torch.export.ExportedProgram, not a"):
        rewrite.optimize_fx(module, (x,))


def test_calibration_takes_a_path():
    """Arrays given where a path goes are a one-line OptionError, not "cannot read
    calibration file {'x': array([...` with every value printed."""
    arrays = {"pixel_values": np.zeros((4, 1, 3, 64, 64), np.float32)}
    for name in ("calibration", "validation", "check_inputs"):
        with pytest.raises(OptionError, match="takes the path of an .npz file, not a dict") as e:
            rewrite.optimize_model(str(RESNET), quantize="static", **{name: arrays})
        assert "array(" not in str(e.value)


def test_progress_shows_a_stage_on_a_terminal_only():
    from rich.console import Console

    from rewrite.cli import _Stages

    for terminal in (True, False):
        buffer = io.StringIO()
        console = Console(file=buffer, force_terminal=terminal, width=80)
        stages = _Stages(delay=0.0, console=console)
        with stages.stage("optimizing"):
            for _ in range(200):  # the status is drawn from a timer thread
                if buffer.getvalue():
                    break
                import time

                time.sleep(0.01)
        assert ("optimizing" in buffer.getvalue()) == terminal
    buffer = io.StringIO()
    quiet = _Stages(quiet=True, verbose=True, delay=0.0, console=Console(file=buffer))
    with quiet.stage("optimizing"):
        pass
    assert buffer.getvalue() == ""


def test_a_stage_shows_the_detail_it_reports_on_a_terminal_only():
    import time

    from rich.console import Console

    from rewrite.cli import _Stages

    for terminal in (True, False):
        buffer = io.StringIO()
        console = Console(file=buffer, force_terminal=terminal, width=120)
        with _Stages(delay=0.0, console=console).stage("optimizing") as detail:
            detail("site 3 of 38 quantized alone")
            for _ in range(200):  # the status is drawn from a timer thread
                if "site 3" in buffer.getvalue():
                    break
                time.sleep(0.01)
        assert ("optimizing: site 3 of 38 quantized alone" in buffer.getvalue()) == terminal


def test_backend_names_an_unknown_option():
    torch = pytest.importorskip("torch")
    from torch import nn

    from frontends.fx.backend import rewrite_backend

    gm = torch.fx.symbolic_trace(nn.Sequential(nn.ReLU()))
    # the backend's own options first: it listed optimize_fx's alone (the black-box tester)
    with pytest.warns(UserWarning, match=r"unknown option 'fp'; accepted: backend, cache, allow"):
        rewrite_backend(gm, [torch.randn(2)], {"backend": "eager", "fp": ("exact",)})


def test_numpy_integers_are_whole_numbers_to_the_options():
    """An opset or held-out count computed with numpy (np.int64) was refused as not an
    integer; a bool is still not one."""
    Options.from_keywords({"opset": np.int64(18)}).validate()
    Options.from_keywords(
        {"quantize": "dynamic", "error_budget": 0.1, "held_out": np.int64(2)}
    ).validate()
    with pytest.raises(OptionError, match="opset must be a positive integer, not True"):
        Options.from_keywords({"opset": True}).validate()
