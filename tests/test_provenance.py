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

from dsl import load_rules, shipped_rules_dir
from frontends.onnx import optimize_model
from rewrite.cli import main
from rewrite.provenance import KEY

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
    assert tree["rule"] == "constant-folding" and tree["at"] == "rewrite/fold.py"
    assert {t["rule"] for t in tree["after"]} == {"fold-batchnorm-into-conv-bias"}
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
    ],
    ids=["original-node", "unknown-node", "missing-file", "no-provenance"],
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
