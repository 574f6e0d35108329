"""SmoothQuant's scale migration (`rewrite quantize --smooth`, patterns/quant/smooth.rules)."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import rewrite
from frontends.onnx.api import OptionError
from frontends.onnx.quantize import (
    SMOOTH,
    Chooser,
    smoothing_divisions,
    smoothing_marks,
    tail_share,
)
from rewrite.cli import main

K, N, TOKENS = 256, 256, 128
OUTLIERS = [3, 17, 140]  # channels a trained transformer's LayerNorm makes large (its outlier dims)


def block(outlier: float = 30.0) -> onnx.ModelProto:
    """x[1, TOKENS, K] -> LayerNormalization (gamma with a few channels `outlier` times the
    rest, as trained BERTs have) -> two MatMuls by constant weights (a Q and a K projection)
    and the residual Add of the normalized value: the normalization has another reader, so the
    smoothed product reads its own division of it. Trained-like: random gamma, beta, biases."""
    rng = np.random.default_rng(1)
    gamma = rng.uniform(0.5, 1.5, K).astype(np.float32)
    gamma[OUTLIERS] *= outlier
    beta = rng.normal(0, 0.1, K).astype(np.float32)
    wq = rng.normal(0, 0.1, (K, N)).astype(np.float32)
    wk = rng.normal(0, 0.1, (K, N)).astype(np.float32)
    wo = rng.normal(0, 0.1, (N, K)).astype(np.float32)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["h"], epsilon=1e-5),
        helper.make_node("MatMul", ["h", "wq"], ["q"]),
        helper.make_node("MatMul", ["h", "wk"], ["k"]),
        helper.make_node("Mul", ["q", "k"], ["qk"]),
        helper.make_node("MatMul", ["qk", "wo"], ["o"]),
        helper.make_node("Add", ["o", "h"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(v, n)
        for n, v in dict(gamma=gamma, beta=beta, wq=wq, wk=wk, wo=wo).items()
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, TOKENS, K])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, TOKENS, K])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def feeds(n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.normal(0, 1, (1, TOKENS, K)).astype(np.float32)} for _ in range(n)]


def run(model: onnx.ModelProto, feed: dict) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feed)[0]


def test_the_marked_factors_follow_the_papers_formula():
    model = block()
    cal = feeds(4, 0)
    marked, count = smoothing_marks(model, cal, alpha=0.5)
    marks = [n for n in marked.graph.node if (n.domain, n.op_type) == SMOOTH]
    # one mark for h, read by both projections, and one for `qk`, the output projection's
    # input, made by a Mul of two activations (nothing constant takes its division)
    assert count == 2 and sorted(m.input[0] for m in marks) == ["h", "qk"]
    readers = [n.op_type for n in marked.graph.node if marks[0].output[0] in n.input]
    assert readers == ["MatMul", "MatMul"]
    assert "h" in [i for n in marked.graph.node if n.op_type == "Add" for i in n.input]
    s = numpy_helper.to_array(
        next(t for t in marked.graph.initializer if t.name == marks[0].input[1])
    )
    # s_j = max|h_j|^a / max|w_j|^(1-a), the weight's max over both readers' row j
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend([helper.make_empty_tensor_value_info("h")])
    sess = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    amax = np.max([np.abs(sess.run(["h"], f)[0]).reshape(-1, K).max(0) for f in cal], axis=0)
    wmax = np.maximum(np.abs(inits["wq"]).max(1), np.abs(inits["wk"]).max(1))
    np.testing.assert_allclose(s, np.sqrt(amax) / np.sqrt(wmax), rtol=1e-5)
    assert s[OUTLIERS].min() > 3 * np.median(s)  # the outlier channels hand over the most


def test_smoothing_alone_keeps_the_function():
    """alpha 0 with quantization off would be a no-op; here the smoothing pass's result
    before quantization equals the float model within float32 regrouping."""
    model = block()
    cal = feeds(4, 0)
    marked, _ = smoothing_marks(model, cal, alpha=0.5)
    out, report = rewrite.optimize_model(marked, allow=["reassoc"], check=False)
    assert not [n for n in out.graph.node if n.domain == SMOOTH[0]]
    assert report.fired.get("smooth-matmul", 0) >= 3
    # qk / s has nowhere to go: it stays a Div, and so does h / s, as h also feeds the
    # residual Add (a Div costs less than a second LayerNormalization)
    assert smoothing_divisions(out, marked) == 2
    # the weights were scaled: no original projection weight is read any more
    read = {i for n in out.graph.node for i in n.input}
    assert "wq" not in read and "wk" not in read
    x = feeds(1, 7)[0]
    want, got = run(model, x), run(out, x)
    assert np.abs(want).std() > 0.1  # not a degenerate output
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_smoothing_lowers_the_dynamic_quantization_error_of_outlier_channels(tmp_path, per_channel):
    model = block()
    cal = feeds(8, 0)
    path = tmp_path / "cal.npz"
    np.savez(path, x=np.stack([f["x"] for f in cal]))
    kw = dict(quantize="dynamic", per_channel=per_channel, check=False)
    plain, _ = rewrite.optimize_model(model, **kw)
    smooth, report = rewrite.optimize_model(model, smooth=0.5, calibration=str(path), **kw)
    assert report.extra["quantize"]["smoothing"] == {
        "alpha": 0.5,
        "samples": 8,
        "activations": 2,
        "smoothed": 2,
        "divisions": 2,
    }
    for q in (plain, smooth):
        assert [n.op_type for n in q.graph.node].count("MatMulInteger") == 3
    assert not [n for n in smooth.graph.node if n.domain == SMOOTH[0]]
    assert SMOOTH[0] not in {o.domain for o in smooth.opset_import}  # nor the marks' domain

    def error(q):
        worst = 0.0
        for f in feeds(8, 100):
            want = run(model, f)
            assert np.abs(want).std() > 0.1
            worst = max(worst, float(np.abs(run(q, f) - want).max() / np.abs(want).max()))
        return worst

    before, after = error(plain), error(smooth)
    assert after < 0.7 * before, (before, after)


def test_smoothing_then_gptq_rounding_compose(tmp_path):
    # --smooth's pass runs first; GPTQ then rounds the smoothed weights on the smoothed
    # activations (what the quantization rules see): both records, no mark of either left
    model = block()
    path = tmp_path / "cal.npz"
    np.savez(path, x=np.stack([f["x"] for f in feeds(16, 0)]))
    kw = dict(quantize="dynamic", smooth=0.5, calibration=str(path), check=False)
    smooth, _ = rewrite.optimize_model(model, **kw)
    both, report = rewrite.optimize_model(model, rounding="gptq", **kw)
    record = report.extra["quantize"]
    assert record["smoothing"]["smoothed"] == 2
    # q and k read activations whose channels hardly correlate: their rounding, 0.91 of the
    # nearest levels' error on the inputs it was fitted to, is 1.02 of it on the held-out ones
    # (measured), so they keep their nearest levels; o's is 0.10 of it on both
    assert record["rounding"] == {
        "method": "gptq",
        "samples": 16,
        "held_out": 4,
        "weights": 1,
        "nearest": ["q", "k"],
    }
    assert not [n for n in both.graph.node if n.domain]
    assert [n.op_type for n in both.graph.node].count("MatMulInteger") == 3
    int8 = lambda q: [numpy_helper.to_array(t) for t in q.graph.initializer if t.data_type == 3]  # noqa: E731
    assert len(int8(both)) == 3
    same = [np.array_equal(a, b) for a, b in zip(int8(both), int8(smooth))]
    assert sorted(same) == [False, True, True]

    def error(q):
        return max(
            float(np.abs(run(q, f) - run(model, f)).max() / np.abs(run(model, f)).max())
            for f in feeds(8, 100)
        )

    assert error(both) <= error(smooth)  # 2.41% against 2.45% by hand


def test_a_product_kept_in_float_reads_its_activation_undivided(tmp_path):
    """--keep-float on the output projection: its smoothing Div would be pure cost, so the
    pass after the quantization (quant-unsmooth) folds it back into the weight; the result
    computes what the file with the Div computes, up to float32 regrouping."""
    path = tmp_path / "cal.npz"
    np.savez(path, x=np.stack([f["x"] for f in feeds(8, 0)]))
    kw = dict(quantize="dynamic", smooth=0.5, calibration=str(path), check=False)
    out, report = rewrite.optimize_model(block(), keep_float=["o"], **kw)
    smoothing = report.extra["quantize"]["smoothing"]
    assert (smoothing["divisions"], smoothing["unsmoothed"]) == (1, 1)
    assert report.extra["quantize"]["sites"][2]["quantized"] is False
    (product,) = [n for n in out.graph.node if n.op_type == "MatMul"]
    assert product.input[0] == "qk"  # not qk / s
    assert not [n for n in out.graph.node if n.op_type == "Div" and "qk" in n.input]
    weight = numpy_helper.to_array(
        next(t for t in out.graph.initializer if t.name == product.input[1])
    )
    wo = numpy_helper.to_array(next(t for t in block().graph.initializer if t.name == "wo"))
    np.testing.assert_allclose(weight, wo, rtol=1e-6)  # (w * s) / s
    # without the pass, the Div stays before the float product; the function is the same
    kept, report = rewrite.optimize_model(
        block(), keep_float=["o"], skip=["ruleset:quant-unsmooth"], **kw
    )
    assert report.extra["quantize"]["smoothing"]["divisions"] == 2
    assert "unsmoothed" not in report.extra["quantize"]["smoothing"]
    for f in feeds(4, 100):
        want = run(kept, f)
        assert np.abs(want).std() > 0.1
        np.testing.assert_allclose(run(out, f), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # every product quantized: no product reads a Div in float, and the pass does not run
    _, report = rewrite.optimize_model(block(), **kw)
    assert "unsmoothed" not in report.extra["quantize"]["smoothing"]


def kept_float_o(tmp_path, n: int):
    """A calibration file of `n` inputs (seeds 0..) and the options of a smoothed dynamic run
    that keeps the output projection `o` in float (its Div left for quant-unsmooth)."""
    path = tmp_path / "cal.npz"
    np.savez(path, x=np.stack([f["x"] for f in feeds(n, 0)]))
    kw = dict(quantize="dynamic", smooth=0.5, calibration=str(path), check=False, keep_float=["o"])
    return path, kw


def test_folding_a_division_back_is_measured_against_the_budget(tmp_path, monkeypatch, capsys):
    """With --error-budget, the graph without the Div is measured again on the search's
    inputs (float32 regrouping can move a compounding model's error) and kept only within
    the budget; over it, the searched graph stays, and the record says why."""
    path, kw = kept_float_o(tmp_path, 8)
    out, report = rewrite.optimize_model(block(), error_budget=0.5, **kw)
    record = report.extra["quantize"]
    assert record["smoothing"]["unsmoothed"] == 1
    assert 0 < record["calibration_error"]["y"] <= 0.5  # measured on the result
    assert not [n for n in out.graph.node if n.op_type == "Div" and "qk" in n.input]
    monkeypatch.setattr(Chooser, "measure", lambda self, model, per_feed=None: {"y": 0.9})
    out, report = rewrite.optimize_model(block(), error_budget=0.5, **kw)
    smoothing = report.extra["quantize"]["smoothing"]
    assert smoothing["unsmoothed"] == 0 and smoothing["unsmoothing_over_budget"] == 0.9
    assert smoothing["divisions"] == 2
    assert [n for n in out.graph.node if n.op_type == "Div" and "qk" in n.input]
    onnx.save(block(), str(tmp_path / "in.onnx"))
    args = ["quantize", str(tmp_path / "in.onnx"), str(tmp_path / "out.onnx"), "--smooth", "0.5"]
    more = ["--keep-float", "o", "--error-budget", "0.5", "--calibration", str(path)]
    assert main([*args, *more, "--no-check"]) == 0
    assert "without them the error measured 90.00%, over the budget" in capsys.readouterr().out


def test_folding_a_division_back_is_held_to_the_over_budget_share_too(
    tmp_path, monkeypatch, capsys
):
    """The graph without the Div is what is written: its tail is recorded, and with
    --over-budget-share a tail over the share keeps the searched graph, as an error over the
    budget does."""
    path, kw = kept_float_o(tmp_path, 20)
    out, report = rewrite.optimize_model(block(), error_budget=0.5, **kw)
    record = report.extra["quantize"]
    assert record["smoothing"]["unsmoothed"] == 1
    errors = [  # each input's error on the written file, as the search measures it
        float(np.abs(run(out, f) - run(block(), f)).max() / np.abs(run(block(), f)).max())
        for f in feeds(20, 0)
    ]
    assert record["tail"]["share"] == pytest.approx(tail_share(errors, 0.5)["share"], rel=1e-3)
    # within the budget on every input, its tail over a share of 0.001: the Div stays
    spread = list(np.linspace(0.3, 0.49, 20))
    assert tail_share(spread, 0.5)["share"] > 0.001

    def measured(self, model, per_feed=None):
        per_feed.update(enumerate(spread))
        return {"y": max(spread)}

    monkeypatch.setattr(Chooser, "measure", measured)
    out, report = rewrite.optimize_model(block(), error_budget=0.5, over_budget_share=0.001, **kw)
    smoothing = report.extra["quantize"]["smoothing"]
    assert smoothing["unsmoothed"] == 0 and smoothing["divisions"] == 2
    assert smoothing["unsmoothing_tail_share"] == pytest.approx(tail_share(spread, 0.5)["share"])
    assert smoothing["unsmoothing_error"] == 0.49 and "unsmoothing_over_budget" not in smoothing
    onnx.save(block(), str(tmp_path / "in.onnx"))
    args = ["quantize", str(tmp_path / "in.onnx"), str(tmp_path / "out.onnx"), "--smooth", "0.5"]
    more = ["--keep-float", "o", "--error-budget", "0.5", "--calibration", str(path)]
    assert main([*args, *more, "--over-budget-share", "0.001", "--no-check"]) == 0
    assert (
        "without them the error measured 49.00%, within the budget, but its tail puts about "
        f"{100 * tail_share(spread, 0.5)['share']:.3g}% of inputs over it, more than "
        "--over-budget-share allows"
    ) in " ".join(capsys.readouterr().out.split())
    assert [n for n in out.graph.node if n.op_type == "Div" and "qk" in n.input]
    # without the option the same measurement is within the budget: the Div goes, and the
    # tail recorded is the written graph's (the measurement after the search's)
    out, report = rewrite.optimize_model(block(), error_budget=0.5, **kw)
    assert report.extra["quantize"]["smoothing"]["unsmoothed"] == 1
    assert report.extra["quantize"]["tail"] == tail_share(spread, 0.5)


def test_cli_smooth_summary_and_bad_values(tmp_path, capsys):
    onnx.save(block(), str(tmp_path / "in.onnx"))
    args = ["quantize", str(tmp_path / "in.onnx"), str(tmp_path / "out.onnx")]
    assert main([*args, "--smooth", "0.5"]) == 0
    printed = capsys.readouterr()
    assert "smoothed 2 of 2 activations" in printed.out
    assert "2 of them divided by their factors in a Div of their own" in printed.out
    assert "drawn from the input types" in printed.out + printed.err
    assert "folded back" not in printed.out
    assert main([*args, "--smooth", "0.5", "--keep-float", "o"]) == 0
    printed = capsys.readouterr()
    assert "1 of them divided by their factors in a Div of their own" in printed.out
    assert "1 folded back into the weights of products kept in float" in printed.out
    assert main([*args, "--smooth", "1.5"]) != 0
    assert "smooth must be a number in [0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options, message",
    [
        ({"smooth": 0.5}, "smooth needs a quantization mode"),
        ({"quantize": "weight-only", "smooth": 0.5}, "smooth applies to modes dynamic and static"),
        ({"quantize": "dynamic", "smooth": -0.1}, r"smooth must be a number in \[0, 1\]"),
    ],
)
def test_smooth_options_that_cannot_be_used(options, message):
    with pytest.raises(OptionError, match=message):
        rewrite.optimize_model(block(), **options)


def test_static_mode_calibrates_the_smoothed_graph(tmp_path):
    """--mode static --smooth: the activation ranges are measured on the smoothed graph, so
    the projections still become QLinearMatMul, and the output check passes."""
    cal = feeds(8, 0)
    path = tmp_path / "cal.npz"
    np.savez(path, x=np.stack([f["x"] for f in cal]))
    out, report = rewrite.optimize_model(
        block(), quantize="static", smooth=0.5, calibration=str(path)
    )
    assert report.extra["quantize"]["smoothing"]["smoothed"] == 2
    ops = [n.op_type for n in out.graph.node]
    assert ops.count("QLinearMatMul") == 3
    assert not [n for n in out.graph.node if n.domain == SMOOTH[0]]
    assert all(d["ok"] for d in report.extra["check"])


@pytest.mark.slow
@pytest.mark.parametrize("name, exporter", [("gpt2", "torchscript"), ("bert", "dynamo")])
def test_smoothing_an_exported_transformer_keeps_its_function(name, exporter):
    """transformers' GPT-2 (LayerNorm -> Reshape -> Gemm, TorchScript) and BERT (dynamo):
    every mark is consumed, x / s reaches the LayerNormalization (through the Reshape on
    GPT-2), and the smoothed model computes the original's function up to float32
    regrouping."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
    import make_models

    from frontends.onnx.check import random_inputs
    from frontends.onnx.quantize import strip_marks

    model = getattr(make_models, name)(None, exporter=exporter)
    cal = [random_inputs(model, seed) for seed in range(4)]
    marked, count = smoothing_marks(model, cal, alpha=0.5)
    assert count >= 4
    out, report = rewrite.optimize_model(marked, allow=["reassoc"], check=False)
    out, left = strip_marks(out, SMOOTH)
    assert left == 0
    # a mark on a LayerNormalization's output (through views) that nothing else reads folds
    # into it (GPT-2's, before each block); where the output also feeds a residual Add
    # (BERT's), and where no normalization made x (attention's output projection after the
    # heads merge, the second FFN product after the GELU, BERT's pooler), a Div stays
    made_by = {o: n for n in marked.graph.node for o in n.output}
    readers = {}
    for n in marked.graph.node:
        for i in n.input:
            readers[i] = readers.get(i, 0) + 1

    def normalized(x: str, alone: bool) -> bool:
        """x made by a LayerNormalization through views (each read only once if `alone`)."""
        n = made_by.get(x)
        while n is not None and n.op_type in ("Reshape", "Squeeze"):
            if alone and readers.get(x) != 1:
                return False
            x = n.input[0]
            n = made_by.get(x)
        return (
            (readers.get(x) == 1 or not alone)
            and n is not None
            and n.op_type == ("LayerNormalization")
        )

    marks = [n for n in marked.graph.node if (n.domain, n.op_type) == SMOOTH]
    folded = sum(normalized(m.input[0], alone=True) for m in marks)
    assert folded < count and (folded > 0) == (name == "gpt2")
    assert smoothing_divisions(out, marked) == count - folded
    # the rule fires on every normalized mark, also where extraction keeps the Div
    on_norms = sum(normalized(m.input[0], alone=False) for m in marks)
    assert on_norms >= 2 and report.fired.get("smooth-into-layernorm", 0) >= on_norms
    if name == "gpt2":
        assert report.fired.get("smooth-through-reshape", 0) >= count
    feed = random_inputs(model, 99)
    want, got = run_all(model, feed), run_all(out, feed)
    for a, b in zip(want, got):
        assert np.abs(a).std() > 1e-3  # not a degenerate output
        assert np.abs(a - b).max() <= 1e-4 * np.abs(a).max()


def run_all(model: onnx.ModelProto, feed: dict) -> list[np.ndarray]:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, feed)
