"""Skip/only lists and culprit bisection (issue 10, items 2 and 3).

ddmin on synthetic predicates; `pick_rules` (names, globs, `ruleset:NAME`, unknown patterns);
skip/only through `optimize_fx` and the CLI; a rule applied only at chosen sites; and
bisection naming a planted wrong rule, and the node it breaks, among the shipped rules on a
real model in O(log n) optimize runs.
"""

import math
import subprocess
import sys
from pathlib import Path

import pytest

from dsl import load_rules, shipped_rules_dir
from dsl.ir import RuleSet
from engine.ddmin import ddmin
from engine.selection import UnknownRulePatternError, pick_rules
from engine.sites import SitedRule, sited

ROOT = Path(__file__).resolve().parent.parent
RESNET = "examples/resnet.onnx"  # as a user types them in the repository (cli runs there)
BROKEN = "examples/broken.rules"

# A wrong rule planted among the shipped ones (the style of tests/wrong_rules/).
PLANTED = """\
(ruleset planted)

;; WRONG: x / c -> x (the divisor is dropped).
(simplify div-constant-dropped
  (Div @x @c)
  (if (is-constant @c))
  @x)
"""


def shipped():
    return load_rules([shipped_rules_dir()])


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `rewrite ARGS...` in this process from the repository root: (status, stdout, stderr)."""
    from rewrite.cli import main

    monkeypatch.chdir(ROOT)

    def run(*args):
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, captured.out, captured.err)

    return run


# ---- ddmin ------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 7, 20, 64, 100])
def test_ddmin_one_culprit_in_logarithmic_tests(n):
    for culprit in range(n):
        found = ddmin(list(range(n)), lambda s, c=culprit: c in s)
        assert found.items == (culprit,) and found.complete
        assert found.tests <= 2 * math.ceil(math.log2(max(n, 2)))


def test_ddmin_two_interacting_culprits_is_one_minimal():
    found = ddmin(list(range(30)), lambda s: 4 in s and 23 in s)
    assert found.items == (4, 23)


def test_ddmin_keeps_input_order_and_reports_progress():
    seen = []
    found = ddmin(
        list("abcdefgh"),
        lambda s: "f" in s and "b" in s,
        progress=lambda k, left: seen.append((k, left)),
    )
    assert found.items == ("b", "f")
    assert [k for k, _ in seen] == list(range(1, found.tests + 1))


def test_ddmin_stops_when_out_of_time():
    calls = []
    found = ddmin(
        list(range(16)), lambda s: calls.append(s) or 3 in s, out_of_time=lambda: len(calls) >= 2
    )
    assert not found.complete and 3 in found.items and len(found.items) > 1


# ---- skip / only --------------------------------------------------------------------------------


def test_only_names_and_globs():
    rules = shipped()
    picked, excluded = pick_rules(rules, only=["matmul-add-to-gemm*", "transpose-transpose"])
    names = picked.names()
    assert "matmul-add-to-gemm" in names and "matmul-add-to-gemm-c1" in names  # :c variants
    assert "transpose-transpose" in names and all(
        n.startswith(("matmul-add-to-gemm", "transpose-transpose")) for n in names
    )
    assert excluded["add-zero"] == "not in --only" and len(excluded) + len(names) == len(
        rules.rules
    )


def test_skip_ruleset_and_reason():
    rules = shipped()
    # one string is one pattern; int32 sums known, so that no `:sums int32` rule is excluded
    picked, excluded = pick_rules(rules, skip="ruleset:fusion", sums=("int32",))
    assert picked.rules and all(r.ruleset != "fusion" for r in picked.rules)
    assert excluded and set(excluded.values()) == {"--skip ruleset:fusion"}


def test_only_then_skip():
    picked, excluded = pick_rules(shipped(), skip=["*-c1"], only=["ruleset:fusion"])
    assert picked.rules and all(
        r.ruleset == "fusion" and not r.name.endswith("-c1") for r in picked.rules
    )
    assert "--skip *-c1" in excluded.values()


def test_no_patterns_is_the_same_rule_set():
    rules = shipped()
    assert pick_rules(rules, sums=("int32",)) == (rules, {})
    # unless told the runtime sums in int32, the rules that need it are left out, with why
    picked, excluded = pick_rules(rules)
    wide = {r.name for r in rules.rules if r.sums == "int32"}
    assert wide and set(excluded) == wide and {r.name for r in picked.rules}.isdisjoint(wide)
    assert set(excluded.values()) == {":sums int32 (the runtime is not known to sum so)"}


@pytest.mark.parametrize(
    "kw,flag", [({"skip": ["no-such-rule"]}, "--skip"), ({"only": ["ruleset:nope"]}, "--only")]
)
def test_unknown_pattern_is_an_error_naming_it(kw, flag):
    with pytest.raises(UnknownRulePatternError) as e:
        pick_rules(shipped(), **kw)
    pattern = next(iter(kw.values()))[0]
    assert str(e.value).startswith(f"{flag} {pattern}: matches no rule")


def test_optimize_fx_skip():
    torch = pytest.importorskip("torch")
    from torch import nn

    import rewrite

    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval()
    x = torch.randn(1, 3, 8, 8)
    gm = torch.fx.symbolic_trace(model)
    _, kept = rewrite.optimize_fx(gm, (x,), allow=["reassoc"], skip=["fold-batchnorm*"])
    assert kept.ops_after == kept.ops_before  # the README example folds it without --skip
    assert not any(n.startswith("fold-batchnorm") for n in kept.fired)
    assert kept.skipped["fold-batchnorm-into-conv"] == "--skip fold-batchnorm*"
    with pytest.raises(UnknownRulePatternError):
        rewrite.optimize_fx(gm, (x,), only="no-such-rule")
    from frontends.fx.backend import REPORTS, rewrite_backend  # the torch.compile options

    rewrite_backend(gm, [x], {"backend": "eager", "skip": ["ruleset:fusion"]})
    assert REPORTS[-1].skipped["fold-batchnorm-into-conv"] == "--skip ruleset:fusion"


def test_cli_unknown_pattern_is_one_line(cli):
    r = cli("optimize", RESNET, ROOT / "never-written.onnx", "--only", "ruleset:nope")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "error: --only ruleset:nope: matches no rule (a name, a glob or ruleset:NAME; "
        f"{len(shipped().rules)} rules loaded)"
    ]
    assert not (ROOT / "never-written.onnx").exists()


# ---- sites ------------------------------------------------------------------------------------


def _two_divs():
    """x / 2 + x / 4: two Div sites, named d1 and d2 (their outputs q1 and q2)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    inits = [
        numpy_helper.from_array(np.array(v, np.float32), n)
        for n, v in (("two", 2.0), ("four", 4.0))
    ]
    nodes = [
        helper.make_node("Div", ["x", "two"], ["q1"], name="d1"),
        helper.make_node("Div", ["x", "four"], ["q2"], name="d2"),
        helper.make_node("Add", ["q1", "q2"], ["y"], name="sum"),
    ]
    g = helper.make_graph(
        nodes,
        "two-divs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


@pytest.fixture
def planted(tmp_path):
    path = tmp_path / "planted.rules"
    path.write_text(PLANTED)
    return path


def test_sited_rule_applies_only_at_chosen_sites(planted):
    from frontends.onnx import optimize_model

    (rule,) = load_rules([planted]).rules
    model = _two_divs()
    everywhere = RuleSet(tuple(sited(rule)), ())
    _, report = optimize_model(model, everywhere)
    assert sorted(report.extra["sites"][rule.name]) == ["q1", "q2"]
    out, report = optimize_model(model, RuleSet(tuple(sited(rule, frozenset({"q2"}))), ()))
    assert report.extra["sites"] == {rule.name: ["q2"]}
    assert [n.name for n in out.graph.node if n.op_type == "Div"] == ["d1"]


def test_site_is_the_original_value_at_the_root(planted):
    from types import SimpleNamespace

    from engine.sites import admits, site_of
    from frontends.onnx import import_model

    (rule,) = load_rules([planted]).rules
    graph = import_model(_two_divs())
    vid = {v.name: i for i, v in enumerate(graph.values)}
    # class 0: q1 merged with x by some rule; class 1: a term only a rewrite built
    snap = SimpleNamespace(
        graph=graph, handles_of={0: [vid["x"], vid["q1"]], 1: [len(graph.values)]}
    )
    assert site_of(snap, 0, rule) == "q1"  # written by a Div, the rule's root op
    assert site_of(snap, 1, rule) is None
    (at_x,) = sited(rule, frozenset({"x"}))
    assert admits(snap, 0, at_x) == (True, "q1") and admits(snap, 1, at_x) == (False, None)


def test_sited_equal_rule_runs_both_ways():
    rule = next(r for r in shipped().rules if r.kind == "equal")
    forward, reverse = sited(rule, frozenset({"v"}))
    assert isinstance(forward, SitedRule) and forward.needs_host and forward.sites == {"v"}
    assert (
        reverse.name == f"{rule.name} (reverse)"
        and reverse.lhs == rule.rhs
        and reverse.rhs == rule.lhs
    )


# ---- bisection ----------------------------------------------------------------------------------


def test_bisect_small_model_names_rule_and_node(planted):
    from frontends.onnx.bisect import bisect_model, format_report

    rules = load_rules([shipped_rules_dir(), planted])
    report = bisect_model(_two_divs(), rules)
    (c,) = report.culprits
    assert c.rule == "div-constant-dropped" and c.where == f"{planted}:4"
    assert len(c.sites) == 1 and c.nodes == ({"q1": "d1", "q2": "d2"}[c.sites[0]],)
    assert report.inputs == {"x": "float32[2, 3]"} and "output y differs" in report.error
    text = "\n".join(format_report(report, model="m.onnx", rule_paths=[planted]))
    assert (
        "--only div-constant-dropped" in text
        and f"rewrite verify {planted} --rule div-constant-dropped" in text
    )


def test_bisect_passing_model_has_nothing_to_bisect():
    from frontends.onnx.bisect import bisect_model

    report = bisect_model(_two_divs(), shipped())
    assert not report.failing and not report.culprits and report.rule_runs == 1


def test_bisect_out_of_time_says_so(planted):
    import time

    from engine.saturate import Limits
    from frontends.onnx.bisect import bisect_model, format_report

    rules = load_rules([shipped_rules_dir(), planted])
    report = bisect_model(_two_divs(), rules, limits=Limits(deadline=time.perf_counter()))
    assert not report.complete and not report.culprits and report.runs == 0
    assert format_report(report, model="m.onnx") == [
        "bisect: the time ran out after 0 optimize runs"
    ]


def test_cli_bisect_and_optimize_name_the_culprit(cli, tmp_path):
    r = cli("bisect", RESNET, "--rules", "patterns", "--rules", BROKEN, "--allow", "reassoc")
    assert r.returncode == 0, r.stderr
    assert "culprit: rule relu-of-add-dropped (examples/broken.rules:7)" in r.stdout
    assert "site: node node_relu_" in r.stdout and "pixel_values float32[1, 3, 64, 64]" in r.stdout
    assert "bisect: rules: run" in r.stderr  # progress
    out = tmp_path / "out.onnx"
    r = cli("optimize", RESNET, out, "--rules", f"patterns,{BROKEN}", "--allow", "reassoc")
    last = r.stderr.strip().splitlines()[-1]
    assert r.returncode == 1 and not out.exists()
    assert (
        "nothing written; culprit: rule relu-of-add-dropped (examples/broken.rules:7) at node_relu_"
        in last
    )
    assert "reproduce: rewrite optimize" in r.stderr
    r = cli(
        "optimize",
        RESNET,
        out,
        "--rules",
        f"patterns,{BROKEN}",
        "--allow",
        "reassoc",
        "--no-bisect",
    )
    assert r.returncode == 1 and "culprit" not in r.stderr and not out.exists()
    r = cli(
        "optimize",
        RESNET,
        out,
        "--rules",
        "patterns",
        "--rules",
        BROKEN,
        "--allow",
        "reassoc",
        "--skip",
        "ruleset:broken",
    )
    assert r.returncode == 0 and out.exists() and "excluded 1 of" in r.stderr


@pytest.mark.slow
def test_bisect_planted_rule_in_shipped_library_on_bert(planted):
    """The planted rule among the ~200 shipped rules on BERT (TorchScript export): bisection
    names it, its file:line and a node it breaks. Bound on the optimize runs over the rules:
    2 * ceil(log2 n) + 2 for n rules that fired (ddmin's binary search, plus the failing run
    and the run that checks the fired rules alone fail); over the sites: 2 * ceil(log2 m) + 1
    for m sites (plus the run that lists them)."""
    sys.path.insert(0, str(ROOT / "examples"))
    import make_models

    from frontends.onnx.bisect import bisect_model

    model = make_models.bert(None, exporter="torchscript")
    rules = load_rules([shipped_rules_dir(), planted])
    report = bisect_model(model, rules, fp=("exact", "reassoc"))
    (c,) = report.culprits
    assert c.rule == "div-constant-dropped" and c.where == f"{planted}:4"
    n, m = len(report.fired), c.fired_sites
    assert n >= 10  # the planted rule is one of many
    assert report.rule_runs <= 2 * math.ceil(math.log2(n)) + 2
    assert len(c.sites) == 1 and c.nodes[0].endswith("/Div")
    assert report.site_runs <= 2 * math.ceil(math.log2(max(m, 2))) + 1


def _reshape_to_an_input_shape():
    """Reshape(x, shape) / 2, `shape` an input: random draws (0s and 1s) cannot run it."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Div", ["r", "two"], ["y"], name="d1"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
            helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    feeds = {"x": np.arange(6, dtype=np.float32) + 1, "shape": np.array([2, 3], np.int64)}
    return model, feeds


def test_bisect_compares_on_the_given_inputs(planted):
    """A model that runs only on its own inputs (a Reshape to a shape given as an input): the
    bisection drew random ones and said the original could not run, where the check had just
    run it on --check-inputs (the black-box tester's onnx test_affine_grid_2d_expanded)."""
    from frontends.onnx.bisect import BisectError, bisect_model, format_report

    model, feeds = _reshape_to_an_input_shape()
    rules = load_rules([shipped_rules_dir(), planted])
    with pytest.raises(BisectError):
        bisect_model(model, rules)
    report = bisect_model(model, rules, feeds=[feeds])
    (c,) = report.culprits
    assert c.rule == "div-constant-dropped" and report.seed is None
    text = "\n".join(format_report(report, model="m.onnx", check_inputs="in.npz"))
    assert "(the given inputs)" in text and "--check-inputs in.npz" in text


def test_the_cli_bisects_on_check_inputs(planted, tmp_path, capsys):
    """`optimize --check-inputs` and `bisect --check-inputs` bisect on the given inputs, and
    the reproduce line passes them on (the review: the CLI's bisection still drew random
    inputs, its reproduce line dropped the option, and `rewrite bisect` had none)."""
    import numpy as np
    import onnx

    from rewrite.cli import main

    model, feeds = _reshape_to_an_input_shape()
    src, npz = tmp_path / "m.onnx", tmp_path / "in.npz"
    onnx.save(model, src)
    np.savez(npz, **{k: v[None] for k, v in feeds.items()})
    args = ["--add-rules", str(planted), "--check-inputs", str(npz)]
    assert main(["optimize", str(src), str(tmp_path / "out.onnx"), *args]) == 1
    err = capsys.readouterr().err
    assert "culprit: rule div-constant-dropped" in err and f"--check-inputs {npz}" in err, err
    assert main(["bisect", str(src), *args]) == 0
    out = capsys.readouterr().out
    assert "culprit: rule div-constant-dropped" in out and "(the given inputs)" in out, out
