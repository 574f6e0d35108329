"""Rule IR: what `dsl.check` produces and `engine.emit` and `verify` consume.

A checked rule is fully explicit: `:c` and `for` are expanded, every operator node lists all of
its input slots (absent optional inputs are `Absent`) and all of its attributes (an attribute
the rule did not write is its op-table default, or, under `:attrs @rest`, the capture
`Capture("rest.NAME")`). Nothing here refers back to the parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class Span:
    """A location in a `.rules` file: 1-based line and column."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


@dataclass(frozen=True)
class Capture:
    """`@name`: binds a value (tensor or attribute) on the left, refers to it on the right."""

    name: str


@dataclass(frozen=True)
class ListCapture:
    """`@name...`: a list capture. On the left, in a variadic input's slots, it binds a run of
    zero or more values; in a result it spreads them into a variadic input; as a guard
    argument it is the list. `dsl.lists` turns a rule with list captures into rules with one
    capture `name.K` per item (`Rule.items`)."""

    name: str


@dataclass(frozen=True)
class Wildcard:
    """`_`: matches anything, binds nothing."""


@dataclass(frozen=True)
class Absent:
    """An optional operator input that is not present."""


@dataclass(frozen=True)
class Literal:
    """An attribute value written in the rule: int, float, str, or tuple of ints/floats."""

    value: Any


@dataclass(frozen=True)
class Call:
    """A computed attribute value in a result: a registered builder applied to arguments."""

    fn: str
    args: tuple[AttrExpr, ...]


@dataclass(frozen=True)
class OpNode:
    """An operator application. `args` has one entry per op-table input slot; `attrs` has one
    `(name, value)` entry per op-table attribute, in op-table order. `bind` is the capture
    name of `(Op@name ...)`, which binds the whole application (left side only)."""

    op: str
    args: tuple[Term, ...]
    attrs: tuple[tuple[str, AttrExpr], ...]
    bind: str | None = None


Term = OpNode | Capture | ListCapture | Wildcard | Absent
AttrExpr = Literal | Capture | ListCapture | Wildcard | Call


@dataclass(frozen=True)
class Guard:
    """`(if (fn args...))`: a registered predicate over captures and literals."""

    fn: str
    args: tuple[AttrExpr, ...]
    negate: bool = False


@dataclass(frozen=True)
class Rule:
    """One directed rewrite `lhs -> rhs`, valid when every guard holds.

    name: kebab-case, unique in its rule set (`for` and `:c` expansion add suffixes).
    kind: `simplify` (directed) or `equal` (an identity; it compiles to both directions).
    ruleset: the `(ruleset NAME)` in force where the rule was written.
    fp: numeric class: `exact`, `reassoc`, `approx` or `quant`.
    bound: a `quant` rule's error bound, a call of `vocab.registry.BOUNDS` over its captures
        (the largest |lhs - rhs| per output element that `verify` allows); None otherwise.
    term_captures / attr_captures: the captures bound on the left, split by what they bind.
    lists: the list captures (`@xs...`) bound on the left. A rule with lists is a template:
    `dsl.lists` makes the rules the engine runs and the rules `verify` draws from it.
    items: in such a rule, list name -> the term captures of its items, in order (an item
        the engine binds to an absent slot is not part of the list).
    instance: what tells apart the rules `dsl.lists` makes of one template (the item counts
        it fixed), so that each gets its own egglog relation; empty for a written rule.
    opset / domains: what the rule's ruleset declares its results need (`(ruleset NAME :opset N
        :domain D)`): the lowest default-domain opset (0: none), the other domains.
    sums: the ruleset's `:sums` (`dsl.ast.Ruleset`): `int32` for results exact only where the
        runtime sums uint8-by-int8 products in int32; "" otherwise.
    roots / results: a multi-root rule's other pattern roots and their results (`(roots ...)`
        on both sides; `lhs` and `rhs` are the first). Each extra root binds its match with
        `OpNode.bind` (`_rootK` unless the rule names it), so it is a term capture.
    """

    name: str
    kind: str
    lhs: Term
    rhs: Term
    guards: tuple[Guard, ...]
    ruleset: str
    fp: str
    span: Span
    term_captures: tuple[str, ...]
    attr_captures: tuple[str, ...]
    lists: tuple[str, ...] = ()
    items: tuple[tuple[str, tuple[str, ...]], ...] = ()
    instance: str = ""
    roots: tuple[Term, ...] = ()
    results: tuple[Term, ...] = ()
    opset: int = 0
    domains: tuple[str, ...] = ()
    bound: Guard | None = None
    sums: str = ""

    @cached_property
    def lhs_ops(self) -> frozenset[str]:
        """The op names on the left side (computed once: the engine asks for every graph)."""
        return frozenset().union(*(_op_names(t) for t in (self.lhs, *self.roots)))

    @cached_property
    def rhs_ops(self) -> frozenset[str]:
        """The op names on the right side."""
        return frozenset().union(*(_op_names(t) for t in (self.rhs, *self.results)))

    @property
    def needs_host(self) -> bool:
        """True if the rule has guards, computed values, list captures or several roots, so its
        matches go through Python."""
        return bool(self.guards or self.lists or self.roots) or _has_call(self.rhs)

    @property
    def results_all(self) -> tuple[Term, ...]:
        """The result of every root, the first root's first."""
        return (self.rhs, *self.results)

    @property
    def pairs(self) -> tuple[tuple[Term, Term], ...]:
        """(pattern root, its result) of every root: one pair but for a multi-root rule."""
        return ((self.lhs, self.rhs), *zip(self.roots, self.results))


@dataclass(frozen=True)
class RuleSet:
    """The rules of one or more `.rules` files, in source order."""

    rules: tuple[Rule, ...]
    files: tuple[str, ...]

    def names(self) -> list[str]:
        """The rule names, in source order."""
        return [r.name for r in self.rules]


def _op_names(t: Term) -> set[str]:
    if isinstance(t, OpNode):
        return {t.op}.union(*(_op_names(a) for a in t.args))
    return set()


def _has_call(t: Term) -> bool:
    if isinstance(t, OpNode):
        return any(isinstance(v, Call) for _, v in t.attrs) or any(_has_call(a) for a in t.args)
    return False
