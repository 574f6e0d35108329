"""List captures (`@xs...`): checking, the rules the engine runs, the list guards, and the
rules of patterns/cleanup/concat.rules applied to ONNX models."""

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import dsl
from dsl.lists import concrete, engine_rules, max_items
from frontends.onnx import optimize_model
from verify.runner import verify_rules

LIBRARY = dsl.load_rules([dsl.shipped_rules_dir()])


def _rules(text: str):
    return dsl.check(dsl.parse(text, file="t.rules"))


FLATTEN = """
(simplify concat-flatten
  (Concat @xs... (Concat @ys... :axis @a) @zs... :axis @a)
  (Concat @xs... @ys... @zs... :axis @a))
"""


def test_a_list_rule_runs_as_one_rule_per_position_of_the_inner_concat():
    (rule,) = _rules(FLATTEN)
    assert rule.lists == ("xs", "ys", "zs") and rule.needs_host
    runs = engine_rules(rule)
    # xs is followed by the inner Concat: one rule per count 0..7; ys and zs are open
    assert [r.instance for r in runs] == [f"xs={n}" for n in range(8)]
    assert all(r.name == "concat-flatten" for r in runs)
    assert len({r.instance for r in runs}) == 8
    assert max_items(rule) == {"xs": 7, "ys": 8, "zs": 7}


def test_the_graph_caps_the_counts_the_engine_compiles():
    (rule,) = _rules(FLATTEN)
    # a graph whose Concats have at most 3 inputs: counts 0 to 3 for xs, not 0 to 8
    assert [r.instance for r in engine_rules(rule, {"Concat": 3})] == [f"xs={n}" for n in range(4)]
    assert len(engine_rules(rule, {"Relu": 1})) == 8  # other ops do not cap Concat's


def test_concrete_rules_write_every_item_and_refuse_what_does_not_fit():
    (rule,) = _rules(FLATTEN)
    c = concrete(rule, {"xs": 1, "ys": 2, "zs": 0})
    assert dict(c.items) == {"xs": ("xs.0",), "ys": ("ys.0", "ys.1"), "zs": ()}
    assert [a for a in c.rhs.args if not isinstance(a, dsl.ir.Absent)] == [
        dsl.ir.Capture("xs.0"),
        dsl.ir.Capture("ys.0"),
        dsl.ir.Capture("ys.1"),
    ]
    assert concrete(rule, {"xs": 4, "ys": 4, "zs": 3}) is None  # 11 inputs: more than 8 slots
    assert concrete(rule, {"xs": 0, "ys": 0, "zs": 0}) is None  # a Concat of no input


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "(simplify a (Concat @xs... :axis 0) @xs)",
            "@xs is bound to a list of terms (@xs...)",
        ),
        ("(simplify a (Relu @xs...) @xs)", "binds a run of inputs, but Relu has no variadic"),
        ("(simplify a (Concat (Relu @xs...) :axis 0) _)", "Relu has no variadic input"),
        ("(simplify a (Concat @x :axis 0) (Concat @x... :axis 0))", "@x is bound to a term"),
        ("(simplify a (Concat @xs... @xs... :axis 0) (Concat @xs... :axis 0))", "bound twice"),
        ("(equal a (Concat @xs... :axis 0) (Concat @xs... :axis 0))", "equal rule"),
        ("(simplify a (Concat @xs... :axis 0) (if (is-constant @xs...)) _)", "must be a term"),
        ("(simplify a (Concat @x :axis 0) (if (length @x 1)) @x)", "must be a list capture"),
    ],
)
def test_misused_list_captures_are_located_errors(text, message):
    with pytest.raises(dsl.RulesError) as info:
        _rules(text)
    assert message in str(info.value)
    assert str(info.value).startswith("t.rules:1:")


def _model(nodes, inputs, output, shape, inits=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(output, TensorProto.FLOAT, shape)],
        initializer=list(inits),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _feeds(model, seed=0):
    rng = np.random.default_rng(seed)
    return {
        i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for i in model.graph.input
    }


def _run(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _same(model, optimized):
    feeds = _feeds(model)
    (want,) = _run(model, feeds)
    (got,) = _run(optimized, feeds)
    assert np.ptp(want) > 0.1  # not a degenerate output
    np.testing.assert_array_equal(got, want)


def _ops(model):
    return [n.op_type for n in model.graph.node]


def test_nested_concats_become_one():
    names = [f"x{i}" for i in range(5)]
    nodes = [
        helper.make_node("Concat", ["x1", "x2"], ["c1"], axis=1),
        helper.make_node("Concat", ["c1", "x3"], ["c2"], axis=1),
        helper.make_node("Concat", ["x0", "c2", "x4"], ["y"], axis=1),
    ]
    model = _model(nodes, [(n, (2, i + 1)) for i, n in enumerate(names)], "y", (2, 15))
    out, report = optimize_model(model, LIBRARY)
    assert _ops(out) == ["Concat"]
    assert list(out.graph.node[0].input) == names
    assert report.fired["concat-flatten"] >= 2
    _same(model, out)


def test_a_flattening_that_would_exceed_the_slots_is_not_built():
    inner = [f"a{i}" for i in range(5)]
    outer = [f"b{i}" for i in range(4)]
    nodes = [
        helper.make_node("Concat", inner, ["c"], axis=0),
        helper.make_node("Concat", [outer[0], "c", *outer[1:]], ["y"], axis=0),
    ]
    model = _model(nodes, [(n, (3,)) for n in inner + outer], "y", (27,))
    out, report = optimize_model(model, LIBRARY)
    assert _ops(out) == ["Concat", "Concat"]  # 9 inputs do not fit a matchable Concat
    assert "concat-flatten" not in report.fired
    _same(model, out)


def _ints(name, v):
    return numpy_helper.from_array(np.array(v, np.int64), name)


def test_slices_of_one_tensor_that_meet_become_one_slice():
    inits = [_ints("s", [1]), _ints("m", [3]), _ints("e", [6]), _ints("ax", [1]), _ints("st", [1])]
    nodes = [
        helper.make_node("Slice", ["x", "s", "m", "ax", "st"], ["p"]),
        helper.make_node("Slice", ["x", "m", "e", "ax", "st"], ["q"]),
        helper.make_node("Concat", ["z", "p", "q"], ["y"], axis=1),
    ]
    model = _model(nodes, [("x", (2, 8)), ("z", (2, 2))], "y", (2, 7), inits)
    out, report = optimize_model(model, LIBRARY)
    assert sorted(_ops(out)) == ["Concat", "Slice"]
    assert report.fired["concat-adjacent-slices"] == 1
    _same(model, out)


def test_a_slice_that_takes_one_part_of_a_concat_is_that_part():
    inits = [_ints("s", [3]), _ints("e", [7]), _ints("ax", [-1]), _ints("st", [1])]
    nodes = [
        helper.make_node("Concat", ["a", "b", "c"], ["cat"], axis=1),
        helper.make_node("Slice", ["cat", "s", "e", "ax", "st"], ["sl"]),
        helper.make_node("Relu", ["sl"], ["y"]),
    ]
    model = _model(nodes, [("a", (2, 3)), ("b", (2, 4)), ("c", (2, 5))], "y", (2, 4), inits)
    out, report = optimize_model(model, LIBRARY)
    assert _ops(out) == ["Relu"] and list(out.graph.node[0].input) == ["b"]
    assert report.fired["slice-concat-part"] == 1
    _same(model, out)


def test_shipped_list_rules_verify():
    rules = dsl.load_rules([dsl.shipped_rules_dir() / "cleanup" / "concat.rules"])
    results = verify_rules(rules, examples=30)
    assert [r.status for r in results] == ["pass"] * len(rules.rules)
    assert all(r.examples >= 30 for r in results)


def test_a_capture_a_result_needs_does_not_bind_an_absent_variadic_input():
    """A pattern names the inputs of the application it matches: (Mean @a @b) matched a
    one-input Mean with @b the absent second slot, so `-> @b` made the Mean equal to `Absent`
    (optimize crashed: 'NoneType' object has no attribute 'attrs'), and (Sum @a @b) -> (Add @a
    @b) fired on a one-input Sum (an Add of one input, extracted were it cheaper)."""
    text = (
        "(simplify mean-second (Mean @a @b) @b) (simplify sum-two-as-add (Sum @a @b) (Add @a @b))"
    )
    rules = dsl.RuleSet(tuple(_rules(text)), ("t.rules",))
    for op in ("Mean", "Sum"):
        nodes = [helper.make_node(op, ["x0"], ["m"]), helper.make_node("Relu", ["m"], ["y"])]
        model = _model(nodes, [("x0", (2, 3))], "y", (2, 3))
        out, report = optimize_model(model, rules)
        assert _ops(out) == [op, "Relu"] and not report.fired
    # with two inputs both fire; a capture passed on in an optional slot still takes an
    # absent input (pad-into-conv's Conv with or without a bias)
    nodes = [helper.make_node("Sum", ["x0", "x1"], ["y"])]
    model = _model(nodes, [("x0", (2, 3)), ("x1", (2, 3))], "y", (2, 3))
    out, report = optimize_model(model, rules)
    assert report.fired["sum-two-as-add"] == 1  # (not cheaper than the Sum: not extracted)
    _same(model, out)
    # a capture a result passes on in an optional slot only still takes an absent input: Max's
    # second input is optional, so (Sum @a @b) -> (Max @a @b) fires on a one-input Sum
    text = "(simplify sum-as-max-sketch (Sum @a @b) (Max @a @b))"
    one = _model([helper.make_node("Sum", ["x0"], ["y"])], [("x0", (2, 3))], "y", (2, 3))
    _, report = optimize_model(one, dsl.RuleSet(tuple(_rules(text)), ("t.rules",)))
    assert report.fired["sum-as-max-sketch"] == 1
