"""Graph fuzzing (`verify.graphs`, `verify.fuzz`): random valid models through the optimizer,
compared with the original under onnxruntime and onnx.reference. The CI profile runs a fixed
set of a few hundred graphs; `bench/fuzz.py` runs 10,000. Each bug found is a regression test
below, as the minimal graph it shrank to."""

import os

import onnx.parser
import pytest
from hypothesis import HealthCheck, given, settings

from dsl import load_rules, shipped_rules_dir
from frontends.onnx.check import tolerance_types
from verify.fuzz import Stats, check_graph
from verify.graphs import onnx_graphs

RULES = load_rules([shipped_rules_dir()])
EXAMPLES = int(os.environ.get("REWRITE_FUZZ_EXAMPLES", "200"))


def _model(body: str) -> onnx.ModelProto:
    return onnx.parser.parse_model('<ir_version: 10, opset_import: ["" : 18]>\n' + body)


@pytest.mark.slow
def test_random_graphs():
    """Every random graph optimizes without error to a valid model with the same outputs, and
    the fuzzing is not vacuous: most graphs change, many rules fire, and both executors
    compare."""
    stats = Stats()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(onnx_graphs())
    def run(model):
        stats.add(model, check_graph(model, RULES))

    run()
    assert stats.graphs >= EXAMPLES
    assert stats.changed > stats.graphs * 0.8
    assert len(stats.fired) > 60 and sum(stats.fired.values()) > 10 * stats.graphs
    assert stats.compared["onnxruntime"] > stats.changed * 0.8
    assert stats.compared["onnx.reference"] > stats.changed * 0.8


def test_cyclic_enode_is_not_a_term():
    """Found by fuzzing: after squeeze-unsqueeze, the class of Unsqueeze(x) also holds
    Squeeze(Unsqueeze(<itself>)); naming it by its e-node with the fewest children looped, and
    the optimizer crashed with `e-class N has no finite term`."""
    model = _model("""
    g (float x) => (float[1] w, float[1] r)
        <float c = {0.125}, int64[1] zero = {0}, int64[1] one = {1}> {
        eq = Equal (c, x)
        n = Not (eq)
        f = Cast <to = 1> (n)
        u1 = Unsqueeze (f, zero)
        u2 = Unsqueeze (u1, zero)
        s = Squeeze (u2, zero)
        nn = Not (n)
        w = Where (nn, s, s)
        rs = Reshape (f, one)
        r = Relu (rs)
    }""")
    result = check_graph(model, RULES)
    assert result.changed and "squeeze-unsqueeze" in result.fired
    assert set(result.compared) == {"onnxruntime", "onnx.reference"}


def test_widened_float32_value_has_float32_tolerance():
    """Found by fuzzing: a decomposed LayerNormalization, fused (a reassoc rule) in float32,
    then cast to double. The fused kernel is off by 1.8e-7 relative, a float32 rounding, and
    the check compared the double output at double's tolerance (1e-9): a correct rewrite was
    refused. An output's tolerance now comes from the least precise float type it is computed
    from (`frontends.onnx.check.tolerance_types`)."""
    model = _model("""
    g (float[3,2,4] x) => (double[3,2,4] y, float[3,2,4] f)
        <int64[1] ax = {-1}, float two = {2}, float eps = {1e-05}, float[4] w = {2, 2, 2, 2}> {
        m = ReduceMean (x, ax)
        d = Sub (x, m)
        p = Pow (d, two)
        v = ReduceMean (p, ax)
        ve = Add (v, eps)
        s = Sqrt (ve)
        n = Div (d, s)
        f = Mul (n, w)
        y = Cast <to = 11> (f)
    }""")
    assert tolerance_types(model) == {"y": onnx.TensorProto.FLOAT, "f": onnx.TensorProto.FLOAT}
    result = check_graph(model, RULES)
    assert result.changed and any(r.startswith("layernorm") for r in result.fired)
    assert set(result.compared) == {"onnxruntime", "onnx.reference"}


def test_unbounded_float_clip_stays():
    """Found by fuzzing: Clip without bounds maps float infinities to the largest finite
    values (its defaults are numeric_limits lowest() and max(), ONNX Clip-13; onnxruntime does
    this), so `clip-unbounded` removed a Clip that changed +-inf (Clip(x / 0)). It now fires
    on integer inputs only."""
    model = _model("""
    g (float[4] x, int64[4] i) => (float[4] y, int64[4] j) <float zero = {0}> {
        d = Div (x, zero)
        y = Clip (d)
        j = Clip (i)
    }""")
    result = check_graph(model, RULES)
    assert result.fired.get("clip-unbounded") == 1  # the int64 one only
    assert set(result.compared) == {"onnxruntime", "onnx.reference"}


def test_tolerance_types_take_the_least_precise_source():
    """Double all the way keeps double's tolerance; a float16 weight or a Cast through float16
    on the way gives float16's; an integer output computed from float values takes theirs (a
    share of its elements may differ), one computed from integers or from a shape alone keeps
    its own type (compared exactly)."""
    model = _model("""
    g (double[2] x, float16[2] h, int64[2] k) => (double[2] a, double[2] b, double[2] c,
                                                 int64[2] i, int64[1] s, int64[2] j) {
        a = Add (x, x)
        hd = Cast <to = 11> (h)
        b = Add (x, hd)
        xh = Cast <to = 10> (x)
        c = Cast <to = 11> (xh)
        i = Cast <to = 7> (x)
        s = Shape (b)
        j = Add (k, k)
    }""")
    T = onnx.TensorProto
    assert tolerance_types(model) == {
        "a": T.DOUBLE,
        "b": T.FLOAT16,
        "c": T.FLOAT16,
        "i": T.DOUBLE,
        "s": T.INT64,
        "j": T.INT64,
    }


def test_reduce_graph_keeps_what_fails():
    """reduce_graph drops the outputs and nodes the failure does not need."""
    from verify.fuzz import reduce_graph

    model = _model("""
    g (float[3] x) => (float[3] y, float[3] z) {
        a = Relu (x)
        b = Sigmoid (a)
        y = Neg (b)
        z = Abs (x)
    }""")
    small = reduce_graph(model, lambda m: any(n.op_type == "Sigmoid" for n in m.graph.node))
    assert [n.op_type for n in small.graph.node] == ["Sigmoid", "Neg"]
    assert [o.name for o in small.graph.output] == ["y"] and [
        i.name for i in small.graph.input
    ] == ["x"]
    assert reduce_graph(model, lambda m: False) is model


@pytest.mark.parametrize(
    "op, zero, exact",
    [("Add", "-0.0", True), ("Add", "0.0", False), ("Sub", "0.0", True), ("Sub", "-0.0", False)],
)
def test_zero_neutral_keeps_the_sign_of_zero(op, zero, exact):
    """Found while adding -0.0 to the fuzzer (a targeted check; random graphs rarely put a
    Reciprocal after an Add of zero): x + 0.0 -> x turned -0.0 + 0.0 (= +0.0) into -0.0,
    and 1/x made -inf of +inf (likewise x - (-0.0)). Exact rules now remove only the zero that
    keeps x's sign (-0.0 for Add, +0.0 for Sub); the other is a reassoc rule."""
    import numpy as np

    from frontends.onnx import optimize_model
    from frontends.onnx.check import run

    model = _model(f"""
    g (float[4] x) => (float[4] y) <float[1] z = {{{zero}}}> {{
        a = {op} (x, z)
        y = Reciprocal (a)
    }}""")
    x = np.array([-0.0, 0.0, np.inf, np.nan], np.float32)
    want = run(model, {"x": x})[0]
    out, report = optimize_model(model, RULES)
    assert report.changed == exact
    np.testing.assert_array_equal(run(out, {"x": x})[0], want)  # NaN == NaN, -inf != inf
    _, loose = optimize_model(model, RULES, fp=("exact", "reassoc"))
    assert loose.changed and (exact or loose.fp == "reassoc")


def test_edge_values_reach_inputs_unless_an_op_is_undefined_on_them():
    """Float inputs get NaN, +-Inf and -0.0 (graphs with an even node count), except in a graph
    with a float -> integer Cast, whose result on them ONNX leaves undefined."""
    import numpy as np

    from frontends.onnx.check import random_inputs
    from verify.fuzz import edge_inputs

    plain = _model("g (float[16,16] x) => (float[16,16] y) { a = Neg (x) y = Abs (a) }")
    feeds = edge_inputs(plain, random_inputs(plain, 0), 0)
    x = feeds["x"]
    assert np.isnan(x).any() and np.isposinf(x).any() and np.isneginf(x).any()
    assert ((x == 0) & np.signbit(x)).any()
    assert np.isfinite(x).mean() > 0.5  # most values stay ordinary
    cast = _model("g (float[8,8] x) => (int64[8,8] y) { a = Neg (x) y = Cast <to = 7> (a) }")
    assert np.isfinite(edge_inputs(cast, random_inputs(cast, 0), 0)["x"]).all()


# a decomposed LayerNormalization over rows of equal values (a constant weight), then * -inf
_FLAT_ROWS = """
    g (float[2,3,1,2] x) => (float[2,1,1,1,9] y) <float[2,3] w = {-2.5,-2.5,-2.5,-2.5,-2.5,-2.5},
        float[3] b = {1.4142135,1.4142135,1.4142135}, float[3] s = {-inf,-0.13,0.64},
        int64[1] last = {-1}, float two = {2}, float eps = {1e-05}, int64[5] shape = {0,1,1,1,9}> {
        m = MatMul (x, w)
        a = Add (b, m)
        mean = ReduceMean (a, last)
        d = Sub (a, mean)
        sq = Pow (d, two)
        var = ReduceMean (sq, last)
        ve = Add (var, eps)
        sd = Sqrt (ve)
        n = Div (d, sd)
        ns = Mul (n, s)
        r = Reshape (ns, shape)
        y = Relu (r)
    }"""


def test_rounding_noise_of_an_ill_conditioned_original_is_not_a_mismatch():
    """Found by fuzzing (CI, Hypothesis 6.155.2): LayerNormalization fused (a reassoc rule)
    over rows of equal values. The original's `x - mean` is rounding noise (1e-7), divided by
    sqrt(eps) and multiplied by -inf and by finite scales: the fused kernel gives other noise,
    inf where the original gives 0 after Relu, and finite values 1.1e-4 apart where the output's
    scale is 1e-4. Neither model is more right. The graph is now checked as exact rules on its
    edge values plus every class on finite values, each allowing twice the original's own
    rounding error (its float32 output against float64)."""
    model = _model(_FLAT_ROWS)
    result = check_graph(model, RULES)
    assert result.changed and result.split and result.fp == "reassoc"
    assert "layernorm-div" in result.fired
    assert set(result.compared) == {"onnxruntime", "onnx.reference"}


def test_rounding_allowance_still_catches_a_wrong_result():
    """The allowance is the original's own rounding error, not a blank cheque: on a
    well-conditioned graph (its float32 output within 1e-5 of float64) a result 1% off is a
    mismatch under the reassoc tolerance. (On an output that is all rounding noise, any other
    noise of that size passes: such an output has no value to keep.)"""
    import numpy as np

    from frontends.onnx.check import random_inputs
    from verify.fuzz import OptimizerError, _compare, _ort, _rounding_noise

    def matmul(scale: float) -> onnx.ModelProto:
        w = ",".join(str(scale * (0.1 * ((i * 7) % 11) - 0.5)) for i in range(64))
        return _model(
            f"g (float[4,8] x) => (float[4,8] y) <float[8,8] w = {{{w}}}> {{ y = MatMul (x, w) }}"
        )

    good = matmul(1.0)
    feeds = random_inputs(good, 0)
    want = _ort(good, feeds)
    assert np.std(want[0]) > 0.1 and 0 < _rounding_noise(good, feeds, want)[0] < 1e-5
    _compare("onnxruntime", _ort, good, matmul(1.0), feeds, "reassoc")
    with pytest.raises(OptimizerError, match="differs"):
        _compare("onnxruntime", _ort, good, matmul(1.01), feeds, "reassoc")
