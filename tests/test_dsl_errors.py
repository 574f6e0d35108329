"""Every DSL error kind: a tiny failing file in tests/dsl_errors/ and its exact message.

The message is the whole `str(err)`: `file:line:col: error: ...`, the source line, a caret.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import dsl

CASES_DIR = Path(__file__).with_name("dsl_errors")

# fmt: off
EXPECTED = {
    "arity": (
        dsl.ArityError,
        "arity.rules:2:4: error: Add takes 2 inputs, got 1\n"
        "      (Add @x)\n"
        "       ^",
    ),
    "attribute_float_range": (
        dsl.AttributeTypeError,
        "attribute_float_range.rules:2:24: error: "
        ":alpha of LeakyRelu: 1e+39 does not fit a float32 (ONNX's FLOAT)\n"
        "      (LeakyRelu @x :alpha 1e39)\n"
        "                           ^",
    ),
    "number_beyond_float": (  # it was read as inf, silently
        dsl.RulesSyntaxError,
        "number_beyond_float.rules:2:24: error: 1e400 is beyond a float's range "
        "(inf writes an infinity)\n"
        "      (LeakyRelu @x :alpha 1e400)\n"
        "                           ^",
    ),
    "equal_with_guard": (  # the guard was read as the result, and the result was unexpected
        dsl.RulesSyntaxError,
        "equal_with_guard.rules:4:3: error: unexpected '@x'; expected ')' (an `equal` rule is a "
        "pattern and a result, read both ways: a guarded rule is a `simplify`)\n"
        "      @x)\n"
        "      ^",
    ),
    "for_without_its_variable": (  # it said the rule was first defined where it stands
        dsl.DuplicateRuleError,
        "for_without_its_variable.rules:1:20: error: duplicate rule name 'same-name': the `for` "
        "around it makes one rule per operator, and {VAR} in its name (VAR the for's variable) "
        "tells them apart\n"
        "    (for op (Relu Neg) (simplify same-name (op (op @x)) (op @x)))\n"
        "                       ^",
    ),
    "number_below_float": (  # it was read as 0, silently
        dsl.RulesSyntaxError,
        "number_below_float.rules:2:24: error: 1e-400 is below a float's range "
        "(it would be read as 0)\n"
        "      (LeakyRelu @x :alpha 1e-400)\n"
        "                           ^",
    ),
    "negated_guard": (  # same-type is false where a dtype is unknown: (not ...) held there
        dsl.ArgumentError,
        "negated_guard.rules:3:7: error: guard 'same-type' cannot be negated: it is false also "
        "where it cannot decide (an unknown shape, dtype or value), so (not ...) would hold on "
        "what is not known; negatable guards: all-equal, has-dtype, identity-perm, "
        "is-constant, is-float, rank, zero-point-at-min\n"
        "      (if (not (same-type @x @x)))\n"
        "          ^",
    ),
    "required_attribute_in_pattern": (  # it matched a Cast to any type, silently
        dsl.MissingAttributeError,
        "required_attribute_in_pattern.rules:3:4: error: Cast needs :to (it has no default); "
        "write it, capture it or write :to _ to match any\n"
        "      (Cast @x)\n"
        "       ^",
    ),
    "guard_literal_kind": (  # check passed it, and verify raised int("two")
        dsl.ArgumentError,
        "guard_literal_kind.rules:3:16: error: argument 2 of guard 'rank' must be an integer, "
        "not 'two'\n"
        '      (if (rank @x "two"))\n'
        "                   ^",
    ),
    "output_beyond_num_outputs": (  # check passed it, and verify aborted in onnxruntime
        dsl.ArityError,
        "output_beyond_num_outputs.rules:2:4: error: 'Split#5': :num_outputs 2 gives Split to "
        "Split#1\n"
        "      (Split#5 @x :num_outputs 2)\n"
        "       ^",
    ),
    "attribute_range": (
        dsl.AttributeTypeError,
        "attribute_range.rules:2:21: error: "
        ":axis of Softmax: 99999999999999999999999 does not fit an int64 (ONNX's INT)\n"
        "      (Softmax @x :axis 99999999999999999999999)\n"
        "                        ^",
    ),
    "attribute_type": (
        dsl.AttributeTypeError,
        "attribute_type.rules:2:23: error: :perm of Transpose takes a list of ints, not 1\n"
        "      (Transpose @x :perm 1)\n"
        "                          ^",
    ),
    "bind_on_right": (
        dsl.PlacementError,
        "bind_on_right.rules:3:4: error: "
        "'Relu@r' binds a match; it is only allowed on the left side\n"
        "      (Relu@r @x))\n"
        "       ^",
    ),
    "builder_on_left": (
        dsl.PlacementError,
        "builder_on_left.rules:2:23: error: "
        "builder 'compose-perm' computes a result; it cannot be in a pattern\n"
        "      (Transpose @x :perm (compose-perm @p @q))\n"
        "                          ^",
    ),
    "capture_kind": (
        dsl.CaptureKindError,
        "capture_kind.rules:2:23: error: "
        "@p is bound to a term at 2:14; it cannot also be an attribute\n"
        "      (Transpose @p :perm @p)\n"
        "                          ^",
    ),
    "commutative_misuse": (
        dsl.CommutativeError,
        "commutative_misuse.rules:2:4: error: ':c' on Sub, which is not commutative\n"
        "      (Sub:c @x @z)\n"
        "       ^",
    ),
    "constant_in_pattern": (
        dsl.PlacementError,
        "constant_in_pattern.rules:2:12: error: a pattern never matches Constant: the import "
        "makes a Constant node a constant; capture it and guard its value, e.g. "
        "(Mul @x @one) (if (all-equal @one 1))\n"
        "      (Mul @x (Constant :value_float 1.0))\n"
        "               ^",
    ),
    "duplicate_name": (
        dsl.DuplicateRuleError,
        "duplicate_name.rules:5:1: error: "
        "duplicate rule name 'identity' (first defined at duplicate_name.rules:1:1)\n"
        "    (simplify identity\n"
        "    ^",
    ),
    "equal_mismatch": (
        dsl.EqualRuleError,
        "equal_mismatch.rules:2:11: error: @b is bound only on the left side; "
        "both sides of an equal rule must bind the same captures\n"
        "      (Mul @a @b)\n"
        "              ^",
    ),
    "for_placeholder": (
        dsl.ForError,
        "for_placeholder.rules:6:1: error: "
        "rule name 'idempotent-{op}' uses {op} outside a 'for op'\n"
        "    (simplify idempotent-{op}\n"
        "    ^",
    ),
    "guard_argument": (
        dsl.ArgumentError,
        "guard_argument.rules:3:18: error: "
        "argument 1 of guard 'all-equal' must be a term capture like @x\n"
        "      (if (all-equal 0 @z))\n"
        "                     ^",
    ),
    "missing_attribute": (
        dsl.MissingAttributeError,
        "missing_attribute.rules:3:4: error: "
        "Cast needs :to (it has no default); write it or copy it with :attrs\n"
        "      (Cast @x))\n"
        "       ^",
    ),
    "random_operator": (
        dsl.ForbiddenOperatorError,
        "random_operator.rules:2:12: error: "
        "RandomNormalLike is random; rules cannot match or build it\n"
        "      (Add @x (RandomNormalLike @x))\n"
        "               ^",
    ),
    "several_errors": (
        dsl.RulesErrors,
        "several_errors.rules:2:12: error: Relu has no attribute :alpha (it has none)\n"
        "      (Relu @x :alpha 0.1)\n"
        "               ^\n"
        "several_errors.rules:7:3: error: @y is not bound by the left side\n"
        "      @y)\n"
        "      ^",
    ),
    "syntax_error": (
        dsl.RulesSyntaxError,
        "syntax_error.rules:3:11: error: unexpected '0'; "
        "expected a capture like @x, a list capture like @xs..., an attribute like :perm, '(',"
        " ')', '_' or 'absent'\n"
        "      (Add @x 0)\n"
        "              ^",
    ),
    "unbound_capture": (
        dsl.UnboundCaptureError,
        "unbound_capture.rules:3:11: error: @z is not bound by the left side\n"
        "      (Sub @x @z))\n"
        "              ^",
    ),
    "unexpected_eof": (
        dsl.RulesSyntaxError,
        "unexpected_eof.rules:1:1: error: '(' is never closed: the file ends at 3:5\n"
        "    (simplify identity\n"
        "    ^",
    ),
    "unknown_attribute": (
        dsl.UnknownAttributeError,
        "unknown_attribute.rules:2:17: error: "
        "Transpose has no attribute :prem; did you mean ':perm'?\n"
        "      (Transpose @x :prem @p)\n"
        "                    ^",
    ),
    "unknown_builder": (
        dsl.UnknownBuilderError,
        "unknown_builder.rules:3:23: error: "
        "unknown builder 'compose-perms'; did you mean 'compose-perm'?\n"
        "      (Transpose @x :perm (compose-perms @p @q)))\n"
        "                          ^",
    ),
    "unknown_guard": (
        dsl.UnknownGuardError,
        "unknown_guard.rules:3:8: error: "
        "unknown guard 'identity-prem'; did you mean 'identity-perm'?\n"
        "      (if (identity-prem @p))\n"
        "           ^",
    ),
    "projection_out_of_range": (
        dsl.UnknownOperatorError,
        "projection_out_of_range.rules:2:4: error: "
        "'Split#9': Split's outputs are Split, then Split#1 to Split#7 (a variadic output)\n"
        "      (Split#9 @x :axis 0 :num_outputs 2)\n"
        "       ^",
    ),
    "unknown_domain": (
        dsl.UnknownOperatorError,
        "unknown_domain.rules:2:4: error: "
        "unknown domain 'com.nosuch' in 'com.nosuch.Foo' (domains: ai.onnx.ml, com.microsoft)\n"
        "      (com.nosuch.Foo @x)\n"
        "       ^",
    ),
    "unknown_family": (
        dsl.ForError,
        "unknown_family.rules:1:1: error: unknown op family 'NO_SUCH_FAMILY' (families: "
        "ACTIVATION, BINARY_ARITHMETIC, BROADCASTING, CLIPPING, COMMUTATIVE, COMPARISON, "
        "CONTRIB_UNARY_ELEMENTWISE, CONV, LOGICAL, MATMUL, MOVEMENT, NORMALIZATION, POOL, "
        "QUANTIZATION, QUANTIZED, RANDOM, REDUCTION, SAME_SHAPE, SAME_TYPE, SELECTING, SHAPE, "
        "SOFTMAX, UNARY_ELEMENTWISE, VARIADIC_ELEMENTWISE, VIEW)\n"
        "    (for op NO_SUCH_FAMILY\n"
        "    ^",
    ),
    "unknown_operator": (
        dsl.UnknownOperatorError,
        "unknown_operator.rules:2:4: error: "
        "unknown operator 'Tranpose'; did you mean 'Transpose'?\n"
        "      (Tranpose @x :perm @p)\n"
        "       ^",
    ),
    "wildcard_on_right": (
        dsl.PlacementError,
        "wildcard_on_right.rules:3:11: error: "
        "'_' cannot appear in a result (there is nothing to build)\n"
        "      (Sub @x _))\n"
        "              ^",
    ),
}
# fmt: on


def _load(path: Path):
    return dsl.check(dsl.parse(path.read_text(encoding="utf-8"), file=path.name))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_error_message(name):
    cls, message = EXPECTED[name]
    with pytest.raises(cls) as info:
        _load(CASES_DIR / f"{name}.rules")
    assert type(info.value) is cls
    assert str(info.value) == message


def test_every_case_file_has_an_expected_message():
    assert sorted(p.stem for p in CASES_DIR.glob("*.rules")) == sorted(EXPECTED)


def test_errors_are_rules_errors_with_location():
    with pytest.raises(dsl.RulesError) as info:
        _load(CASES_DIR / "unknown_operator.rules")
    err = info.value
    assert (err.span.file, err.span.line, err.span.col) == ("unknown_operator.rules", 2, 4)
    assert err.message == "unknown operator 'Tranpose'; did you mean 'Transpose'?"
    assert err.source_line == "  (Tranpose @x :perm @p)"


def test_several_errors_are_collected_in_source_order():
    with pytest.raises(dsl.RulesErrors) as info:
        _load(CASES_DIR / "several_errors.rules")
    kinds = [type(e) for e in info.value.errors]
    assert kinds == [dsl.UnknownAttributeError, dsl.UnboundCaptureError]


def test_load_rules_reports_the_path_as_given(tmp_path):
    path = tmp_path / "bad.rules"
    path.write_text("(simplify x (Relu @x) @y)\n")
    with pytest.raises(dsl.UnboundCaptureError) as info:
        dsl.load_rules([path])
    assert str(info.value).startswith(f"{path}:1:23: error: @y is not bound")


def test_caret_keeps_tabs():
    with pytest.raises(dsl.UnknownOperatorError) as info:
        dsl.check(dsl.parse("(simplify x\n\t(Rleu @x)\n\t@x)", file="t.rules"))
    assert str(info.value).splitlines()[1:] == ["    \t(Rleu @x)", "    \t ^"]


@pytest.mark.parametrize(
    "text, cls, message",
    [
        ("(simplify x (Add:q @a @b) @a)", dsl.RulesSyntaxError, "unknown operator flag ':q'"),
        ("(simplify x (Add @a :attrs 1) @a)", dsl.RulesSyntaxError, ":attrs takes one capture"),
        ("(simplify x :fp fast (Relu @a) @a)", dsl.RulesSyntaxError, "expected exact, reassoc"),
        (
            "(simplfy x (Relu @a) @a)",
            dsl.RulesSyntaxError,
            "expected 'equal', 'for', 'op', 'ruleset'",
        ),
        ("(simplify x (Relu:c @a) @a)", dsl.CommutativeError, "needs two operands"),
        ("(simplify x (Relu @a) (Add:c @a @a))", dsl.CommutativeError, "only allowed on the left"),
        ("(equal x (Add:c @a @b) (Add @b @a))", dsl.CommutativeError, "equal rule"),
        ("(simplify x @a (Relu @a))", dsl.PlacementError, "left side must be an operator"),
        ("(simplify x (Relu @a :alpha 1) @a)", dsl.UnknownAttributeError, "(it has none)"),
        ("(simplify x (Transpose @a :perm @p :perm @q) @a)", dsl.UnknownAttributeError, "twice"),
        ("(simplify x (Slice @a) @a)", dsl.ArityError, "Slice takes 3 to 5 inputs, got 1"),
        ("(simplify x (Relu @a @b) @a)", dsl.ArityError, "Relu takes 1 input, got 2"),
        ("(simplify x (Conv @a @w :group 1.5) @a)", dsl.AttributeTypeError, "takes an int"),
        ("(simplify x (Conv @a @w :auto_pad 0) @a)", dsl.AttributeTypeError, "takes a string"),
        (
            "(simplify x (Transpose @a :perm @p) (Conv @a @a :group @p))",
            dsl.AttributeTypeError,
            "@p holds a list of ints",
        ),
        ("(simplify x (Relu @a) (if (rank @a)) @a)", dsl.ArgumentError, "takes 2 arguments, got 1"),
        ("(simplify x (Transpose @a :perm @p) (if (rank @p 2)) @a)", dsl.ArgumentError, "term"),
        ("(simplify x (Relu @a) (if (rank @a @a)) @a)", dsl.ArgumentError, "argument 2"),
        ("(simplify x (Relu @a) (if (rank @b 2)) @a)", dsl.UnboundCaptureError, "@b is not bound"),
        ("(simplify x (Relu @a) (Relu @a :attrs @r))", dsl.UnboundCaptureError, "@r is not"),
        ("(simplify x (Relu @a :attrs @r) @r)", dsl.CaptureKindError, "cannot be used as a term"),
        ("(equal x (Relu @a) (Abs _))", dsl.PlacementError, "'_' cannot appear in an equal"),
        ("(equal x (Cast @a) (Cast @a :to 1))", dsl.MissingAttributeError, "needs :to"),
        ("(for op (Relu) (for op (Abs) (simplify x (op @a) @a)))", dsl.ForError, "shadows"),
    ],
)
def test_more_errors(text, cls, message):
    with pytest.raises(cls) as info:
        dsl.check(dsl.parse(text))
    assert message in str(info.value)


def test_unclosed_paren_names_the_innermost_open_one_not_the_end():
    """Of the parentheses left open at the end, the error points at the innermost; parentheses
    in comments and strings do not count."""
    text = ";; a comment (\n(simplify relu-relu ; (\n  (Relu (Relu @x)\n  @x\n\n"
    with pytest.raises(dsl.RulesSyntaxError) as e:
        dsl.parse(text, "f.rules")
    assert str(e.value).splitlines()[:3] == [
        "f.rules:3:3: error: '(' is never closed: the file ends at 4:5 "
        "(2 parentheses are open there)",
        "      (Relu (Relu @x)",
        "      ^",
    ]


def test_a_file_that_is_not_utf8_is_named_with_its_first_bad_byte(tmp_path):
    """A non-UTF-8 rules file gave lint a UnicodeDecodeError traceback, and check an error
    naming the list of paths it was given, not the file."""
    bad = tmp_path / "rules" / "latin1.rules"
    bad.parent.mkdir()
    bad.write_bytes(b"(simplify r\n  (Neg (Neg @x)) @x) ; caf\xe9\n")
    with pytest.raises(dsl.RulesError) as e:
        dsl.load_rules([tmp_path / "rules"])
    assert str(e.value) == (
        f"{bad}:2:27: error: not UTF-8 text: byte 0xe9 (invalid continuation byte)"
    )
