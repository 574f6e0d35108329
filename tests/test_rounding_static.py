"""`rewrite quantize --mode static --rounding gptq`: GPTQ onto the static rules' weight levels
(patterns/quant/rounding_static.rules), for Convs through their patches in QLinearConv's K
order and for MatMuls and Gemms through their rows. The rules' bounds are
verified like every shipped rule (the pytest plugin); here the patches, the weight layouts the
rules read, and the whole path on a small CNN and an MLP with trained-like values."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import test_quantize_static
from onnx import TensorProto, helper, numpy_helper
from test_quantize_static import MODEL as CNN
from test_quantize_static import audio_cnn, held_out, old_cnn, ops, run
from test_rounding import correlated, weight

import rewrite
from frontends.onnx import api
from frontends.onnx.check import run as run_plain
from frontends.onnx.quantize import (
    ROUNDED,
    conv_patches,
    conv_weight_of_rows,
    conv_weight_rows,
    rounding_marks,
)
from rewrite.cli import main
from vocab.registry import conv_full_range_steps, conv_pair_steps, full_range_steps, pair_steps


def onnxruntime_conv(x, w, **attrs) -> np.ndarray:
    node = helper.make_node("Conv", ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph(
        [node],
        "conv",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape)),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, list(w.shape)),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x, "w": w})[0]


@pytest.mark.parametrize(
    "kernel, strides, pads, dilations",
    [
        ((1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
        ((3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
        ((7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),
        ((3, 2), (2, 1), (1, 0, 0, 1), (2, 1)),
        # auto_pad (EfficientNet's exports): pads from the input's size, 11 x 9, the odd one
        # at the end or at the beginning
        ((3, 3), (2, 2), "SAME_UPPER", (1, 1)),
        ((4, 2), (1, 2), "SAME_UPPER", (1, 1)),
        ((4, 2), (1, 2), "SAME_LOWER", (1, 1)),
        ((3, 3), (2, 2), "SAME_LOWER", (1, 1)),  # onnxruntime: no dilation with SAME
        ((3, 3), (2, 1), "VALID", (1, 1)),
    ],
)
def test_a_convs_patches_times_its_weight_rows_is_the_conv(kernel, strides, pads, dilations):
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (2, 5, 11, 9)).astype(np.float32)
    w = rng.normal(0, 1, (4, 5, *kernel)).astype(np.float32)
    padding = {"auto_pad": pads} if isinstance(pads, str) else {"pads": pads}
    want = onnxruntime_conv(x, w, strides=strides, dilations=dilations, **padding)
    rows = conv_patches(x, kernel, strides, pads, dilations)
    got = rows @ conv_weight_rows(w)  # [B * OH * OW, C_out]
    b, c, oh, ow = want.shape
    np.testing.assert_allclose(
        got.reshape(b, oh, ow, c).transpose(0, 3, 1, 2), want, rtol=1e-5, atol=1e-4
    )
    # with a limit, as many of those rows as it holds, in order
    limit = rows.size // 3
    few = conv_patches(x, kernel, strides, pads, dilations, limit=limit)
    assert len(few) == limit // rows.shape[1] and few.size <= limit
    same = (few[:, None, :] == rows[None, :, :]).all(axis=2)  # [few, rows]: which row it is
    at = [np.flatnonzero(m) for m in same]
    assert all(len(a) for a in at)  # each one of the rows (a padded row may occur twice)
    firsts = [int(a[0]) for a in at]
    assert firsts == sorted(firsts)


@pytest.mark.parametrize(
    "strides, pads, dilations", [((1,), (0, 0), (1,)), ((2,), (1, 2), (2,)), ((5,), (3, 0), (1,))]
)
def test_a_1d_convs_patches_are_those_of_its_2d_form(strides, pads, dilations):
    # a 1-D Conv's input [B, C, L] and weight [C_out, C_in, k] as the 2-D Conv over (1, L)
    # that conv1d-as-conv2d writes (kernel (1, k), pads (0, p0, 0, p1))
    rng = np.random.default_rng(2)
    x = rng.normal(0, 1, (2, 5, 40)).astype(np.float32)
    w = rng.normal(0, 1, (4, 5, 3)).astype(np.float32)
    want = onnxruntime_conv(x, w, strides=strides, pads=pads, dilations=dilations)
    rows = conv_patches(x, (1, 3), (1, *strides), (0, pads[0], 0, pads[1]), (1, *dilations))
    got = rows @ conv_weight_rows(w[:, :, None, :])
    b, c, length = want.shape
    np.testing.assert_allclose(
        got.reshape(b, length, c).transpose(0, 2, 1), want, rtol=1e-5, atol=1e-4
    )


def test_a_convs_weight_rows_are_the_static_rules_columns():
    w = np.random.default_rng(1).normal(0, 1, (6, 3, 3, 3)).astype(np.float32)
    rows = conv_weight_rows(w)
    assert rows.shape == (27, 6)
    # K in QLinearConv's order, input channels fastest: the rules' pairs are GPTQ's neighbours
    np.testing.assert_array_equal(rows[:3, 0], w[0, :, 0, 0])
    np.testing.assert_array_equal(pair_steps(rows, per_column=True), conv_pair_steps(w))
    np.testing.assert_array_equal(full_range_steps(rows), conv_full_range_steps(w))
    np.testing.assert_array_equal(conv_weight_of_rows(rows, w.shape), w)


def cnn_calibration(path, n: int = 8) -> str:
    np.savez(path, x=np.random.default_rng(3).normal(0, 1, (n, 1, 3, 16, 16)).astype(np.float32))
    return str(path)


def mean_error(q: onnx.ModelProto, reference: onnx.ModelProto, xs, runner=None) -> float:
    """The mean over `xs` of max|q - ref| / max|ref|, `q` run by onnxruntime or `runner` (a
    function of a model returning what has `.run(None, feeds)`)."""
    sess = None if runner is None else runner(q)
    got = [run(q, x) if sess is None else sess.run(None, {"x": x})[0] for x in xs]
    outs = [(run(reference, x), g) for x, g in zip(xs, got)]
    for want, _ in outs:
        assert np.abs(want).std() > 0.05 * np.abs(want).max()  # not a degenerate output
    return float(np.mean([np.abs(g - w).max() / np.abs(w).max() for w, g in outs]))


def assert_levels_moved_at_the_same_steps(gptq: onnx.ModelProto, nearest: onnx.ModelProto):
    """The QLinearConvs of `gptq` (a static GPTQ result) are on the rules' own levels: each
    channel's step is `nearest`'s (to float32's rounding of max / 127 over the levels), and
    some of the integer weights moved."""
    inits = {i.name: numpy_helper.to_array(i) for i in gptq.graph.initializer}
    plain = {i.name: numpy_helper.to_array(i) for i in nearest.graph.initializer}
    convs = [n for n in gptq.graph.node if n.op_type == "QLinearConv"]
    before = [n for n in nearest.graph.node if n.op_type == "QLinearConv"]
    assert len(convs) == len(before)
    moved = 0
    for a, b in zip(convs, before):
        np.testing.assert_allclose(inits[a.input[4]], plain[b.input[4]], rtol=2**-22)
        moved += int((inits[a.input[3]] != plain[b.input[3]]).sum())
    assert moved > 0


@pytest.mark.parametrize("cpu", ["any", "vnni"])
def test_static_gptq_rounds_convs_onto_the_static_rules_levels(
    tmp_path, cpu, monkeypatch, reference_at_19
):
    monkeypatch.setattr(api, "int8_sums_in_int32", lambda: True)  # no VNNI warning
    cal = cnn_calibration(tmp_path / "cal.npz")
    kw = {"quantize": "static", "calibration": cal, "cpu": cpu}
    nearest, _ = rewrite.optimize_model(CNN, **kw)
    gptq, report = rewrite.optimize_model(CNN, rounding="gptq", **kw)
    assert ops(gptq) == ops(nearest) and ops(gptq).count("QLinearConv") == 3
    assert not any(n.domain == ROUNDED[0] for n in gptq.graph.node)  # no mark left
    record = report.extra["quantize"]["rounding"]
    assert record["samples"] == 8 and record["held_out"] == 2
    assert record["weights"] + len(record["nearest"]) == 3  # every Conv judged
    assert record["weights"] >= 2
    rule = (
        "quantize-conv-static-full-range-rounded"
        if cpu == "vnni"
        else "quantize-conv-static-rounded"
    )
    fired = {r.removesuffix("-alt1") for r in report.fired}
    assert rule in fired
    assert_levels_moved_at_the_same_steps(gptq, nearest)
    # on inputs neither saw, the integer sums exact (onnx.reference: onnxruntime's pairs may
    # saturate full-range weights on a CPU without VNNI), measured: 0.22x of the nearest
    # levels' mean error with pair steps, 0.55x over the full range
    xs, exact = held_out(16), (reference_at_19 if cpu == "vnni" else None)
    ratio = mean_error(gptq, CNN, xs, exact) / mean_error(nearest, CNN, xs, exact)
    assert ratio < (0.3 if cpu == "any" else 0.65)


def mlp() -> onnx.ModelProto:
    """x[64, 256] -> MatMul(w1 [256, 192]) -> Relu -> Gemm(w2 [128, 192], b, transB=1): a
    transformer's projections as static mode quantizes them (QLinearMatMul, MatMulInteger)."""
    w1, w2 = weight(256, 192, 1), weight(192, 128, 2).T.copy()
    b = np.random.default_rng(5).normal(0, 0.2, 128).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "b"], ["y"], transB=1, name="fc2"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 128])],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(b, "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_static_gptq_rounds_matmuls_and_transposed_gemms(tmp_path):
    model = mlp()
    path = tmp_path / "cal.npz"
    np.savez(path, x=np.stack([correlated(64, 256, s) for s in range(16)]))
    kw = {"quantize": "static", "calibration": str(path), "target": "onnxruntime"}
    nearest, _ = rewrite.optimize_model(model, **kw)
    gptq, report = rewrite.optimize_model(model, rounding="gptq", **kw)
    assert ops(gptq) == ops(nearest)
    assert {"QLinearMatMul", "MatMulInteger"} <= set(ops(gptq))
    fired = set(report.fired)
    assert {"quantize-matmul-static-rounded", "quantize-gemm-transposed-static-rounded"} <= fired
    assert report.extra["quantize"]["rounding"]["weights"] == 2
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    q = {
        name: ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
        for name, m in (("nearest", nearest), ("gptq", gptq))
    }
    err = {name: [] for name in q}
    for seed in range(100, 108):  # inputs the calibration did not see
        x = correlated(64, 256, seed)
        want = s.run(None, {"x": x})[0]
        assert np.abs(want).std() > 0.1
        for name, sess in q.items():
            err[name].append(np.abs(sess.run(None, {"x": x})[0] - want).max() / np.abs(want).max())
    assert np.mean(err["gptq"]) < 0.9 * np.mean(err["nearest"])  # measured: 0.84x


def test_rounding_marks_leave_convs_to_the_static_rules_only():
    feeds = [{"x": x} for x in held_out(4)]
    marked, count, nearer = rounding_marks(CNN, feeds, "pairs")
    assert count == 0 and not nearer  # no MatMul or Gemm: nothing for the dynamic rules
    said: list[str] = []
    marked, count, nearer = rounding_marks(CNN, feeds, "pairs", convs=True, progress=said.append)
    assert count + len(nearer) == 3
    assert said == ["0 of 3 weights", "1 of 3 weights", "2 of 3 weights"]  # the stage's detail
    marks = [n for n in marked.graph.node if n.domain == ROUNDED[0]]
    assert len(marks) == count
    inits = {i.name: numpy_helper.to_array(i) for i in marked.graph.initializer}
    for n in marks:  # the rounding has the weight's shape, and its steps
        w, r = inits[n.input[0]], inits[n.input[1]]
        assert r.shape == w.shape and r.dtype == np.float32
        np.testing.assert_allclose(conv_pair_steps(r), conv_pair_steps(w), rtol=2**-22)


def test_convs_of_one_weight_at_two_sizes_share_one_rounding():
    # a detection head shares its Convs across pyramid levels: one weight, inputs of other
    # sizes; one rounding from both activations' patches (their K is the same)
    rng = np.random.default_rng(21)
    w = rng.normal(0, np.sqrt(2 / 144), (16, 16, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["a"], pads=[1] * 4, name="level0"),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "w"], ["y"], pads=[1] * 4, name="level1"),
    ]
    graph = helper.make_graph(
        nodes,
        "shared_head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 8, 8])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    feeds = [{"x": rng.normal(0, 1, (1, 16, 16, 16)).astype(np.float32)} for _ in range(8)]
    marked, count, nearer = rounding_marks(model, feeds, "pairs", convs=True)
    assert count + len(nearer) == 1
    readers = {n.input[1] for n in marked.graph.node if n.op_type == "Conv"}
    assert len(readers) == 1  # both Convs read one mark, or both the weight itself


def test_a_grouped_conv_keeps_its_nearest_levels_and_an_auto_padded_one_is_rounded():
    # a grouped Conv has an H per group (not built: depthwise ones measured worse on MobileNetV2,
    # docs/benchmarks.md); an auto_pad Conv's patches take the pads of its input's size
    model = onnx.ModelProto()
    model.CopyFrom(CNN)
    conv = next(n for n in model.graph.node if n.name == "conv2")
    conv.attribute.append(helper.make_attribute("group", 2))
    w = next(t for t in model.graph.initializer if t.name == "conv2.w")
    half = numpy_helper.to_array(w)[:, :8]
    w.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(half), "conv2.w"))
    feeds = [{"x": x} for x in held_out(4)]
    marked, count, nearer = rounding_marks(model, feeds, "pairs", convs=True)
    assert count + len(nearer) == 2 and "conv2" not in nearer
    assert all(n.input[1] == "conv2.w" for n in marked.graph.node if n.name == "conv2")
    same = onnx.ModelProto()
    same.CopyFrom(CNN)
    conv = next(n for n in same.graph.node if n.name == "conv2")
    del conv.attribute[:]  # pads=[1] * 4 is SAME_UPPER's for a 3x3 kernel at stride 1
    conv.attribute.append(helper.make_attribute("auto_pad", "SAME_UPPER"))
    marked, count, nearer = rounding_marks(same, feeds, "pairs", convs=True)
    explicit, count_explicit, _ = rounding_marks(CNN, feeds, "pairs", convs=True)
    assert count + len(nearer) == 3 and count == count_explicit
    rounded = {
        t.name: numpy_helper.to_array(t) for t in marked.graph.initializer if "rounded" in t.name
    }
    want = {
        t.name: numpy_helper.to_array(t) for t in explicit.graph.initializer if "rounded" in t.name
    }
    assert rounded.keys() == want.keys()  # the same rounding as with its pads written out
    for name in want:
        np.testing.assert_array_equal(rounded[name], want[name])


def test_static_gptq_rounds_1d_convs_as_their_2d_form(tmp_path):
    # audio_cnn: three Conv1ds (the third grouped: its nearest levels). rounding_marks rounds a
    # 1-D Conv's weight as its (1, k) Conv's and marks the 3-D weight; conv1d-of-rounded-as-
    # conv2d moves the mark onto the 2-D form's weight, where quantize-conv-static-rounded
    # takes it. On this small model the error stays about the same (measured: 0.73% against
    # 0.65% mean); on Wav2Vec2 (bench/quant_archs.py --measure), whose feature extractor is
    # seven Conv1ds, 6 of them rounded took its mean error from 7.3% to 6.6% (TorchScript) and
    # from 7.4% to 7.0% (dynamo)
    rng = np.random.default_rng(31)
    model = audio_cnn(rng)
    cal = tmp_path / "cal.npz"
    np.savez(cal, x=rng.normal(0, 1, (16, 1, 1, 4000)).astype(np.float32))
    feeds = [{"x": x} for x in np.load(cal)["x"]]
    marked, count, nearer = rounding_marks(model, feeds, "pairs", convs=True)
    assert count + len(nearer) == 2  # c1 and c2; not the grouped c3
    inits = {t.name: numpy_helper.to_array(t) for t in marked.graph.initializer}
    rounded = [k for k in inits if k.endswith("_rounded")]
    assert rounded and all(
        inits[k].shape == inits[k.removesuffix("_rounded")].shape for k in rounded
    )
    kw = {"quantize": "static", "calibration": str(cal)}
    nearest, _ = rewrite.optimize_model(model, **kw)
    gptq, report = rewrite.optimize_model(model, rounding="gptq", **kw)
    assert ops(gptq) == ops(nearest) and ops(gptq).count("QLinearConv") == 3
    assert not any(n.domain == ROUNDED[0] for n in gptq.graph.node)
    fired = {r.removesuffix("-alt1") for r in report.fired}
    assert {"conv1d-of-rounded-as-conv2d", "quantize-conv-static-rounded"} <= fired
    assert report.extra["quantize"]["rounding"]["weights"] == count
    assert_levels_moved_at_the_same_steps(gptq, nearest)
    for x in rng.normal(0, 1, (4, 1, 1, 4000)).astype(np.float32):  # held out
        want = run(model, x)
        assert np.ptp(want) > 0.1  # not degenerate
        assert 0 < np.abs(run(gptq, x) - want).max() / np.abs(want).max() < 0.05


def test_cli_quantize_static_with_gptq(tmp_path, capsys):
    src, out = tmp_path / "cnn.onnx", tmp_path / "q.onnx"
    onnx.save(CNN, src)
    cal = cnn_calibration(tmp_path / "cal.npz")
    argv = ["quantize", str(src), str(out), "--mode", "static", "--calibration", cal]
    assert main([*argv, "--rounding", "gptq"]) == 0
    printed = capsys.readouterr().out
    assert "by GPTQ on 8 calibration inputs" in printed
    assert ops(onnx.load(out)).count("QLinearConv") == 3


def test_static_gptq_rounds_the_batchnorm_folded_weights_of_an_old_opset_model(
    tmp_path, monkeypatch
):
    # opset 9 with a BatchNormalization after each Conv: the weights GPTQ rounds are the folded
    # ones the static rules read (rounded before the folding, no Conv weight would be constant)
    monkeypatch.setattr(test_quantize_static, "RNG", np.random.default_rng(11))  # one model
    old = old_cnn()
    cal = cnn_calibration(tmp_path / "cal.npz")
    nearest, _ = rewrite.optimize_model(old, quantize="static", calibration=cal)
    gptq, report = rewrite.optimize_model(old, quantize="static", calibration=cal, rounding="gptq")
    assert ops(gptq) == ops(nearest) and ops(gptq).count("QLinearConv") == 3
    record = report.extra["quantize"]["rounding"]
    assert record["weights"] >= 2 and record["weights"] + len(record["nearest"]) == 3
    xs = held_out(16)
    errors = {}
    for name, q in (("nearest", nearest), ("gptq", gptq)):
        per = []
        for x in xs:
            want, got = run_plain(old, {"x": x})[0], run(q, x)
            per.append(np.abs(got - want).max() / np.abs(want).max())
        errors[name] = float(np.mean(per))
    assert errors["gptq"] < 0.5 * errors["nearest"]  # measured: 0.30x
