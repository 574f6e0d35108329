"""Dynamic int8 quantization as rules: `rewrite quantize` and `optimize_model(quantize=...)`
(patterns/quant/dynamic.rules). The rules' bounds are verified like every shipped rule (the
pytest plugin, and tests/wrong_rules/quant.rules for the planted wrong ones); here the whole
path: the engine picks the quantized form where it pays, onnxruntime runs it, and a single
MatMul's measured error stays within its rule's bound."""

import contextlib
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import ExternalDataInfo, uses_external_data
from onnx.reference import ReferenceEvaluator

import frontends.onnx
import rewrite
from engine.cost import CostModel
from frontends.onnx import api, check, import_model, quantize
from frontends.onnx.api import OptionError, OutputMismatch
from frontends.onnx.exporter import IN_MEMORY, export_model
from rewrite.cli import _measured, main
from vocab.registry import BOUNDS, conv_pair_steps, int8_sums_in_int32, pair_steps
from vocab.types import TensorType

ROOT = Path(__file__).resolve().parent.parent

RNG = np.random.default_rng(0)


# onnxruntime's uint8-by-int8 kernels on x86 CPUs with VNNI (AVX512-VNNI or AVX-VNNI) sum the
# products in int32 (vpdpbusd), where nothing saturates; without it (AVX2, AVX512BW) they add
# neighbouring pairs in int16 (vpmaddubsw), which the pair steps are for. The tests below check
# the steps exact on either; their controls, that stepping without them saturates, only where
# the kernel pairs.
VNNI = int8_sums_in_int32()

# trained-like: weights of varied column scales, a nonzero bias
W1 = (RNG.normal(0, 0.05, (256, 256)) * RNG.uniform(0.2, 2.0, 256)).astype(np.float32)
W2 = RNG.normal(0, 0.05, (256, 64)).astype(np.float32)
B1 = RNG.normal(0, 0.1, 256).astype(np.float32)


def mlp(layers: int = 2) -> onnx.ModelProto:
    """x[64, 256] -> MatMul W1 -> Add B1 -> Relu (-> MatMul W2): static shapes, so that the cost
    model sees the products' sizes."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "B1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["y" if layers == 1 else "h3"]),
    ]
    inits = [numpy_helper.from_array(W1, "W1"), numpy_helper.from_array(B1, "B1")]
    if layers == 2:
        nodes.append(helper.make_node("MatMul", ["h3", "W2"], ["y"]))
        inits.append(numpy_helper.from_array(W2, "W2"))
    width = 64 if layers == 2 else 256
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, width])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_quantize_dynamic_writes_integer_matmuls_that_onnxruntime_runs(per_channel):
    q, report = rewrite.optimize_model(mlp(), quantize="dynamic", per_channel=per_channel)
    assert ops(q).count("MatMulInteger") == 2 and ops(q).count("DynamicQuantizeLinear") == 2
    assert "MatMul" not in ops(q)
    rule = "quantize-matmul-dynamic" + ("-per-column" if per_channel else "")
    assert report.fired.get(rule) == 2
    weights = [i for i in q.graph.initializer if i.data_type == TensorProto.INT8]
    assert len(weights) == 2  # folded ahead of time, not QuantizeLinear nodes
    for w in weights:  # more than 7 bits, but no two neighbours along K above 128 together
        wq = numpy_helper.to_array(w).astype(np.int64)
        a, pairs = np.abs(wq), np.abs(wq[:-1] + wq[1:])  # same-sign neighbours add up
        assert 63 < a.max() <= 127 and 126 <= max(a.max(), pairs.max()) and pairs.max() <= 128
    x = RNG.normal(0, 1, (64, 256)).astype(np.float32)
    want, got = run(mlp(), x), run(q, x)
    assert want.std() > 0.05  # not a degenerate output
    assert np.abs(got - want).max() / np.abs(want).max() < 0.05


def _integer_matmul(wq: np.ndarray, kind: str, sy: float = 1.0) -> ort.InferenceSession:
    """MatMulInteger(x, wq) with wq an int8 initializer: of uint8 x ("plain"), of float x
    quantized at run time, cast and rescaled by 1 ("fused": onnxruntime fuses that form into
    DynamicQuantizeMatMul, a kernel of its own), or QLinearMatMul of uint8 x by wq, scales 1
    in, `sy` out, zero point 128 out ("qlinear")."""
    k, n = wq.shape
    init = [numpy_helper.from_array(wq, "w"), numpy_helper.from_array(np.float32(1), "one")]
    if kind == "qlinear":
        init += [
            numpy_helper.from_array(np.uint8(0), "zx"),
            numpy_helper.from_array(np.int8(0), "zw"),
            numpy_helper.from_array(np.float32(sy), "sy"),
            numpy_helper.from_array(np.uint8(128), "zy"),
        ]
        nodes = [
            helper.make_node(
                "QLinearMatMul", ["x", "one", "zx", "w", "one", "zw", "sy", "zy"], ["y"]
            )
        ]
        x_type, y_type = TensorProto.UINT8, TensorProto.UINT8
    elif kind == "fused":
        nodes = [
            helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "sx", "zx"]),
            helper.make_node("MatMulInteger", ["xq", "w", "zx"], ["p"]),
            helper.make_node("Cast", ["p"], ["pf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["sx", "one"], ["s"]),
            helper.make_node("Mul", ["pf", "s"], ["y"]),
        ]
        x_type, y_type = TensorProto.FLOAT, TensorProto.FLOAT
    else:
        nodes = [helper.make_node("MatMulInteger", ["x", "w"], ["y"])]
        x_type, y_type = TensorProto.UINT8, TensorProto.INT32
    graph = helper.make_graph(
        nodes,
        "integer_matmul",
        [helper.make_tensor_value_info("x", x_type, [5, k])],
        [helper.make_tensor_value_info("y", y_type, [5, n])],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("k", [2, 3, 34, 767, 768, 3074])
@pytest.mark.parametrize("kind", ["plain", "fused", "qlinear"])
def test_onnxruntime_sums_weights_quantized_for_pairs_exactly_at_the_limit(k, kind):
    # The dynamic rules' step (pair_steps) keeps |q_k| <= 127 and |q_k + q_k+1| <= 128, so
    # the int16 pair sums of onnxruntime's uint8-by-int8 kernels (x86 without VNNI) cannot
    # saturate, at any alignment of the pairs: same-sign neighbours add to at most 255 * 128,
    # opposite-sign ones (here up to 127 and -127 side by side) partly cancel. Weights at that
    # limit (neighbouring outliers of both signs), activations at 255 (the worst for
    # same-sign pairs) and at 255 or 0 (the largest part of an opposite-sign pair alone): the
    # integer products must be exact, K odd or even.
    rng = np.random.default_rng(k)
    w = rng.normal(0, 1, (k, 24)).astype(np.float32)
    # outliers, two apart or neighbours: positive on rows 0, 3, 6, ...; on rows 1, 8, 15, ...
    # positive too in the first 12 columns (same-sign neighbours), negative in the others
    w[::3] = np.abs(w[::3]) * 40
    rows = w[1::7].shape
    w[1::7] = np.abs(rng.normal(0, 1, rows)) * 40 * np.where(np.arange(24) < 12, 1, -1)
    q = np.clip(np.rint(w / pair_steps(w, per_column=True)), -127, 127).astype(np.int8)
    qi = q.astype(np.int64)
    same, opposite = qi[:, :12], qi[:, 12:]  # at the same-sign limit; beyond it, cancelling
    assert np.abs(same[:-1] + same[1:]).max() >= 126
    assert (np.abs(opposite[:-1]) + np.abs(opposite[1:])).max() > 150
    want = np.broadcast_to(255 * q.astype(np.int64).sum(axis=0), (5, 24))
    if kind == "fused":  # x in [0, 1]: DynamicQuantizeLinear gives zero point 0, 255 for x = 1
        got = _integer_matmul(q, kind).run(None, {"x": np.ones((5, k), np.float32)})[0]
        np.testing.assert_allclose(got * 255, want, rtol=1e-6)
    elif kind == "qlinear":  # the sums in 8 bits: within a level of the exact ones
        sy = float(np.abs(want).max()) / 100
        got = _integer_matmul(q, kind, sy).run(None, {"x": np.full((5, k), 255, np.uint8)})[0]
        assert np.abs(got.astype(np.float64) - 128 - want / sy).max() <= 0.5 + 1e-3
    else:
        got = _integer_matmul(q, kind).run(None, {"x": np.full((5, k), 255, np.uint8)})[0]
        np.testing.assert_array_equal(got, want)
        x = rng.choice(np.array([0, 255], np.uint8), (5, k))
        got = _integer_matmul(q, kind).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, x.astype(np.int64) @ qi)
        # the control: one same-sign pair at 129 levels (127 + 2) saturates at x = 255 where
        # the kernel adds pairs in int16, and is exact where it sums in int32 (VNNI)
        over = qi.copy()
        over[:2, 0] = (127, 2)
        x = np.full((5, k), 255, np.uint8)
        got = _integer_matmul(over.astype(np.int8), kind).run(None, {"x": x})[0]
        assert (np.abs(got - x.astype(np.int64) @ over).max() > 0) == (not VNNI)


def _qlinear_conv_at_255(wq: np.ndarray, group: int, sy: float) -> np.ndarray:
    """QLinearConv of an all-255 uint8 image (zero point 0, scale 1) by the int8 weight `wq`
    [C_out, C_in / group, k, k] (zero point 0, scale 1), padded so that the centre output sees
    the whole kernel; its centre pixel per output channel, in output levels above the zero
    point 128 at output scale `sy`."""
    c_out, c_group, k, _ = wq.shape
    h = k + 2
    init = [
        numpy_helper.from_array(wq, "w"),
        numpy_helper.from_array(np.float32(1), "one"),
        numpy_helper.from_array(np.uint8(0), "zx"),
        numpy_helper.from_array(np.int8(0), "zw"),
        numpy_helper.from_array(np.float32(sy), "sy"),
        numpy_helper.from_array(np.uint8(128), "zy"),
    ]
    conv = helper.make_node(
        "QLinearConv",
        ["x", "one", "zx", "w", "one", "zw", "sy", "zy"],
        ["y"],
        group=group,
        pads=[k // 2] * 4,
    )
    shape = [1, c_group * group, h, h]
    graph = helper.make_graph(
        [conv],
        "qlinear_conv",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, shape)],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, None)],
        init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    y = run(model, np.full(shape, 255, np.uint8))
    return y[0, :, h // 2, h // 2].astype(np.float64) - 128


@pytest.mark.parametrize(
    "c_group, k, group",
    [(3, 3, 1), (3, 7, 1), (16, 3, 1), (67, 3, 1), (64, 1, 1), (8, 3, 2), (1, 3, 32)],
    ids=["rgb-3x3", "rgb-7x7", "16-3x3", "67-3x3", "64-1x1", "grouped", "depthwise"],
)
def test_onnxruntime_conv_sums_weights_quantized_for_pairs_exactly(c_group, k, group):
    # The static Conv rule's steps (conv_pair_steps) keep |q_k + q_k+1| <= 128 along
    # QLinearConv's K order: kernel positions and, fastest, input channels. Weights at that
    # limit (same-sign outliers), activations at 255: the sums are exact to the output's
    # rounding. Stepped along the weight's own layout (channels slowest) instead, the same
    # weights saturate where the kernel takes the pairs as above (three input channels).
    c_out = 24 if group == 1 else group
    rng = np.random.default_rng(c_group * k + group)
    w = np.abs(rng.normal(0, 1, (c_out, c_group, k, k))).astype(np.float32)
    w[:, ::3] *= 40
    w[:, 1::7] *= 40
    w[:, :, 0] *= 1.5

    def quantized(w: np.ndarray, steps: np.ndarray) -> np.ndarray:
        return np.clip(np.rint(w / steps[:, None, None, None]), -127, 127).astype(np.int8)

    def off_by(w: np.ndarray, steps: np.ndarray) -> float:
        q = quantized(w, steps)
        want = 255 * q.astype(np.int64).reshape(c_out, -1).sum(axis=1)
        sy = float(np.abs(want).max()) / 100
        return float(np.abs(_qlinear_conv_at_255(q, group, sy) - want / sy).max())

    assert off_by(w, conv_pair_steps(w)) <= 0.5 + 1e-3
    if c_group == 3:  # the layout's neighbours are not the kernel's: saturation shows, where
        # the kernel adds pairs in int16 (not with VNNI: exact there)
        layout = pair_steps(w.reshape(c_out, -1).T, per_column=True)
        assert (off_by(w, layout) > 2) == (not VNNI)
    if c_group > 1:  # every other input channel negative, and channels 0 and 1 at the
        # largest magnitude, +-: neighbours within a kernel position cancel, so they may pass
        # the same-sign limit; exact all the same
        mixed = w.copy()
        mixed[:, 1::2] *= -1
        mixed[:, 0], mixed[:, 1] = np.abs(w).max(), -np.abs(w).max()
        steps = conv_pair_steps(mixed)
        k_order = np.moveaxis(quantized(mixed, steps), 1, -1).reshape(c_out, -1).astype(int)
        assert (np.abs(k_order[:, :-1]) + np.abs(k_order[:, 1:])).max() > 150
        assert off_by(mixed, steps) <= 0.5 + 1e-3


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_one_matmul_stays_within_its_rules_bound_on_onnxruntime(per_channel):
    model = mlp(layers=1)
    model.graph.node.pop()  # x @ W1 + B1 only: the bound is the MatMul's, the Add is exact
    model.graph.node.pop()
    model.graph.node[0].output[0] = "y"
    q, _ = rewrite.optimize_model(model, quantize="dynamic", per_channel=per_channel)
    assert "MatMulInteger" in ops(q)
    name = "matmul-dynamic-8bit" + ("-per-column" if per_channel else "")
    for seed in range(4):
        x = np.random.default_rng(seed).normal(0, 3, (64, 256)).astype(np.float32)
        err = np.abs(run(q, x) - run(model, x))
        bound = BOUNDS[name].fn(x, W1)
        assert np.all(err <= bound)
        assert err.max() > 0  # it did quantize


def test_an_int8_bound_asked_again_for_one_weight_equals_the_bound_computed_afresh():
    # the weight's side of the int8 bounds is remembered for the last weight asked (by
    # identity, as the budget search asks once per calibration input): the same weight with
    # other inputs, a copy of it, and another weight in between all give the fresh values
    rng = np.random.default_rng(0)
    w = rng.normal(0, 0.1, (32, 16)).astype(np.float32)
    orig = w + rng.normal(0, 0.01, w.shape).astype(np.float32)
    c = rng.normal(0, 1, 16).astype(np.float32)
    xs = [rng.normal(0, 1, (4, 32)).astype(np.float32) for _ in range(3)]
    for name, extra in (
        ("matmul-dynamic-8bit-full-range-rounded", (orig,)),
        ("gemm-dynamic-8bit-per-column-rounded", (c, orig)),
        ("gemm-dynamic-8bit", (c,)),
    ):
        fn = BOUNDS[name].fn
        remembered = [fn(x, w, *extra) for x in xs]  # the first computes, the others recall
        fresh = [fn(x, w.copy(), *(a.copy() for a in extra)) for x in xs]  # new arrays
        assert all(np.array_equal(a, b) for a, b in zip(remembered, fresh))
        other = fn(xs[0], 2 * w, *extra)  # another weight in between
        assert not np.array_equal(other, remembered[0])
        assert np.array_equal(fn(xs[0], w, *extra), remembered[0])


def test_without_quantize_nothing_is_quantized():
    optimized, _ = rewrite.optimize_model(mlp())
    assert "MatMulInteger" not in ops(optimized)
    # the quant class without a mode lowers QDQ groups (test_quantize_static) and quantizes no
    # float product: before, every mode's rules ran on them at once, per tensor and per column
    lowered, report = rewrite.optimize_model(mlp(), allow=["quant"], target="onnxruntime")
    assert ops(lowered) == ["Gemm", "Relu", "MatMul"]
    assert not [r for r in report.fired if r.startswith("quantize-")]
    assert report.extra["warning"].endswith("to quantize a float model: rewrite quantize")
    dynamic, report = rewrite.optimize_model(mlp(), quantize="dynamic")
    again, report = rewrite.optimize_model(dynamic, allow=["quant"])  # quantized: no warning
    assert "warning" not in report.extra and "MatMulInteger" in ops(again)


def test_an_unknown_mode_is_an_option_error():
    with pytest.raises(OptionError, match="unknown mode 'fancy'"):
        rewrite.optimize_model(mlp(), quantize="fancy")


def test_dynamic_mode_defaults_to_one_weight_scale_per_output_column():
    q, report = rewrite.optimize_model(mlp(), quantize="dynamic")
    assert report.fired.get("quantize-matmul-dynamic-per-column") == 2
    assert "quantize-matmul-dynamic" not in report.fired
    scales = [n for n in q.graph.node if n.op_type == "Mul"]
    assert any(
        numpy_helper.to_array(i).shape == (256,)
        for i in q.graph.initializer
        if i.name in {x for n in scales for x in n.input}
    )
    _, per_tensor = rewrite.optimize_model(mlp(), quantize="dynamic", per_channel=False)
    assert per_tensor.fired.get("quantize-matmul-dynamic") == 2
    with pytest.raises(OptionError, match="per-tensor does not apply to mode static"):
        rewrite.optimize_model(mlp(), quantize="static", per_channel=False)
    # weight-only's blocks are finer than per-column: --per-tensor was silently ignored
    with pytest.raises(OptionError, match="per-tensor does not apply to mode weight-only"):
        rewrite.optimize_model(mlp(), quantize="weight-only", per_channel=False)


def test_cli_quantize(tmp_path, capsys):
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(mlp(), src)
    assert main(["quantize", str(src), str(dst), "--per-tensor"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "quantize-matmul-dynamic" in out and "per-column" not in out
    assert "quant rules fired" in out
    assert "--skip" not in captured.err  # the other modes' rulesets are not the user's skips
    assert "MatMulInteger" in ops(onnx.load(dst))
    bad = tmp_path / "bad.onnx"
    assert main(["quantize", str(src), str(bad), "--mode", "fancy"]) == 1
    err = capsys.readouterr().err
    assert (
        err.startswith("error: ") and "unknown mode 'fancy'" in err and len(err.splitlines()) == 1
    )
    assert not bad.exists()


def test_a_run_that_quantizes_nothing_says_why(tmp_path, capsys):
    # a float16 model (the rules read float32 weights), and a model without the mode's ops:
    # the file is written (a valid model, the cleanup's), with a warning naming the reason,
    # on stderr with --quiet too; a run that quantizes has no such warning
    half = mlp()
    for t in half.graph.initializer:
        t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float16), t.name))
    for v in (*half.graph.input, *half.graph.output):
        v.type.tensor_type.elem_type = TensorProto.FLOAT16
    _, report = rewrite.optimize_model(half, quantize="dynamic")
    assert report.extra["quantize"]["warning"] == (
        "nothing was quantized: 2 MatMul compute float16 (the rules take float32)"
    )
    conv = helper.make_model(
        helper.make_graph(
            [helper.make_node("Conv", ["x", "w"], ["y"])],
            "conv",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 6, 6])],
            [numpy_helper.from_array(RNG.normal(0, 1, (4, 4, 3, 3)).astype(np.float32), "w")],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=10,
    )
    with pytest.warns(rewrite.RewriteWarning) as issued:  # a library user sees it too
        _, report = rewrite.optimize_model(conv, quantize="dynamic")
    assert [str(w.message) for w in issued] == [report.extra["quantize"]["warning"]]
    assert report.extra["quantize"]["warning"] == (
        "nothing was quantized: the model has none of the ops --mode dynamic quantizes "
        "(Gather, Gemm, MatMul)"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", rewrite.RewriteWarning)
        _, report = rewrite.optimize_model(mlp(), quantize="dynamic")
    assert "warning" not in report.extra["quantize"]
    # weights the guards refuse: the guard is named (K = 20 is no whole number of blocks)
    odd = helper.make_model(
        helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["y"])],
            "odd",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 20])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
            [numpy_helper.from_array(RNG.normal(0, 1, (20, 8)).astype(np.float32), "w")],
        ),
        opset_imports=[helper.make_opsetid("", 21)],
        ir_version=10,
    )
    with pytest.warns(rewrite.RewriteWarning):
        _, report = rewrite.optimize_model(odd, quantize="weight-only")
    assert report.extra["quantize"]["warning"] == (
        "nothing was quantized: 1 MatMul have a float32 constant weight the rules' guards did "
        "not take; the quant rules' guards refused: quantize-matmul-weight-4bit-dq's guard "
        "(whole-blocks @x @w 32) (1 matches)"
    )
    src, dst = tmp_path / "half.onnx", tmp_path / "q.onnx"
    onnx.save(half, src)
    assert main(["quantize", str(src), str(dst), "-q"]) == 0 and dst.exists()
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("warning: nothing was quantized: ")
    assert "MatMul compute float16" in captured.err and len(captured.err.splitlines()) == 1


def test_nothing_quantized_names_a_weight_read_through_views_by_its_constant():
    # MatMul(x, Transpose(Identity(w))), as a dynamo export reads a shared weight: the reason
    # is the constant's (float16), not "read no constant weight"
    w = RNG.normal(0, 1, (8, 4)).astype(np.float16)
    model = helper.make_model(
        helper.make_graph(
            [
                helper.make_node("Identity", ["w"], ["wi"]),
                helper.make_node("Transpose", ["wi"], ["wt"], perm=[1, 0]),
                helper.make_node("MatMul", ["x", "wt"], ["y"]),
                helper.make_node("MatMul", ["y", "x2"], ["z"]),
            ],
            "views",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 4]),
                helper.make_tensor_value_info("x2", TensorProto.FLOAT16, [8, 3]),
            ],
            [helper.make_tensor_value_info("z", TensorProto.FLOAT16, [2, 3])],
            [numpy_helper.from_array(w, "w")],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=10,
    )
    assert quantize.nothing_quantized(model, {"MatMul"}, "dynamic") == (
        "1 MatMul compute float16 (the rules take float32); 1 MatMul read no constant weight"
    )


def test_nothing_quantized_names_unusual_gemms_and_computed_weights():
    """A Gemm no quant rule matches (transA = 1, alpha or beta other than 1) and a weight a
    ConstantOfShape makes (onnx's light model zoo) are said so, not "the rules' guards did not
    take" and "read no constant weight"."""
    w = numpy_helper.from_array(np.ones((8, 4), np.float32), "w")
    shape = numpy_helper.from_array(np.array([4, 3], np.int64), "shape")
    nodes = [
        helper.make_node("Gemm", ["x", "w"], ["a"], transA=1),
        helper.make_node("Gemm", ["xt", "w", "c"], ["b"], alpha=0.5),
        helper.make_node("Gemm", ["xt", "w", "c"], ["bb"], beta=2.0),
        helper.make_node("Gemm", ["xt", "w", "c"], ["ok"]),
        helper.make_node("ConstantOfShape", ["shape"], ["w2"]),
        helper.make_node("MatMul", ["a", "w2"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 2])
    xt = helper.make_tensor_value_info("xt", TensorProto.FLOAT, [2, 8])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph(nodes, "g", [x, xt, c], [y], [w, shape])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    assert quantize.nothing_quantized(model, {"Gemm", "MatMul"}, "dynamic") == (
        f"1 Gemm {quantize.GUARDS_DID_NOT_TAKE}; 3 Gemm have transA = 1 or alpha or beta other "
        "than 1, which no quant rule matched; 1 MatMul read a weight a ConstantOfShape node "
        "computes, not a stored constant"
    )


def named_mlp() -> onnx.ModelProto:
    """`mlp()` with node names, as exporters give them (fc1/MatMul, fc1/Add, relu, fc2/MatMul)."""
    model = mlp()
    for node, name in zip(model.graph.node, ("fc1/MatMul", "fc1/Add", "relu", "fc2/MatMul")):
        node.name = name
    return model


def sites(report) -> dict[str, dict]:
    return {s["node"]: s for s in report.extra["quantize"]["sites"]}


def test_every_quantization_run_reports_its_sites_once():
    # fc1's MatMul is quantized as a MatMul and, fused with its Add, as a Gemm: one site
    _, report = rewrite.optimize_model(named_mlp(), quantize="dynamic")
    found = sites(report)
    assert sorted(found) == ["fc1/MatMul", "fc2/MatMul"]
    assert all(s["quantized"] and s["why"] == "quantized" for s in found.values())


def test_keep_float_keeps_the_matching_nodes_in_float():
    q, report = rewrite.optimize_model(named_mlp(), quantize="dynamic", keep_float=["fc1/*"])
    assert ops(q).count("MatMulInteger") == 1
    found = sites(report)
    assert not found["fc1/MatMul"]["quantized"]
    assert found["fc1/MatMul"]["why"] == "--keep-float fc1/* matches fc1/MatMul"
    assert found["fc2/MatMul"]["quantized"]
    # the float layer is the original product: fc1's output is exact
    x = RNG.normal(0, 1, (64, 256)).astype(np.float32)
    float_layer = named_mlp()
    del float_layer.graph.node[3]
    float_layer.graph.output[0].CopyFrom(
        helper.make_tensor_value_info("h3", TensorProto.FLOAT, [64, 256])
    )
    kept = onnx.ModelProto()
    kept.CopyFrom(q)
    kept.graph.output.append(helper.make_tensor_value_info("h3", TensorProto.FLOAT, None))
    s = ort.InferenceSession(kept.SerializeToString(), providers=["CPUExecutionProvider"])
    h3 = s.run(["h3"], {"x": x})[0]
    np.testing.assert_allclose(h3, run(float_layer, x), rtol=1e-5, atol=1e-5)


def test_op_types_limits_what_is_quantized():
    q, report = rewrite.optimize_model(named_mlp(), quantize="dynamic", op_types=["Gemm"])
    assert "MatMulInteger" not in ops(q)  # the model's products are MatMuls
    assert all(s["why"] == "--op-types: MatMul not listed" for s in sites(report).values())
    q, _ = rewrite.optimize_model(named_mlp(), quantize="dynamic", op_types="MatMul")
    assert ops(q).count("MatMulInteger") == 2


def calibration(tmp_path, n: int = 8, seed: int = 7):
    """An `.npz` of `n` inputs x ~ N(0, 1) of the MLP (`cal-SEED.npz`), and the inputs."""
    rng = np.random.default_rng(seed)
    path = tmp_path / f"cal-{seed}.npz"
    xs = rng.normal(0, 1, (n, 64, 256)).astype(np.float32)
    np.savez(path, x=xs)
    return path, xs


def measured_error(q: onnx.ModelProto, xs: np.ndarray) -> float:
    """max|q - ref| / max|ref| per input, the worst over the inputs, as the budget is defined."""
    errors = []
    for x in xs:
        want, got = run(named_mlp(), x), run(q, x)
        errors.append(np.abs(got - want).max() / np.abs(want).max())
    return float(max(errors))


def test_an_error_budget_holds_on_the_calibration_inputs(tmp_path):
    path, xs = calibration(tmp_path)
    full, _ = rewrite.optimize_model(named_mlp(), quantize="dynamic")
    everything = measured_error(full, xs)
    one = [
        measured_error(
            rewrite.optimize_model(named_mlp(), quantize="dynamic", keep_float=[k])[0], xs
        )
        for k in ("fc1/*", "fc2/*")
    ]
    assert 0 < max(one) < everything  # either layer alone errs less than both
    budget = (max(one) + everything) / 2  # one layer in float fits, none does not
    q, report = rewrite.optimize_model(
        named_mlp(), quantize="dynamic", error_budget=budget, calibration=str(path)
    )
    record = report.extra["quantize"]
    assert 0 < measured_error(q, xs) <= budget
    assert record["calibration_error"]["y"] <= budget
    assert record["calibration_samples"] == 8 and "warning" not in record
    search = {step["kept_float"]: step["error"] for step in record["search"]}
    assert search[1] <= budget < search[0]  # one kept in float fits, none does not
    found = sites(report)
    assert sum(s["quantized"] for s in found.values()) == 1  # one layer kept in float
    kept = next(s for s in found.values() if not s["quantized"])
    assert kept["why"].startswith("kept in float")
    done = next(s for s in found.values() if s["quantized"])
    # either layer alone in float fits, one site kept in every order: the search keeps the one
    # of less float work, fc2
    # (a [64, 256] x [256, 64] product, a quarter of fc1's), though fc1's estimate is the larger
    f32 = lambda *shape: TensorType(TensorProto.FLOAT, shape)  # noqa: E731
    fc1_ns = CostModel().node_cost("MatMul", (), (f32(64, 256), f32(256, 256)), f32(64, 256))
    fc2_ns = CostModel().node_cost("MatMul", (), (f32(64, 256), f32(256, 64)), f32(64, 64))
    assert found["fc1/MatMul"]["float_ns"] == pytest.approx(fc1_ns)
    assert found["fc2/MatMul"]["float_ns"] == pytest.approx(fc2_ns) and fc2_ns < fc1_ns
    assert kept is found["fc2/MatMul"] and kept["estimate"] < done["estimate"]
    # the output's estimate: the sum of the estimates of the quantized nodes it depends on (one
    # here), the worst-case bounds' sum, far above what was measured
    assert record["estimated_error"] == {"y": pytest.approx(done["estimate"])}
    assert record["estimated_error"]["y"] > record["calibration_error"]["y"]
    assert ops(q).count("MatMulInteger") == 1
    # the output check held the outputs to the budget, on the same inputs
    assert report.extra["check"][0]["rtol"] == budget and report.extra["check"][0]["atol"] == 0
    # a budget above the full error quantizes everything
    q, report = rewrite.optimize_model(
        named_mlp(), quantize="dynamic", error_budget=everything * 2, calibration=str(path)
    )
    assert ops(q).count("MatMulInteger") == 2


def test_the_budget_search_orders_sites_by_their_error_measured_alone(tmp_path):
    # each site's error with it alone quantized (the other in float), on the ALONE_INPUTS
    # inputs that the graph with every site quantized errs most on, orders two of the five
    # searches, and is reported per site
    path, xs = calibration(tmp_path)
    full, _ = rewrite.optimize_model(named_mlp(), quantize="dynamic")
    per_input = [measured_error(full, x[None]) for x in xs]
    hardest = sorted(range(len(xs)), key=lambda i: -per_input[i])[: quantize.ALONE_INPUTS]
    assert 0 < quantize.ALONE_INPUTS < len(xs)
    other = {"fc1/MatMul": "fc2/*", "fc2/MatMul": "fc1/*"}
    one = {
        n: rewrite.optimize_model(named_mlp(), quantize="dynamic", keep_float=[o])[0]
        for n, o in other.items()
    }  # n alone quantized
    kept = {n: measured_error(one[m], xs) for n, m in zip(other, reversed(list(other)))}
    budget = (max(kept.values()) + max(per_input)) / 2  # either kept in float fits, none not
    _, report = rewrite.optimize_model(
        named_mlp(), quantize="dynamic", error_budget=budget, calibration=str(path)
    )
    found, record = sites(report), report.extra["quantize"]
    for name in other:
        want = measured_error(one[name], xs[hardest])
        assert want > 0 and found[name]["alone"] == pytest.approx(want, rel=1e-4)
    assert record["alone_inputs"] == quantize.ALONE_INPUTS
    assert set(record["searches"]) == {
        "largest error alone first",
        "largest error alone per float nanosecond first",
        "largest estimate first",
        "largest estimate per float nanosecond first",
        "graph order",
    }
    # each alone order keeps its first site in float at its one-site step: the step's error
    # is that of the graph with that site kept (within the budget: measured on every input)
    for order, key in (
        ("largest error alone first", lambda n: found[n]["alone"]),
        (
            "largest error alone per float nanosecond first",
            lambda n: found[n]["alone"] / found[n]["float_ns"],
        ),
    ):
        first = max(found, key=key)
        step = next(s for s in record["searches"][order] if s["kept_float"] == 1)
        assert step["error"] == pytest.approx(kept[first], rel=1e-4)
    # a budget the graph with every site quantized fits: one graph measured, no search
    _, report = rewrite.optimize_model(
        named_mlp(), quantize="dynamic", error_budget=2 * max(per_input), calibration=str(path)
    )
    record = report.extra["quantize"]
    assert record["evaluations"] == 1 and record["alone_inputs"] == 0
    assert all(s["quantized"] and s["alone"] is None for s in sites(report).values())
    for steps in record["searches"].values():
        assert steps == [{"kept_float": 0, "error": pytest.approx(max(per_input), rel=1e-4)}]


def chain(n: int = 6) -> onnx.ModelProto:
    """x[64, 128] through n MatMuls by [128, 128] weights (fc0..), a Relu after each but the
    last; the last weight has an outlier row, so that quantizing it alone errs most."""
    rng = np.random.default_rng(3)
    nodes, inits, prev = [], [], "x"
    for i in range(n):
        w = rng.normal(0, 0.09, (128, 128)).astype(np.float32)
        if i == n - 1:
            w[0, :] = 3.0  # each column's step set by its outlier: the rest rounds coarsely
        inits.append(numpy_helper.from_array(w, f"W{i}"))
        out = "y" if i == n - 1 else f"m{i}"
        nodes.append(helper.make_node("MatMul", [prev, f"W{i}"], [out], name=f"fc{i}"))
        if i < n - 1:
            nodes.append(helper.make_node("Relu", [out], [f"h{i}"], name=f"relu{i}"))
            prev = f"h{i}"
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 128])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 128])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_an_order_that_would_keep_more_in_float_than_one_before_is_cut_short(tmp_path):
    # the orders are searched in turn, each capped at the fewest kept by those before: one
    # over the budget at that count cannot be chosen and takes that one step; one within it
    # bisects below it
    xs = np.random.default_rng(7).normal(0, 1, (8, 64, 128)).astype(np.float32)
    xs[:, :, 0] *= 0.01  # the outlier row reads a small input channel
    path = tmp_path / "chain.npz"
    np.savez(path, x=xs)
    want = [check.run(chain(), {"x": x})[0] for x in xs]

    def error(q: onnx.ModelProto) -> float:
        sess = check.session(q)
        return max(
            float(np.abs(check.run(sess, {"x": x})[0] - w).max() / np.abs(w).max())
            for x, w in zip(xs, want)
        )

    everything = error(rewrite.optimize_model(chain(), quantize="dynamic")[0])
    last = error(rewrite.optimize_model(chain(), quantize="dynamic", keep_float=["fc5"])[0])
    first = error(rewrite.optimize_model(chain(), quantize="dynamic", keep_float=["fc0"])[0])
    budget = (everything + last) / 2
    assert last < budget < first < everything  # fc5 in float fits, fc0 does not
    _, report = rewrite.optimize_model(
        chain(), quantize="dynamic", error_budget=budget, calibration=str(path)
    )
    record = report.extra["quantize"]
    assert record["order"] == "largest error alone first"
    assert [s["node"] for s in record["sites"] if not s["quantized"]] == ["fc5"]
    searches = record["searches"]
    # the first order bisects over all 6: 3, 1, 0 kept in float
    assert [s["kept_float"] for s in searches["largest error alone first"]] == [3, 1, 0]
    # graph order keeps fc0 first: over the budget at 1, so it needs more than 1: one step
    # (its error up to the first input over the budget, a lower bound of the worst)
    (step,) = searches["graph order"]
    assert step["kept_float"] == 1 and budget < step["error"] <= first * (1 + 1e-5)
    # the other orders keep fc5 first too: within at 1, bisected below it
    for name in (
        "largest error alone per float nanosecond first",
        "largest estimate first",
        "largest estimate per float nanosecond first",
    ):
        assert [s["kept_float"] for s in searches[name]] == [1, 0], name


def test_the_budget_search_says_which_candidate_it_measures(tmp_path):
    path, xs = calibration(tmp_path)
    full, _ = rewrite.optimize_model(named_mlp(), quantize="dynamic")
    budget = 0.5 * measured_error(full, xs)  # every site quantized is over: a search runs
    lines: dict[str, list[str]] = {}

    @contextlib.contextmanager
    def stage(label):
        lines[label] = []
        yield lines[label].append

    options = api.Options.from_keywords(
        {"quantize": "dynamic", "error_budget": budget, "calibration": str(path)}
    )
    done = api.run(named_mlp(), options, stage=stage)
    said = lines["optimizing (import, saturate, extract, fold)"]
    assert said[:4] == [
        "error budget search: the float model's outputs on 8 inputs",
        "error budget search: every site quantized, on 8 inputs",
        "error budget search: site 1 of 2 quantized alone (fc1/MatMul)",
        "error budget search: site 2 of 2 quantized alone (fc2/MatMul)",
    ]
    record = done.report.extra["quantize"]
    assert len(record["searches"]) == 5
    for name, steps in record["searches"].items():  # each bisection step of each order
        assert steps and [
            f"error budget search: {name}: {s['kept_float']} of 2 sites kept in float"
            for s in steps
        ] == [line for line in said if line.startswith(f"error budget search: {name}:")]
    assert len(said) == 4 + sum(len(steps) for steps in record["searches"].values())


def test_the_budget_search_stops_a_candidate_at_the_first_input_over_the_budget(
    tmp_path, monkeypatch
):
    # a candidate over the budget is over it whatever the other inputs give: the search runs
    # the inputs only up to the first that takes it over, hardest first (by the candidate
    # measured before); one within runs them all
    path, xs = calibration(tmp_path)
    full, _ = rewrite.optimize_model(named_mlp(), quantize="dynamic")
    errors = [measured_error(full, x[None]) for x in xs]
    over = sorted(errors)[3]  # the first input above it: the first of 4 (of 8) in file order
    first = next(i for i, e in enumerate(errors) if e > over)
    assert 0 < first < len(xs) - 1
    chooser = quantize.Chooser(
        quantize.Plan(error_budget=over), quantize.load_calibration(str(path), named_mlp())
    )
    reference = chooser._reference(named_mlp(), {}, [])[0]
    runs = []
    monkeypatch.setattr(quantize, "run", lambda s, f: runs.append(f) or check.run(s, f))
    full = check.session(full, optimized=True)
    stopped = chooser._errors(full, reference, stop_over=over)
    assert len(runs) == first + 1
    assert stopped["y"] == pytest.approx(max(errors[: first + 1]), rel=1e-4) and stopped["y"] > over
    runs.clear()
    whole = chooser._errors(full, reference)
    assert len(runs) == len(xs) and whole["y"] == pytest.approx(max(errors), rel=1e-4)
    # within the budget, nothing stops: the error is the worst of every input
    runs.clear()
    assert chooser._errors(full, reference, stop_over=max(errors)) == whole
    assert len(runs) == len(xs)
    # the feeds now run hardest first: a candidate over the budget stops at the first
    assert chooser.hardest[0] == int(np.argmax(errors))
    runs.clear()
    assert chooser._errors(full, reference, stop_over=over)["y"] == whole["y"]
    assert len(runs) == 1


def test_an_error_budget_with_validation_inputs_is_searched_and_checked_on_them(tmp_path):
    # GPTQ fits the calibration inputs; the budget is searched and checked on the validation
    # inputs, which it did not see
    fit, xs = calibration(tmp_path)
    held, vs = calibration(tmp_path, 6, seed=8)
    q, report = rewrite.optimize_model(
        named_mlp(),
        quantize="dynamic",
        rounding="gptq",
        error_budget=0.5,
        calibration=str(fit),
        validation=str(held),
    )
    record = report.extra["quantize"]
    assert record["rounding"]["samples"] == 8  # fitted on the calibration inputs
    assert record["budget_inputs"] == "validation" and record["calibration_samples"] == 6
    assert ops(q).count("MatMulInteger") == 2
    on_validation = record["calibration_error"]["y"]
    assert on_validation == pytest.approx(measured_error(q, vs), rel=1e-5)
    assert on_validation != pytest.approx(measured_error(q, xs), rel=1e-3)
    # the output check ran on the validation inputs at the budget
    assert report.extra["check"][0]["rtol"] == 0.5
    assert report.extra["check"][0]["max_rel"] == pytest.approx(on_validation, rel=1e-5)


def test_a_candidate_reaches_onnxruntime_with_its_large_constants_as_arrays():
    # the budget search's sessions: the constants of IN_MEMORY_BYTES and more stay arrays
    # (external data "in memory" in the proto), and the session computes what the whole
    # model's does, bit for bit
    g = import_model(named_mlp())
    arrays: dict = {}
    stubbed = export_model(g, arrays)
    whole = export_model(g)
    assert sorted(arrays) == ["W1", "W2"]  # 256 KB and 64 KB; B1 (1 KB) is inline
    inits = {t.name: t for t in stubbed.graph.initializer}
    for name in arrays:
        t = inits[name]
        assert t.data_location == TensorProto.EXTERNAL and not t.raw_data
        assert ExternalDataInfo(t).location == IN_MEMORY
    assert inits["B1"].raw_data and not any(uses_external_data(t) for t in whole.graph.initializer)
    np.testing.assert_array_equal(arrays["W1"], W1)
    x = RNG.normal(0, 1, (64, 256)).astype(np.float32)
    for optimized in (False, True):
        got = check.session(stubbed, optimized, arrays).run(None, {"x": x})[0]
        want = check.session(whole, optimized).run(None, {"x": x})[0]
        np.testing.assert_array_equal(got, want)
    assert not np.allclose(got, 0)


def test_an_error_budget_on_a_model_with_external_data_searches_and_writes_the_same(tmp_path):
    # a model whose weights are in a file beside it: the search's candidates read those in
    # and keep their own large constants in memory; the same choice and the same graph
    path, xs = calibration(tmp_path)
    src = tmp_path / "m.onnx"
    onnx.save_model(named_mlp(), str(src), save_as_external_data=True, size_threshold=0)
    everything = measured_error(rewrite.optimize_model(named_mlp(), quantize="dynamic")[0], xs)
    kept = rewrite.optimize_model(named_mlp(), quantize="dynamic", keep_float=["fc2/*"])[0]
    budget = (measured_error(kept, xs) + everything) / 2  # fc2 in float fits, none does not
    kw = dict(quantize="dynamic", error_budget=budget, calibration=str(path))
    from_file, report = rewrite.optimize_model(src, **kw)
    in_memory, expected = rewrite.optimize_model(named_mlp(), **kw)
    assert report.extra["quantize"]["evaluations"] > 1  # a search ran
    assert sites(report) == sites(expected)
    assert ops(from_file) == ops(in_memory) and "MatMulInteger" in ops(from_file)
    for a, b in zip(from_file.graph.initializer, in_memory.graph.initializer):
        np.testing.assert_array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))


def per_input_errors(q: onnx.ModelProto, xs: np.ndarray) -> np.ndarray:
    """max|q - ref| / max|ref| of each input."""
    want = [run(named_mlp(), x) for x in xs]
    return np.array([np.abs(run(q, x) - w).max() / np.abs(w).max() for x, w in zip(xs, want)])


def test_held_out_inputs_are_kept_from_the_search_and_reported_with_a_bound(tmp_path, capsys):
    _, xs = calibration(tmp_path)
    full, _ = rewrite.optimize_model(named_mlp(), quantize="dynamic")
    fc2 = rewrite.optimize_model(named_mlp(), quantize="dynamic", keep_float=["fc2/*"])[0]
    everything, kept = per_input_errors(full, xs), per_input_errors(fc2, xs)
    # the file's last two inputs, held out, are those the graph with fc2 in float errs most on
    order = np.argsort(kept)
    path, first = tmp_path / "ordered.npz", tmp_path / "searched.npz"
    np.savez(path, x=xs[order])
    np.savez(first, x=xs[order][:-2])
    searched, held = kept[order][:-2], kept[order][-2:]
    assert kept.max() < everything[order][:-2].max()
    budget = (kept.max() + everything[order][:-2].max()) / 2  # fc2 in float fits everywhere
    kw = dict(quantize="dynamic", error_budget=budget, calibration=str(path), held_out=2)
    q, report = rewrite.optimize_model(named_mlp(), **kw)
    record = report.extra["quantize"]
    assert not sites(report)["fc2/MatMul"]["quantized"] and sites(report)["fc1/MatMul"]["quantized"]
    assert record["calibration_samples"] == 6
    assert record["calibration_error"]["y"] == pytest.approx(searched.max(), rel=1e-5)
    assert record["held_out"] == {
        "inputs": 2,
        "error": {"y": pytest.approx(held.max(), rel=1e-5)},
        "over_budget": 0,
        "over_budget_share_at_most": pytest.approx(1 - 0.05**0.5),
        "confidence": 0.95,
    }
    # the search saw only the first six: it searched as on a file of those alone
    _, alone = rewrite.optimize_model(
        named_mlp(), quantize="dynamic", error_budget=budget, calibration=str(first)
    )
    for key in ("searches", "order", "evaluations", "calibration_error", "estimated_error"):
        assert record[key] == alone.extra["quantize"][key], key
    for key in ("alone", "estimate"):
        assert [s[key] for s in record["sites"]] == [
            s[key] for s in alone.extra["quantize"]["sites"]
        ]
    # the output check held all eight to the budget
    assert report.extra["check"][0]["max_rel"] == pytest.approx(kept.max(), rel=1e-5)
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    argv = ["quantize", str(src), str(dst), "--error-budget", str(budget)]
    argv += ["--calibration", str(path), "--held-out", "2"]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert (
        f"held out from the search: 2 inputs, worst {100 * held.max():.2f}% against the "
        f"budget's {100 * budget:.2f}%; none over it: at most 77.6% of inputs drawn like them "
        "would be (95% confidence, Clopper-Pearson)"
    ) in " ".join(said.split())
    # the check's tolerance is the budget, and said so (it was put down to --atol/--rtol)
    assert (
        f"(quant rules fired) (--error-budget): |a-b| <= atol + rtol*max|b| with rtol {budget:g}"
        in said
    )
    # a budget the searched inputs meet and the held-out ones do not: refused, nothing written
    assert searched.max() < held.min() < everything[order][:-2].max()
    tight = (searched.max() + held.min()) / 2
    with pytest.raises(OutputMismatch) as e:
        rewrite.optimize_model(named_mlp(), **{**kw, "error_budget": tight})
    assert e.value.run.report.extra["quantize"]["held_out"]["over_budget"] == 2
    dst.unlink()
    argv[argv.index(str(budget))] = str(tight)
    assert main(argv) == 1 and not dst.exists()
    assert "(2 of the 2 held out from the search over it); nothing written" in " ".join(
        capsys.readouterr().err.split()
    )


def test_held_out_inputs_leave_some_to_search_on(tmp_path):
    path, _ = calibration(tmp_path)
    with pytest.raises(OptionError, match="held-out 8 leaves none of the 8 calibration inputs"):
        rewrite.optimize_model(
            named_mlp(), quantize="dynamic", error_budget=0.1, calibration=str(path), held_out=8
        )


def test_tail_share_extrapolates_an_exponential_tail_above_the_worst_seen():
    # 16 errors: k = 4 above the threshold u = 0.02 (the 5th worst), their mean excess b = 0.025
    top = 0.02 + np.array([0.01, 0.02, 0.03, 0.04])
    errors = np.concatenate([top, [0.02], np.linspace(0.0, 0.019, 11)])
    RNG.shuffle(errors)
    tail = quantize.tail_share(errors, 0.02 + 0.025 * np.log(4 / 16 / 0.001))
    assert tail == {
        "share": pytest.approx(0.001),
        "inputs": 16,
        "tail": 4,
        "threshold": 0.02,
        "scale": pytest.approx(0.025),
    }
    # above the worst seen the share keeps falling, not to 0 as the empirical share does
    assert 0 < quantize.tail_share(errors, 0.5)["share"] < 0.001 / 1000
    # at or below the threshold the share is the empirical one
    assert quantize.tail_share(errors, 0.02)["share"] == 4 / 16
    assert quantize.tail_share(errors, 0.015)["share"] == 8 / 16
    assert quantize.tail_share(errors, 0.0)["share"] == 15 / 16
    assert quantize.tail_share(errors[:15], 0.1) is None  # too few to fit a tail
    # errors all equal: nothing lies above them
    assert quantize.tail_share(np.full(16, 0.01), 0.02)["share"] == 0.0


def test_tail_share_estimates_the_share_of_an_exponential_tail_near_its_value():
    # errors 0.01 + Exp(0.002): P(error > limit) = exp(-(limit - 0.01) / 0.002); limit at a
    # share of 0.001, beyond the worst of 100 (a share of 0.01). Over 400 sets of n, the
    # median estimate is near it (0.76x at n = 100), and the spread narrows as n grows: an
    # estimate from 100 inputs (10 above the threshold) is noisy, a factor of 4 either way in
    # one set of 5 (the 10th and 90th percentiles, 0.05x and 4x)
    rng = np.random.default_rng(1)
    limit = 0.01 + 0.002 * np.log(1000)

    def shares(n: int) -> np.ndarray:
        draws = [0.01 + rng.exponential(0.002, n) for _ in range(400)]
        return np.array([quantize.tail_share(d, limit)["share"] for d in draws])

    few, many = shares(100), shares(300)
    assert 0.0006 < np.median(few) < 0.0014 and 0.0006 < np.median(many) < 0.0014
    spread = lambda s: np.quantile(s, 0.75) / np.quantile(s, 0.25)  # noqa: E731
    assert spread(many) < spread(few) / 2
    # the worst of the 100 alone says nothing of it: below the limit in 9 sets of 10
    assert np.mean([(0.01 + rng.exponential(0.002, 100)).max() < limit for _ in range(400)]) > 0.85


def test_over_budget_share_keeps_sites_in_float_until_the_tail_fits(tmp_path, capsys):
    path, xs = calibration(tmp_path, 20)
    full, _ = rewrite.optimize_model(named_mlp(), quantize="dynamic")
    everything = per_input_errors(full, xs)
    budget = float(everything.max()) * 1.01  # every site quantized is within on all 20
    kw = dict(quantize="dynamic", error_budget=budget, calibration=str(path))
    q, report = rewrite.optimize_model(named_mlp(), **kw)
    record = report.extra["quantize"]
    assert all(s["quantized"] for s in record["sites"])
    # its tail, recorded without the option: the share of inputs like these over the budget
    tail = quantize.tail_share(everything, budget)
    assert 0.001 < tail["share"] and tail["inputs"] == 20 and tail["tail"] == 5
    assert record["tail"]["share"] == pytest.approx(tail["share"], rel=1e-3)
    assert record["over_budget_share"] is None
    # at most 0.1% of inputs over it: a product stays in float, and the chosen graph's tail
    # (measured here on the written file) fits
    q, report = rewrite.optimize_model(named_mlp(), over_budget_share=0.001, **kw)
    record = report.extra["quantize"]
    assert sum(s["quantized"] for s in record["sites"]) == 1
    written = quantize.tail_share(per_input_errors(q, xs), budget)
    assert written["share"] <= 0.001 and record["tail"]["share"] == pytest.approx(
        written["share"], rel=1e-3
    )
    # the search's step with every site quantized was within the budget, and refused by its tail
    step = next(s for s in record["search"] if s["kept_float"] == 0)
    assert step["error"] <= budget and step["over_budget_share"] > 0.001
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    argv = ["quantize", str(src), str(dst), "--error-budget", str(budget)]
    argv += ["--calibration", str(path), "--over-budget-share", "0.001"]
    assert main(argv) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (
        f"tail of the 20 searched inputs' errors (exponential above the 6th worst, "
        f"{100 * written['threshold']:.2f}%"
    ) in said
    assert "of inputs like them would err over the budget (--over-budget-share 0.1%)" in said
    # without the option the estimate is shown, and the option named
    assert main(argv[:-2]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert (
        f"about {100 * tail['share']:.3g}% of inputs like them would err over the budget "
        "(--over-budget-share P keeps nodes in float until it is at most P)"
    ) in said


def test_over_budget_share_needs_enough_searched_inputs(tmp_path):
    path, _ = calibration(tmp_path, 18)
    with pytest.raises(OptionError) as e:
        rewrite.optimize_model(
            named_mlp(),
            quantize="dynamic",
            error_budget=0.1,
            calibration=str(path),
            held_out=3,
            over_budget_share=0.01,
        )
    assert str(e.value) == (
        "over-budget-share fits a tail to at least 16 searched inputs; the budget is searched "
        "on 15 (3 more held out): give --calibration a file with more"
    )
    # without a file, the 8 inputs drawn at random
    with pytest.raises(OptionError, match="searched on 8 drawn at random: give --calibration"):
        rewrite.optimize_model(
            named_mlp(), quantize="dynamic", error_budget=0.1, over_budget_share=0.01
        )


def test_cli_validation_inputs_are_named_in_the_summary_and_their_errors(tmp_path, capsys):
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    path, _ = calibration(tmp_path)
    args = ["quantize", str(src), str(dst), "--error-budget", "0.5", "--validation", str(path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "error per output on 8 validation inputs" in out
    assert "output check (onnxruntime, the validation inputs)" in out
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    never = tmp_path / "never.onnx"
    args = ["quantize", str(src), str(never), "--error-budget", "0.5", "--validation", str(bad)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "validation file" in err and "is not an .npz archive (numpy.savez(" in err
    assert len(err.splitlines()) == 1 and not never.exists()


def test_an_error_budget_without_calibration_draws_inputs_and_warns():
    _, report = rewrite.optimize_model(named_mlp(), quantize="dynamic", error_budget=0.5)
    record = report.extra["quantize"]
    assert "drawn from the input types" in record["warning"]
    assert record["calibration_samples"] == 8


def test_weight_only_for_standard_onnx_writes_int4_blocks_before_the_matmul():
    model = mlp(layers=1)
    model.graph.node.pop()
    model.graph.node.pop()
    model.graph.node[0].output[0] = "y"
    q, report = rewrite.optimize_model(model, quantize="weight-only", check=False)
    assert ops(q) == ["DequantizeLinear", "MatMul"]
    assert [o.version for o in q.opset_import if o.domain in ("", "ai.onnx")] == [21]
    assert report.extra["opset"]["converted"]  # opset 18 in, 21 (block_size) out
    dq = q.graph.node[0]
    assert {a.name: a.i for a in dq.attribute} == {"axis": 0, "block_size": 32}
    weights = {i.name: i for i in q.graph.initializer}
    wq, scales = (weights[name] for name in dq.input[:2])
    assert wq.data_type == TensorProto.INT4 and tuple(wq.dims) == (256, 256)
    assert len(wq.raw_data) == 256 * 256 // 2  # packed two a byte
    assert scales.data_type == TensorProto.FLOAT and tuple(scales.dims) == (8, 256)
    # the rule's bound, on onnxruntime without its own fusions (at full optimization it runs
    # the pair as MatMulNBits with int8 activations inside, the runtime's own extra error)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(q.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    for seed in range(4):
        x = np.random.default_rng(seed).normal(0, 3, (64, 256)).astype(np.float32)
        err = np.abs(plain.run(None, {"x": x})[0] - run(model, x))
        assert np.all(err <= BOUNDS["matmul-weight-4bit-block32"].fn(x, W1))
        assert err.max() > 0


def test_cli_weight_only_for_standard_onnx_converts_the_model_as_its_structure(
    tmp_path, monkeypatch
):
    # the CLI keeps only the loaded model's structure once its weights are imported, and
    # converts that to opset 21 (block_size), imported with the arrays: the same file as the
    # Python API's, which converts the whole model
    imports = []

    def spy(model, folder=None, arrays=None):
        imports.append(arrays is not None)
        return import_model(model, folder, arrays)

    monkeypatch.setattr(frontends.onnx, "import_model", spy)
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    model = mlp()
    onnx.save(model, src)
    args = ["quantize", str(src), str(dst), "--mode", "weight-only", "-q", "--rtol", "0.5"]
    assert main(args) == 0  # 4-bit weights of unlike column scales: over the default check
    assert imports == [True]  # the converted structure, with the arrays
    got = onnx.load(dst)
    want, _ = rewrite.optimize_model(model, quantize="weight-only", check=False)
    assert [o.version for o in got.opset_import if o.domain in ("", "ai.onnx")] == [21]
    assert ops(got) == ops(want) and ops(got).count("DequantizeLinear") == 2
    weights = lambda m: sorted(i.raw_data for i in m.graph.initializer)  # noqa: E731
    assert weights(got) == weights(want)


def _onnxruntime_optimized(model: onnx.ModelProto, tmp_path) -> list[str]:
    """The ops of `model` after onnxruntime's own optimizations (ORT_ENABLE_ALL)."""
    opts = ort.SessionOptions()
    opts.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return ops(onnx.load(opts.optimized_model_filepath))


@pytest.mark.parametrize("activation", ["Relu", "Sigmoid"])
def test_weight_only_warns_of_products_onnxruntime_leaves_unfused(tmp_path, activation):
    # mlp(): Gemm(x, DQ(w1), b1) -> Relu -> MatMul(DQ(w2)). onnxruntime 1.32 fuses a blocked
    # DequantizeLinear into its MatMul or Gemm as MatMulNBits, but not that of a product whose
    # output a Relu (or Clip) alone reads: the warning counts those, and says what to do
    model = mlp()
    model.graph.node[2].op_type = activation
    q, report = rewrite.optimize_model(model, quantize="weight-only", check=False)
    assert ops(q).count("DequantizeLinear") == 2
    optimized = _onnxruntime_optimized(q, tmp_path)
    warning = report.extra["quantize"].get("warning", "")
    if activation == "Relu":
        assert optimized.count("DequantizeLinear") == 1 and optimized.count("MatMulNBits") == 1
        assert warning.startswith("1 quantized products feed a Relu or Clip")
        assert "--target onnxruntime writes MatMulNBits" in warning
    else:
        assert optimized.count("MatMulNBits") == 2 and "DequantizeLinear" not in optimized
        assert not warning
    q, report = rewrite.optimize_model(
        model, quantize="weight-only", target="onnxruntime", check=False
    )
    assert ops(q).count("MatMulNBits") == 2 and "warning" not in report.extra["quantize"]


def test_weight_only_8bit_for_standard_onnx_passes_the_output_check():
    q, report = rewrite.optimize_model(named_mlp(), quantize="weight-only", bits=8)
    assert ops(q).count("DequantizeLinear") == 2
    assert report.fired.get("quantize-matmul-weight-8bit-dq") == 2
    int8 = sorted(tuple(i.dims) for i in q.graph.initializer if i.data_type == TensorProto.INT8)
    assert int8 == [(256, 64), (256, 256)]
    x = RNG.normal(0, 1, (64, 256)).astype(np.float32)
    want, got = run(named_mlp(), x), run(q, x)
    assert want.std() > 0.05
    assert 0 < np.abs(got - want).max() / np.abs(want).max() < 0.02


@pytest.mark.parametrize(
    "options, message",
    [
        ({"keep_float": ["fc1/*"]}, "keep-float needs a quantization mode"),
        ({"quantize": "dynamic", "error_budget": 0}, "error-budget must be a number > 0"),
        (
            {"quantize": "dynamic", "validation": "v.npz"},
            "validation inputs are used by error-budget only",
        ),
        (
            {"quantize": "dynamic", "error_budget": 0.1, "validation": "v.npz", "calibration": "c"},
            "calibration inputs are unused here",
        ),
        ({"validation": "v.npz"}, "validation needs a quantization mode"),
        ({"quantize": "dynamic", "held_out": 2}, "held-out inputs are used by error-budget only"),
        (
            {"quantize": "dynamic", "error_budget": 0.1, "held_out": -1},
            "held-out must be a whole number >= 0",
        ),
        ({"held_out": 2}, "held-out needs a quantization mode"),
        (
            {"quantize": "dynamic", "over_budget_share": 0.01},
            "over-budget-share is used by error-budget only",
        ),
        (
            {"quantize": "dynamic", "error_budget": 0.1, "over_budget_share": 1.0},
            "over-budget-share must lie strictly between 0 and 1, not 1.0",
        ),
        ({"over_budget_share": 0.01}, "over-budget-share needs a quantization mode"),
        ({"quantize": "dynamic", "op_types": ["Matmul"]}, "'Matmul' is not an ONNX op"),
        ({"quantize": "dynamic", "cpu": "arm"}, "cpu: unknown choice 'arm'"),
        ({"cpu": "vnni"}, "cpu needs a quantization mode"),
        (
            {"quantize": "dynamic", "cpu": "vnni", "per_channel": False},
            "cpu vnni applies to modes dynamic with one weight scale per output column",
        ),
        ({"quantize": "weight-only", "cpu": "vnni"}, "cpu vnni applies to modes dynamic"),
    ],
)
def test_quantization_options_that_cannot_be_used(options, message):
    with pytest.raises(OptionError, match=message):
        rewrite.optimize_model(named_mlp(), **options)


def _column_levels(q: onnx.ModelProto) -> list[np.ndarray]:
    """Per int8 weight of `q`, the largest |level| of each output column."""
    return [
        np.abs(numpy_helper.to_array(i).astype(int)).max(axis=0)
        for i in q.graph.initializer
        if i.data_type == TensorProto.INT8
    ]


def test_cpu_vnni_quantizes_weights_over_their_full_range_per_column(monkeypatch):
    # --cpu vnni: each output column's largest weight on +-127, where the default's pair steps
    # leave same-sign neighbours at most 128 levels together (most columns' largest weight
    # then below 127); less error for the same ops (x of its own seed: the module's RNG is
    # drawn in test order, which pytest-xdist's workers change; seeds 0-9: 1.22-1.66% against
    # 1.51-2.10%)
    x = np.random.default_rng(0).normal(0, 1, (64, 256)).astype(np.float32)
    want = run(named_mlp(), x)
    default, plain = rewrite.optimize_model(named_mlp(), quantize="dynamic")
    vnni, report = rewrite.optimize_model(named_mlp(), quantize="dynamic", cpu="vnni")
    assert ops(vnni) == ops(default) and ops(vnni).count("MatMulInteger") == 2
    assert "quantize-matmul-dynamic-full-range" in report.fired
    assert not any("full-range" in r for r in plain.fired)
    assert "quantize-matmul-dynamic-full-range" in plain.skipped  # :sums int32
    assert all(np.all(m == 127) for m in _column_levels(vnni))
    assert all(np.mean(m) < 120 for m in _column_levels(default))
    err = {
        name: np.abs(run(q, x) - want).max() / np.abs(want).max()
        for name, q in (("vnni", vnni), ("default", default))
    }
    assert 0 < err["vnni"] < err["default"]
    if VNNI:  # onnxruntime sums in int32 here: its integer products are onnx.reference's
        got = run(vnni, x)
        from_reference = ReferenceEvaluator(vnni).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, from_reference, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # where this CPU would add int16 pairs, the run says so
    monkeypatch.setattr(api, "int8_sums_in_int32", lambda: False)
    _, report = rewrite.optimize_model(named_mlp(), quantize="dynamic", cpu="vnni")
    assert "this CPU has no VNNI" in report.extra["quantize"]["warning"]


def test_cli_cpu_vnni_writes_full_range_weights_and_refuses_per_tensor(tmp_path, capsys):
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    assert main(["quantize", str(src), str(dst), "--cpu", "vnni"]) == 0
    assert all(np.all(m == 127) for m in _column_levels(onnx.load(dst)))
    capsys.readouterr()
    never = tmp_path / "never.onnx"
    assert main(["quantize", str(src), str(never), "--cpu", "vnni", "--per-tensor"]) == 1
    err = capsys.readouterr().err
    assert "cpu vnni applies to modes dynamic with one weight scale per output column" in err
    assert len(err.splitlines()) == 1 and not never.exists()


def test_cli_error_budget_reports_and_refuses_bad_calibration(tmp_path, capsys):
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    path, _ = calibration(tmp_path)
    assert (
        main(["quantize", str(src), str(dst), "--error-budget", "0.5", "--calibration", str(path)])
        == 0
    )
    out = capsys.readouterr().out
    assert "quantized 2 of 2 nodes" in out and "error per output on 8 calibration inputs" in out
    assert "output check (onnxruntime, the calibration inputs)" in out
    bad = tmp_path / "bad.npz"
    np.savez(bad, y=np.zeros((2, 64, 256), np.float32))
    out_bad = tmp_path / "never.onnx"
    args = ["quantize", str(src), str(out_bad), "--error-budget", "0.5", "--calibration", str(bad)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "has no array for input 'x'" in err and len(err.splitlines()) == 1
    assert not out_bad.exists()


@pytest.mark.parametrize(
    "array, says",
    [
        # one sample without the samples' axis: the model's x is (64, 256)
        (
            np.zeros((64, 256), np.float32),
            "has samples of shape (256,), the model's input is "
            "(64, 256); the samples go along a new first axis: an array of shape (N, 64, 256)",
        ),
        (np.zeros((8, 64, 128), np.float32), "has samples of shape (64, 128)"),
        (np.zeros((8, 64, 256), np.float64), "input 'x' is float64, the model's input is float32"),
    ],
)
def test_calibration_samples_of_another_shape_or_type_are_refused_in_one_line(
    tmp_path, capsys, array, says
):
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=array)
    for mode in (["--mode", "static"], ["--rounding", "gptq"]):
        args = ["quantize", str(src), str(dst), *mode, "--calibration", str(bad)]
        assert main(args) == 1
        err = capsys.readouterr().err
        assert says in err and len(err.splitlines()) == 1, err
        assert not dst.exists()


@pytest.mark.parametrize(
    "write, says",
    [
        # a .npy of the one input's samples: np.load gives an array, not an archive
        (lambda p: np.save(p, np.zeros((8, 64, 256), np.float32)), "is not an .npz archive"),
        (lambda p: p.write_text("hello"), "is not an .npz archive"),  # numpy: "pickled data"
        (lambda p: None, "No such file or directory"),  # none at all
    ],
    ids=["npy", "text", "missing"],
)
def test_a_calibration_file_numpy_misreads_is_refused_in_one_line(tmp_path, capsys, write, says):
    """numpy's own messages named its internals ("'numpy.ndarray' object has no attribute
    'files'") or advised allow_pickle; a missing file is said to be missing."""
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    bad = tmp_path / "bad.npz"
    write(bad)
    if (tmp_path / "bad.npz.npy").exists():  # np.save appends .npy to a name without it
        (tmp_path / "bad.npz.npy").rename(bad)
    args = ["quantize", str(src), str(dst), "--mode", "static", "--calibration", str(bad)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert says in err and len(err.splitlines()) == 1, err
    assert "pickle" not in err and not dst.exists()


def test_calibration_inputs_with_nan_are_taken_and_warned_of(tmp_path, capsys):
    """A model may read NaN as missing data, so NaN calibration inputs are not refused: the
    ranges come from the finite values, the run warns where the NaN is, and a NaN the
    quantized model turned into a number is named as such, not as "measured error nan%"."""
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    xs = np.random.default_rng(7).normal(0, 1, (8, 64, 256)).astype(np.float32)
    xs[5, 3, 7] = np.nan
    path = tmp_path / "nan.npz"
    np.savez(path, x=xs)
    args = ["quantize", str(src), str(dst), "--mode", "static", "--calibration", str(path)]
    assert main([*args, "-q"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        f"warning: {path} holds a NaN or an infinity (input 'x', sample 5): ranges are "
        "calibrated on the finite values, and a quantized product turns a NaN into a number"
    )
    assert err[1].startswith(
        "error: a NaN in the original model's output where the new one has a number in y: the "
        "original model gives NaN on the check's inputs, where no error can be measured (the "
        "inputs given; a quantized product turns a NaN into a number)"
    ), err[1]
    assert not dst.exists()


def test_calibration_of_a_scalar_input_and_of_a_sequence_input(tmp_path):
    # a scalar input's samples are 0-d arrays (onnxruntime takes no numpy scalar); an input
    # that is not a tensor (a sequence) is not checked as one
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [])
    s = helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, None)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x, s], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    path = tmp_path / "cal.npz"
    np.savez(path, x=np.arange(3, dtype=np.float32), s=np.zeros((3, 2), np.float32))
    feeds = quantize.load_calibration(str(path), model)
    assert len(feeds) == 3 and all(isinstance(f["x"], np.ndarray) for f in feeds)
    assert [float(f["x"]) for f in feeds] == [0.0, 1.0, 2.0] and feeds[0]["x"].shape == ()


def test_weight_only_8bit_stores_blockwise_uint8_weights_in_matmulnbits():
    q, report = rewrite.optimize_model(
        named_mlp(), quantize="weight-only", bits=8, target="onnxruntime"
    )
    assert ops(q).count("MatMulNBits") == 2 and "MatMul" not in ops(q)
    assert report.fired.get("quantize-matmul-weight-8bit") == 2
    packed = sorted(tuple(i.dims) for i in q.graph.initializer if i.data_type == TensorProto.UINT8)
    assert packed == [(64, 8, 32), (256, 8, 32)]  # [N, K / 32, 32]: folded ahead of time
    x = RNG.normal(0, 1, (64, 256)).astype(np.float32)
    want, got = run(named_mlp(), x), run(q, x)
    assert want.std() > 0.05
    assert 0 < np.abs(got - want).max() / np.abs(want).max() < 0.02


def test_weight_only_4bit_matmul_stays_within_its_bound_on_onnxruntime():
    model = mlp(layers=1)
    model.graph.node.pop()
    model.graph.node.pop()
    model.graph.node[0].output[0] = "y"
    # 4-bit weights of unlike column scales err by more than the output check's default 10%
    # (the check is tested elsewhere); here the rule's bound is what is checked
    q, _ = rewrite.optimize_model(model, quantize="weight-only", target="onnxruntime", check=False)
    assert ops(q) == ["MatMulNBits"]
    node = q.graph.node[0]
    attrs = {a.name: a.i for a in node.attribute}
    assert attrs.get("bits", 4) == 4  # MatMulNBits' default, which the export may leave out
    assert (attrs["K"], attrs["N"], attrs["block_size"]) == (256, 256, 32)
    packed = next(i for i in q.graph.initializer if i.data_type == TensorProto.UINT8)
    assert tuple(packed.dims) == (256, 8, 16)  # two 4-bit weights a byte
    for seed in range(4):
        x = np.random.default_rng(seed).normal(0, 3, (64, 256)).astype(np.float32)
        err = np.abs(run(q, x) - run(model, x))
        assert np.all(err <= BOUNDS["matmul-weight-4bit-block32"].fn(x, W1))
        assert err.max() > 0


@pytest.mark.parametrize(
    "options, message",
    [
        ({"quantize": "weight-only", "opset": 18}, "needs opset 21, not 18"),
        ({"quantize": "weight-only", "target": "onnxruntime", "per_channel": True}, "per-channel"),
        ({"quantize": "weight-only", "target": "onnxruntime", "bits": 2}, "takes 4 or 8, not 2"),
        ({"quantize": "dynamic", "bits": 4}, "mode dynamic takes 8, not 4"),
    ],
)
def test_weight_only_options_that_cannot_be_used(options, message):
    with pytest.raises(OptionError, match=message):
        rewrite.optimize_model(named_mlp(), **options)


def embedding() -> onnx.ModelProto:
    """ids[4, 8] -> Gather of a trained-like table E[1000, 64] (rows of unlike scales)."""
    rng = np.random.default_rng(3)
    table = (rng.normal(0, 0.05, (1000, 64)) * rng.uniform(0.1, 2.0, (1000, 1))).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["E", "ids"], ["y"])],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8, 64])],
        [numpy_helper.from_array(table, "E")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_an_embedding_table_is_stored_in_int8_with_a_scale_per_row():
    model = embedding()
    q, report = rewrite.optimize_model(model, quantize="dynamic")
    assert report.fired.get("quantize-gather-embedding") == 1
    tables = [i for i in q.graph.initializer if i.data_type == TensorProto.INT8]
    assert [tuple(t.dims) for t in tables] == [(1000, 64)]  # 4x smaller than the float table
    assert np.abs(numpy_helper.to_array(tables[0])).max() == 127  # the full int8 range
    table = numpy_helper.to_array(model.graph.initializer[0])
    s = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    for seed in range(3):
        ids = np.random.default_rng(seed).integers(-1000, 1000, (4, 8))
        got = s.run(None, {"ids": ids})[0]
        err = np.abs(got - table[ids % 1000])
        assert np.all(err <= BOUNDS["gather-8bit-per-row"].fn(table, ids)) and err.max() > 0


def qdq_model() -> onnx.ModelProto:
    """An int8 input dequantized, transposed and reshaped before a float op, and quantized
    again with the same parameters: what a QDQ exporter leaves around movement ops."""
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["d"]),
        helper.make_node("Transpose", ["d"], ["t"], perm=[1, 0]),
        helper.make_node("Reshape", ["t", "shape"], ["r"]),
        helper.make_node("Relu", ["r"], ["y"]),
        helper.make_node("QuantizeLinear", ["d", "s", "z"], ["back"]),
    ]
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s"),
        numpy_helper.from_array(np.array(3, np.int8), "z"),
        numpy_helper.from_array(np.array([4, 12], np.int64), "shape"),
    ]
    graph = helper.make_graph(
        nodes,
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [6, 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 12]),
            helper.make_tensor_value_info("back", TensorProto.INT8, [6, 8]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_qdq_canonicalization_moves_a_transpose_before_dequantize_and_drops_q_of_dq():
    q, report = rewrite.optimize_model(qdq_model())  # exact rules: the default library
    assert (
        report.fired.get("transpose-before-dequantize-alt1", 0)
        + report.fired.get("transpose-before-dequantize", 0)
        >= 1
    )
    assert report.fired.get("quantize-of-dequantize", 0) >= 1
    assert "QuantizeLinear" not in ops(q)
    dq = next(n for n in q.graph.node if n.op_type == "DequantizeLinear")
    transpose = next(n for n in q.graph.node if n.op_type == "Transpose")
    # the Transpose runs on the int8 input (a quarter of the bytes), before the dequantize,
    # and so do the Reshape and the Relu (a Max with the zero point): the dequantize is last
    assert transpose.input[0] == "x" and dq.output[0] == "y"
    assert [n.op_type for n in q.graph.node if n.op_type != "Identity"] == [
        "Transpose",
        "Reshape",
        "Max",
        "DequantizeLinear",
    ]
    x = np.random.default_rng(0).integers(-128, 128, (6, 8)).astype(np.int8)
    s = ort.InferenceSession(q.SerializeToString(), providers=["CPUExecutionProvider"])
    r = ort.InferenceSession(qdq_model().SerializeToString(), providers=["CPUExecutionProvider"])
    for got, want in zip(s.run(None, {"x": x}), r.run(None, {"x": x})):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_cli_a_quantized_model_over_the_check_tolerance_is_not_written(tmp_path, capsys):
    # 4-bit weights of unlike column scales: more than the 10% the check allows by default
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    args = ["quantize", str(src), str(dst), "--mode", "weight-only", "--target", "onnxruntime"]
    assert main([*args, "-q"]) == 1
    err = capsys.readouterr().err
    assert "exceeds the output check's tolerance for quantized models" in err
    assert len(err.splitlines()) == 1 and "bisect" not in err
    assert not dst.exists()
    assert main([*args, "-q", "--rtol", "0.5"]) == 0 and dst.exists()


@pytest.mark.parametrize("per_channel", [False, True], ids=["per-tensor", "per-channel"])
def test_an_old_opset_linear_layer_gemm_with_transposed_weight_is_quantized(per_channel):
    # nn.Linear at opset 9 (and the model zoo's fc layers): Gemm(x, W[N, K], b, transB=1); the
    # model is converted to a newer opset for the rules, and kept there though it has more nodes
    rng = np.random.default_rng(6)
    w = (rng.normal(0, 0.05, (256, 512)) * rng.uniform(0.5, 1.5, (256, 1))).astype(np.float32)
    b = rng.normal(0, 0.1, 256).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "W", "b"], ["y"], transB=1)],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 512])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 256])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=4)
    q, report = rewrite.optimize_model(model, quantize="dynamic", per_channel=per_channel)
    assert "MatMulInteger" in ops(q) and report.extra["opset"]["converted"]
    assert [s["quantized"] for s in report.extra["quantize"]["sites"]] == [True]
    for seed in range(3):
        x = np.random.default_rng(seed).normal(0, 1, (64, 512)).astype(np.float32)
        err = np.abs(run(q, x) - run(model, x))
        name = "gemm-dynamic-8bit-transposed" + ("-per-column" if per_channel else "")
        assert np.all(err <= BOUNDS[name].fn(x, w, b)) and err.max() > 0


@pytest.mark.parametrize("transposed", [False, True], ids=["gemm", "gemm-transB"])
@pytest.mark.parametrize("mode", ["dynamic", "static", "weight-only"])
def test_a_gemm_without_a_bias_is_quantized_as_its_matmul(mode, transposed, tmp_path):
    # Gemm(x, W) with no C (beta written, unused) -> Relu -> MatMul W2: fusion/gemm.rules'
    # gemm-to-matmul puts a MatMul in the Gemm's e-class, where the MatMul rules quantize it
    # (in static mode a product's output must be an activation, as the Gemm's is here), so
    # the file computes what the same network written with a MatMul does once quantized.
    # With transB = 1 (W stored [N, K], nn.Linear(bias=False)'s layout) the MatMul reads
    # Transpose(W), which the e-graph sees as a constant (`Snapshot.value_of`)
    rng = np.random.default_rng(8)
    w = (rng.normal(0, 0.05, (256, 256)) * rng.uniform(0.5, 1.5, 256)).astype(np.float32)

    def linear(op: str, **attrs) -> onnx.ModelProto:
        stored = w.T.copy() if attrs.get("transB") else w
        graph = helper.make_graph(
            [
                helper.make_node(op, ["x", "W"], ["h"], name="fc", **attrs),
                helper.make_node("Relu", ["h"], ["r"], name="relu"),
                helper.make_node("MatMul", ["r", "W2"], ["y"], name="out"),
            ],
            "linear",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
            [numpy_helper.from_array(stored, "W"), numpy_helper.from_array(W2, "W2")],
        )
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)

    extra = {"calibration": str(calibration(tmp_path)[0])} if mode == "static" else {}
    if mode == "weight-only":
        extra = {"bits": 8}  # (4-bit blocks err beyond the output check's 10% on this model)
    gemm = linear("Gemm", transB=1) if transposed else linear("Gemm", beta=0.5)
    q, report = rewrite.optimize_model(gemm, quantize=mode, **extra)
    assert sites(report)["fc"]["quantized"] and "Gemm" not in ops(q), sites(report)
    integer = {"dynamic": "MatMulInteger", "static": "QLinearMatMul"}.get(mode, "DequantizeLinear")
    assert ops(q).count(integer) >= 1
    as_matmul, _ = rewrite.optimize_model(linear("MatMul"), quantize=mode, **extra)
    x = np.random.default_rng(1).normal(0, 1, (64, 256)).astype(np.float32)
    got = run(q, x)
    np.testing.assert_array_equal(got, run(as_matmul, x))
    assert np.abs(got - run(gemm, x)).max() > 0
    # one site, its MatMul's firings tied to the Gemm's: kept in float, x goes to a float product
    kept, report = rewrite.optimize_model(gemm, quantize=mode, keep_float=["fc"], **extra)
    assert [s["quantized"] for s in report.extra["quantize"]["sites"] if s["node"] == "fc"] == [
        False
    ]
    assert {n.op_type for n in kept.graph.node if "x" in n.input} <= {"Gemm", "MatMul"}


def test_keeping_one_product_in_float_keeps_a_product_reading_the_same_weight_quantized():
    # fcA = Gemm(x, W, C, transB=1) and fcB = MatMul(h, Transpose(W)): fcA's rule builds
    # Transpose(W), which is fcB's own imported node; --keep-float fcA forbade it, and fcB's
    # quantized form with it (a site forbids only the e-nodes it alone built)
    rng = np.random.default_rng(41)
    w = rng.normal(0, 0.05, (256, 256)).astype(np.float32)
    c = rng.normal(0, 0.1, 256).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Gemm", ["x", "W", "C"], ["y1"], transB=1, name="fcA"),
            helper.make_node("Transpose", ["W"], ["WT"], perm=[1, 0], name="tr"),
            helper.make_node("MatMul", ["h", "WT"], ["y2"], name="fcB"),
        ],
        "tied",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, [64, 256]),
        ],
        [
            helper.make_tensor_value_info("y1", TensorProto.FLOAT, [64, 256]),
            helper.make_tensor_value_info("y2", TensorProto.FLOAT, [64, 256]),
        ],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(c, "C")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    _, report = rewrite.optimize_model(model, quantize="dynamic")
    assert [s["quantized"] for s in report.extra["quantize"]["sites"]] == [True, True]
    kept, report = rewrite.optimize_model(model, quantize="dynamic", keep_float=["fcA"])
    assert {s["node"]: s["quantized"] for s in report.extra["quantize"]["sites"]} == {
        "fcA": False,
        "fcB": True,
    }
    assert ops(kept).count("MatMulInteger") == 1


def projections(shape=("batch", "seq", 256)) -> onnx.ModelProto:
    """A transformer's feed-forward block as exporters write it, batch and sequence symbolic:
    x[batch, seq, 256] -> MatMul W1 -> Add B1 -> Relu -> MatMul W2 -> Add B2 (with static
    `shape`, the cleanup turns each MatMul + Add into a Gemm between Reshapes)."""
    b2 = RNG.normal(0, 0.1, 64).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"]),
        helper.make_node("Add", ["h", "B1"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("MatMul", ["h3", "W2"], ["h4"]),
        helper.make_node("Add", ["h4", "B2"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(a, n) for a, n in ((W1, "W1"), (B1, "B1"), (W2, "W2"), (b2, "B2"))
    ]
    graph = helper.make_graph(
        nodes,
        "ffn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [*shape[:-1], 64])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def linear_layers() -> onnx.ModelProto:
    """x[64, 256] -> Gemm(W1^T stored [256, 256], transB=1, B1) -> Relu -> Gemm(W2, B2): torch
    Linear layers as the TorchScript exporter writes them at old opsets, and a Conv1D-style
    Gemm (GPT-2)."""
    b2 = np.random.default_rng(22).normal(0, 0.1, 64).astype(np.float32)
    nodes = [
        helper.make_node("Gemm", ["x", "W1t", "B1"], ["h"], transB=1),
        helper.make_node("Relu", ["h"], ["h2"]),
        helper.make_node("Gemm", ["h2", "W2", "B2"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(a, n)
        for a, n in ((np.ascontiguousarray(W1.T), "W1t"), (B1, "B1"), (W2, "W2"), (b2, "B2"))
    ]
    graph = helper.make_graph(
        nodes,
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 64])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def test_weight_only_gptq_rounds_a_gemm_with_a_bias(tmp_path):
    # GPTQ marks the weight of a Gemm of transB 0 for the block grids too: its MatMul (gemm-
    # as-matmul-add) reads Rounded(w, w~), which the rounded weight-only rule stores; the
    # transB = 1 Gemm's weight keeps its nearest levels (its MatMul reads a Transpose)
    cal, _ = calibration(tmp_path)
    kw = {"quantize": "weight-only", "bits": 8}
    q, report = rewrite.optimize_model(linear_layers(), rounding="gptq", calibration=str(cal), **kw)
    assert report.extra["quantize"]["rounding"]["weights"] == 1
    assert report.fired.get("quantize-matmul-weight-8bit-dq-rounded") == 1
    plain, _ = rewrite.optimize_model(linear_layers(), **kw)
    errors = []
    for x in np.random.default_rng(99).normal(0, 1, (4, 64, 256)).astype(np.float32):  # held out
        want = run(linear_layers(), x)
        errors.append([np.abs(run(m, x) - want).max() / np.abs(want).max() for m in (q, plain)])
    rounded, nearest = np.array(errors).T
    assert 0 < rounded.mean() < nearest.mean()


@pytest.mark.parametrize("target", ["onnx", "onnxruntime"])
def test_weight_only_stores_the_weights_of_gemms_with_a_bias_in_blocks(target):
    # GPT-2's Conv1D Gemms and an old-opset Linear (transB = 1): gemm-as-matmul-add puts
    # MatMul + Add in each Gemm's e-class, where the weight-only rules store the weight in
    # blocks (8 bits here: 4-bit blocks err beyond the output check's 10% on this model). For
    # standard ONNX the cleanup fuses the Add back, Gemm(x, DQ(w), c), and both Gemms take it;
    # for onnxruntime the cost model finds MatMulNBits + Add no cheaper than the small second
    # Gemm (256 x 64). --keep-float keeps the first Gemm's weight in float32 in either form
    kw = {"quantize": "weight-only", "target": target, "bits": 8}
    q, report = rewrite.optimize_model(linear_layers(), **kw)
    sites = {s["node"]: s["quantized"] for s in report.extra["quantize"]["sites"]}
    assert sites == {"h": True, "y": target == "onnx"}
    blocks = TensorProto.UINT8 if target == "onnxruntime" else TensorProto.INT8
    packed = [i for i in q.graph.initializer if i.data_type == blocks and len(i.dims) >= 2]
    assert len(packed) == sum(sites.values())
    floats = [tuple(i.dims) for i in q.graph.initializer if i.data_type == TensorProto.FLOAT]
    assert (256, 256) not in floats  # the transposed Linear's weight, in blocks
    x = RNG.normal(0, 1, (64, 256)).astype(np.float32)
    want, got = run(linear_layers(), x), run(q, x)
    assert want.std() > 0.05 and 0 < np.abs(got - want).max() / np.abs(want).max() < 0.02
    kept, report = rewrite.optimize_model(linear_layers(), keep_float=["h"], **kw)
    floats = [tuple(i.dims) for i in kept.graph.initializer if i.data_type == TensorProto.FLOAT]
    assert (256, 256) in floats
    assert not [s for s in report.extra["quantize"]["sites"] if s["node"] == "h" and s["quantized"]]


@pytest.mark.parametrize(
    "make, fired",
    [
        (lambda: projections((2, 32, 256)), {"quantize-gemm-static"}),
        (linear_layers, {"quantize-gemm-transposed-static", "quantize-gemm-static"}),
    ],
    ids=["matmul-add-static-shapes", "linear-layers"],
)
def test_static_mode_quantizes_gemms_with_a_bias(tmp_path, make, fired):
    # a Gemm's bias has no place in QLinearMatMul: the product runs as MatMulInteger on the
    # calibrated uint8 activation, rescaled and biased in float (onnxruntime fuses the four)
    rng = np.random.default_rng(21)  # not the module's RNG: the other tests' draws stay put
    model = make()
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    cal = tmp_path / "cal.npz"
    np.savez(cal, x=rng.normal(0, 1, (8, *shape)).astype(np.float32))
    q, report = rewrite.optimize_model(model, quantize="static", calibration=str(cal))
    assert ops(q).count("MatMulInteger") == 2 and "Gemm" not in ops(q)
    assert all(report.fired.get(r) for r in fired)
    x = rng.normal(0, 1, shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = ort.InferenceSession(q.SerializeToString()).run(None, {"x": x})[0]
    assert want.std() > 0.05  # not a degenerate output
    assert np.abs(got - want).max() / np.abs(want).max() < 0.05


def head() -> onnx.ModelProto:
    """x[batch, seq, 256] -> MatMul W1 -> Add B1 -> Relu -> MatMul W2 -> y: a language model's
    head (or a bias-less classifier) writes a graph output, which no calibrated range marks."""
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["h"], name="fc"),
        helper.make_node("Add", ["h", "B1"], ["h2"], name="bias"),
        helper.make_node("Relu", ["h2"], ["h3"], name="relu"),
        helper.make_node("MatMul", ["h3", "W2"], ["y"], name="head"),
    ]
    inits = [numpy_helper.from_array(a, n) for a, n in ((W1, "W1"), (B1, "B1"), (W2, "W2"))]
    graph = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 256])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 64])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.mark.parametrize(
    "options, fired",
    [
        ({}, "quantize-matmul-static-to-float"),
        ({"cpu": "vnni"}, "quantize-matmul-static-to-float-full-range"),
        ({"rounding": "gptq"}, "quantize-matmul-static-to-float-rounded"),
        ({"cpu": "vnni", "rounding": "gptq"}, "quantize-matmul-static-to-float-full-range-rounded"),
    ],
    ids=["pairs", "vnni", "gptq", "vnni-gptq"],
)
def test_static_mode_quantizes_a_product_that_writes_a_graph_output(tmp_path, options, fired):
    # the head's output stays float: its product runs as MatMulInteger on the calibrated uint8
    # activation, rescaled to float (before, the static rules needed a quantized output or a
    # bias, and the head stayed a float MatMul)
    rng = np.random.default_rng(23)
    samples = rng.normal(0, 1, (8, 2, 16, 256)).astype(np.float32)
    cal = tmp_path / "cal.npz"
    np.savez(cal, x=samples)
    model = head()
    q, report = rewrite.optimize_model(model, quantize="static", calibration=str(cal), **options)
    assert "MatMul" not in ops(q) and ops(q).count("MatMulInteger") == 1
    assert ops(q).count("QLinearMatMul") == 1
    assert report.fired.get(fired)
    assert [s["quantized"] for s in report.extra["quantize"]["sites"]] == [True, True]
    float_run = ort.InferenceSession(model.SerializeToString())
    quant_run = ort.InferenceSession(q.SerializeToString())
    for x in samples[:4]:
        want = float_run.run(None, {"x": x})[0]
        got = quant_run.run(None, {"x": x})[0]
        assert want.std() > 0.05  # not a degenerate output
        assert 0 < np.abs(got - want).max() / np.abs(want).max() < 0.05


def test_static_mode_runs_projections_in_uint8_with_qlinearmatmul(tmp_path):
    # calibrated ranges mark the activations; each MatMul by a constant weight becomes a
    # QLinearMatMul (int8 weights per output column, stepped for pairs), 8 bits in and out
    cal = tmp_path / "cal.npz"
    samples = np.random.default_rng(7).normal(0, 1, (8, 2, 32, 256)).astype(np.float32)
    np.savez(cal, x=samples)
    model = projections()
    q, report = rewrite.optimize_model(
        model, quantize="static", calibration=str(cal), target="onnxruntime"
    )
    assert ops(q).count("QLinearMatMul") == 2 and "MatMul" not in ops(q)
    # two sites, each a projection quantized by the rule (it also matches the second one's
    # input after the Relu moved onto the integers: one more firing, the same site)
    found = report.extra["quantize"]["sites"]
    assert len(found) == 2 and all(s["quantized"] for s in found)
    assert {s["rule"] for s in found} == {"quantize-matmul-static"}
    weights = [i for i in q.graph.initializer if i.data_type == TensorProto.INT8]
    assert len([w for w in weights if len(w.dims) == 2]) == 2  # and two zero points
    for w in (w for w in weights if len(w.dims) == 2):  # no two neighbours along K above 128
        wq = numpy_helper.to_array(w).astype(np.int64)
        assert 63 < np.abs(wq).max() <= 127 and np.abs(wq[:-1] + wq[1:]).max() <= 128
    # measured on the calibration inputs, where every activation lies inside its calibrated
    # range, so the error is the roundings alone (2.3-3.6% over 12 seeds by hand; a held-out
    # input beyond a range saturates, by up to 17% on those seeds: calibration's limit, not
    # the rules')
    float_run = ort.InferenceSession(model.SerializeToString())
    quant_run = ort.InferenceSession(q.SerializeToString())
    for x in samples:
        want = float_run.run(None, {"x": x})[0]
        got = quant_run.run(None, {"x": x})[0]
        assert want.std() > 0.05  # not a degenerate output
        assert 0 < np.abs(got - want).max() / np.abs(want).max() < 0.05


@pytest.mark.parametrize(
    "make, shape, fired",
    [
        (projections, (2, 32, 256), {"quantize-matmul-static-full-range"}),
        (
            linear_layers,
            (64, 256),
            {"quantize-gemm-transposed-static-full-range", "quantize-gemm-static-full-range"},
        ),
    ],
    ids=["qlinear-matmul", "linear-layers"],
)
def test_static_cpu_vnni_steps_each_column_over_its_full_range(
    tmp_path, monkeypatch, reference_at_19, make, shape, fired
):
    # --mode static --cpu vnni: the MatMul and both Gemm forms take full-range weights per
    # output column (each column's largest weight on +-127), less error than the pair steps
    rng = np.random.default_rng(23)
    cal = tmp_path / "cal.npz"
    samples = rng.normal(0, 1, (8, *shape)).astype(np.float32)
    np.savez(cal, x=samples)
    model = make()
    monkeypatch.setattr(api, "int8_sums_in_int32", lambda: True)  # no warning, whatever CPU
    results = {
        cpu: rewrite.optimize_model(model, quantize="static", calibration=str(cal), cpu=cpu)
        for cpu in ("any", "vnni")
    }
    q, report = results["vnni"]
    assert fired <= set(report.fired) and not any(
        "full-range" in r for r in results["any"][1].fired
    )
    assert ops(q) == ops(results["any"][0])
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    weights = [
        inits[n.input[3] if n.op_type == "QLinearMatMul" else n.input[1]]
        for n in q.graph.node
        if n.op_type in ("QLinearMatMul", "MatMulInteger")
    ]
    assert len(weights) == 2 and all(w.dtype == np.int8 for w in weights)
    assert all(np.all(np.abs(w.astype(np.int64)).max(axis=0) == 127) for w in weights)  # [K, N]
    errors = {}
    for cpu, (quantized, _) in results.items():
        # exact int32 sums: onnxruntime's on a CPU with VNNI, else onnx.reference's
        runner = reference_at_19(quantized) if not VNNI else None
        worst = 0.0
        for x in samples:
            want = run(model, x)
            got = run(quantized, x) if VNNI else runner.run(None, {"x": x})[0]
            assert want.std() > 0.05  # not a degenerate output
            worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
        errors[cpu] = worst
    assert 0 < errors["vnni"] < errors["any"] < 0.05


def test_a_vnni_cpu_gets_a_note_pointing_to_cpu_vnni(monkeypatch, tmp_path, capsys):
    # quantizing for any CPU on one that sums in int32: a note says --cpu vnni would do better
    # there, only for the modes it applies to and not when it was chosen or cannot apply
    def note(vnni_here, **options):
        monkeypatch.setattr(api, "int8_sums_in_int32", lambda: vnni_here)
        _, report = rewrite.optimize_model(named_mlp(), quantize="dynamic", **options)
        return report.extra["quantize"].get("note")

    assert "--cpu vnni gives full-range weights" in note(True)
    assert note(False) is None  # this CPU adds int16 pairs: the default is what it needs
    assert note(True, cpu="vnni") is None and note(True, per_channel=False) is None
    monkeypatch.setattr(api, "int8_sums_in_int32", lambda: True)
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    assert main(["quantize", str(src), str(dst)]) == 0
    assert "note: this CPU sums int8 products in int32 (VNNI)" in capsys.readouterr().err


def _argmax_model(shift: float) -> onnx.ModelProto:
    """scores = x + [0, shift] (float [16, 2]), label = ArgMax(scores, axis 1) (int64 [16, 1]),
    and n = Shape(scores): a classifier's scores, its label and a shape-only integer output."""
    return onnx.parser.parse_model(f"""
    <ir_version: 9, opset_import: ["" : 17]>
    g (float[16, 2] x) => (float[16, 2] scores, int64[16, 1] label, int64[2] n)
      <float[2] shift = {{0.0, {float(shift)!r}}}> {{
        scores = Add (x, shift)
        label = ArgMax <axis = 1> (scores)
        n = Shape (scores)
    }}""")


def test_an_integer_output_computed_from_floats_may_differ_in_a_share_of_its_elements():
    """An ArgMax of float scores flips on a near-tie once the scores move: the output check
    allows a share rtol of its elements to differ (the float tolerance of its source), so a
    quantized classifier with a label output is not refused for one flipped label, while the
    exact rules' share (1e-5) allows none here; a shape-only integer output stays exact."""
    x = np.zeros((16, 2), np.float32)
    x[:, 0] = np.linspace(1.0, 2.0, 16)
    x[0, 1] = x[0, 0] + 0.005  # the one near-tie: shifted by -0.01, row 0's label flips
    feeds = [{"x": x}]
    original, moved = _argmax_model(0.0), _argmax_model(-0.01)
    diffs = {d.name: d for d in check.compare(original, moved, fp="quant", feeds=feeds)}
    assert diffs["label"].shares and diffs["label"].max_rel == pytest.approx(1 / 16)
    assert diffs["label"].ok and diffs["label"].max_abs == 1.0
    assert not diffs["n"].shares and diffs["n"].ok and diffs["n"].rtol == 0.0
    exact = {d.name: d for d in check.compare(original, moved, fp="exact", feeds=feeds)}
    assert not exact["label"].ok and exact["label"].rtol == 1e-5
    strict = check.compare(original, moved, fp="quant", feeds=feeds, rtol=0.05)
    assert not {d.name: d for d in strict}["label"].ok  # --rtol sets the share too
    # the share is over every run's elements together: 1 of 32 differs (not 1 of 16 in one)
    two = feeds + [{"x": np.stack([np.linspace(1.0, 2.0, 16), np.zeros(16)], 1).astype(np.float32)}]
    both = {d.name: d for d in check.compare(original, moved, fp="quant", feeds=two, rtol=0.05)}
    assert both["label"].ok and both["label"].max_rel == pytest.approx(1 / 32)


def test_a_string_output_is_compared_as_equal_or_not():
    """The check's error of an integer output was computed in float64 even where both were
    equal: a string output made every check fail ("could not convert string to float")."""
    g = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["t"])],
        "strings",
        [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("t", TensorProto.STRING, [2])],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    (d,) = check.compare(m, m, feeds=[{"s": np.array(["a", "b"], dtype=object)}])
    assert d.ok and d.max_abs == 0.0
    (d,) = check.compare(m, m)  # drawn: the strings "0" and "1"
    assert d.ok and d.dtype == "string"


def test_a_refused_label_output_is_reported_as_a_share_of_elements():
    """The one-line error of a refused run names an integer output's share of differing
    elements, not a difference of class ids as a percentage."""
    label = check.OutputDiff("label", "int64", 44.0, 0.25, 0.1, 0.0, False, shares=True)
    scores = check.OutputDiff("scores", "float", 0.3, 0.12, 0.1, 1e-3, False)
    text = _measured([scores, label])
    assert text == "measured error 12.00% of scores; 25.00% of the elements of label differing"
    assert _measured([label]) == "25.00% of the elements of label differing"


def test_calibration_inputs_alone_are_the_output_checks_inputs(tmp_path, capsys):
    """--calibration without a budget, smoothing, GPTQ or static mode was refused ("used by
    ... only"), though the README says the check runs on them when given: a user could not
    check a dynamic or weight-only file on real inputs. It is checked on the first 8."""
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(named_mlp(), src)
    path, _ = calibration(tmp_path, n=12)
    for mode in (["dynamic"], ["weight-only", "--bits", "8"]):  # (4 bits err 11-13% here)
        args = ["quantize", str(src), str(dst), "--mode", *mode, "--calibration", str(path)]
        assert main(args) == 0
        out = capsys.readouterr().out
        assert "output check (onnxruntime, the calibration inputs)" in out


def test_products_inside_subgraphs_are_noted_as_left_float():
    """The rules rewrite the main graph: a MatMul in an If branch stayed float, unmentioned
    (the summary said 'quantized 1 of 1')."""
    w = numpy_helper.from_array(RNG.normal(0, 1, (64, 64)).astype(np.float32), "w")

    def branch(name):
        return helper.make_graph(
            [helper.make_node("MatMul", ["h", "w"], [f"{name}_y"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [2, 64])],
        )

    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node(
            "If", ["c"], ["y"], then_branch=branch("then"), else_branch=branch("else")
        ),
    ]
    model = helper.make_model(
        helper.make_graph(
            nodes,
            "if",
            [
                helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64]),
                helper.make_tensor_value_info("c", TensorProto.BOOL, []),
            ],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])],
            [w],
        ),
        opset_imports=[helper.make_opsetid("", 18)],
        ir_version=10,
    )
    _, report = rewrite.optimize_model(model, quantize="dynamic")
    assert (
        "2 MatMul inside If, Loop or Scan bodies stay float: the quant rules rewrite the main "
        "graph only" in report.extra["quantize"]["note"]
    )


def test_the_budget_search_measures_the_model_as_the_check_runs_it(tmp_path):
    """A Dropout in training mode (a dynamo export of a module left in train mode) that
    onnxruntime's optimizations remove: the search's reference outputs come from the model as
    a user runs it, not from the session that also returns the values its estimates read, in
    which the Dropout, its output returned, stayed and drew at random (the black-box tester's
    both MatMuls kept in float at a "measured" 45% where quantizing both errs 2%)."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((0.05 * rng.standard_normal((512, 1024))).astype(np.float32), "w1"),
        numpy_helper.from_array((0.05 * rng.standard_normal((1024, 256))).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array(0.1, np.float32), "ratio"),
        numpy_helper.from_array(np.array(True), "train"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="fc1"),
        helper.make_node("Relu", ["a"], ["b"]),
        helper.make_node("Dropout", ["b", "ratio", "train"], ["c"]),
        helper.make_node("MatMul", ["c", "w2"], ["y"], name="fc2"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 256])
    graph = helper.make_graph(nodes, "g", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "cal.npz"
    np.savez(path, x=rng.standard_normal((8, 16, 512)).astype(np.float32))
    q, report = rewrite.optimize_model(
        model, quantize="dynamic", error_budget=0.05, calibration=str(path)
    )
    record = report.extra["quantize"]
    assert ops(q).count("MatMulInteger") == 2, (ops(q), record)
    assert 0 < record["calibration_error"]["y"] < 0.05


def test_quantize_with_rules_given(tmp_path, capsys):
    """`--rules` replaces the library in quantize too: the mode's own rules file runs (the
    other modes' rulesets are left out by the run, not by a `--skip` that names rules the
    file lacks: "--skip ruleset:quant-weight-only-4bit: matches no rule"), and rules without
    any of them are one error line."""
    src, out = str(tmp_path / "m.onnx"), str(tmp_path / "q.onnx")
    onnx.save(named_mlp(), src)
    rules = str(ROOT / "patterns" / "quant" / "dynamic.rules")
    assert main(["quantize", src, out, "--rules", rules, "--quiet"]) == 0
    assert "MatMulInteger" in ops(onnx.load(out))
    capsys.readouterr()
    cleanup = str(ROOT / "patterns" / "cleanup")
    assert main(["quantize", src, str(tmp_path / "x.onnx"), "--rules", cleanup]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no rule of the rulesets --mode dynamic quantizes with" in err[0]
    assert not (tmp_path / "x.onnx").exists()
    # rulesets that quantize nothing themselves (the Gemm helper, GPTQ's mark moves, the
    # rounded rules without --rounding gptq) are no rules to quantize with either
    for args in (
        ["--mode", "weight-only", "--only", "ruleset:quant-weight-only-gemm"],
        ["--only", "ruleset:quant-rounded-moves"],
        ["--only", "ruleset:quant-dynamic-per-channel-rounded"],
    ):
        assert main(["quantize", src, str(tmp_path / "x.onnx"), *args]) == 1, args
        assert "--skip/--only leave no rule of the rulesets" in capsys.readouterr().err
        assert not (tmp_path / "x.onnx").exists()


@pytest.mark.parametrize("ir_version", [3, 7])
def test_an_overridable_weight_read_as_a_constant_is_warned_of(ir_version):
    """A weight that is also a graph input (a default the caller may override, from IR 4 on) is
    quantized from the value it holds, and the output no longer takes it: a warning says so
    (the black-box tester's model lost its input `w` silently). IR 3 lists every initializer
    as an input: nothing to warn of there."""
    w = numpy_helper.from_array(
        (0.1 * np.random.default_rng(0).standard_normal((256, 256))).astype(np.float32), "w"
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 256])
    wi = helper.make_tensor_value_info("w", TensorProto.FLOAT, [256, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 256])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x, wi], [y], [w]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = ir_version
    with warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter("always")
        q, report = rewrite.optimize_model(model, quantize="dynamic")
    assert "MatMulInteger" in ops(q) and [i.name for i in q.graph.input] == ["x"]
    # (an IR 3 model's new initializers are not inputs: the output is IR 4, which allows it)
    onnx.checker.check_model(q, full_check=True)
    said = [str(m.message) for m in issued if "initializer default" in str(m.message)]
    if ir_version < 4:
        assert not said
        return
    assert len(said) == 1 and "(w) were read" in said[0] and said[0] in report.extra["warning"]
    # still an input, as an Add reads it too, but the MatMul's weight was quantized from it
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [256, 256])
    model.graph.input.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, [256, 256]))
    model.graph.node.append(helper.make_node("Add", ["x2", "w"], ["z"]))
    model.graph.output.append(z)
    with warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter("always")
        q, report = rewrite.optimize_model(model, quantize="dynamic")
    assert "MatMulInteger" in ops(q) and "w" in [i.name for i in q.graph.input]
    said = [str(m.message) for m in issued if "initializer default" in str(m.message)]
    assert len(said) == 1 and "(w) are still inputs, but the rules rewrote" in said[0]


def test_a_product_of_a_dequantized_weight_is_not_counted_in_float():
    """weight-only's standard-ONNX form is a DequantizeLinear feeding a MatMul (or a Gemm,
    after MatMul + Add): the note on products left in float counted those (the black-box
    tester's "quantized 1 of 1" beside "the output has 1 MatMul in float")."""
    w4 = helper.make_tensor("w", TensorProto.INT4, [64, 8], [1] * 512)
    s = numpy_helper.from_array(np.ones((2, 8), np.float32), "s")
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "s"], ["wd"], axis=0, block_size=32),
        helper.make_node("MatMul", ["x", "wd"], ["y"]),  # quantized
        helper.make_node("MatMul", ["y", "y2"], ["z"]),  # two activations: float
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])
    y2 = helper.make_tensor_value_info("y2", TensorProto.FLOAT, [8, 8])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [8, 8])
    graph = helper.make_graph(nodes, "g", [x, y2], [z], [w4, s])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    rejected = {"quantize-matmul-weight-4bit-dq": {"guard (is-constant @w) failed": 2}}
    note = quantize.refused_products(
        model, {"MatMul"}, rejected, {"quantize-matmul-weight-4bit-dq"}
    )
    assert note.startswith("the output has 1 MatMul in float"), note
    del model.graph.node[2]
    assert (
        quantize.refused_products(model, {"MatMul"}, rejected, {"quantize-matmul-weight-4bit-dq"})
        == ""
    )


def test_an_original_that_gives_nan_on_the_check_inputs_is_said_so(tmp_path, capsys):
    """Sqrt of a random input gives NaN where it is negative, and DynamicQuantizeLinear makes a
    number of a NaN: the check fails on the original's NaN, not on quantization error, and
    the error says which model has it and the option that helps (--check-inputs), not
    --rtol and --error-budget (the black-box tester's masked attention on random masks)."""
    w = numpy_helper.from_array(
        (0.1 * np.random.default_rng(0).standard_normal((256, 256))).astype(np.float32), "w"
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 256])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 256])
    nodes = [helper.make_node("Sqrt", ["x"], ["r"]), helper.make_node("MatMul", ["r", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], [w])
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), src)
    assert main(["quantize", str(src), str(tmp_path / "q.onnx"), "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a NaN in the original model's output" in err[0], err
    assert "--check-inputs" in err[0] and "--rtol" not in err[0]
    assert not (tmp_path / "q.onnx").exists()
    # with --error-budget too: the original's NaN, not the budget, and the check's tolerance
    # put down to the budget in the summary
    argv = ["quantize", str(src), str(tmp_path / "q.onnx"), "--error-budget", "0.05"]
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert "the original model gives NaN on the check's inputs" in err and "exceeds" not in err
    assert "(quant rules fired) (--error-budget): |a-b| <= atol + rtol*max|b| with rtol 0.05" in out


def test_weight_only_asymmetric_blocks_carry_zero_points(tmp_path, capsys):
    """`--asymmetric` (MatMulNBitsQuantizer's default): MatMulNBits gets zero points, two a
    byte [N, K / 64], and on weights that lean to one sign the blocks err less than the
    symmetric ones; for standard ONNX the same levels are a uint4 DequantizeLinear's with
    uint4 zero points. 4 bits only."""
    model = named_mlp()
    for init in model.graph.initializer:  # the weights shifted to lean positive
        if len(init.dims) == 2:
            w = numpy_helper.to_array(init)
            init.CopyFrom(numpy_helper.from_array(w + 0.5 * np.abs(w).max(), init.name))
    kw = {"quantize": "weight-only", "target": "onnxruntime", "check": False}
    sym, _ = rewrite.optimize_model(model, **kw)
    asym, report = rewrite.optimize_model(model, asymmetric=True, **kw)
    assert report.fired.get("quantize-matmul-weight-4bit-asym") == 2
    nbits = [n for n in asym.graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 2 and all(len(n.input) == 4 for n in nbits)
    inits = {i.name: numpy_helper.to_array(i) for i in asym.graph.initializer}
    assert sorted(inits[n.input[3]].shape for n in nbits) == [(64, 4), (256, 4)]
    assert all(inits[n.input[3]].dtype == np.uint8 for n in nbits)
    x = RNG.normal(0, 1, (64, 256)).astype(np.float32)
    want = run(model, x)
    assert want.std() > 0.05
    err_sym = np.abs(run(sym, x) - want).max()
    err_asym = np.abs(run(asym, x) - want).max()
    assert 0 < err_asym < 0.7 * err_sym, (err_asym, err_sym)
    # standard ONNX: a uint4 DequantizeLinear with uint4 zero points, the same levels
    dq, report = rewrite.optimize_model(model, quantize="weight-only", asymmetric=True, check=False)
    assert report.fired.get("quantize-matmul-weight-4bit-asym-dq") == 2
    deq = [n for n in dq.graph.node if n.op_type == "DequantizeLinear"]
    inits = {i.name: i for i in dq.graph.initializer}
    assert len(deq) == 2 and all(len(n.input) == 3 for n in deq)
    assert all(inits[n.input[k]].data_type == TensorProto.UINT4 for n in deq for k in (0, 2))
    ref = ReferenceEvaluator(dq).run(None, {"x": x})[0]
    assert np.abs(ref - run(asym, x)).max() < 1e-3 * np.abs(want).max()  # the same weights
    for bad in (
        {"quantize": "weight-only", "target": "onnxruntime", "bits": 8},
        {"quantize": "dynamic"},
    ):
        with pytest.raises(OptionError, match="asymmetric applies to mode weight-only"):
            rewrite.optimize_model(model, asymmetric=True, **bad)
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    argv = ["quantize", str(src), str(tmp_path / "q.onnx"), "--mode", "weight-only"]
    assert main([*argv, "--asymmetric", "--target", "onnxruntime", "--no-check", "-q"]) == 0
    assert main([*argv, "--asymmetric", "--bits", "8"]) == 1
    assert "asymmetric applies to mode weight-only" in capsys.readouterr().err
