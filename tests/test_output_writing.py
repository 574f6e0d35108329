"""The memory-saving paths of `rewrite optimize`: the output written initializer by initializer
(`write_serialized`), the weight-free `structure` the CLI keeps of its input, and the checks
`load_model` makes of the weights it no longer hands to onnx.checker."""

import io
from dataclasses import replace

import ml_dtypes
import numpy as np
import onnx
import onnx.helper as oh
import onnx.parser
import pytest
from onnx import numpy_helper

from dsl import load_rules, shipped_rules_dir
from frontends.onnx import (
    ModelError,
    _fails_full_check,
    import_model,
    load_model,
    optimize_model,
    structure,
    write_serialized,
)
from frontends.onnx.check import run
from frontends.onnx.exporter import _write_tensor
from frontends.onnx.importer import ImportError_, constants_by_name

RULES = load_rules([shipped_rules_dir()])


def weighted_model() -> onnx.ModelProto:
    """y = Relu(Identity(x @ W + B) * 1) with metadata, a doc string and value_info: W float
    [32,32] is large (over the skeleton's 64 elements), B float[32] small."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    nodes = [
        oh.make_node("MatMul", ["x", "W"], ["m"]),
        oh.make_node("Add", ["m", "B"], ["a"]),
        oh.make_node("Identity", ["a"], ["i"]),
        oh.make_node("Mul", ["i", "one"], ["s"]),
        oh.make_node("Relu", ["s"], ["y"]),
    ]
    graph = oh.make_graph(
        nodes,
        "weighted",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 32])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 32])],
        [
            numpy_helper.from_array(w, "W"),
            numpy_helper.from_array(b, "B"),
            numpy_helper.from_array(np.float32(1.0), "one"),
        ],
        value_info=[oh.make_tensor_value_info("m", onnx.TensorProto.FLOAT, [2, 32])],
        doc_string="a graph",
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    model.metadata_props.add(key="k", value="v")
    return model


def test_write_serialized_parses_as_the_same_model():
    model = weighted_model()
    buf = io.BytesIO()
    write_serialized(model, buf)
    back = onnx.load_from_string(buf.getvalue())
    assert sorted(t.SerializeToString() for t in back.graph.initializer) == sorted(
        t.SerializeToString() for t in model.graph.initializer
    )
    for m in (back, model):
        m.graph.ClearField("initializer")
    assert back == model


def test_write_serialized_runs_in_onnxruntime_like_the_original():
    model = weighted_model()
    buf = io.BytesIO()
    write_serialized(model, buf)
    x = {"x": np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)}
    np.testing.assert_array_equal(run(buf.getvalue(), x)[0], run(model, x)[0])


def test_structure_keeps_names_types_and_shapes_without_values():
    model = weighted_model()
    s = structure(model)
    w = {t.name: t for t in s.graph.initializer}
    assert w["W"].dims == [32, 32] and w["W"].data_type == onnx.TensorProto.FLOAT
    assert not w["W"].raw_data and not w["W"].float_data
    assert w["B"] == model.graph.initializer[1]  # small: kept whole
    assert list(s.graph.node) == list(model.graph.node)


def test_optimize_on_a_structure_gives_the_same_model_with_its_weights():
    model = weighted_model()
    want, rep = optimize_model(model, RULES)
    graph = import_model(model)
    s = structure(model)
    got, rep2 = optimize_model(s, RULES, graph=replace(graph, meta=s))
    assert [n.op_type for n in got.graph.node] == [n.op_type for n in want.graph.node]
    assert rep2.nodes_after == rep.nodes_after
    assert {p.key for p in got.metadata_props} == {p.key for p in want.metadata_props}
    x = {"x": np.ones((2, 32), np.float32)}
    np.testing.assert_array_equal(run(got, x)[0], run(want, x)[0])


def test_optimize_on_a_structure_exports_even_when_nothing_changes():
    """A model the rules cannot improve: the result is exported from the imported graph, so
    it has its weights, not the structure's missing values."""
    w = np.random.default_rng(0).standard_normal((32, 32)).astype(np.float32)
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "W"], ["y"])],
        "plain",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 32])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 32])],
        [numpy_helper.from_array(w, "W")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    g = import_model(model)
    s = structure(model)
    got, _ = optimize_model(s, RULES, graph=replace(g, meta=s))
    np.testing.assert_array_equal(numpy_helper.to_array(got.graph.initializer[0]), w)


@pytest.mark.parametrize("opset", [17, 21])
def test_a_structure_converted_to_another_opset_takes_its_weights_from_the_arrays(opset):
    """Converted as a structure (no weight copied into the converted model), imported with
    the imported graph's arrays: the same model as converting the whole model."""
    model = weighted_model()
    want, _ = optimize_model(model, RULES, opset=opset)
    graph = import_model(model)
    s = structure(model)
    got, report = optimize_model(s, RULES, opset=opset, graph=replace(graph, meta=s))
    assert report.extra["opset"]["converted"] and got.opset_import == want.opset_import
    assert [n.op_type for n in got.graph.node] == [n.op_type for n in want.graph.node]
    weights = {t.name: numpy_helper.to_array(t) for t in got.graph.initializer}
    np.testing.assert_array_equal(weights["W"], numpy_helper.to_array(model.graph.initializer[0]))
    x = {"x": np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)}
    np.testing.assert_array_equal(run(got, x)[0], run(want, x)[0])


def test_a_structure_converted_with_an_aliased_weight_keeps_that_weight_whole():
    # two byte-identical weights of 100 elements (over the skeleton's 64, under the import's
    # sharing size): the import holds the second under the first's name, so the structure
    # keeps the second whole and the converted structure still imports (a wav2vec2 export's
    # mask constant failed there)
    v = np.random.default_rng(2).standard_normal(100).astype(np.float32)
    graph = oh.make_graph(
        [oh.make_node("Add", ["x", "A"], ["a"]), oh.make_node("Mul", ["a", "B"], ["y"])],
        "aliased",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 100])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 100])],
        [numpy_helper.from_array(v, "A"), numpy_helper.from_array(v.copy(), "B")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)
    g = import_model(model)
    held = constants_by_name(g)
    assert set(held) == {"A"}  # B is an alias of A
    s = structure(model, held)
    kept = {t.name: bool(t.raw_data) for t in s.graph.initializer}
    assert kept == {"A": False, "B": True}
    got, _ = optimize_model(s, RULES, opset=21, graph=replace(g, meta=s))
    x = {"x": np.random.default_rng(3).standard_normal((2, 100)).astype(np.float32)}
    np.testing.assert_allclose(run(got, x)[0], (x["x"] + v) * v, rtol=1e-6)
    with pytest.raises(ImportError_, match="'B': no values, and not in arrays"):
        import_model(structure(model), arrays={"A": v})


def test_import_takes_arrays_only_for_weights_held_without_values():
    model = weighted_model()
    s = structure(model)
    w = np.full((32, 32), 2.0, np.float32)
    g = import_model(s, arrays={"W": w, "B": np.zeros(32, np.float32)})
    by_name = {g.values[v].name: a for v, a in g.constants.items()}
    assert by_name["W"] is w  # a stub: the array, not a copy
    np.testing.assert_array_equal(by_name["B"], numpy_helper.to_array(model.graph.initializer[1]))


def _shorten(w: onnx.TensorProto) -> None:
    w.raw_data = w.raw_data[:-4]


@pytest.mark.parametrize(
    "spoil, message",
    [
        (_shorten, "rejected by onnx.checker: initializer W: raw_data"),
        (lambda w: w.float_data.append(1.0), "one and only one value field"),  # two fields
        (lambda w: w.ClearField("raw_data"), "one and only one value field"),  # none
    ],
    ids=["wrong-size", "two-value-fields", "no-value-field"],
)
def test_load_rejects_weights_with_bad_value_fields(tmp_path, spoil, message):
    model = weighted_model()
    spoil(model.graph.initializer[0])
    p = tmp_path / "m.onnx"
    onnx.save(model, str(p))
    with pytest.raises(ModelError, match=message):
        load_model(p)


def test_load_takes_weights_in_a_typed_field(tmp_path):
    model = weighted_model()
    w = numpy_helper.to_array(model.graph.initializer[0])
    model.graph.initializer[0].ClearField("raw_data")
    model.graph.initializer[0].float_data.extend(w.reshape(-1).tolist())
    p = tmp_path / "m.onnx"
    onnx.save(model, str(p))
    np.testing.assert_array_equal(numpy_helper.to_array(load_model(p).graph.initializer[0]), w)


@pytest.mark.parametrize("dtype", ["int4", "uint4", "float4_e2m1fn"])
@pytest.mark.parametrize("shape", [(6, 4), (3, 5), (7,), (), (0,)])
def test_four_bit_weights_are_packed_as_numpy_helper_packs_them(dtype, shape):
    kind = getattr(ml_dtypes, dtype)
    rng = np.random.default_rng(0)
    levels = {"int4": (-8, 8), "uint4": (0, 16)}.get(dtype)
    if levels:
        arr = rng.integers(*levels, shape).astype(kind)
    else:
        arr = rng.choice([0.0, 0.5, -1.0, 1.5, 6.0, -6.0], shape).astype(kind)
    for a in (arr, arr.T):  # a transposed weight is a view, not contiguous
        t = onnx.TensorProto()
        _write_tensor(t, a, "w")
        assert t == numpy_helper.from_array(a, "w")
        assert numpy_helper.to_array(t).tobytes() == np.ascontiguousarray(a).tobytes()


def test_an_input_that_fails_the_full_check_is_named_as_the_cause():
    """A result failing onnx's full check (strict shape inference) was "optimization failed"
    even where the input fails it the same way (an ONNX function body of the onnx package's
    node tests); the input is named then, and a valid input leaves the result's error."""
    bad = onnx.parser.parse_model(
        """
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[3, 4] x) => (float[3, 4] y) <float[5, 7] r> {
            r = Relu (x)
            y = Relu (r)
        }"""
    )
    onnx.checker.check_model(bad)  # what load_model checks: passes
    with pytest.raises(ModelError, match="the input fails onnx.checker's full check: "):
        _fails_full_check(bad, ValueError("the result's"))
    good = onnx.parser.parse_model(
        """
        <ir_version: 9, opset_import: ["" : 17]>
        g (float[3, 4] x) => (float[3, 4] y) {
            y = Relu (x)
        }"""
    )
    assert _fails_full_check(good, ValueError("the result's")) is None


def test_a_loaded_model_keeps_its_weights_when_the_file_changes(tmp_path):
    """`load_model` parses a memory map of the file (`_read_proto`): the model it returns is
    the one `onnx.load` reads, and holds its own bytes, so a file overwritten or removed after
    loading (OUT = IN) changes nothing of it. Text formats are read by `onnx.load`."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2, 32])
    graph = oh.make_graph(
        [oh.make_node("MatMul", ["x", "w"], ["y"])],
        "g",
        [x],
        [y],
        [numpy_helper.from_array(w, "w")],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=9)
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    loaded = load_model(path)
    assert loaded == onnx.load(str(path))
    with open(path, "r+b") as f:  # every byte of the file changed in place, then removed
        data = f.read()
        f.seek(0)
        f.write(bytes(b ^ 0xFF for b in data))
    path.unlink()
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), w)
    text = tmp_path / "m.textproto"
    onnx.save(model, text, format="textproto")
    assert load_model(text) == loaded
