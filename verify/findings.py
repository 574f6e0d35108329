"""What the rule-set lint's checks share: the kinds of finding, `Finding`, and the guard
helpers (`contradiction`, `guard_text`) and rule naming (`source_name`) that `verify.lint`,
`verify.lint_growth` and `verify.lint_pairs` all use.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from dsl.ir import Guard, Rule, Span
from verify.dtypes import FLOATS

KINDS = ("duplicate", "shadowed", "never-fires", "grows", "critical-pair")


@dataclass(frozen=True)
class Finding:
    """One finding: `kind` (one of `KINDS`), the rule it is about and where, a one-line
    `reason`, and `allowed`: the acknowledgement's reason ("" if not acknowledged)."""

    kind: str
    rule: str
    span: Span
    reason: str
    allowed: str = ""
    other: str = ""

    def line(self) -> str:
        """The finding as one line: `file:line: kind: rule: reason`, plus the acknowledgement."""
        note = f" (allowed: {self.allowed})" if self.allowed else ""
        return f"{self.span.file}:{self.span.line}: {self.kind}: {self.rule}: {self.reason}{note}"


def guard_text(g: Guard) -> str:
    """Guard `g` as written in a rule: `(fn @a @b ...)`, or `(not ...)` when negated."""
    args = " ".join(f"@{a.name}" if hasattr(a, "name") else repr(a.value) for a in g.args)
    body = f"({g.fn} {args})"
    return f"(not {body})" if g.negate else body


def contradiction(guards) -> str:
    """Why two of `guards` cannot hold together ("" if none found): a guard and its
    negation, two ranks or dtypes for one value, a rank below a minimum rank, two fill
    values, a float guard against an integer dtype."""
    for g, h in itertools.combinations(guards, 2):
        same_args = g.args == h.args
        if g.fn == h.fn and same_args and g.negate != h.negate:
            return f"{guard_text(g)} and {guard_text(h)}"
        if g.negate or h.negate or not g.args or not h.args or g.args[0] != h.args[0]:
            continue
        pair = {g.fn: g, h.fn: h}
        lit = lambda x: getattr(x.args[-1], "value", None)  # noqa: E731
        if lit(g) is None or lit(h) is None:
            continue
        if g.fn == h.fn and g.fn in ("rank", "has-dtype", "all-equal") and lit(g) != lit(h):
            return f"{guard_text(g)} and {guard_text(h)}"
        if {"rank", "rank-at-least"} <= pair.keys() and lit(pair["rank"]) < lit(
            pair["rank-at-least"]
        ):
            return f"{guard_text(g)} and {guard_text(h)}"
        if {"is-float", "has-dtype"} <= pair.keys() and lit(pair["has-dtype"]) not in FLOATS:
            return f"{guard_text(g)} and {guard_text(h)}"
    return ""


def source_name(r: Rule) -> str:
    """The name of the rule a directed rule comes from (an `equal` rule's reverse included)."""
    return r.name.removesuffix(" (reverse)")
