"""Check parsed `.rules` files and turn them into Rule IR (`dsl.ir`).

Op declarations (`(op ...)`) are registered first (`dsl.declare`, into `vocab.ops.OPS`); `for`
is expanded (`dsl.expand`), every term is lowered against the op table (`dsl.lower`), guards
and builder calls against the registry (`dsl.host`), and `:c` is expanded into one rule per
operand order: the written order keeps the rule's name, the others get `-c1`, `-c2`, ... in a
fixed order. Errors are collected rule by rule (see `dsl.errors`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from itertools import product

from dsl import ast, ir
from dsl.declare import declare_ops
from dsl.errors import (
    DuplicateRuleError,
    EqualRuleError,
    PlacementError,
    RulesError,
    RulesErrors,
    RulesetNeedsError,
    UnboundCaptureError,
)
from dsl.expand import FlatRule, flatten
from dsl.host import Scope, lower_bindings, lower_bound, lower_guard
from dsl.lower import PRUNED, Lowering, lower_left, lower_right
from vocab.ops import MAX_OPSET, MIN_OPSET, OPS, ORT_DOMAINS, OpTable
from vocab.registry import BOUNDS, BUILDERS, GUARDS


def check(
    files: ast.File | Iterable[ast.File],
    ops: OpTable = OPS,
    guards: dict | None = None,
    builders: dict | None = None,
) -> list[ir.Rule]:
    """Check one parsed file, or several together (rule names must be unique across them).

    ops: the op table; guards / builders: name -> `vocab.registry.HostFn` (default: the
    registry's `GUARDS` and `BUILDERS`).
    Returns the rules in source order, `for` and `:c` expanded.
    Raises the one `RulesError` subclass found, or `RulesErrors` holding all of them.
    """
    files = [files] if isinstance(files, ast.File) else list(files)
    lw = Lowering(ops, BUILDERS if builders is None else builders)
    guards = GUARDS if guards is None else guards
    rules: list[ir.Rule] = []
    errors: list[RulesError] = declare_ops(files, lw)  # before any rule uses the ops
    first: dict[str, ir.Span] = {}
    for f in files:
        try:
            flat = flatten(f)
        except RulesError as e:
            errors.append(e)
            continue
        declared = {id(fr.declared): fr.declared for fr in flat if fr.declared is not None}
        bad = {}
        for form in declared.values():
            try:
                _check_declared(form, lw.ops)
            except RulesError as e:
                errors.append(e)
                bad[id(form)] = True
        for fr in flat:
            if id(fr.declared) in bad:
                continue
            try:
                new = check_rule(fr, lw, guards)
                for r in new:
                    _check_needs(r, fr.declared, lw.ops)
            except RulesError as e:
                errors.append(e)
                continue
            for r in new:
                if r.name in first:
                    msg = f"duplicate rule name '{r.name}' (first defined at {first[r.name]})"
                    if first[r.name] == r.span:  # one rule written once: a `for` made both
                        msg = (
                            f"duplicate rule name '{r.name}': the `for` around it makes one rule "
                            "per operator, and {VAR} in its name (VAR the for's variable) tells "
                            "them apart"
                        )
                    errors.append(DuplicateRuleError(r.span, msg))
                else:
                    first[r.name] = r.span
                    rules.append(r)
    if errors:
        sources = {f.path: f.source for f in files}
        located = [e.locate(sources) for e in errors]
        raise located[0] if len(located) == 1 else RulesErrors(located)
    return rules


def check_rule(fr: FlatRule, lw: Lowering, guards: dict) -> list[ir.Rule]:
    """The IR rules of one expanded `simplify` or `equal` form (several when `:c` is used).
    Raises the first `RulesError` found in it."""
    form = fr.form
    if form.fp == "quant" and (isinstance(form, ast.Equal) or isinstance(form.lhs, ast.Roots)):
        msg = "a :fp quant rule is a simplify rule of one root (its bound is per output)"
        raise PlacementError(form.span, msg)
    if isinstance(form, ast.Equal):
        return [_check_equal(fr, lw)]
    if isinstance(form.lhs, ast.Roots) or isinstance(form.rhs, ast.Roots):
        return _check_roots(fr, lw, guards)
    if not isinstance(form.lhs, ast.App):
        raise PlacementError(form.lhs.span, "a rule's left side must be an operator application")
    scope = Scope()
    lhss = lower_left(form.lhs, scope, lw)
    _bindings(form, scope, lw)
    gs = tuple(lower_guard(g, scope, guards) for g in form.guards)
    bound = _bound(form, scope)
    rhs = lower_right(form.rhs, scope, lw)
    if rhs is PRUNED:
        msg = (
            f"the result needs a capture that this alternative of the pattern ({form.name})"
            " does not bind"
        )
        raise UnboundCaptureError(form.rhs.span, msg)
    names = [form.name] + [f"{form.name}-c{i}" for i in range(1, len(lhss))]
    rules = [_rule(fr, name, "simplify", lhs, rhs, gs, scope) for name, lhs in zip(names, lhss)]
    return [dataclasses.replace(r, bound=bound) for r in rules]


def _bound(form: ast.Simplify, scope: Scope) -> ir.Guard | None:
    """The lowered `(bound ...)` of a `quant` rule; a quant rule must state one, and no other
    rule may (its class's tolerance is its bound). Raises PlacementError."""
    if form.fp == "quant" and form.bound is None:
        msg = f"rule {form.name} is :fp quant: it must state its error with (bound NAME ARG...)"
        raise PlacementError(form.span, msg)
    if form.bound is None:
        return None
    if form.fp != "quant":
        msg = "(bound ...) belongs to a :fp quant rule; other classes have their tolerances"
        raise PlacementError(form.bound.span, msg)
    return lower_bound(form.bound, scope, BOUNDS)


def _check_roots(fr: FlatRule, lw: Lowering, guards: dict) -> list[ir.Rule]:
    """A multi-root rule: `(roots P1 P2 ...)` matched together, `(roots R1 R2 ...)` their
    results, one per root. Roots after the first bind `_rootK` unless they are `Op@name`."""
    form = fr.form
    lhs, rhs = form.lhs, form.rhs
    if not isinstance(lhs, ast.Roots) or not isinstance(rhs, ast.Roots):
        one, other = (rhs, lhs) if isinstance(lhs, ast.Roots) else (lhs, rhs)
        n = len(other.terms)
        msg = f"a pattern of {n} roots needs {n} results, written (roots R1 R2 ...)"
        if not isinstance(lhs, ast.Roots):
            msg = "(roots ...) as a result needs a pattern of several roots, (roots P1 P2 ...)"
        raise PlacementError(one.span, msg)
    if len(lhs.terms) != len(rhs.terms):
        msg = f"a pattern of {len(lhs.terms)} roots needs {len(lhs.terms)} results, got"
        raise PlacementError(rhs.span, f"{msg} {len(rhs.terms)}")
    scope = Scope()
    variants = []
    for k, t in enumerate(lhs.terms):
        if not isinstance(t, ast.App):
            raise PlacementError(t.span, "each root of a pattern must be an operator application")
        if k and t.bind is None:
            t = dataclasses.replace(t, bind=f"_root{k}")
        variants.append(lower_left(t, scope, lw))
    _bindings(form, scope, lw)
    gs = tuple(lower_guard(g, scope, guards) for g in form.guards)
    results = tuple(lower_right(t, scope, lw) for t in rhs.terms)
    for t, result in zip(rhs.terms, results):
        if result is PRUNED:
            msg = f"the result needs a capture that the pattern ({form.name}) does not bind"
            raise UnboundCaptureError(t.span, msg)
    combos = list(product(*variants))
    names = [form.name] + [f"{form.name}-c{i}" for i in range(1, len(combos))]
    return [
        dataclasses.replace(
            _rule(fr, name, "simplify", c[0], results[0], gs, scope),
            roots=tuple(c[1:]),
            results=results[1:],
        )
        for name, c in zip(names, combos)
    ]


def _bindings(form: ast.Simplify, scope: Scope, lw: Lowering) -> None:
    lower_bindings(form.bindings, scope, lambda t: lower_right(t, scope, lw), lw.ops, lw.builders)


def _check_equal(fr: FlatRule, lw: Lowering) -> ir.Rule:
    form = fr.form
    sides = []
    for t in (form.lhs, form.rhs):
        if not isinstance(t, ast.App):
            msg = "both sides of an equal rule must be operator applications"
            raise PlacementError(t.span, msg)
        scope = Scope()
        (term,) = lower_left(t, scope, lw, equal=True)
        sides.append((term, scope))
    (lhs, left), (rhs, right) = sides
    for here, there, side in ((left, right, "left"), (right, left, "right")):
        for name, b in here.bound.items():
            if name not in there.bound or there.bound[name].role != b.role:
                shown = name.split(".")[0]
                msg = (
                    f"@{shown} is bound only on the {side} side; both sides of an equal rule"
                    " must bind the same captures"
                )
                raise EqualRuleError(b.span, msg)
    return _rule(fr, form.name, "equal", lhs, rhs, (), left)


def _domains(ops: OpTable) -> set[str]:
    return {n.rsplit(".", 1)[0] for n in ops.names() if "." in n} | set(ORT_DOMAINS)


def _check_declared(form: ast.Ruleset, ops: OpTable) -> None:
    """A `(ruleset NAME :opset N :domain D)` form's own errors: an unknown domain or opset."""
    for d in form.domains:
        if d not in _domains(ops):
            known = ", ".join(sorted(_domains(ops)))
            raise RulesetNeedsError(form.span, f"unknown domain '{d}' (domains: {known})")
    if form.opset is not None and not MIN_OPSET <= form.opset <= MAX_OPSET:
        msg = f":opset {form.opset} is outside the op table's opsets {MIN_OPSET} to {MAX_OPSET}"
        raise RulesetNeedsError(form.span, msg)


def _check_needs(r: ir.Rule, form: ast.Ruleset | None, ops: OpTable) -> None:
    """What `r` writes must be what its ruleset declares: an op of another domain needs
    `:domain`, and with `:opset N` every op it writes must exist at opset N."""
    writes = r.rhs_ops | (r.lhs_ops if r.kind == "equal" else frozenset())
    domains = form.domains if form is not None else ()
    name = form.name if form is not None else "default"
    for op in sorted(writes):
        spec = ops.get(op)
        # a declared op needs no domain: the exporter writes its function into the model
        if spec.domain not in ("", "ai.onnx", *domains) and not spec.declared:
            msg = (
                f"rule {r.name} writes {op}, but its ruleset '{name}' does not declare the"
                f" domain (write (ruleset {name} :domain {spec.domain}))"
            )
            raise RulesetNeedsError(r.span, msg)
        if form is not None and form.opset is not None and spec.domain in ("", "ai.onnx"):
            if ops.get(op, form.opset) is None:
                first = ops.first_opset(op)
                msg = (
                    f"rule {r.name} writes {op}, which opset {form.opset} does not have (it"
                    f" is in opset {first} and later), but its ruleset '{name}' declares"
                    f" :opset {form.opset}"
                )
                raise RulesetNeedsError(r.span, msg)


def _rule(fr: FlatRule, name, kind, lhs, rhs, guards, scope: Scope) -> ir.Rule:
    declared = fr.declared
    return ir.Rule(
        name=name,
        kind=kind,
        lhs=lhs,
        rhs=rhs,
        guards=guards,
        ruleset=fr.ruleset,
        fp=fr.form.fp or "exact",
        span=fr.form.span,
        term_captures=scope.names("term"),
        attr_captures=scope.names("attr"),
        lists=scope.names("list"),
        opset=(declared.opset or 0) if declared is not None else 0,
        domains=declared.domains if declared is not None else (),
        sums=declared.sums if declared is not None else "",
    )
