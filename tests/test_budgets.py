"""Budgets: `--timeout` and `--max-nodes` bound the whole run, on a graph built to grow without
bound (associativity and commutativity of Add on a 12-term sum multiply the e-nodes by ~10 per
iteration). When a budget runs out the best graph so far (or the input) comes back, valid, and
the report names the stage."""

import json
import subprocess
import sys
import time
from pathlib import Path

import onnx
import onnx.helper as oh
import pytest

from dsl import load_rules
from engine.saturate import Limits
from frontends.onnx import compare, optimize_model

ROOT = Path(__file__).resolve().parent.parent
GROW = ROOT / "tests" / "data" / "grow.rules"
FP = ("exact", "reassoc")


def long_sum(n: int = 12) -> onnx.ModelProto:
    """Relu(x0 + x1 + ... + x{n-1}), summed left to right, every x float[4]."""
    xs = [oh.make_tensor_value_info(f"x{i}", onnx.TensorProto.FLOAT, [4]) for i in range(n)]
    nodes, prev = [], "x0"
    for i in range(1, n):
        nodes.append(oh.make_node("Add", [prev, f"x{i}"], [f"s{i}"]))
        prev = f"s{i}"
    nodes.append(oh.make_node("Relu", [prev], ["y"]))
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])
    graph = oh.make_graph(nodes, "long_sum", xs, [y])
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


@pytest.fixture(scope="module")
def grow():
    return load_rules([GROW])


def _valid(model, result, report):
    onnx.checker.check_model(result, full_check=True)
    assert all(d.ok for d in compare(model, result, fp=report.fp))


def test_timeout_stops_saturation(grow):
    """No iteration starts after the deadline, nor one that, growing as the last one did,
    would end after it with its extraction; the e-graph so far is extracted. The rule is
    checked on the times the engine saw at each check (`extra["budget"]`), not on this test's
    clock: how long the stages take is for `bench/`, and depends on the machine's load."""
    model, timeout = long_sum(), 2.0
    limits = Limits(max_iterations=30, max_nodes=10**8, timeout=timeout)
    result, report = optimize_model(model, grow, fp=FP, limits=limits)
    assert report.stop_reason == "time-limit" and report.limit_stage == "saturate"
    history, budget = report.extra["history"], report.extra["budget"]
    assert report.iterations == len(history) >= 3 and history[-1][1] > 10 * history[0][1]
    assert len(budget) == len(history) + 1  # a check before each iteration and the last one
    assert all(need <= left for left, need in budget[:-1])  # each started one was predicted to fit
    left, need = budget[-1]
    assert need > left  # the one not started would not have
    # the prediction grows with the e-graph: the refused iteration was predicted to take longer
    # than the first one took
    assert need > history[0][0]
    _valid(model, result, report)


def test_max_nodes_stops_saturation(grow):
    """An iteration starts only under the node limit, and not when growing as the last one
    did would cross it."""
    model, max_nodes = long_sum(), 5000
    result, report = optimize_model(model, grow, fp=FP, limits=Limits(max_nodes=max_nodes))
    assert report.stop_reason == "node-limit" and report.limit_stage == "saturate"
    history = report.extra["history"]
    assert len(history) >= 2 and all(n <= max_nodes for _, n in history[:-1])
    grew = history[-1][1] / history[-2][1]
    assert history[-1][1] * grew > max_nodes  # the next one would have crossed it
    _valid(model, result, report)


@pytest.mark.parametrize("n, max_nodes", [(12, 5000), (16, 20000), (16, 100000)])
def test_max_nodes_is_not_crossed_when_growth_speeds_up(grow, n, max_nodes):
    """Associativity and commutativity grow an e-graph faster each iteration (the 16-term sum:
    15.8x in its fourth): a prediction from the last growth alone let --max-nodes 20000 reach
    33,709 e-nodes. The growth's own rise is extrapolated now: no iteration crosses it."""
    _, report = optimize_model(long_sum(n), grow, fp=FP, limits=Limits(max_nodes=max_nodes))
    assert report.stop_reason == "node-limit"
    history = report.extra["history"]
    assert len(history) >= 2 and all(e <= max_nodes for _, e in history)


def test_input_over_max_nodes_comes_back_unchanged(grow):
    model = long_sum()
    result, report = optimize_model(model, grow, fp=FP, limits=Limits(max_nodes=10))
    assert result is model and report.iterations == 0
    assert (report.stop_reason, report.limit_stage) == ("node-limit", "import")


def test_deadline_past_on_entry(grow):
    """A caller that spent the whole budget gets the model back at once."""
    model = long_sum()
    clock = time.perf_counter()
    result, report = optimize_model(model, grow, fp=FP, limits=Limits(deadline=clock - 1.0))
    assert result is model and (report.stop_reason, report.limit_stage) == ("time-limit", "load")
    assert time.perf_counter() - clock < 0.5


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "rewrite.cli", *args], capture_output=True, text=True, cwd=ROOT
    )


def test_cli_timeout_counts_from_the_start(tmp_path):
    """--timeout covers reading the rules and the model: a budget spent there writes the input
    unchanged and says where it ran out."""
    src, dst, rep = tmp_path / "sum.onnx", tmp_path / "out.onnx", tmp_path / "r.json"
    onnx.save(long_sum(), str(src))
    r = _cli(
        "optimize",
        str(src),
        str(dst),
        "--rules",
        str(GROW),
        "--allow",
        "reassoc",
        "--timeout",
        "0.001",
        "--report",
        str(rep),
    )
    assert r.returncode == 0, r.stderr
    assert "time-limit reached during load" in r.stdout and "input unchanged" in r.stdout
    assert onnx.load(str(dst)) == onnx.load(str(src))
    assert json.loads(rep.read_text())["limit_stage"] == "load"


def test_cli_max_nodes(tmp_path):
    src, dst = tmp_path / "sum.onnx", tmp_path / "out.onnx"
    onnx.save(long_sum(), str(src))
    r = _cli(
        "optimize",
        str(src),
        str(dst),
        "--rules",
        str(GROW),
        "--allow",
        "reassoc",
        "--max-nodes",
        "5000",
    )
    assert r.returncode == 0, r.stderr
    assert "node-limit reached during saturate" in r.stdout
    # stopped before an iteration predicted to cross it, under it: the summary says why
    assert "saturation: node-limit (the next iteration would have grown it past 5,000)" in r.stdout
    onnx.checker.check_model(onnx.load(str(dst)), full_check=True)
