"""Typed errors of the rules DSL, located in the source text.

Every error names `file:line:col`, shows the offending line and puts a caret under the column:

    patterns/x.rules:3:4: error: unknown operator 'Tranpose'; did you mean 'Transpose'?
        (Tranpose @x :perm @p)
         ^

`dsl.parse` stops at the first syntax error. `dsl.check` checks every rule, stops at the first
error inside a rule, and raises the single error it found, or a `RulesErrors` holding all of
them (in source order) when there are several.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from dsl.ir import Span


class RulesError(Exception):
    """Base class: an error at `span`, with `message` and the text of the source line (None
    when the source is not known; the caret lines are then left out)."""

    def __init__(self, span: Span, message: str, source_line: str | None = None):
        super().__init__(message)
        self.span = span
        self.message = message
        self.source_line = source_line

    def __str__(self) -> str:
        head = f"{self.span}: error: {self.message}"
        if self.source_line is None:
            return head
        # Keep tabs in the caret line so the caret lines up however tabs are displayed.
        pad = "".join("\t" if c == "\t" else " " for c in self.source_line[: self.span.col - 1])
        return f"{head}\n    {self.source_line}\n    {pad}^"

    def locate(self, sources: dict[str, str]) -> RulesError:
        """Fill in `source_line` from `sources` (file name -> text) if it is missing."""
        text = sources.get(self.span.file)
        if self.source_line is None and text is not None:
            self.source_line = source_line(text, self.span.line)
        return self


class RulesErrors(RulesError):
    """Several errors from one check; `errors` in source order, `str` is theirs joined by a
    newline. `span` and `message` are the first error's."""

    def __init__(self, errors: list[RulesError]):
        super().__init__(errors[0].span, errors[0].message, errors[0].source_line)
        self.errors = list(errors)

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


class RulesSyntaxError(RulesError):
    """The text is not a well-formed `.rules` file (from lark's UnexpectedInput)."""


class UnknownOperatorError(RulesError):
    """An operator that is not in the op table."""


class ForbiddenOperatorError(RulesError):
    """An effectful or random operator: rules never match or build those."""


class ArityError(RulesError):
    """Too few required or too many inputs for an operator."""


class UnknownAttributeError(RulesError):
    """An attribute the operator does not have, or one written twice."""


class MissingAttributeError(RulesError):
    """A required attribute left unwritten in a result (and not covered by `:attrs`)."""


class AttributeTypeError(RulesError):
    """An attribute value of the wrong kind (a float for an `ints` attribute, ...)."""


class UnknownGuardError(RulesError):
    """A guard name that is not in `vocab.registry.GUARDS`."""


class UnknownBuilderError(RulesError):
    """A builder name that is not in `vocab.registry.BUILDERS`."""


class ArgumentError(RulesError):
    """A guard or builder called with the wrong number or kind of arguments."""


class UnboundCaptureError(RulesError):
    """A capture used in a result or a guard that the left side never binds."""


class CaptureKindError(RulesError):
    """A capture used both as a term and as an attribute (or attribute group)."""


class DuplicateRuleError(RulesError):
    """Two rules with the same name (after `for` and `:c` expansion) in one check."""


class CommutativeError(RulesError):
    """`:c` on a result, on a non-commutative operator, or with fewer than two operands."""


class PlacementError(RulesError):
    """Something in the wrong place: `Op@name` or `_` in a result, a builder call in a pattern,
    a bare capture as a left side."""


class EqualRuleError(RulesError):
    """An `equal` rule whose sides bind different captures."""


class ForError(RulesError):
    """A `for` misuse: a `{VAR}` in a rule name with no enclosing `for VAR`, or a shadowed
    variable."""


def source_line(text: str, line: int) -> str | None:
    """Line `line` (1-based) of `text` without its line break, or None if out of range."""
    lines = text.splitlines()
    return lines[line - 1].rstrip("\r\n") if 1 <= line <= len(lines) else None


def did_you_mean(name: str, choices: Iterable[str], prefix: str = "") -> str:
    """`"; did you mean 'X'?"` for the closest of `choices` (difflib), or `""`."""
    close = difflib.get_close_matches(name, list(choices), n=1)
    return f"; did you mean '{prefix}{close[0]}'?" if close else ""


class RulesetNeedsError(RulesError):
    """A ruleset's declared needs do not hold: an unknown `:domain`, a result writing an op of
    a domain its ruleset does not declare, or an op missing at its declared `:opset`."""


class OpDeclarationError(RulesError):
    """An `(op ...)` declaration the op table cannot take: a variadic input, an input or
    attribute written twice, an unknown attribute kind or cost class, a body using a declared
    op, an op declared differently before, or one in a domain an installed registry owns."""
