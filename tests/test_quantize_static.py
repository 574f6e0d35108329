"""Static int8 quantization as rules: `rewrite quantize --mode static` (calibrated activation
ranges as `rewrite.Observed` marks, patterns/quant/static.rules, the QDQ moves of
patterns/quant/qdq.rules). The rules' bounds are verified like every shipped rule (the pytest
plugin); here the whole path on a small CNN with trained-like values: calibration, the chain
of integer Convs the extraction picks, onnxruntime running it, and the error it measures."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

import rewrite
from engine.provenance import describe, replaced_names
from frontends.onnx import api
from frontends.onnx import quantize as quantize_module
from frontends.onnx.api import OptionError
from frontends.onnx.check import run as run_plain
from frontends.onnx.quantize import (
    OBSERVED,
    Range,
    calibrate,
    drawn_calibration,
    observe,
    product_boundary,
)
from rewrite.cli import main
from vocab.registry import int8_sums_in_int32

RNG = np.random.default_rng(11)
VNNI = int8_sums_in_int32()  # onnxruntime's uint8-by-int8 kernels sum in int32 on this CPU


def _conv(name: str, cin: int, cout: int, k: int = 3, rng=None) -> list:
    """A Conv's weight (He-scaled, as trained layers are) and a nonzero bias, drawn from `rng`
    (the module's RNG, looked up when called: tests replace it)."""
    rng = RNG if rng is None else rng
    w = rng.normal(0, np.sqrt(2 / (cin * k * k)), (cout, cin, k, k)).astype(np.float32)
    b = rng.normal(0, 0.2, cout).astype(np.float32)
    return [numpy_helper.from_array(w, f"{name}.w"), numpy_helper.from_array(b, f"{name}.b")]


def cnn() -> onnx.ModelProto:
    """x[1, 3, 16, 16] -> conv1 -> Relu -> MaxPool -> conv2 -> Relu -> conv3 -> + (residual)
    -> Relu -> GlobalAveragePool: ResNet's pieces, at opset 18, static shapes."""
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], pads=[1] * 4, name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "conv2.w", "conv2.b"], ["c2"], pads=[1] * 4, name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "conv3.w", "conv3.b"], ["c3"], pads=[1] * 4, name="conv3"),
        helper.make_node("Add", ["c3", "p1"], ["a"], name="residual"),
        helper.make_node("Relu", ["a"], ["r3"], name="relu3"),
        helper.make_node("GlobalAveragePool", ["r3"], ["y"], name="pool"),
    ]
    inits = _conv("conv1", 3, 16) + _conv("conv2", 16, 16) + _conv("conv3", 16, 16)
    return _image_model(nodes, "cnn", inits, [1, 16, 1, 1])


def _image_model(nodes: list, name: str, inits: list, out_shape: list) -> onnx.ModelProto:
    """A model of `nodes` from x[1, 3, 16, 16] to y of `out_shape`, at opset 18, IR 10."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


MODEL = cnn()


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {"x": x})[0]


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.fixture(scope="module")
def calibration(tmp_path_factory):
    path = tmp_path_factory.mktemp("cal") / "cal.npz"
    np.savez(path, x=np.random.default_rng(3).normal(0, 1, (8, 1, 3, 16, 16)).astype(np.float32))
    return path


def held_out(n: int = 4) -> list[np.ndarray]:
    rng = np.random.default_rng(99)
    return [rng.normal(0, 1, (1, 3, 16, 16)).astype(np.float32) for _ in range(n)]


def test_the_reference_outputs_are_not_degenerate():
    outs = np.stack([run(MODEL, x).ravel() for x in held_out()])
    assert outs.std(axis=1).min() > 0.05 * np.abs(outs).max()  # features differ from each other
    assert np.abs(outs[0] - outs[1]).max() > 0.05 * np.abs(outs).max()  # and between inputs


@pytest.mark.parametrize("target", ["onnx", "onnxruntime"])
def test_static_mode_chains_integer_convs_that_onnxruntime_runs(calibration, target):
    q, report = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), target=target
    )
    found = ops(q)
    # every Conv is a QLinearConv; the Relus between them are absorbed by their outputs'
    # quantization, the MaxPool runs on uint8; one QuantizeLinear in
    assert found.count("QLinearConv") == 3 and "Conv" not in found
    assert found.count("QuantizeLinear") == 1
    # the residual Add's result feeds only the pooling, no product: it is not quantized, so
    # the Add runs in float on the dequantized branches for either target (where it feeds a
    # Conv, onnxruntime's QLinearAdd: test_static_quantizes_products_operands_and_results_only)
    assert "QLinearAdd" not in found and found.count("Add") == found.count("Relu") == 1
    assert not any(n.domain == OBSERVED[0] for n in q.graph.node)  # no mark left
    conv = next(n for n in q.graph.node if n.op_type == "QLinearConv")
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    w, sw = inits[conv.input[3]], inits[conv.input[4]]
    assert w.dtype == np.int8 and sw.shape == (16,)  # one step per output channel
    wq = np.moveaxis(w, 1, -1).reshape(16, -1).astype(np.int64)  # QLinearConv's K order
    a, pairs = np.abs(wq), np.abs(wq[:, :-1] + wq[:, 1:])  # for pairs: same-sign ones add up
    assert 63 < a.max() <= 127 and 126 <= max(a.max(), pairs.max()) and pairs.max() <= 128
    assert inits[conv.input[8]].dtype == np.int32  # the bias, in units of s_x * s_w
    errors = []
    for x in held_out():
        want, got = run(MODEL, x), run(q, x)
        errors.append(np.abs(got - want).max() / np.abs(want).max())
    assert 0 < max(errors) < 0.05  # quantized (not exact), and close
    record = report.extra["quantize"]
    assert record["calibration"] == {
        "method": "minmax",
        "samples": 8,
        "symmetric": False,
        "activations": 7,  # the product_boundary: x, c1, r1, p1, c2, r2, c3
    }
    assert "warning" not in record


def silu_se_cnn() -> onnx.ModelProto:
    """EfficientNet's block (MBConv) at opset 18: x[1, 3, 16, 16] -> conv1 -> SiLU (v *
    Sigmoid(v)) -> conv2 -> SiLU -> squeeze-excitation (GlobalAveragePool -> 1x1 conv3 ->
    Sigmoid, times the SiLU's output) -> 1x1 conv4 -> + conv1's output (residual) -> conv5."""
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], pads=[1] * 4),
        helper.make_node("Sigmoid", ["c1"], ["g1"]),
        helper.make_node("Mul", ["c1", "g1"], ["s1"]),
        helper.make_node("Conv", ["s1", "conv2.w", "conv2.b"], ["c2"], pads=[1] * 4),
        helper.make_node("Sigmoid", ["c2"], ["g2"]),
        helper.make_node("Mul", ["c2", "g2"], ["s2"]),
        helper.make_node("GlobalAveragePool", ["s2"], ["p"]),
        helper.make_node("Conv", ["p", "conv3.w", "conv3.b"], ["c3"]),
        helper.make_node("Sigmoid", ["c3"], ["gate"]),
        helper.make_node("Mul", ["s2", "gate"], ["e"]),
        helper.make_node("Conv", ["e", "conv4.w", "conv4.b"], ["c4"]),
        helper.make_node("Add", ["c4", "c1"], ["a"], name="residual"),
        helper.make_node("Conv", ["a", "conv5.w", "conv5.b"], ["y"], pads=[1] * 4),
    ]
    inits = _conv("conv1", 3, 16) + _conv("conv2", 16, 16) + _conv("conv3", 16, 16, k=1)
    inits += _conv("conv4", 16, 16, k=1) + _conv("conv5", 16, 16)
    return _image_model(nodes, "mbconv", inits, [1, 16, 16, 16])


def test_the_output_check_runs_on_the_calibration_inputs_given(tmp_path, capsys):
    # inputs of a tenth of the random inputs' scale: on random ones the activations pass their
    # calibrated ranges tenfold and clip, which says nothing of the inputs the model will see
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(MODEL, src)
    small = tmp_path / "small.npz"
    np.savez(small, x=np.random.default_rng(4).normal(0, 0.1, (8, 1, 3, 16, 16)).astype(np.float32))
    assert (
        main(["quantize", str(src), str(dst), "--mode", "static", "--calibration", str(small)]) == 0
    )
    assert "output check (onnxruntime, the calibration inputs)" in capsys.readouterr().out
    q = onnx.load(dst)
    x = np.random.default_rng(5).normal(0, 1, (1, 3, 16, 16)).astype(np.float32)
    want = run(MODEL, x)
    assert np.abs(run(q, x) - want).max() > 0.1 * np.abs(want).max()  # random ones: clipped
    # without calibration inputs the check draws random ones, as the ranges were drawn from
    assert main(["quantize", str(src), str(dst), "--mode", "static"]) == 0
    assert "output check (onnxruntime, random inputs)" in capsys.readouterr().out


def test_product_boundary_names_the_products_operands_and_results_and_their_chains():
    # the Convs' inputs and outputs (the residual's result is conv5's input); not the
    # Sigmoids' outputs, nor the second SiLU's product (it feeds the pooling and the gating)
    want = {"x", "c1", "s1", "c2", "p", "c3", "e", "c4", "a", "y"}
    assert product_boundary(silu_se_cnn()) == want
    # through Relu and MaxPool, in either direction: ResNet's stem is one quantization
    assert product_boundary(MODEL) == {"x", "c1", "r1", "p1", "c2", "r2", "c3"}


def test_static_quantizes_products_operands_and_results_only(calibration, monkeypatch):
    # --target onnxruntime: the residual Add between Convs runs as QLinearAdd (its operands
    # and result are the Convs'); the SiLUs and the gating Mul stay in float: QLinearSigmoid
    # and QLinearMul would each quantize a value of their own (onnxruntime's QLinearSigmoid
    # is no faster than Sigmoid). On this one block the error is about the same as with every
    # activation marked (2.16% against 2.22% when measured); on EfficientNet-B0's 16 blocks
    # 32% against 48% (bench/quant.py --mode static)
    model = silu_se_cnn()
    q, _ = rewrite.optimize_model(
        model, quantize="static", calibration=str(calibration), target="onnxruntime"
    )
    found = ops(q)
    assert found.count("QLinearConv") == 3 and "QLinearAdd" in found and "Add" not in found
    assert found.count("Sigmoid") == found.count("Mul") == 3
    assert not {"QLinearSigmoid", "QLinearMul"} & set(found)
    errors = []
    for x in held_out(8):
        want, got = run(model, x), run(q, x)
        assert np.ptp(want) > 1.0  # not degenerate
        errors.append(np.abs(got - want).max() / np.abs(want).max())
    assert 0 < max(errors) < 0.05

    # what marking every activation gave: the elementwise ops on integers too
    def every_activation(m):
        return {v for n in m.graph.node for v in n.output}

    monkeypatch.setattr(quantize_module, "product_boundary", every_activation)
    monkeypatch.setattr(api, "product_boundary", every_activation)
    every, _ = rewrite.optimize_model(
        model, quantize="static", calibration=str(calibration), target="onnxruntime"
    )
    assert ops(every).count("QLinearSigmoid") == ops(every).count("QLinearMul") == 3


def test_cpu_vnni_gives_each_conv_channel_its_full_range(calibration, monkeypatch, reference_at_19):
    # --cpu vnni: each output channel's largest weight on +-127 (the default's pair steps
    # leave most channels below), the same integer chain, less error on held-out inputs
    default, _ = rewrite.optimize_model(MODEL, quantize="static", calibration=str(calibration))
    monkeypatch.setattr(api, "int8_sums_in_int32", lambda: True)  # no warning, whatever CPU
    vnni, report = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), cpu="vnni"
    )
    assert ops(vnni) == ops(default) and ops(vnni).count("QLinearConv") == 3
    fired = {r.removesuffix("-with-bias") for r in report.fired}  # the Conv with a bias
    assert "quantize-conv-static-full-range" in fired and "quantize-conv-static" not in fired
    assert "warning" not in report.extra["quantize"]

    def channel_levels(q):
        inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
        ws = [inits[n.input[3]] for n in q.graph.node if n.op_type == "QLinearConv"]
        return [np.abs(w.astype(np.int64)).reshape(len(w), -1).max(axis=1) for w in ws]

    assert all(np.all(m == 127) for m in channel_levels(vnni))
    assert all(np.mean(m) < 120 for m in channel_levels(default))
    # the error of exact int32 sums: onnx.reference's (onnxruntime's too on a CPU with VNNI,
    # checked below; without VNNI its int16 pairs may saturate the full-range weights)
    err = {}
    for name, q in (("vnni", vnni), ("default", default)):
        exact = reference_at_19(q)
        diffs = [np.abs(exact.run(None, {"x": x})[0] - run(MODEL, x)).max() for x in held_out(8)]
        err[name] = float(np.mean(diffs))
    assert 0 < err["vnni"] < err["default"]
    if VNNI:  # onnxruntime sums in int32 here: its QLinearConvs are onnx.reference's
        exact = reference_at_19(vnni)
        for x in held_out(2):
            np.testing.assert_allclose(
                run(vnni, x), exact.run(None, {"x": x})[0], rtol=0, atol=1e-6
            )
    # where this CPU would add int16 pairs, the run says so
    monkeypatch.setattr(api, "int8_sums_in_int32", lambda: False)
    _, report = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), cpu="vnni"
    )
    assert "this CPU has no VNNI" in report.extra["quantize"]["warning"]


def test_keep_float_keeps_a_conv_in_float(calibration):
    q, report = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), keep_float=["conv2"]
    )
    assert ops(q).count("QLinearConv") == 2 and ops(q).count("Conv") == 1
    sites = {s["node"]: s for s in report.extra["quantize"]["sites"]}
    assert sites["conv2"]["why"] == "--keep-float conv2 matches conv2"
    assert sites["conv1"]["quantized"] and sites["conv3"]["quantized"]
    assert all(s["op"] != "Observed" and "observed" not in s["node"] for s in sites.values())


def test_every_conv_kept_in_float_leaves_no_activation_quantized(calibration):
    # The calibration marks quantize activations apart from the Convs (DQ(Q(x))), so that
    # the Convs' rules can read 8-bit inputs. Where no quantized Conv reads one, extraction
    # must not take it either: conv1's output in 8 bits through the MaxPool is cheaper than the
    # float Relu and MaxPool, and was taken with every Conv kept in float (an error no site
    # accounted for, which a budget search then measured its candidates against)
    float_ops = ops(MODEL)
    x = held_out(1)[0]
    q, report = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), keep_float=["*"]
    )
    assert ops(q) == float_ops
    np.testing.assert_allclose(run(q, x), run(MODEL, x), rtol=1e-5, atol=1e-6)
    assert not any(s["quantized"] for s in report.extra["quantize"]["sites"])
    # a budget no quantized Conv fits: the search keeps all three, and the float graph passes
    # the output check (before: refused, the MaxPool still in 8 bits)
    q, report = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), error_budget=1e-4
    )
    assert ops(q) == float_ops
    assert report.extra["quantize"]["calibration_error"]["y"] < 1e-5
    # one Conv kept: the activations it shares with the quantized ones stay quantized
    q, _ = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), keep_float=["conv1"]
    )
    assert ops(q).count("QLinearConv") == 2 and "QuantizeLinear" in ops(q)


def test_an_error_budget_estimates_static_sites_from_their_quantized_inputs(calibration):
    # A static rule's bound reads the quantized activation Q(x, s, zp), a value only rewriting
    # made: the estimate computes it from the float model's x, and counts the bound's output
    # levels in the output QuantizeLinear's scale, relative to the float Conv's output.
    budget = 0.5  # above the full quantization's error: every Conv quantized
    q, report = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), error_budget=budget
    )
    record = report.extra["quantize"]
    sites = {s["node"]: s for s in record["sites"]}
    assert set(sites) == {"conv1", "conv2", "conv3"} and ops(q).count("QLinearConv") == 3
    estimates = [sites[n]["estimate"] for n in ("conv1", "conv2", "conv3")]
    assert all(e is not None and 0 < e < 10 for e in estimates)
    # y depends on all three: its estimate is their sum, a worst case above the measured error
    assert record["estimated_error"] == {"y": pytest.approx(sum(estimates))}
    assert 0 < record["calibration_error"]["y"] < record["estimated_error"]["y"]
    # a budget below that error keeps sites in float: the first of the order the search
    # found to keep fewest (the largest errors measured alone first, or estimates, each also
    # per float nanosecond, or graph order)
    tight = record["calibration_error"]["y"] * 0.9
    q, report = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), error_budget=tight
    )
    record = report.extra["quantize"]
    found = {s["node"]: s for s in record["sites"]}
    kept = [n for n, s in found.items() if not s["quantized"]]
    done = [n for n, s in found.items() if s["quantized"]]
    assert kept and record["calibration_error"]["y"] <= tight
    rate = "largest estimate per float nanosecond first"
    alone_rate = "largest error alone per float nanosecond first"
    assert set(record["searches"]) == {
        "largest error alone first",
        alone_rate,
        "largest estimate first",
        rate,
        "graph order",
    }
    assert all(s["float_ns"] > 0 and s["alone"] is not None for s in found.values())
    if record["order"] == "graph order":
        assert kept == list(found)[: len(kept)]
    else:
        key = {
            "largest error alone first": lambda n: found[n]["alone"],
            alone_rate: lambda n: found[n]["alone"] / found[n]["float_ns"],
            "largest estimate first": lambda n: found[n]["estimate"],
            rate: lambda n: found[n]["estimate"] / found[n]["float_ns"],
        }[record["order"]]
        assert min(map(key, kept)) >= max(map(key, done), default=0.0)


def test_symmetric_quantizes_activations_around_zero_and_percentile_clips_outliers(calibration):
    q, report = rewrite.optimize_model(
        MODEL,
        quantize="static",
        calibration=str(calibration),
        symmetric=True,
        calibrate="percentile",
    )
    qlinear = [n for n in q.graph.node if n.op_type == "QLinearConv"]
    inits = {i.name: numpy_helper.to_array(i) for i in q.graph.initializer}
    # the inner Convs at least (the cost model may keep the 3-channel first one in float: its
    # input's quantization costs about what its 8-bit product saves); int8's levels shifted
    # into uint8 (zero point 128: onnxruntime's int8-activation kernels are slow), so a Relu
    # between two Convs is a Max with the zero point (quantize-of-relu-as-max)
    assert len(qlinear) >= 2 and "Max" in ops(q)
    assert all(inits[n.input[2]].dtype == np.uint8 and inits[n.input[2]] == 128 for n in qlinear)
    assert report.extra["quantize"]["calibration"]["method"] == "percentile"
    x = held_out()[0]
    assert np.abs(run(q, x) - run(MODEL, x)).max() < 0.1 * np.abs(run(MODEL, x)).max()
    # each site is named by its Conv, not by the Relu the symmetric output's clamp merged into
    # its e-class (the black-box tester's sites "/Relu_1", op Relu, rule quantize-conv-static)
    found = {s["node"]: s["op"] for s in report.extra["quantize"]["sites"]}
    assert found == {"conv1": "Conv", "conv2": "Conv", "conv3": "Conv"}, found


def test_without_calibration_inputs_static_draws_them_and_warns():
    _, report = rewrite.optimize_model(MODEL, quantize="static")
    assert "the activations' ranges come from those" in report.extra["quantize"]["warning"]


def test_calibrate_measures_every_activation_and_includes_zero():
    feeds = drawn_calibration(MODEL, 4)
    ranges = calibrate(MODEL, feeds)
    assert set(ranges) == {"x", "c1", "r1", "p1", "c2", "r2", "c3", "a", "r3", "y"}
    assert all(r.lo <= 0 <= r.hi for r in ranges.values())
    assert ranges["r1"].lo == 0 and ranges["c1"].lo < 0  # a ReLU's floor; a Conv's negatives
    xs = np.stack([f["x"] for f in feeds])
    assert ranges["x"] == Range(float(xs.min()), float(xs.max()))
    clipped = calibrate(MODEL, feeds, "percentile")["x"]
    assert ranges["x"].lo < clipped.lo <= 0 <= clipped.hi < ranges["x"].hi
    with pytest.raises(ValueError, match="unknown calibration method"):
        calibrate(MODEL, feeds, "entropy")


def test_range_params_are_onnx_quantization_parameters():
    s, zp = Range(-1.0, 3.0).params(symmetric=False)
    assert s.dtype == np.float32 and zp.dtype == np.uint8 and s.shape == zp.shape == ()
    assert s == np.float32(4 / 255) and zp == 64  # round(1 / (4 / 255)) = round(63.75)
    s, zp = Range(-1.0, 3.0).params(symmetric=True)
    assert s == np.float32(3 / 127) and zp.dtype == np.uint8 and zp == 128  # int8 levels, shifted
    assert Range(0.0, 0.0).params(False)[0] == 1  # one point: any scale; 1


def test_observe_marks_what_nodes_read_and_shares_parameters_through_selecting_ops():
    ranges = calibrate(MODEL, drawn_calibration(MODEL, 2))
    marked = observe(MODEL, ranges)
    marks = {n.input[0]: n for n in marked.graph.node if n.domain == OBSERVED[0]}
    # the products' operands and results (and what Relu or MaxPool links to them) are read
    # through their mark; not the residual's result a nor its Relu's r3, read by the pooling
    # only, nor y, only a graph output
    assert set(marks) == set(ranges) - {"a", "r3", "y"}
    readers = {i for n in marked.graph.node if n.domain != OBSERVED[0] for i in n.input}
    assert not readers & set(marks) and all(m.output[0] in readers for m in marks.values())
    assert marked.graph.output[0].name == "y"
    # MaxPool's output p1 is quantized with r1's parameters: no requantization between them
    assert marks["p1"].input[1:] == marks["r1"].input[1:]
    assert marks["c1"].input[1:] != marks["r1"].input[1:]
    # topological order: each mark after its value is made
    made = {"x"} | {i.name for i in marked.graph.initializer}
    for n in marked.graph.node:
        assert all(i in made for i in n.input if i)
        made.update(n.output)
    assert ("rewrite", 1) in {(o.domain, o.version) for o in marked.opset_import}
    assert len(MODEL.graph.node) == 9  # the input is not changed


@pytest.mark.parametrize(
    "options, message",
    [
        ({"quantize": "dynamic", "symmetric": True}, "apply to mode static only"),
        ({"quantize": "static", "calibrate": "kl"}, "calibrate: unknown method 'kl'"),
    ],
)
def test_static_options_that_cannot_be_used(options, message):
    with pytest.raises(OptionError, match=message):
        rewrite.optimize_model(MODEL, **options)


def test_cli_quantize_static(tmp_path, calibration, capsys):
    src, dst = tmp_path / "cnn.onnx", tmp_path / "cnn.int8.onnx"
    onnx.save(MODEL, src)
    code = main(
        [
            "quantize",
            str(src),
            str(dst),
            "--mode",
            "static",
            "--calibration",
            str(calibration),
            "--target",
            "onnxruntime",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0 and "QLinearConv" in out and "quantize-conv-static" in out
    assert ops(onnx.load(dst)).count("QLinearConv") == 3
    assert main(["quantize", str(src), str(dst), "--mode", "static", "--calibrate", "kl"]) == 2


def _onnxruntime_qdq(
    tmp_path, activation_type=QuantType.QInt8, weight_type=QuantType.QInt8
) -> onnx.ModelProto:
    """MODEL quantized by onnxruntime's `quantize_static` (QDQ form, per-channel weights;
    its defaults: int8 activations and weights)."""

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter({"x": x} for x in held_out(8))

        def get_next(self):
            return next(self.feeds, None)

    src, qdq = tmp_path / "cnn.onnx", tmp_path / "cnn.qdq.onnx"
    onnx.save(MODEL, src)
    quantize_static(
        str(src),
        str(qdq),
        Reader(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=activation_type,
        weight_type=weight_type,
    )
    return onnx.load(qdq)


def test_the_exact_qdq_rules_clean_onnxruntimes_own_quantize_static_output(tmp_path):
    # a model we did not quantize: onnxruntime's QDQ file, optimized without any quantization
    model = _onnxruntime_qdq(tmp_path)
    out, report = rewrite.optimize_model(model)
    before, after = ops(model), ops(out)
    assert report.fp == "exact" and "MaxPool" in before
    # the MaxPool runs on int8 between the Q/DQ pair onnxruntime wrote around it with one
    # scale, and the pair goes (onnxruntime's file has no Relu left to drop: it folded them)
    assert after.count("QuantizeLinear") == before.count("QuantizeLinear") - 1
    assert after.count("DequantizeLinear") == before.count("DequantizeLinear") - 1
    fired = report.fired
    assert fired.get("quantize-of-dequantize") and fired.get("maxpool-before-dequantize")
    maxpool = next(n for n in out.graph.node if n.op_type == "MaxPool")
    producer = next(n for n in out.graph.node if maxpool.input[0] in n.output)
    assert producer.op_type == "QuantizeLinear"  # int8 in
    # bit for bit: the rules are exact (onnxruntime's own optimizations off: at full
    # optimization it fuses the two graphs' QDQ groups into different kernels)
    for x in held_out(2):
        np.testing.assert_array_equal(run_plain(out, {"x": x})[0], run_plain(model, {"x": x})[0])


def old_cnn() -> onnx.ModelProto:
    """`cnn()` as an old exporter writes it: opset 9, IR 3 (initializers listed as graph
    inputs), a BatchNormalization after each Conv with calibrated statistics and scales."""
    m = cnn()
    g = m.graph
    nodes, extra = [], []
    for n in g.node:
        if n.op_type != "Conv":
            nodes.append(n)
            continue
        raw = f"{n.output[0]}_raw"
        bn = helper.make_node(
            "BatchNormalization",
            [raw, *(f"{n.name}.bn.{k}" for k in ("scale", "bias", "mean", "var"))],
            [n.output[0]],
            name=f"{n.name}.bn",
        )
        n.output[0] = raw
        nodes += [n, bn]
        c = 16
        extra += [
            numpy_helper.from_array(RNG.uniform(0.5, 1.5, c).astype(np.float32), bn.input[1]),
            numpy_helper.from_array(RNG.normal(0, 0.1, c).astype(np.float32), bn.input[2]),
            numpy_helper.from_array(RNG.normal(0, 0.2, c).astype(np.float32), bn.input[3]),
            numpy_helper.from_array(RNG.uniform(0.5, 2.0, c).astype(np.float32), bn.input[4]),
        ]
    del g.node[:]
    g.node.extend(nodes)
    g.initializer.extend(extra)
    g.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in g.initializer
    )
    del m.opset_import[:]
    m.opset_import.append(helper.make_opsetid("", 9))
    m.ir_version = 3
    onnx.checker.check_model(m)
    return m


def test_static_mode_on_an_old_opset_model_with_batchnorm(calibration):
    # converted to a current opset and BatchNorm folded before the marks go on, so the static
    # rules see the Convs' weights as constants
    old = old_cnn()
    q, report = rewrite.optimize_model(old, quantize="static", calibration=str(calibration))
    assert ops(q).count("QLinearConv") == 3 and "BatchNormalization" not in ops(q)
    assert report.extra["quantize"].get("warning") is None
    assert not any(n.domain == OBSERVED[0] for n in q.graph.node)
    assert report.ops_before.get("BatchNormalization") == 3  # counted on the model given
    errors = []
    for x in held_out():
        want, got = run_plain(old, {"x": x})[0], run(q, x)
        errors.append(np.abs(got - want).max() / np.abs(want).max())
    assert 0 < max(errors) < 0.05


def test_explain_names_the_folded_batchnorm_and_shows_marks_as_marks(calibration, tmp_path):
    """The BatchNorm folding runs in a pass of its own before the marks go on: the second
    pass keeps its trees, so a QLinearConv's says which BatchNormalization and Conv it
    replaces; the calibration marks are the quantization's, never 'replaced' user nodes (the
    twenty-fourth session's black-box tester: a Conv named after its folded BatchNorm's
    output, the fold not in the tree, marks shown as replaced nodes)."""
    path = tmp_path / "q.onnx"
    q, report = rewrite.optimize_model(old_cnn(), quantize="static", calibration=str(calibration))
    onnx.save(q, path)
    trees = replaced_names(report.provenance)
    convs = [n.name for n in q.graph.node if n.op_type == "QLinearConv"]
    assert len(convs) == 3
    for name in convs:
        assert {"conv1", "conv2", "conv3"} & set(trees.get(name, ())), trees
        assert any(r.endswith(".bn") for r in trees[name]), trees[name]
    assert not any(r.endswith("/observed") for names in trees.values() for r in names)
    text = "\n".join(x for c in convs for x in describe(c, "QLinearConv", report.provenance[c]))
    assert "BatchNormalization conv1.bn" in text and "/observed" in text
    assert "replaced rewrite.Observed" not in text and "share-constant" not in text


def test_marks_the_rules_leave_are_stripped_and_reported(calibration):
    # the static rules skipped: every mark would be left; none reaches the output
    q, report = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), skip=["ruleset:quant-static"]
    )
    assert not any(n.domain == OBSERVED[0] for n in q.graph.node)
    assert all(o.domain != OBSERVED[0] for o in q.opset_import)
    assert "left in float" in report.extra["quantize"]["warning"]
    x = held_out()[0]
    np.testing.assert_allclose(run(q, x), run(MODEL, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", ["onnx", "onnxruntime"])
def test_quant_lowers_onnxruntimes_qdq_groups_to_integer_kernels(tmp_path, target):
    # onnxruntime's QDQ file with uint8 activations and weights: every Conv group (int32 bias,
    # per-channel weight scales) becomes a QLinearConv, and with onnxruntime's ops the residual
    # Add and the pool run in 8 bits too: no float op is left between the input's Q and the
    # output's DQ
    types = ("QUInt8", "QUInt8")
    model = _onnxruntime_qdq(tmp_path, *(getattr(QuantType, t) for t in types))
    out, report = rewrite.optimize_model(model, allow=("quant",), target=target)
    after = ops(out)
    assert after.count("QLinearConv") == 3 and "Conv" not in after
    assert report.fired.get("qlinear-conv-of-qdq-with-bias") == 3
    if target == "onnxruntime":
        assert after == [
            "QuantizeLinear",
            "QLinearConv",
            "MaxPool",
            "QLinearConv",
            "QLinearConv",
            "QLinearAdd",
            "QLinearGlobalAveragePool",
            "DequantizeLinear",
        ]
    # each lowering is within a level of its QDQ group (onnxruntime's own fusion off, so the
    # QDQ file runs its float ops): the output stays within a few of its levels
    last = model.graph.node[-1]
    scale = float(
        numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == last.input[1]))
    )
    for x in held_out(4):
        ref, got = run_plain(model, {"x": x})[0], run_plain(out, {"x": x})[0]
        assert np.ptp(ref) > 20 * scale  # not degenerate
        assert np.abs(got - ref).max() <= 3 * scale


def test_quant_leaves_int8_activation_groups_to_onnxruntimes_own_fusion(tmp_path):
    # onnxruntime's defaults, int8 activations and weights: the lowering is exact (its guards
    # hold), but onnxruntime's int8-activation QLinearConv ran 3.3-7.5x slower than float
    # here, and the cost model says so (engine.cost.S8_FLOP_FACTOR): the groups stay QDQ,
    # which onnxruntime fuses into uint8 kernels itself
    model = _onnxruntime_qdq(tmp_path, QuantType.QInt8, QuantType.QInt8)
    out, report = rewrite.optimize_model(model, allow=("quant",), target="onnxruntime")
    assert "QLinearConv" not in ops(out) and ops(out).count("Conv") == 3
    assert report.fired.get("qlinear-conv-of-qdq-with-bias") == 3  # in the e-graph, not taken


def test_quant_keeps_uint8_by_full_range_int8_groups_in_qdq_form(tmp_path):
    # uint8 activations by int8 weights in [-127, 127]: onnxruntime's x86 kernels without VNNI
    # add pairs of such products in int16, which saturates, so no Conv group is lowered
    model = _onnxruntime_qdq(tmp_path, QuantType.QUInt8, QuantType.QInt8)
    out, report = rewrite.optimize_model(model, allow=("quant",), target="onnxruntime")
    assert "QLinearConv" not in ops(out) and ops(out).count("Conv") == 3
    rejected = report.rejected.get("qlinear-conv-of-qdq-with-bias", {})
    assert any("integer-conv-exact" in reason for reason in rejected)


def _chain(steps: list[tuple[str, float, int, int]], out_type: int) -> onnx.ModelProto:
    """x (uint8 [256], every value) -> DequantizeLinear -> QuantizeLinear -> ..., one node per
    step (op, scale, zero point, its ONNX element type), at opset 19, IR 9."""
    nodes, inits, prev = [], [], "x"
    for i, (op, scale, zp, zp_type) in enumerate(steps):
        s, z = f"s{i}", f"z{i}"
        inits += [
            numpy_helper.from_array(np.array(scale, np.float32), s),
            numpy_helper.from_array(np.array(zp, helper.tensor_dtype_to_np_dtype(zp_type)), z),
        ]
        nodes.append(helper.make_node(op, [prev, s, z], [f"t{i}"], name=f"{op}{i}"))
        prev = f"t{i}"
    nodes.append(helper.make_node("Identity", [prev], ["y"]))
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [256])],
        [helper.make_tensor_value_info("y", out_type, [256])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


U8, I8 = TensorProto.UINT8, TensorProto.INT8
EVERY_UINT8 = np.arange(256, dtype=np.uint8)


@pytest.mark.parametrize(
    "steps, out_type, left",
    [
        # on b's grid (0.5 = 2 x 0.25), and c saturates inside b's range: the middle pair goes
        (
            [
                ("DequantizeLinear", 0.5, 10, U8),
                ("QuantizeLinear", 0.25, 0, I8),
                ("DequantizeLinear", 0.25, 0, I8),
                ("QuantizeLinear", 0.1, 0, U8),
            ],
            U8,
            ["DequantizeLinear", "QuantizeLinear"],
        ),
        # uint8 -> int8 -> uint8 with one scale and shifted zero points: no value is lost,
        # the whole chain is x
        (
            [
                ("DequantizeLinear", 0.5, 128, U8),
                ("QuantizeLinear", 0.5, 0, I8),
                ("DequantizeLinear", 0.5, 0, I8),
                ("QuantizeLinear", 0.5, 128, U8),
            ],
            U8,
            [],
        ),
        # the same ending in float: one DequantizeLinear is left
        (
            [
                ("DequantizeLinear", 0.5, 128, U8),
                ("QuantizeLinear", 0.5, 0, I8),
                ("DequantizeLinear", 0.5, 0, I8),
            ],
            TensorProto.FLOAT,
            ["DequantizeLinear"],
        ),
        # on b's grid but b saturates (int8 -32..31.75 of a's -5..122.5): a Clip is left,
        # cheaper than the pair
        (
            [
                ("DequantizeLinear", 0.5, 10, U8),
                ("QuantizeLinear", 0.25, 0, I8),
                ("DequantizeLinear", 0.25, 0, I8),
            ],
            TensorProto.FLOAT,
            ["DequantizeLinear", "Clip"],
        ),
        # off the grid (0.3 is not a multiple of 0.2): the requantization rounds, so it stays
        (
            [
                ("DequantizeLinear", 0.3, 10, U8),
                ("QuantizeLinear", 0.2, 0, I8),
                ("DequantizeLinear", 0.2, 0, I8),
                ("QuantizeLinear", 0.1, 0, U8),
            ],
            U8,
            ["DequantizeLinear", "QuantizeLinear", "DequantizeLinear", "QuantizeLinear"],
        ),
    ],
)
def test_requantization_chains_lose_the_pairs_that_round_nothing(steps, out_type, left):
    model = _chain(steps, out_type)
    out, report = rewrite.optimize_model(model)
    assert [o for o in ops(out) if o != "Identity"] == left
    if len(left) < len(steps):
        assert any(r.startswith("requantize-on-grid") for r in report.fired)
    # bit for bit on onnxruntime over every uint8 value, and not a constant
    ref = run_plain(model, {"x": EVERY_UINT8})[0]
    assert len(np.unique(ref)) > 50
    np.testing.assert_array_equal(run_plain(out, {"x": EVERY_UINT8})[0], ref)


@pytest.mark.parametrize("zp, left", [(100, ["Max"]), (0, [])], ids=["zp-100", "zp-at-min"])
def test_a_relu_between_dequantize_and_quantize_runs_on_the_integers(zp, left):
    # DQ -> Relu -> Q with one scale and zero point (a PT2E graph's ReLU between two
    # quantized ops): the Relu becomes a Max with the zero point on uint8, the pair goes
    s = numpy_helper.from_array(np.array(0.05, np.float32), "s")
    z = numpy_helper.from_array(np.array(zp, np.uint8), "z")
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "s", "z"], ["d"]),
        helper.make_node("Relu", ["d"], ["r"]),
        helper.make_node("QuantizeLinear", ["r", "s", "z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "relu",
        [helper.make_tensor_value_info("x", U8, [256])],
        [helper.make_tensor_value_info("y", U8, [256])],
        [s, z],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    out, report = rewrite.optimize_model(model)
    assert [o for o in ops(out) if o != "Identity"] == left
    assert report.fired.get("relu-before-dequantize")
    ref = run_plain(model, {"x": EVERY_UINT8})[0]
    assert len(np.unique(ref)) > 100
    np.testing.assert_array_equal(run_plain(out, {"x": EVERY_UINT8})[0], ref)


def test_quant_lowers_a_qdq_product_to_qlinearmul_for_onnxruntime():
    # Q(Mul(DQ(a), DQ(b))) of two uint8 tensors (b broadcast along the rows, as a gate is):
    # com.microsoft.QLinearMul, within one output level of the QDQ group on every input
    inits = [
        numpy_helper.from_array(np.array(v, dt), n)
        for n, v, dt in (
            ("sa", 0.04, np.float32),
            ("za", 120, np.uint8),
            ("sb", 0.01, np.float32),
            ("zb", 3, np.uint8),
            ("sy", 0.02, np.float32),
            ("zy", 128, np.uint8),
        )
    ]
    nodes = [
        helper.make_node("DequantizeLinear", ["a", "sa", "za"], ["da"]),
        helper.make_node("DequantizeLinear", ["b", "sb", "zb"], ["db"]),
        helper.make_node("Mul", ["da", "db"], ["m"]),
        helper.make_node("QuantizeLinear", ["m", "sy", "zy"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "gate",
        [
            helper.make_tensor_value_info("a", U8, [64, 16]),
            helper.make_tensor_value_info("b", U8, [16]),
        ],
        [helper.make_tensor_value_info("y", U8, [64, 16])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    out, report = rewrite.optimize_model(model, allow=("quant",), target="onnxruntime")
    assert ops(out) == ["QLinearMul"] and report.fired.get("qlinear-mul-of-qdq") == 1
    assert not any(op == "QLinearMul" for op in ops(rewrite.optimize_model(model)[0]))
    rng = np.random.default_rng(5)
    for _ in range(4):
        feeds = {"a": rng.integers(0, 256, (64, 16), np.uint8), "b": EVERY_UINT8[::16].copy()}
        ref, got = run_plain(model, feeds)[0], run_plain(out, feeds)[0]
        assert len(np.unique(ref)) > 100  # not degenerate
        assert np.abs(got.astype(int) - ref.astype(int)).max() <= 1


def audio_cnn(rng: np.random.Generator) -> onnx.ModelProto:
    """x[1, 1, 4000] -> Conv1d(32, k 10, stride 5) -> Relu -> Conv1d(32, k 3, stride 2, pads 1,
    bias) -> Relu -> Conv1d(32, k 5, group 4, pads 2) -> Relu -> GlobalAveragePool: a speech
    model's feature extractor (Wav2Vec2's is seven such Conv1ds), He-scaled weights, nonzero
    biases, at opset 17."""

    def weight(cout: int, cin: int, k: int) -> np.ndarray:
        return rng.normal(0, np.sqrt(2 / (cin * k)), (cout, cin, k)).astype(np.float32)

    inits = {
        "w1": weight(32, 1, 10),
        "w2": weight(32, 32, 3),
        "b2": rng.normal(0, 0.2, 32).astype(np.float32),
        "w3": weight(32, 8, 5),
        "b3": rng.normal(0, 0.2, 32).astype(np.float32),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], kernel_shape=[10], strides=[5], name="c1"),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], strides=[2], pads=[1, 1], name="c2"),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[2, 2], group=4, name="c3"),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "audio",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4000])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 1])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("cpu", ["any", "vnni"])
def test_static_mode_quantizes_1d_convs_as_their_2d_form(tmp_path, cpu):
    # conv1d-as-conv2d: each Conv1d is a Conv over a (1, L) image; the 2-D rule makes it a
    # QLinearConv, and the Unsqueeze and Squeeze between two of them cancel on the integers
    rng = np.random.default_rng(31)
    model = audio_cnn(rng)
    samples = rng.normal(0, 1, (8, 1, 1, 4000)).astype(np.float32)
    cal = tmp_path / "cal.npz"
    np.savez(cal, x=samples)
    q, report = rewrite.optimize_model(model, quantize="static", calibration=str(cal), cpu=cpu)
    assert ops(q).count("QLinearConv") == 3 and "Conv" not in ops(q)
    assert ops(q).count("Unsqueeze") == ops(q).count("Squeeze") == 1
    assert report.fired.get("conv1d-as-conv2d") and report.fired.get("quantize-of-squeeze-alt1")
    assert all(s["quantized"] for s in report.extra["quantize"]["sites"])
    errors = []
    for x in rng.normal(0, 1, (4, 1, 1, 4000)).astype(np.float32):  # held out
        want, got = run(model, x), run(q, x)
        assert np.ptp(want) > 0.1  # not degenerate
        errors.append(np.abs(got - want).max() / np.abs(want).max())
    assert 0 < max(errors) < 0.05


def _bn_cnn(dead: int | None = None, rng=None) -> onnx.ModelProto:
    """conv1 -> bn1 (BatchNormalization, trained-like statistics) -> relu1 -> conv2 -> relu2 ->
    conv3 -> y: static mode folds bn1 into conv1 before it calibrates (conv3, whose output is
    the graph's, stays float by design). With `dead`, bn1's channel `dead` has gamma 1e-6 (a
    channel training switched off) and beta 0.5: folded, conv1's weights in that channel are
    tiny beside its bias."""
    rng = RNG if rng is None else rng
    c = 8
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32)
    beta = rng.normal(0, 0.2, c).astype(np.float32)
    if dead is not None:
        gamma[dead], beta[dead] = 1e-6, 0.5
    bn = [
        numpy_helper.from_array(gamma, "bn1.scale"),
        numpy_helper.from_array(beta, "bn1.bias"),
        numpy_helper.from_array(rng.normal(0, 0.3, c).astype(np.float32), "bn1.mean"),
        numpy_helper.from_array(rng.uniform(0.5, 2.0, c).astype(np.float32), "bn1.var"),
    ]
    inits = _conv("conv1", 3, c, rng=rng) + bn + _conv("conv2", c, c, rng=rng)
    inits += _conv("conv3", c, c, rng=rng)
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], pads=[1] * 4, name="conv1"),
        helper.make_node(
            "BatchNormalization",
            ["c1", "bn1.scale", "bn1.bias", "bn1.mean", "bn1.var"],
            ["b1"],
            name="bn1",
        ),
        helper.make_node("Relu", ["b1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "conv2.w", "conv2.b"], ["c2"], pads=[1] * 4, name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "conv3.w", "conv3.b"], ["y"], pads=[1] * 4, name="conv3"),
    ]
    return _image_model(nodes, "bn_cnn", inits, [1, c, 16, 16])


@pytest.mark.parametrize("pattern", ["conv1", "bn1", "c*1"])
def test_keep_float_matches_a_conv_by_its_name_before_its_batchnorm_was_folded(
    calibration, pattern
):
    """Static mode folds BatchNormalization into its Conv in a pass before calibration, and
    the fused node took a new name: --keep-float conv1 (or bn1) matched nothing, silently.
    The fused node answers to the names of the nodes it replaces."""
    model = _bn_cnn()
    q, report = rewrite.optimize_model(
        model, quantize="static", calibration=str(calibration), keep_float=[pattern]
    )
    record = report.extra["quantize"]
    kept = [s for s in record["sites"] if not s["quantized"]]
    assert len(kept) == 1 and kept[0]["why"].startswith(f"--keep-float {pattern} matches ")
    assert ops(q).count("QLinearConv") == 1 and "warning" not in record
    assert "guards refused" not in record.get("note", "")  # kept by the user, not a guard


def test_a_keep_float_pattern_that_matches_nothing_is_warned_of(calibration):
    # conv2 and conv[2] both match conv2 alone (the first is its reason): neither is warned of
    _, report = rewrite.optimize_model(
        MODEL,
        quantize="static",
        calibration=str(calibration),
        keep_float=["conv9", "conv2", "conv[2]"],
    )
    assert report.extra["quantize"]["warning"] == (
        "--keep-float conv9 matches no node the quant rules matched (the summary and --report "
        "name them)"
    )


def test_every_site_kept_in_float_is_warned_of_with_its_reasons(calibration):
    _, report = rewrite.optimize_model(
        MODEL, quantize="static", calibration=str(calibration), keep_float=["conv*"]
    )
    assert report.extra["quantize"]["warning"] == (
        "nothing was quantized: the 3 nodes the quant rules matched stay in float "
        "(3: --keep-float conv*)"
    )


def test_a_conv_with_a_dead_batchnorm_channel_is_quantized_with_that_channels_step_raised(
    calibration,
):
    """A BatchNormalization channel with gamma near 0, folded into its Conv, leaves weights of
    1e-6 beside a bias of 0.5: in units of s_x * s_w that bias is ~1e9, beyond the 2^24 the
    bias may count, and the whole Conv stayed float. Now that channel's step is raised until
    its bias counts 2^23 (onnxruntime's quantizer raises such a scale too); the other
    channels keep theirs, and the output check passes."""
    model = _bn_cnn(dead=3, rng=np.random.default_rng(0))
    q, report = rewrite.optimize_model(model, quantize="static", calibration=str(calibration))
    assert ops(q).count("QLinearConv") == 2 and ops(q).count("Conv") == 1  # conv3: by design
    assert "guards refused" not in report.extra["quantize"].get("note", "")
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    conv1 = next(n for n in q.graph.node if n.op_type == "QLinearConv" and n.input[0] != "r1")
    sx, sw = inits[conv1.input[1]], inits[conv1.input[4]]
    bias = inits[conv1.input[8]].astype(np.int64)
    assert 2**23 - 2 <= abs(bias[3]) <= 2**23 and np.abs(np.delete(bias, 3)).max() < 2**20
    w = inits[conv1.input[3]].astype(np.int64)
    assert np.abs(w[3]).max() <= 1 and np.abs(np.delete(w, 3, axis=0)).max() >= 100
    # the raised step: |b| / (s_x 2^23), b = beta + (conv1's bias - mean) gamma / sqrt(var)
    # folded, 0.5 to within 1e-5
    np.testing.assert_allclose(sw[3], 0.5 / (float(sx) * 2**23), rtol=1e-4)
    # held out: 4.9% (seed 0; its sibling with bn1's channel 3 alive, 4.5%)
    for x in held_out():
        ref = run(model, x)
        assert np.abs(run(q, x) - ref).max() < 0.06 * np.abs(ref).max()


def _big_kernel_cnn() -> onnx.ModelProto:
    """conv1 (3 -> 64) -> relu1 -> conv2 (64 -> 2, kernel 33 x 33, pads 16: K = 69,696 terms a
    sum, more than int32 holds of uint8-by-int8 products) -> relu2 -> conv3 (1 x 1) -> y."""
    inits = _conv("conv1", 3, 64) + _conv("conv2", 64, 2, k=33) + _conv("conv3", 2, 2, k=1)
    nodes = [
        helper.make_node("Conv", ["x", "conv1.w", "conv1.b"], ["c1"], pads=[1] * 4, name="conv1"),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "conv2.w", "conv2.b"], ["c2"], pads=[16] * 4, name="conv2"),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "conv3.w", "conv3.b"], ["y"], name="conv3"),
    ]
    return _image_model(nodes, "big_kernel_cnn", inits, [1, 2, 16, 16])


def test_a_conv_a_guard_refused_is_named_in_a_note(calibration):
    """conv2's 69,696 products a sum could overflow int32: the static rule's guard refuses
    it, and the run says so instead of counting only what it matched."""
    q, report = rewrite.optimize_model(
        _big_kernel_cnn(), quantize="static", calibration=str(calibration), check=False
    )
    assert ops(q).count("QLinearConv") == 1 and ops(q).count("Conv") == 2  # conv2, conv3
    note = report.extra["quantize"]["note"]
    assert (
        "the output has 2 Conv in float (kept by options, by design, or refused); the quant "
        in note
    )
    assert "quantize-conv-static-with-bias's guard (conv-accumulates-in-int32 @w)" in note
