"""The op table (`vocab.ops`) is derived from the registries: every default-domain op that is
not control flow, random, deprecated or over sequences is matchable, with the registry's
inputs, attributes and defaults; onnxruntime's contrib ops are there by domain; families are
named once and rule files use them; `rewrite ops` lists it all."""

import json
import pickle

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import TensorProto, helper

import dsl
from dsl import check, parse
from dsl.errors import ForError
from dsl.ir import RuleSet
from frontends.onnx import optimize_model
from frontends.onnx.check import run
from frontends.onnx.importer import import_model
from rewrite.cli import main
from vocab.ops import (
    FAMILIES,
    MIN_OPSET,
    OPS,
    REQUIRED,
    VARIADIC_SLOTS,
    TensorValue,
    decode_attr,
    encode_attr,
    vocabulary,
)

NOT_MATCHABLE = ("control flow", "sequences", "random", "deprecated")


def _registry_newest() -> dict[str, onnx.defs.OpSchema]:
    out = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain in ("", "ai.onnx") and s.since_version <= 26:
            if s.name not in out or s.since_version > out[s.name].since_version:
                out[s.name] = s
    return out


def test_every_tensor_op_of_the_default_domain_is_matchable():
    """Read independently of vocab.ops: every newest default-domain schema without a
    subgraph attribute, not deprecated, not random, whose inputs and outputs can be tensors,
    has a spec with the registry's inputs (variadic as slots) and attributes."""
    graph_attr = (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
    missing, checked = [], 0
    for name, s in _registry_newest().items():
        if s.deprecated or any(a.type in graph_attr for a in s.attributes.values()):
            continue
        if name in FAMILIES["RANDOM"]:
            assert OPS.get(name).random  # in the table, never matched
            continue
        types = {c.type_param_str: c.allowed_type_strs for c in s.type_constraints}
        params = [*s.inputs, *s.outputs]
        if not all(
            any(t.startswith("tensor(") for t in types.get(p.type_str, [p.type_str]))
            for p in params
        ):
            continue
        spec = OPS.get(name)
        if spec is None:
            missing.append(name)
            continue
        checked += 1
        assert spec.version == s.since_version
        variadic = (
            s.inputs and s.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic
        )
        fixed = [p.name for p in s.inputs][: -1 if variadic else None]
        assert list(spec.inputs[: len(fixed)]) == fixed
        assert spec.arity == len(fixed) + (VARIADIC_SLOTS if variadic else 0)
        for a in s.attributes.values():
            if a.type in (onnx.AttributeProto.SPARSE_TENSOR, onnx.AttributeProto.TENSORS):
                continue
            assert spec.has_attr(a.name), (name, a.name)
            if a.required:
                assert spec.attr_index[a.name].default is REQUIRED
    assert not missing, f"registry ops not matchable: {missing}"
    assert checked > 170  # the registry has ~180 such ops at opset 26


def test_vocabulary_gives_a_reason_for_every_op_it_cannot_match():
    entries = {(e.spec.domain, e.spec.name): e for e in vocabulary()}
    assert entries[("", "If")].reason.startswith("control flow")
    assert entries[("", "SequenceAt")].reason.startswith("works on sequences")
    assert entries[("", "RandomNormal")].reason.startswith("random")
    assert entries[("", "Concat")].reason == "" and entries[("", "Split")].reason == ""
    default = [e for (d, _), e in entries.items() if d == ""]
    unmatched = [e for e in default if e.reason]
    assert all(any(w in e.reason for w in NOT_MATCHABLE) for e in unmatched), [
        (e.spec.name, e.reason) for e in unmatched
    ]
    assert len(default) - len(unmatched) > 170


def test_onnxruntime_contrib_ops_by_domain():
    spec = OPS.get("com.microsoft.MatMulNBits")
    assert spec is not None and spec.domain == "com.microsoft" and spec.name == "MatMulNBits"
    assert spec.inputs[:3] == ("A", "B", "scales") and spec.n_required == 3
    assert spec.attr_index["bits"].default == 4 and spec.attr_index["K"].default is REQUIRED
    assert OPS.lookup("com.microsoft", "FusedConv", 1) is not None
    assert OPS.get("com.microsoft.NoSuchOp") is None


def test_older_forms_have_their_own_slots_and_attributes():
    """ReduceMean-13 has an `axes` attribute, ReduceMean-18 an `axes` input: one constructor
    whose slots hold both, and each form knows which it has."""
    old, new = OPS.get("ReduceMean", 13), OPS.get("ReduceMean", 18)
    assert (old.since, old.until, new.since) == (13, 18, 18)
    assert old.has_attr("axes") and not old.has_input(1)
    assert new.has_input(1) and not new.has_attr("axes")
    assert OPS.get("Relu", 12) is None and OPS.get("Relu", MIN_OPSET) is not None
    assert OPS.get("LayerNormalization", 16) is None  # since 17


def test_the_cached_table_keeps_its_sentinels():
    """The table is pickled to the user's cache (`_cached_default_specs`): REQUIRED must
    still be REQUIRED after a round trip."""
    spec = OPS.get("Cast")
    again = pickle.loads(pickle.dumps(spec))
    assert again.attr_index["to"].default is REQUIRED


@pytest.mark.parametrize(
    "kind, value",
    [
        ("strings", ("a", "b c")),
        ("tensor", TensorValue.of(np.array([1.5, -2.0], np.float32))),
        ("tensor", TensorValue.of(np.array(3, np.int64))),
        ("ints", (1, -2)),
    ],
)
def test_attribute_literals_round_trip(kind, value):
    assert decode_attr(kind, encode_attr(kind, value)) == value


def test_families_name_registry_ops():
    names = set(_registry_newest())
    for family, ops in FAMILIES.items():
        # qualified names are onnxruntime's contrib ops, which the op table has
        mine = {op for op in ops if "." not in op or OPS.get(op) is None}
        assert ops and mine <= names, (family, mine - names)
    assert "Relu" in FAMILIES["UNARY_ELEMENTWISE"] and "Add" in FAMILIES["COMMUTATIVE"]
    assert OPS.get("Mul").commutative and not OPS.get("Sub").commutative
    assert OPS.get("ReduceSum").cost == "reduce" and OPS.get("MatMul").cost == "matmul"


def test_rule_files_iterate_over_a_family():
    rules = check(
        parse("(for op UNARY_ELEMENTWISE (simplify id-{op} (Identity (op @x)) (op @x)))", "f.rules")
    )
    assert [r.lhs.args[0].op for r in rules] == list(FAMILIES["UNARY_ELEMENTWISE"])
    mixed = check(
        parse("(for op (SOFTMAX Gelu) (simplify i-{op} (Identity (op @x)) (op @x)))", "f.rules")
    )
    assert [r.name for r in mixed] == ["i-hardmax", "i-log-softmax", "i-softmax", "i-gelu"]
    with pytest.raises(ForError, match="unknown op family 'NO_SUCH'"):
        check(parse("(for op NO_SUCH (simplify r (Identity (op @x)) (op @x)))", "f.rules"))


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 18),)):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    m.ir_version = 10
    return m


def _info(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def test_a_rule_can_write_an_op_of_another_domain():
    """A rule whose result is `com.microsoft.Gelu` (onnxruntime's kernel) writes that node
    with its domain, adds the domain's opset import, and onnxruntime runs the result; it runs
    only for a target that has the domain (or a model with nodes of it)."""
    text = (
        "(ruleset ms :domain com.microsoft)(simplify to-ms-gelu (Gelu @x) (com.microsoft.Gelu @x))"
    )
    rules = RuleSet(tuple(check(parse(text, "f.rules"))), ("f.rules",))
    model = _model(
        [helper.make_node("Gelu", ["x"], ["y"])],
        [_info("x", [2, 8])],
        [_info("y", [2, 8])],
        opsets=[("", 20)],
    )
    same, report = optimize_model(model, rules)  # standard ONNX: the ruleset is skipped
    assert same is model and "com.microsoft" in report.skipped["to-ms-gelu"]
    out, report = optimize_model(model, rules, target="onnxruntime")
    assert report.changed and [(n.domain, n.op_type) for n in out.graph.node] == [
        ("com.microsoft", "Gelu")
    ]
    assert {i.domain: i.version for i in out.opset_import}["com.microsoft"] == 1
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32)
    np.testing.assert_allclose(run(out, {"x": x})[0], run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)
    # a model that only imports the domain (onnxruntime's quant_pre_process imports it into
    # every file) is still a model of standard ops: the ruleset is skipped for target onnx
    imports = _model(
        model.graph.node,
        [_info("x", [2, 8])],
        [_info("y", [2, 8])],
        opsets=[("", 20), ("com.microsoft", 1)],
    )
    same, report = optimize_model(imports, rules)
    assert same is imports and "com.microsoft" in report.skipped["to-ms-gelu"]
    # one whose nodes use it gets more of them
    nodes = [
        helper.make_node("Gelu", ["x"], ["g"]),
        helper.make_node("Gelu", ["g"], ["y"], domain="com.microsoft"),
    ]
    uses = _model(
        nodes, [_info("x", [2, 8])], [_info("y", [2, 8])], opsets=[("", 20), ("com.microsoft", 1)]
    )
    out, report = optimize_model(uses, rules)
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("com.microsoft", "Gelu")] * 2


@pytest.mark.parametrize(
    "text, message",
    [
        ("(simplify a (Gelu @x) (com.microsoft.Gelu @x))", "does not declare the domain"),
        ("(ruleset r :domain com.nowhere) (simplify a (Relu @x) @x)", "unknown domain"),
        ("(ruleset r :opset 13) (simplify a (Relu @x) (Gelu @x))", "opset 13 does not have"),
        ("(ruleset r :opset 99) (simplify a (Relu @x) @x)", "outside the op table's opsets"),
        ("(ruleset r :size 3) (simplify a (Relu @x) @x)", "takes :opset N, :domain NAME"),
        ("(ruleset r :sums int16) (simplify a (Relu @x) @x)", "and :sums int32 (once)"),
        ("(ruleset r :sums int32 :sums int32) (simplify a (Relu @x) @x)", "not :sums int32"),
    ],
)
def test_ruleset_needs_are_checked(text, message):
    with pytest.raises(dsl.RulesError) as info:
        check(parse(text, "f.rules"))
    assert message in str(info.value) and str(info.value).startswith("f.rules:1:")


def test_a_ruleset_that_needs_int32_sums_runs_only_for_such_a_runtime():
    # `:sums int32`: results exact only where uint8-by-int8 products are summed in int32
    # (full-range int8 weights); the engine runs them only when told the runtime does
    text = "(ruleset wide :sums int32) (simplify relu-of-relu (Relu (Relu @x)) (Relu @x))"
    rules = RuleSet(tuple(check(parse(text, "f.rules"))), ("f.rules",))
    assert rules.rules[0].sums == "int32"
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    model = _model(nodes, [_info("x", [2])], [_info("y", [2])], opsets=[("", 18)])
    same, report = optimize_model(model, rules)
    assert same is model and ":sums int32" in report.skipped["relu-of-relu"]
    out, report = optimize_model(model, rules, sums=("int32",))
    assert [n.op_type for n in out.graph.node] == ["Relu"]


def test_a_ruleset_that_needs_a_newer_opset_is_skipped_on_an_older_model():
    text = "(ruleset new :opset 20) (simplify relu-of-relu (Relu (Relu @x)) (Relu @x))"
    rules = RuleSet(tuple(check(parse(text, "f.rules"))), ("f.rules",))
    assert rules.rules[0].opset == 20
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    model = _model(nodes, [_info("x", [2])], [_info("y", [2])], opsets=[("", 18)])
    same, report = optimize_model(model, rules)
    assert same is model and "needs opset 20" in report.skipped["relu-of-relu"]
    model = _model(nodes, [_info("x", [2])], [_info("y", [2])], opsets=[("", 20)])
    out, report = optimize_model(model, rules)
    assert [n.op_type for n in out.graph.node] == ["Relu"]


def test_variadic_ops_are_matchable_up_to_their_slots():
    """A Concat of 2 inputs is a term (one-input folding sees it); one of more than
    VARIADIC_SLOTS inputs stays opaque and comes back unchanged."""
    few = _model(
        [helper.make_node("Concat", ["a", "b"], ["y"], axis=0)],
        [_info("a", [2]), _info("b", [3])],
        [_info("y", [5])],
    )
    node = import_model(few).nodes[0]
    assert not node.opaque and node.op == "Concat" and len(node.inputs) == VARIADIC_SLOTS
    names = [f"i{k}" for k in range(VARIADIC_SLOTS + 1)]
    many = _model(
        [helper.make_node("Concat", names, ["y"], axis=0)],
        [_info(n, [1]) for n in names],
        [_info("y", [len(names)])],
    )
    assert import_model(many).nodes[0].opaque


def test_rewrite_ops_lists_the_vocabulary(capsys):
    assert main(["ops", "--json", "--domain", "ai.onnx", "--opset", "13"]) == 0
    rows = {r["op"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["ReduceMean"]["inputs"] == ["data"] and "axes" in rows["ReduceMean"]["attributes"]
    assert rows["Concat"]["inputs"] == ["inputs..."] and rows["Concat"]["matchable"]
    assert rows["If"]["matchable"] is False and rows["If"]["reason"].startswith("control flow")
    assert "LayerNormalization" not in rows  # opset 17
    assert rows["Add"]["shape_rule"] == "direct" and rows["Reshape"]["shape_rule"] == "symbolic"
    assert main(["ops", "--family", "REDUCTION"]) == 0
    text = capsys.readouterr().out
    assert "ReduceLogSumExp" in text and "10 ops, 10 matchable" in text
    assert main(["ops", "--family", "NOPE"]) == 2
    assert "unknown op family" in capsys.readouterr().err
    # a misspelt domain is said so (it listed "0 ops" and exited 0)
    assert main(["ops", "--domain", "com.microsft"]) == 2
    err = capsys.readouterr().err
    assert "unknown domain 'com.microsft'" in err and "com.microsoft" in err
