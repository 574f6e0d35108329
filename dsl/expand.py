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


def flatten(file: ast.File) -> list[FlatRule]:
    """The rules of `file` in source order, `for` expanded, each with the ruleset in force
    (`default` before any `(ruleset NAME)`). Raises `ForError` for a `{VAR}` left in a rule
    name or a shadowed `for` variable."""
    out: list[FlatRule] = []
    ruleset = "default"
    for form in file.forms:
        if isinstance(form, ast.Ruleset):
            ruleset = form.name
        else:
            out += [FlatRule(f, ruleset) for f in _expand(form, {})]
    for r in out:
        left = _PLACEHOLDER.search(r.form.name)
        if left:
            msg = f"rule name '{r.form.name}' uses {{{left[1]}}} outside a 'for {left[1]}'"
            raise ForError(r.form.span, msg)
    return out


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
    return dataclasses.replace(
        form, name=name, lhs=_substitute(form.lhs, env), rhs=_substitute(form.rhs, env)
    )


def _substitute(t: ast.Term, env: dict[str, str]) -> ast.Term:
    if not isinstance(t, ast.App):
        return t
    args = tuple(_substitute(a, env) for a in t.args)
    return dataclasses.replace(t, head=env.get(t.head, t.head), args=args)
