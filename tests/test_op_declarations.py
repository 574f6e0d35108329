"""Op declarations (`(op ...)`, dsl.declare and vocab.declared): a declared op is in the op
table with a type from its body, the importer reads it as matchable, rules rewrite to it, the
exported model carries its body as a function and runs on onnxruntime, `verify` checks rules
over it on both executors, and a bad declaration is a located error."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper

from dsl import (
    OpDeclarationError,
    PlacementError,
    UnboundCaptureError,
    UnknownOperatorError,
    check,
    parse,
)
from dsl.ir import RuleSet
from engine.infer import infer_type
from frontends.onnx import optimize_model
from frontends.onnx.importer import import_model
from verify import verify_rule
from vocab.ops import OPS
from vocab.types import TensorType

SWISH = """
(op com.acme.Swish (@x) :cost elementwise
  (Mul @x (Sigmoid @x)))
(op com.acme.LeakySwish (@x) :attr (alpha float 0.5)
  (Mul @x (Sigmoid (LeakyRelu @x :alpha @alpha))))
;; x * sigmoid(x) -> Swish(x)
(simplify mul-sigmoid-to-swish
  (Mul:c @x (Sigmoid @x))
  (com.acme.Swish @x))
"""


def rules(text: str = SWISH, file: str = "acme.rules") -> RuleSet:
    return RuleSet(tuple(check(parse(text, file))), (file,))


def model(nodes, opset_imports=(("", 17),), functions=()):
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TP.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TP.FLOAT, [2, 3])],
    )
    imports = [helper.make_opsetid(d, v) for d, v in opset_imports]
    m = helper.make_model(graph, opset_imports=imports, functions=list(functions))
    m.ir_version = 10
    return m


def test_declared_op_is_one_spec_of_the_table():
    rules()
    spec = OPS.get("com.acme.LeakySwish")
    assert (spec.domain, spec.name, spec.inputs, spec.n_required) == (
        "com.acme",
        "LeakySwish",
        ("x",),
        1,
    )
    assert [(a.name, a.kind, a.default) for a in spec.attrs] == [("alpha", "float", 0.5)]
    assert (spec.cost, spec.families, spec.version, spec.declared) == ("kernel", (), 1, True)
    assert OPS.get("com.acme.Swish").cost == "elementwise"


def test_type_comes_from_the_body():
    rules()
    t = infer_type("com.acme.Swish", (), (TensorType(TP.FLOAT, (2, "n")),), (None,))
    assert t == TensorType(TP.FLOAT, (2, "n"))


def test_loading_the_same_declarations_twice_is_fine():
    assert rules().names() == rules().names()


def test_importer_reads_a_declared_op_as_matchable():
    rules()
    m = model(
        [helper.make_node("Swish", ["x"], ["y"], domain="com.acme")],
        (("", 17), ("com.acme", 1)),
    )
    (node,) = import_model(m).nodes
    assert (node.op, node.opaque) == ("com.acme.Swish", False)


def test_rule_fires_and_the_output_runs_with_the_function_attached():
    m = model(
        [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])]
    )
    out, report = optimize_model(m, rules())
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("com.acme", "Swish")]
    assert ("com.acme", 1) in [(i.domain, i.version) for i in out.opset_import]
    assert [(f.domain, f.name) for f in out.functions] == [("com.acme", "Swish")]
    onnx.checker.check_model(out)
    x = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    (y,) = ort.InferenceSession(out.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(y, x / (1 + np.exp(-x)), rtol=1e-6)


def test_verify_passes_the_right_rule_and_refuses_a_wrong_one():
    text = (
        SWISH
        + """
;; LeakySwish(x, a) -> x * sigmoid(LeakyRelu(x, a))
(simplify leaky-swish-expand
  (com.acme.LeakySwish @x :alpha @a)
  (Mul @x (Sigmoid (LeakyRelu @x :alpha @a))))
;; wrong on purpose: Swish is not Relu
(simplify swish-is-relu
  (com.acme.Swish @x)
  (Relu @x))
"""
    )
    rs = rules(text)
    by_name = {r.name: r for r in rs.rules}
    for name in ("mul-sigmoid-to-swish", "leaky-swish-expand"):
        assert verify_rule(by_name[name], rs, examples=20).status == "pass", name
    wrong = verify_rule(by_name["swish-is-relu"], rs, examples=20)
    assert wrong.status == "FAIL"
    assert "onnx.reference" in wrong.checks[-1].failure.text  # both executors ran the body


@pytest.mark.parametrize(
    "text, error, message",
    [
        (
            "(op com.acme.Bad1 (@x) (Sigmoidd @x))",
            UnknownOperatorError,
            "bad.rules:1:25: error: unknown operator 'Sigmoidd'; did you mean 'Sigmoid'?",
        ),
        (
            "(op com.acme.Bad2 (@x) (Mul @x @y))",
            UnboundCaptureError,
            "bad.rules:1:32: error: @y is neither an input nor an attribute of com.acme.Bad2",
        ),
        (
            "(op com.acme.Bad3 (@x) (LeakyRelu @x :alpha @a))",
            UnboundCaptureError,
            "bad.rules:1:45: error: @a is neither an input nor an attribute of com.acme.Bad3",
        ),
        (
            "(op com.microsoft.Gelu (@x) (Relu @x))",
            OpDeclarationError,
            "bad.rules:1:5: error: com.microsoft.Gelu is in domain 'com.microsoft', which an"
            " installed registry owns; declare ops in a domain of your own (com.acme.Swish)",
        ),
        (
            "(op Relu (@x) (Relu @x))",
            OpDeclarationError,
            "bad.rules:1:5: error: Relu is in the default domain, which an installed registry"
            " owns; declare ops in a domain of your own (com.acme.Swish)",
        ),
        (
            "(op com.acme.Bad4 (@xs...) (Sum @xs...))",
            OpDeclarationError,
            "bad.rules:1:20: error: @xs... : a declared op cannot have a variadic input (an"
            " ONNX function has a fixed list of inputs)",
        ),
        (
            "(op com.acme.Bad5 (@x @b?) (Add @x @b))",
            PlacementError,
            "bad.rules:1:36: error: optional input @b is input 2 of Add, which is required (an"
            " absent optional input can only fill an optional slot)",
        ),
    ],
    ids=[
        "unknown-op",
        "unbound-term",
        "unbound-attr",
        "contrib-name",
        "onnx-name",
        "variadic",
        "optional-slot",
    ],
)
def test_located_errors(text, error, message):
    with pytest.raises(error) as e:
        check(parse(text, "bad.rules"))
    assert str(e.value).splitlines()[0] == message


def test_a_different_declaration_of_a_declared_name_is_an_error():
    check(parse("(op com.acme.Twice (@x) (Relu @x))", "first.rules"))
    with pytest.raises(OpDeclarationError) as e:
        check(parse("\n(op com.acme.Twice (@x) (Neg @x))", "second.rules"))
    assert str(e.value).splitlines()[0] == (
        "second.rules:2:5: error: com.acme.Twice is already declared at first.rules:1:5,"
        " differently"
    )
