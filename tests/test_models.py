"""Model-level tests: real architectures (transformers configs, random weights) exported by both
of torch's ONNX exporters, optimized with the shipped library.

Rules of numeric classes exact and reassoc run (BatchNorm folding is reassoc). For each:
onnx.checker passes, outputs match the input model under onnxruntime on random
inputs, the node count never goes up, and it goes down where the library has rules for the
model (BatchNorm folding on ResNet, attention scales folded into weights, constant and shape
subgraphs on the TorchScript-exported transformers).
"""

import functools
import sys
from pathlib import Path

import onnx
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

pytestmark = pytest.mark.slow

CASES = [
    ("resnet", "dynamo"),
    ("resnet", "torchscript"),
    ("bert", "dynamo"),
    ("bert", "torchscript"),
    ("gpt2", "dynamo"),
    ("gpt2", "torchscript"),
    ("vit", "dynamo"),
    ("vit", "torchscript"),
]
MUST_SHRINK = set(CASES)


@functools.cache
def _optimized(name: str, exporter: str):
    import make_models

    from dsl import load_rules, shipped_rules_dir
    from frontends.onnx import optimize_model

    model = getattr(make_models, name)(None, exporter=exporter)
    result, report = optimize_model(
        model, load_rules([shipped_rules_dir()]), fp=("exact", "reassoc")
    )
    return name, exporter, model, result, report


@pytest.fixture(params=CASES, ids=[f"{m}-{e}" for m, e in CASES])
def optimized(request):
    return _optimized(*request.param)


def test_checker_passes(optimized):
    *_, result, _ = optimized
    onnx.checker.check_model(result, full_check=True)


def test_outputs_match(optimized):
    from frontends.onnx import compare

    _, _, model, result, report = optimized
    diffs = compare(model, result, runs=2, fp=report.fp)
    assert [d.name for d in diffs] == [o.name for o in model.graph.output]
    bad = [d for d in diffs if not d.ok]
    assert not bad, f"outputs differ: {bad}"


def test_interface_unchanged(optimized):
    _, _, model, result, _ = optimized
    assert [i.name for i in result.graph.input] == [i.name for i in model.graph.input]
    assert [o.SerializeToString() for o in result.graph.output] == [
        o.SerializeToString() for o in model.graph.output
    ]
    assert result.ir_version <= 13 and result.opset_import[0].version <= 26


def test_node_count(optimized):
    name, exporter, model, result, report = optimized
    before, after = len(model.graph.node), len(result.graph.node)
    assert report.stop_reason == "saturated"
    assert after <= before
    if (name, exporter) in MUST_SHRINK:
        assert after < before, f"{name}/{exporter}: {before} -> {after} nodes"


@pytest.mark.parametrize("exporter", ["dynamo", "torchscript"])
def test_resnet_batchnorm_folded(exporter):
    _, _, model, result, report = _optimized("resnet", exporter)
    assert sum(n.op_type == "BatchNormalization" for n in model.graph.node) == 6
    assert not any(n.op_type == "BatchNormalization" for n in result.graph.node)
    assert sum(n.op_type == "Conv" for n in result.graph.node) == 6
    assert (
        report.fired.get("fold-batchnorm-into-conv", 0)
        + report.fired.get("fold-batchnorm-into-conv-alt1", 0)
        >= 6
    )


def test_second_pass_changes_nothing(optimized):
    """Optimizing an optimized model finds nothing cheaper: the same object comes back."""
    from dsl import load_rules, shipped_rules_dir
    from frontends.onnx import optimize_model

    *_, result, _ = optimized
    again, report = optimize_model(
        result, load_rules([shipped_rules_dir()]), fp=("exact", "reassoc")
    )
    assert not report.changed and again is result, f"second pass: {report.fired}"
