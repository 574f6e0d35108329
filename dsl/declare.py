"""Op declarations: `(op DOMAIN.NAME (INPUT...) [:attr (NAME KIND [DEFAULT])]... [:cost CLASS]
BODY)` forms -> `vocab.declared.Declaration`s, registered in the op table.

The inputs bind term captures (`@b?`: an optional input), the attributes attribute captures,
and BODY is lowered as a result over them (`dsl.lower.lower_right`): registry ops only, no
builders, a capture that is neither an input nor an attribute is an error, and an optional
input may only stand in an optional input slot of a body op (when it is absent the slot is
empty, which only an optional slot allows). The body becomes body nodes, a repeated subterm
once. Variadic inputs (`@xs...`) and several outputs are not declarable: an ONNX function has
a fixed list of formal inputs, and a body is one result term.

Declarations are registered before the rules of the same check are lowered, so a rule may use
an op declared in any file checked with it (`dsl.check`).
"""

from __future__ import annotations

from collections.abc import Iterable

from dsl import ast, ir
from dsl.errors import (
    AttributeTypeError,
    OpDeclarationError,
    PlacementError,
    RulesError,
    UnboundCaptureError,
)
from dsl.host import Scope
from dsl.lower import Lowering, literal, lower_right
from vocab.declared import AttrRef, BodyNode, Declaration, DeclarationError, declare
from vocab.ops import ATTR_KINDS, COST_CLASSES, MIN_OPSET, REQUIRED, AttrSpec, OpSpec


def declare_ops(files: Iterable[ast.File], lw: Lowering) -> list[RulesError]:
    """Declare the ops of every `(op ...)` form of `files` in `lw.ops`, in order; returns the
    errors (a form with an error declares nothing)."""
    errors: list[RulesError] = []
    for f in files:
        for form in f.forms:
            if isinstance(form, ast.OpDecl):
                try:
                    declare_op(form, lw)
                except RulesError as e:
                    errors.append(e)
    return errors


def declare_op(form: ast.OpDecl, lw: Lowering) -> Declaration:
    """Lower one `(op ...)` form and declare it (`vocab.declared.declare`). Raises
    OpDeclarationError, or the error of its body (UnknownOperatorError, ...)."""
    domain, _, name = form.name.rpartition(".")
    if "#" in form.name:
        raise OpDeclarationError(form.span, "a declared op has one output; its name has no #K")
    scope = Scope()
    inputs = _inputs(form, scope)
    attrs = tuple(sorted((_attr(form, a, scope) for a in form.attrs), key=lambda a: a.name))
    cost = form.cost or "kernel"
    if cost not in COST_CLASSES:
        msg = f"unknown cost class '{cost}' (classes: {', '.join(COST_CLASSES)})"
        raise OpDeclarationError(form.span, msg)
    optional = {i.name for i in form.inputs if i.optional}
    _check_body(form, form.body, scope, optional, lw)
    body = _body_nodes(lower_right(form.body, scope, lw))
    spec = OpSpec(
        name,
        tuple(i.name for i in inputs),
        sum(not i.optional for i in inputs),
        attrs,
        cost=cost,
        since=1,
        domain=domain,
        version=1,
        function=True,
        declared=True,
    )
    first = [lw.ops.first_opset(b.op) for b in body if not lw.ops.get(b.op).domain]
    d = Declaration(spec, body, max([MIN_OPSET, *first]), origin=str(form.span))
    try:
        declare(d)
    except DeclarationError as e:
        raise OpDeclarationError(form.span, str(e)) from None
    return d


def _inputs(form: ast.OpDecl, scope: Scope) -> tuple[ast.DeclInput, ...]:
    seen_optional = False
    for i in form.inputs:
        if i.many:
            msg = (
                f"@{i.name}... : a declared op cannot have a variadic input (an ONNX function"
                " has a fixed list of inputs)"
            )
            raise OpDeclarationError(i.span, msg)
        if scope.has(i.name):
            raise OpDeclarationError(i.span, f"input @{i.name} is written twice")
        if seen_optional and not i.optional:
            msg = f"required input @{i.name} after an optional one (write optional inputs last)"
            raise OpDeclarationError(i.span, msg)
        seen_optional |= i.optional
        scope.bind(i.name, "term", i.span)
    return form.inputs


def _attr(form: ast.OpDecl, a: ast.DeclAttr, scope: Scope) -> AttrSpec:
    if a.kind not in ATTR_KINDS or a.kind == "tensor":
        kinds = ", ".join(k for k in ATTR_KINDS if k != "tensor")
        msg = f"attribute {a.name} of unknown kind '{a.kind}' (kinds: {kinds})"
        raise OpDeclarationError(a.span, msg)
    if scope.has(a.name):
        raise OpDeclarationError(a.span, f"{a.name} is already an input or attribute")
    scope.bind(a.name, "attr", a.span, a.kind)
    if a.default is None:
        return AttrSpec(a.name, a.kind, REQUIRED)
    at = ast.Attr(a.name, a.default, span=a.default.span)
    return AttrSpec(a.name, a.kind, literal(ast.App(form.name, ()), at, a.kind).value)


def _check_body(form: ast.OpDecl, t: ast.Term, scope: Scope, optional: set, lw: Lowering):
    """What `lower_right` would accept in a rule's result but a body may not hold: a capture
    that is no input or attribute, a builder, a declared op, an optional input at a required
    slot; and a body that is not an application."""
    if t is form.body and not isinstance(t, ast.App):
        raise PlacementError(t.span, "a body must be an operator application")
    if isinstance(t, ast.CaptureRef) and not scope.has(t.name):
        msg = f"@{t.name} is neither an input nor an attribute of {form.name}"
        raise UnboundCaptureError(t.span, msg)
    if not isinstance(t, ast.App):
        return
    spec = lw.ops.get(t.head)
    if spec is not None and spec.declared:
        msg = f"{t.head} is a declared op; a body is written in registry ops"
        raise OpDeclarationError(t.span, msg)
    for i, a in enumerate(t.args):
        if isinstance(a, ast.CaptureRef) and a.name in optional and spec and i < spec.n_required:
            msg = (
                f"optional input @{a.name} is input {i + 1} of {t.head}, which is required"
                " (an absent optional input can only fill an optional slot)"
            )
            raise PlacementError(a.span, msg)
        _check_body(form, a, scope, optional, lw)
    for at in t.attrs:
        v = at.value
        if isinstance(v, ast.BuilderCall):
            raise PlacementError(v.span, f"a body cannot call builder '{v.fn}'")
        if isinstance(v, ast.CaptureRef) and not scope.has(v.name):
            msg = f"@{v.name} is neither an input nor an attribute of {form.name}"
            raise UnboundCaptureError(v.span, msg)
    if t.rest is not None:
        raise AttributeTypeError(t.rest.span, "a body cannot copy attributes with :attrs")


def _body_nodes(root: ir.Term) -> tuple[BodyNode, ...]:
    """The nodes of lowered body `root`, children first, a repeated subterm once. Values are
    named by number (a capture name cannot start with a digit, so no input is shadowed)."""
    nodes: list[BodyNode] = []
    seen: dict[tuple, str] = {}

    def walk(t: ir.Term) -> str:
        if isinstance(t, ir.Capture):
            return t.name
        if isinstance(t, ir.Absent):
            return ""
        ins = tuple(walk(a) for a in t.args)
        while ins and not ins[-1]:
            ins = ins[:-1]
        attrs = tuple(
            (a, AttrRef(v.name) if isinstance(v, ir.Capture) else v.value) for a, v in t.attrs
        )
        key = (t.op, ins, attrs)
        if key not in seen:
            seen[key] = str(len(nodes))
            nodes.append(BodyNode(t.op, ins, seen[key], attrs))
        return seen[key]

    walk(root)
    return tuple(nodes)
