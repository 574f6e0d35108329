"""Captures and host calls: the `Scope` a left side binds, and the lowering of guard and
builder calls (`vocab.registry`) against it.

A capture has one role: `term` (a tensor value: `@x` at an operand position, or `Op@x`),
`attr` (an attribute value, including the `rest.a` captures of `:attrs @rest`) or `attrs` (the
`:attrs @rest` group itself). Registry parameters of kind `term` take a term capture; those of
kind `attr` take an attribute capture, a literal or (for builders) another builder call.
"""

from __future__ import annotations

from dataclasses import dataclass

from dsl import ast, ir
from dsl.errors import (
    ArgumentError,
    AttributeTypeError,
    CaptureKindError,
    PlacementError,
    UnboundCaptureError,
    UnknownBuilderError,
    UnknownGuardError,
    did_you_mean,
)
from dsl.ir import Span
from vocab.registry import LIST, TERM

ROLE_WORDS = {
    "term": "a term",
    "attr": "an attribute",
    "attrs": "an attribute group (:attrs)",
    "list": "a list of terms (@xs...)",
}


@dataclass(frozen=True)
class Binding:
    """Where and as what a capture is first bound; `kind` is the attribute kind for `attr`."""

    role: str
    span: Span
    kind: str | None = None


class Scope:
    """The captures bound by a left side, in binding order."""

    def __init__(self) -> None:
        self.bound: dict[str, Binding] = {}
        # `(with (@name VALUE))` bindings: name -> the IR result term or builder `Call`
        self.lets: dict[str, ir.Term | ir.Call] = {}

    def bind(self, name: str, role: str, span: Span, kind: str | None = None) -> None:
        """Bind `name` (again: a repeated capture means equal values). Raises CaptureKindError
        for a second role, AttributeTypeError for a second attribute kind."""
        old = self.bound.setdefault(name, Binding(role, span, kind))
        if old.role != role:
            raise CaptureKindError(
                span, f"@{name} {_was(old)}; it cannot also be {ROLE_WORDS[role]}"
            )
        if old.kind != kind:
            msg = f"@{name} {_was(old)} of kind {old.kind}; here it would be of kind {kind}"
            raise AttributeTypeError(span, msg)

    def use(self, name: str, role: str, span: Span) -> Binding:
        """The binding of a capture used in a result or guard as `role`. Raises
        UnboundCaptureError or CaptureKindError."""
        b = self.bound.get(name)
        if b is None:
            raise UnboundCaptureError(span, f"@{name} is not bound by the left side")
        if b.role != role:
            raise CaptureKindError(
                span, f"@{name} {_was(b)}; it cannot be used as {ROLE_WORDS[role]}"
            )
        return b

    def has(self, name: str) -> bool:
        """True if capture `name` is bound by the left side (in any role)."""
        return name in self.bound

    def names(self, role: str) -> tuple[str, ...]:
        """The captures of `role`, in binding order."""
        return tuple(n for n, b in self.bound.items() if b.role == role)


def _was(b: Binding) -> str:
    return f"is bound to {ROLE_WORDS[b.role]} at {b.span.line}:{b.span.col}"


def lower_guard(g: ast.GuardCall, scope: Scope, guards: dict) -> ir.Guard:
    """The IR of `(name ARG...)` / `(not (name ARG...))`. Raises UnknownGuardError,
    ArgumentError, UnboundCaptureError."""
    fn = guards.get(g.fn)
    if fn is None:
        raise UnknownGuardError(g.span, f"unknown guard '{g.fn}'{did_you_mean(g.fn, guards)}")
    if g.negate and not fn.negatable:
        raise ArgumentError(
            g.span,
            f"guard '{g.fn}' cannot be negated: it is false also where it cannot decide (an "
            "unknown shape, dtype or value), so (not ...) would hold on what is not known; "
            f"negatable guards: {', '.join(sorted(n for n, f in guards.items() if f.negatable))}",
        )
    args = _host_args(g.fn, "guard", fn, g.args, g.span, scope, None)
    return ir.Guard(g.fn, args, g.negate)


def lower_bound(g: ast.GuardCall, scope: Scope, bounds: dict) -> ir.Guard:
    """The IR of a `quant` rule's `(bound name ARG...)`. Raises UnknownGuardError (a name
    that is not in `bounds`), ArgumentError, UnboundCaptureError."""
    fn = bounds.get(g.fn)
    if fn is None:
        raise UnknownGuardError(g.span, f"unknown bound '{g.fn}'{did_you_mean(g.fn, bounds)}")
    return ir.Guard(g.fn, _host_args(g.fn, "bound", fn, g.args, g.span, scope, None))


def lower_bindings(bindings, scope: Scope, lower_term, ops, builders: dict) -> None:
    """Lower `(with (@name VALUE)...)` into `scope.lets`, in order (a binding may use the
    ones before it): an application whose head is a builder (and no op) is a builder call,
    anything else a result term (`lower_term`). Raises PlacementError for a name already
    bound, and what lowering the value raises."""
    for b in bindings:
        if scope.has(b.name) or b.name in scope.lets:
            msg = f"@{b.name} is already bound; a with binding needs a name of its own"
            raise PlacementError(b.span, msg)
        v = b.value
        if isinstance(v, ast.App) and ops.get(v.head) is None and v.head in builders:
            scope.lets[b.name] = lower_call(_as_call(v), scope, builders)
        else:
            scope.lets[b.name] = lower_term(v)


def _as_call(t: ast.App) -> ast.BuilderCall:
    args = tuple(_as_call(a) if isinstance(a, ast.App) else a for a in t.args)
    return ast.BuilderCall(t.head, args, span=t.span)


def lower_call(c: ast.BuilderCall, scope: Scope, builders: dict) -> ir.Call:
    """The IR of a builder call in a result. Raises UnknownBuilderError, ArgumentError,
    UnboundCaptureError."""
    fn = builders.get(c.fn)
    if fn is None:
        hint = did_you_mean(c.fn, builders)
        raise UnknownBuilderError(c.span, f"unknown builder '{c.fn}'{hint}")
    return ir.Call(c.fn, _host_args(c.fn, "builder", fn, c.args, c.span, scope, builders))


def _host_args(name, what, fn, args, span, scope, builders) -> tuple[ir.AttrExpr, ...]:
    params = fn.params
    if len(args) != len(params):
        n = len(params)
        msg = f"{what} '{name}' takes {n} argument{'s' * (n != 1)}, got {len(args)}"
        raise ArgumentError(span, msg)
    out = tuple(
        _host_arg(name, what, i, p, a, scope, builders)
        for i, (p, a) in enumerate(zip(params, args))
    )
    for i, (a, v) in enumerate(zip(args, out)):
        kind = fn.literal(i)
        if kind is None or not isinstance(v, ir.Literal) or isinstance(v.value, tuple):
            continue
        value = v.value
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            continue  # 2 is a float's value too
        if not isinstance(value, kind):
            msg = f"argument {i + 1} of {what} '{name}' must be {_KIND_WORDS[kind]}, not {value!r}"
            raise ArgumentError(a.span, msg)
    return out


_KIND_WORDS = {int: "an integer", float: "a number", str: "a string"}


_WANT = {TERM: "a term capture like @x", LIST: "a list capture like @xs..."}
_ROLE = {TERM: "term", LIST: "list"}


def _host_arg(name, what, i, param, a, scope, builders) -> ir.AttrExpr:
    want = _WANT.get(param, "an attribute capture or a literal")
    where = f"argument {i + 1} of {what} '{name}'"
    if isinstance(a, ast.CaptureRef) and a.name in scope.lets:
        value = scope.lets[a.name]
        if param in (TERM, LIST) or not isinstance(value, ir.Call):
            what = "a builder's value" if isinstance(value, ir.Call) else "a result term"
            msg = f"{where} must be {want}; @{a.name} is a with binding of {what}"
            if not isinstance(value, ir.Call):
                msg += " (not built before the result)"
            raise ArgumentError(a.span, msg)
        return value
    if isinstance(a, ast.CaptureRef):
        b = scope.bound.get(a.name)
        shown = f"@{a.name}" + ("..." if a.many else "")
        if b is None:
            raise UnboundCaptureError(a.span, f"{shown} is not bound by the left side")
        if b.role != _ROLE.get(param, "attr") or a.many != (b.role == "list"):
            raise ArgumentError(a.span, f"{where} must be {want}; @{a.name} {_was(b)}")
        return ir.ListCapture(a.name) if a.many else ir.Capture(a.name)
    if param in (TERM, LIST):
        raise ArgumentError(a.span, f"{where} must be {want}")
    if isinstance(a, ast.Number | ast.String):
        return ir.Literal(a.value)
    if isinstance(a, ast.ListLit):
        return ir.Literal(tuple(n.value for n in a.items))
    if isinstance(a, ast.BuilderCall) and builders is not None:
        return lower_call(a, scope, builders)
    raise ArgumentError(a.span, f"{where} must be {want}")
