"""Provenance: the rules (name, file:line, original nodes) behind each rewritten node, from the
firings saturation recorded, on ONNX metadata, fx meta, the report and `rewrite explain`."""

import json
import re
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import rewrite
from dsl import load_rules, shipped_rules_dir
from engine.provenance import KEY, describe
from frontends.onnx import optimize_model
from frontends.onnx.explain import find_provenance
from rewrite.cli import main

ROOT = Path(__file__).resolve().parent.parent
AT = re.compile(r"patterns/\w+/\w+\.rules:\d+")
# Transpose(Relu(Transpose x)): transpose-through-relu moves the outer Transpose inside, then
# transpose-transpose merges the two; Sigmoid w is left as it is
CHAIN = """<ir_version: {ir}, opset_import: ["" : 18]>
g (float[2,3,4] x) => (float[4,2,3] y, float[2,3,4] w) {{
    a = Transpose<perm=[0,2,1]>(x)  b = Relu(a)  y = Transpose<perm=[1,0,2]>(b)
    w = Sigmoid(x) }}"""


@pytest.fixture(scope="module")
def rules():
    return load_rules([shipped_rules_dir()])


def _meta(proto) -> dict | None:
    return next((json.loads(p.value) for p in proto.metadata_props if p.key == KEY), None)


def test_chain_of_two_rules_in_node_metadata(rules):
    model = onnx.parser.parse_model(CHAIN.format(ir=10))
    out, report = optimize_model(model, rules)
    node = next(n for n in out.graph.node if n.op_type == "Transpose")
    tree = _meta(node)
    assert tree["rule"] == "transpose-transpose" and AT.fullmatch(tree["at"])
    assert tree["replaces"] == ["a"] and tree["op"] == "Transpose"
    (first,) = tree["after"]  # fired before transpose-transpose, which matched its result
    assert first["rule"] == "transpose-through-relu" and AT.fullmatch(first["at"])
    assert first["replaces"] == ["b", "y"] and first["after"] == []
    assert report.provenance[node.name] == tree
    onnx.checker.check_model(out, full_check=True)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    got = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, np.maximum(x, 0).transpose(2, 0, 1))


def test_no_provenance_gives_a_bare_model(rules):
    out, report = optimize_model(
        onnx.parser.parse_model(CHAIN.format(ir=10)), rules, provenance=False
    )
    assert report.changed and report.provenance == {}
    assert not any(p.key == KEY for n in out.graph.node for p in n.metadata_props)
    assert not any(p.key == KEY for p in out.metadata_props)


def test_old_ir_version_keeps_provenance_at_model_level(rules):
    """NodeProto.metadata_props exists from IR 10 on: an IR 8 model gets one model-level entry."""
    out, report = optimize_model(onnx.parser.parse_model(CHAIN.format(ir=8)), rules)
    assert out.ir_version == 8 and not any(n.metadata_props for n in out.graph.node)
    trees = json.loads(next(p.value for p in out.metadata_props if p.key == KEY))
    assert trees == report.provenance and any(
        t["rule"] == "transpose-transpose" for t in trees.values()
    )
    onnx.checker.check_model(out, full_check=True)
    ort.InferenceSession(out.SerializeToString())


def test_constant_folding_names_what_it_folded(rules):
    """BatchNorm folded into Conv: the new weight is a folded constant whose tree names the
    rule that built its expression."""
    model = onnx.load(str(ROOT / "examples" / "resnet.onnx"))
    out, report = optimize_model(model, rules, fp=("exact", "reassoc"))
    folded = {t.name: _meta(t) for t in out.graph.initializer if _meta(t)}
    assert folded
    tree = next(iter(folded.values()))
    assert tree["rule"] == "fold:Mul" and tree["at"] == "engine/fold.py"
    assert {t["rule"] for t in tree["after"]} == {"fold-batchnorm-into-conv-alt1"}
    conv = next(n for n in out.graph.node if n.op_type == "Conv" and _meta(n))
    assert any(r.startswith("node_conv2d") for r in _meta(conv)["replaces"])
    onnx.checker.check_model(out, full_check=True)


@pytest.fixture(scope="module")
def chain_files(tmp_path_factory, rules):
    d = tmp_path_factory.mktemp("explain")
    onnx.save(onnx.parser.parse_model(CHAIN.format(ir=10)), str(d / "in.onnx"))
    assert main(["optimize", str(d / "in.onnx"), str(d / "out.onnx"), "--no-check"]) == 0
    assert (
        main(
            ["optimize", str(d / "in.onnx"), str(d / "bare.onnx"), "--no-check", "--no-provenance"]
        )
        == 0
    )
    return d


def test_explain_says_what_each_rule_did(chain_files, capsys):
    node = next(
        n for n in onnx.load(str(chain_files / "out.onnx")).graph.node if n.op_type == "Transpose"
    )
    capsys.readouterr()
    assert main(["explain", str(chain_files / "out.onnx"), node.name]) == 0
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if "rules:" in ln]
    assert "transpose-transpose" in lines[0] and "transpose-through-relu" in lines[1]
    assert f"transpose-transpose: replaced Transpose a with Transpose {node.name} (" in lines[0]
    assert lines[1].startswith(
        "    transpose-through-relu: replaced Relu b, Transpose y with an intermediate Transpose"
    )


@pytest.mark.parametrize(
    "file, node, code, message",
    [
        ("out.onnx", "w", 0, "original node"),  # an output name works too
        ("out.onnx", "nope", 1, "no node, output or initializer named 'nope'"),
        ("missing.onnx", "y", 1, "no such file"),
        ("bare.onnx", "y", 1, "no provenance in this model"),
        # (it may be a file optimize wrote unchanged: it says so)
        ("bare.onnx", "y", 1, "or as its input unchanged (no rewrite made it cheaper)"),
    ],
    ids=["original-node", "unknown-node", "missing-file", "no-provenance", "maybe-unchanged"],
)
def test_explain_answers_in_one_line(chain_files, capsys, file, node, code, message):
    capsys.readouterr()
    assert main(["explain", str(chain_files / file), node]) == code
    captured = capsys.readouterr()
    text = captured.out if code == 0 else captured.err
    assert message in text and len(text.strip().splitlines()) == 1


def test_fx_nodes_carry_provenance(rules):
    torch = pytest.importorskip("torch")
    from frontends.fx import optimize_fx

    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x.transpose(1, 2)).permute(1, 0, 2)

    gm = torch.fx.symbolic_trace(M())
    out, _ = optimize_fx(gm, (torch.randn(2, 3, 4),), rules)
    trees = [n.meta["rewrite"] for n in out.graph.nodes if "rewrite" in n.meta]
    assert any(
        t["rule"] == "transpose-transpose" and t["after"][0]["rule"] == "transpose-through-relu"
        for t in trees
    )
    bare, _ = optimize_fx(gm, (torch.randn(2, 3, 4),), rules, provenance=False)
    assert not any("rewrite" in n.meta for n in bare.graph.nodes)


def _shape_chain_model() -> onnx.ModelProto:
    """x[N,8,4]: Reshape(x, Concat(Unsqueeze(Gather(Shape x, 0)), [-1])) @ Neg(Transpose(
    Transpose w)), and k = Slice(Shape x, 1, 3) * 2 as a second output."""
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    def const(name, v):
        return h.make_node("Constant", [], [name], name=f"c_{name}", value=nh.from_array(v))

    inits = [
        nh.from_array(np.array([0], np.int64), "ax"),
        nh.from_array(np.array([1], np.int64), "st"),
        nh.from_array(np.array([3], np.int64), "en"),
        nh.from_array(np.array([2], np.int64), "two"),
        nh.from_array(np.arange(160, dtype=np.float32).reshape(32, 5) / 100, "w"),
    ]
    nodes = [
        h.make_node("Shape", ["x"], ["s"], name="shape"),
        const("i0", np.array(0, np.int64)),
        h.make_node("Gather", ["s", "i0"], ["d0"], name="gather", axis=0),
        h.make_node("Unsqueeze", ["d0", "ax"], ["u0"], name="unsq"),
        const("m1", np.array([-1], np.int64)),
        h.make_node("Concat", ["u0", "m1"], ["t"], name="concat", axis=0),
        h.make_node("Reshape", ["x", "t"], ["r"], name="reshape"),
        h.make_node("Transpose", ["w"], ["wt"], name="wt", perm=[1, 0]),
        h.make_node("Transpose", ["wt"], ["wtt"], name="wtt", perm=[1, 0]),
        h.make_node("Neg", ["wtt"], ["wn"], name="neg"),
        h.make_node("MatMul", ["r", "wn"], ["y"], name="mm"),
        h.make_node("Shape", ["x"], ["s2"], name="shape2"),
        h.make_node("Slice", ["s2", "st", "en"], ["b"], name="slice"),
        h.make_node("Mul", ["b", "two"], ["k"], name="mul"),
    ]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", T.FLOAT, ["N", 8, 4])],
        [
            h.make_tensor_value_info("y", T.FLOAT, ["N", 5]),
            h.make_tensor_value_info("k", T.INT64, [2]),
        ],
        inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 18)], ir_version=10)


def _changed(before: onnx.ModelProto, after: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """Names of the nodes of `after` that no node of `before` equals (op, inputs, outputs,
    attributes), and of its initializers `before` does not have."""

    def key(n):
        return (n.op_type, tuple(n.input), tuple(n.output), tuple(map(str, n.attribute)))

    old = {key(n) for n in before.graph.node}
    inits = {t.name for t in before.graph.initializer}
    nodes = [n.name for n in after.graph.node if key(n) not in old]
    return nodes, [t.name for t in after.graph.initializer if t.name not in inits]


def _explained(path: Path, names: list[str], capsys) -> dict[str, str]:
    """`rewrite explain` on all names in one call: name -> its printed tree (asserting exit 0
    and that no name is reported as an original node)."""
    capsys.readouterr()
    assert main(["explain", str(path), *names]) == 0, names
    text = capsys.readouterr().out
    # each name's tree starts at an unindented "WHAT: ..." line, in the order given
    blocks = [b for b in text.splitlines(keepends=True)]
    out, current = {}, None
    heads = iter(names)
    for line in blocks:
        if not line.startswith(" "):
            current = next(heads)
            out[current] = ""
        out[current] += line
    assert list(out) == list(names)
    for name, tree in out.items():
        assert "not produced by a rewrite" not in tree, (name, tree)
    return out


def test_shape_and_constant_folding_are_explained(tmp_path, capsys):
    model = _shape_chain_model()
    onnx.save(model, str(tmp_path / "in.onnx"))
    assert main(["optimize", str(tmp_path / "in.onnx"), str(tmp_path / "out.onnx")]) == 0
    out = onnx.load(str(tmp_path / "out.onnx"))
    assert [n.op_type for n in out.graph.node] == ["Reshape", "MatMul"]
    nodes, inits = _changed(model, out)
    assert nodes == ["reshape"] and sorted(inits) == ["k", "r_shape", "wn"]
    chain = ["shape", "gather", "unsq", "concat"]
    trees = {t.name: _meta(t) for t in out.graph.initializer}
    assert trees["r_shape"] == {
        "rule": "fold:Concat",
        "at": "engine/shapes.py",
        "op": "Concat",
        "replaces": chain,
        "after": [],
    }
    reshape = _meta(out.graph.node[0])
    assert reshape["rule"] == "fold:Concat" and reshape["replaces"] == chain
    assert trees["k"]["rule"] == "fold:Mul" and trees["k"]["replaces"] == ["shape2", "slice", "mul"]
    assert trees["wn"]["rule"] == "fold:Neg" and trees["wn"]["at"] == "engine/fold.py"
    assert trees["wn"]["replaces"] == ["neg"]
    assert "transpose-transpose" in json.dumps(trees["wn"]["after"])  # wt, wtt: gone before
    # every node and every new initializer, by node name and by output name
    texts = _explained(tmp_path / "out.onnx", [*nodes, "r", *inits], capsys)
    assert (
        "fold:Concat: folded shape, gather, unsq, concat into Reshape reshape (engine/shapes.py)"
        in texts["r"]
    )
    assert "fold:Mul: folded shape2, slice, mul into constant k (engine/shapes.py)" in texts["k"]
    x = np.random.default_rng(0).standard_normal((3, 8, 4)).astype(np.float32)
    sess = ort.InferenceSession(out.SerializeToString())
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    for got, ref in zip(sess.run(None, {"x": x}), want):
        np.testing.assert_allclose(got, ref, rtol=1e-6)


def test_no_provenance_drops_the_fold_trees_too(tmp_path):
    onnx.save(_shape_chain_model(), str(tmp_path / "in.onnx"))
    args = ["optimize", str(tmp_path / "in.onnx"), str(tmp_path / "o.onnx"), "--no-provenance"]
    assert main(args) == 0
    out = onnx.load(str(tmp_path / "o.onnx"))
    assert not any(
        p.key == KEY for x in (*out.graph.node, *out.graph.initializer) for p in x.metadata_props
    )


def _efficientnet(full: bool) -> onnx.ModelProto:
    """transformers' EfficientNet (random weights), exported by the TorchScript exporter with a
    dynamic batch: B0 when `full`, else a narrow, shallow one of the same blocks (depthwise
    convolutions with padding computed by Shape/Slice chains, squeeze-excite, Identity weights)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import io
    import warnings

    torch.manual_seed(0)
    side = 224 if full else 32
    cfg = (
        transformers.EfficientNetConfig()
        if full
        else transformers.EfficientNetConfig(
            image_size=side, width_coefficient=0.25, depth_coefficient=0.2, hidden_dim=320
        )
    )
    net = transformers.EfficientNetModel(cfg).eval()

    class Wrapped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, pixel_values):
            out = self.net(pixel_values=pixel_values)
            return out.last_hidden_state, out.pooler_output

    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Wrapped(),
            (torch.randn(1, 3, side, side),),
            f,
            dynamo=False,
            opset_version=17,
            input_names=["pixel_values"],
            output_names=["last_hidden_state", "pooler_output"],
            dynamic_axes={
                n: {0: "batch"} for n in ("pixel_values", "last_hidden_state", "pooler_output")
            },
        )
    model = onnx.load_from_string(f.getvalue())
    model.ir_version = 10
    return model


def _every_change_explained(model, tmp_path, capsys):
    onnx.save(model, str(tmp_path / "in.onnx"))
    assert main(["optimize", str(tmp_path / "in.onnx"), str(tmp_path / "out.onnx")]) == 0
    out = onnx.load(str(tmp_path / "out.onnx"))
    nodes, inits = _changed(model, out)
    assert nodes and inits  # the folding did something to explain
    texts = _explained(tmp_path / "out.onnx", [*nodes, *inits], capsys)
    assert any("fold:" in t for t in texts.values())
    # the model-level view agrees: every changed name has a tree in the metadata
    has = {x.name for x in (*out.graph.node, *out.graph.initializer) if _meta(x)}
    assert set(nodes) | set(inits) <= has


def test_efficientnet_like_every_changed_node_is_explained(tmp_path, capsys):
    _every_change_explained(_efficientnet(full=False), tmp_path, capsys)


@pytest.mark.slow
def test_efficientnet_b0_every_changed_node_is_explained(tmp_path, capsys):
    _every_change_explained(_efficientnet(full=True), tmp_path, capsys)


@pytest.mark.parametrize("value", ["not json", '"a string"', "[1, 2]", '{"rule": 3}'])
def test_rewrite_rules_metadata_that_is_not_a_tree_is_left_out(value):
    """A node whose `rewrite.rules` metadata another tool wrote, or a hand edit: the import
    now reads earlier trees, and invalid JSON aborted the optimization, a JSON string broke
    `describe` (the review's finding). It is left out; the node is read as an original one."""
    node = helper.make_node("Relu", ["x"], ["r"], name="relu")
    entry = node.metadata_props.add()
    entry.key, entry.value = KEY, value
    graph = helper.make_graph(
        [node, helper.make_node("Relu", ["r"], ["y"], name="relu2")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    out, report = rewrite.optimize_model(model)
    assert report.fired
    for n in out.graph.node:
        what, tree = find_provenance(out, n.name)
        assert tree is None or describe(n.name, n.op_type, tree)
