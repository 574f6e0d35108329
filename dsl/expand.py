"""`for` expansion: a file's forms -> a flat list of rules, each with its ruleset.

`(for op (Relu Floor) FORM...)` repeats FORM once per operator: an application whose head is
`op` gets the operator as head (keeping its `:c` and `@bind` suffixes), and `{op}` in a rule
name becomes the operator's name in kebab case (`ReduceMean` -> `reduce-mean`), so names stay
kebab-case. `(for op UNARY_ELEMENTWISE FORM...)` iterates over a family of
`vocab.ops.FAMILIES`; a family may also stand in the list (`(for op (SOFTMAX Gelu) ...)`).
`for` nests; an inner `for` may not reuse an outer variable.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass

from dsl import ast
from dsl.errors import ForError
from vocab.ops import FAMILIES

_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class FlatRule:
    """One rule after `for` expansion: the form with operators and name substituted."""

    form: ast.Simplify | ast.Equal
    ruleset: str
    declared: ast.Ruleset | None = None  # the `(ruleset ...)` form in force, if any


def flatten(file: ast.File) -> list[FlatRule]:
    """The rules of `file` in source order, `for` expanded, each with the ruleset in force
    (`default` before any `(ruleset NAME)`). Raises `ForError` for a `{VAR}` left in a rule
    name or a shadowed `for` variable."""
    out: list[FlatRule] = []
    ruleset, declared = "default", None
    for form in file.forms:
        if isinstance(form, ast.Ruleset):
            ruleset, declared = form.name, form
        elif not isinstance(form, ast.OpDecl):  # (op declarations: dsl.declare)
            out += [
                FlatRule(a, ruleset, declared) for f in _expand(form, {}) for a in alternatives(f)
            ]
    for r in out:
        left = _PLACEHOLDER.search(r.form.name)
        if left:
            msg = f"rule name '{r.form.name}' uses {{{left[1]}}} outside a 'for {left[1]}'"
            raise ForError(r.form.span, msg)
    return out


def alternatives(form: ast.Simplify | ast.Equal) -> list[ast.Simplify | ast.Equal]:
    """The rules a form stands for once its pattern's choices are made: `(or P1 P2 ...)` is
    each alternative, `Op?` the application or its first input in its place. The first keeps
    the rule's name, the others get `-alt1`, `-alt2`, ... A guard that uses a capture which
    another alternative binds but this one does not is left out of this one: `(or absent @z)`
    with `(if (all-equal @z 0))` matches an absent input or a constant zero. Raises ForError
    for a choice outside a `simplify` pattern."""
    for side, t in (("result", form.rhs), ("pattern of an equal rule", form.lhs)):
        if side == "result" or isinstance(form, ast.Equal):
            bad = _first_choice(t)
            if isinstance(bad, ast.App) and side == "result" and isinstance(form, ast.Simplify):
                bad = None if len(bad.args) == 2 else bad  # `Op?` of two inputs: see _prune
            if bad is not None:
                what = "'or'" if isinstance(bad, ast.Alt) else f"'{bad.head}?'"
                raise ForError(bad.span, f"{what} is only allowed in a simplify rule's pattern")
    if isinstance(form, ast.Equal):
        return [form]
    if _first_choice(form.lhs) is None:
        return [dataclasses.replace(form, rhs=_prune(form.rhs, set()))]
    lhss = _choices(form.lhs)
    bound = [_captures(t) for t in lhss]
    some = set.union(*bound)
    out = []
    for i, (lhs, mine) in enumerate(zip(lhss, bound)):
        guards = tuple(g for g in form.guards if not (_guard_captures(g) & (some - mine)))
        name = form.name if i == 0 else f"{form.name}-alt{i}"
        rhs = _prune(form.rhs, some - mine)
        out.append(dataclasses.replace(form, name=name, lhs=lhs, guards=guards, rhs=rhs))
    return out


def _prune(t, unbound: set[str]):
    """The result `t` for an alternative that does not bind `unbound`: each use of one of
    them becomes `ast.Pruned`, which lowering turns into an absent optional input, leaving
    out the terms that need it (`dsl.lower.lower_right`)."""
    if isinstance(t, ast.CaptureRef):
        return ast.Pruned(span=t.span) if t.name in unbound else t
    if isinstance(t, ast.Roots):
        return dataclasses.replace(t, terms=tuple(_prune(a, unbound) for a in t.terms))
    if not isinstance(t, ast.App):
        return t
    return dataclasses.replace(t, args=tuple(_prune(a, unbound) for a in t.args))


def _first_choice(t: ast.Term):
    if isinstance(t, ast.Roots):
        return next((c for a in t.terms if (c := _first_choice(a)) is not None), None)
    if isinstance(t, ast.Alt) or (isinstance(t, ast.App) and t.optional):
        return t
    if isinstance(t, ast.App):
        return next((c for a in t.args if (c := _first_choice(a)) is not None), None)
    return None


def _choices(t: ast.Term) -> list[ast.Term]:
    if isinstance(t, ast.Alt):
        return [c for o in t.options for c in _choices(o)]
    if isinstance(t, ast.Roots):
        return [dataclasses.replace(t, terms=c) for c in itertools.product(*map(_choices, t.terms))]
    if not isinstance(t, ast.App):
        return [t]
    combos = itertools.product(*(_choices(a) for a in t.args))
    out = [dataclasses.replace(t, args=tuple(c), optional=False) for c in combos]
    if t.optional:
        out += _choices(t.args[0])
    return out


def _captures(t: ast.Term) -> set[str]:
    if isinstance(t, ast.CaptureRef):
        return {t.name}
    if isinstance(t, ast.Roots):
        return set().union(*map(_captures, t.terms))
    if not isinstance(t, ast.App):
        return set()
    out = {t.bind} if t.bind else set()
    out |= {a.value.name for a in t.attrs if isinstance(a.value, ast.CaptureRef)}
    for a in t.args:
        out |= _captures(a)
    return out


def _guard_captures(g: ast.GuardCall) -> set[str]:
    return {a.name for a in g.args if isinstance(a, ast.CaptureRef)}


def kebab(op: str) -> str:
    """`ReduceMean` -> `reduce-mean`, `Relu` -> `relu`: an op name as part of a rule name."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "-", op).lower()


def _expand(form: ast.RuleForm, env: dict[str, str]) -> list[ast.Simplify | ast.Equal]:
    if not isinstance(form, ast.For):
        return [_substitute_rule(form, env)] if env else [form]
    if form.var in env:
        raise ForError(form.span, f"'for {form.var}' shadows an enclosing 'for {form.var}'")
    out = []
    for op in _operators(form):
        inner = {**env, form.var: env.get(op, op)}
        for body in form.body:
            out += _expand(body, inner)
    return out


_FAMILY_NAME = re.compile(r"[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$")


def _operators(form: ast.For) -> list[str]:
    """The operators a `for` iterates over: its items, a family name (`UNARY_ELEMENTWISE`,
    `vocab.ops.FAMILIES`) standing for its ops. Raises ForError for an unknown family."""
    out: list[str] = []
    for item in form.ops:
        if item in FAMILIES:
            out += [op for op in FAMILIES[item] if op not in out]
        elif _FAMILY_NAME.match(item):
            known = ", ".join(sorted(FAMILIES))
            raise ForError(form.span, f"unknown op family '{item}' (families: {known})")
        elif item not in out:
            out.append(item)
    return out


def _substitute_rule(form: ast.Simplify | ast.Equal, env: dict[str, str]):
    name = _PLACEHOLDER.sub(lambda m: kebab(env[m[1]]) if m[1] in env else m[0], form.name)
    out = dataclasses.replace(
        form, name=name, lhs=_substitute(form.lhs, env), rhs=_substitute(form.rhs, env)
    )
    if isinstance(form, ast.Simplify) and form.bindings:
        bindings = tuple(
            dataclasses.replace(b, value=_substitute(b.value, env)) for b in form.bindings
        )
        out = dataclasses.replace(out, bindings=bindings)
    return out


def _substitute(t: ast.Term, env: dict[str, str]) -> ast.Term:
    if isinstance(t, ast.Alt):
        return dataclasses.replace(t, options=tuple(_substitute(o, env) for o in t.options))
    if isinstance(t, ast.Roots):
        return dataclasses.replace(t, terms=tuple(_substitute(o, env) for o in t.terms))
    if not isinstance(t, ast.App):
        return t
    args = tuple(_substitute(a, env) for a in t.args)
    return dataclasses.replace(t, head=env.get(t.head, t.head), args=args)
