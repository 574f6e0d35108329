"""Parse `.rules` text into the syntax tree of `dsl.ast`.

Lark parses with the LALR parser and the contextual lexer (`grammar.lark`); a Transformer
builds the frozen `dsl.ast` nodes, each with its `Span`. Lark's UnexpectedInput becomes a
`RulesSyntaxError` that says, in words, what was expected there.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from pathlib import Path

from lark import Lark, Token, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError
from lark.lexer import PatternStr

from dsl import ast
from dsl.errors import RulesError, RulesSyntaxError, source_line
from dsl.ir import Span

_HEAD = re.compile(r"(?P<op>[^:@?]+)(?P<opt>\?)?(:(?P<flag>[A-Za-z]+))?(@(?P<bind>\w+))?$")

# What a terminal means to a rule author; string terminals are shown quoted instead.
_WORDS = {
    "RULE_NAME": "a rule name",
    "VAR": "a variable name",
    "OP_ITEM": "an operator name",
    "FAMILY": "an op family (UNARY_ELEMENTWISE, ...)",
    "HEAD": "an operator name",
    "FN_NAME": "a guard or builder name",
    "ATTR_KEY": "an attribute like :perm",
    "CAPTURE": "a capture like @x",
    "LIST_CAPTURE": "a list capture like @xs...",
    "NUMBER": "a number",
    "STRING": 'a string like "NOTSET"',
    "FP_CLASS": "exact, reassoc, approx or quant",
    "$END": "end of file",
}


@lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = Path(__file__).with_name("grammar.lark")
    return Lark.open(str(grammar), parser="lalr", propagate_positions=True)


def parse(text: str, file: str = "<string>") -> ast.File:
    """Parse the text of a `.rules` file. `file` names it in spans and error messages.

    Returns a `dsl.ast.File` (nothing is expanded or checked; see `dsl.check`).
    Raises `RulesSyntaxError` at the first syntax error.
    """
    try:
        tree = _parser().parse(text)
        forms = _ToAst(file).transform(tree)
    except UnexpectedInput as e:
        raise _syntax_error(e, text, file) from None
    except VisitError as e:
        if isinstance(e.orig_exc, RulesError):
            raise e.orig_exc.locate({file: text}) from None
        raise
    return ast.File(tuple(forms), path=file, source=text)


# ---- syntax errors -------------------------------------------------------------------------


def _syntax_error(e: UnexpectedInput, text: str, file: str) -> RulesSyntaxError:
    if isinstance(e, UnexpectedCharacters):
        what, line, col = f"character {text[e.pos_in_stream]!r}", e.line, e.column
    elif isinstance(e, UnexpectedToken) and e.token.type != "$END":
        what, line, col = f"'{e.token.value}'", e.token.line, e.token.column
    else:
        what, (line, col) = "end of file", _end_of(text)
        opened = _unclosed(text)
        if opened:  # the parenthesis at fault is the open one, not the end of the file
            (oline, ocol), n = opened[-1], len(opened)
            more = f" ({n} parentheses are open there)" if n > 1 else ""
            msg = f"'(' is never closed: the file ends at {line}:{col}{more}"
            return RulesSyntaxError(Span(file, oline, ocol), msg, source_line(text, oline))
    expected = _expected(e)
    msg = f"unexpected {what}; expected {_describe(expected)}"
    if expected == {"RPAR"} and _form_head(text, line, col) == "equal":  # after a guard
        msg += (
            " (an `equal` rule is a pattern and a result, read both ways: a guarded rule is a"
            " `simplify`)"
        )
    return RulesSyntaxError(Span(file, line, col), msg, source_line(text, line))


def _form_head(text: str, line: int, col: int) -> str:
    """The first word of the top-level form open at `line`:`col` of `text` ("" if none)."""
    lines = text.splitlines()
    before = "\n".join(
        [*lines[: line - 1], lines[line - 1][: col - 1] if line <= len(lines) else ""]
    )
    opened = _unclosed(before)
    if not opened:
        return ""
    oline, ocol = opened[0]
    m = re.match(r"\(\s*([A-Za-z_-]+)", lines[oline - 1][ocol - 1 :])
    return m[1] if m else ""


def _unclosed(text: str) -> list[tuple[int, int]]:
    """(line, column) of each '(' of `text` that no ')' closes, outermost first; parentheses
    in comments (`;` to the end of the line) and strings (`"..."`) do not count."""
    stack: list[tuple[int, int]] = []
    for i, raw in enumerate(text.splitlines(), 1):
        code = re.sub(r'"[^"\\\n]*"', lambda m: " " * len(m[0]), raw).split(";", 1)[0]
        for j, ch in enumerate(code, 1):
            if ch == "(":
                stack.append((i, j))
            elif ch == ")" and stack:
                stack.pop()
    return stack


def _expected(e: UnexpectedInput) -> set[str]:
    """The terminals the parser could take at the error. LALR merges states, so lark's own
    `expected` may list tokens that only fit in another context; replaying each candidate on
    a copy of the parser state (`accepts()`) gives the exact set."""
    ip = getattr(e, "interactive_parser", None)
    if ip is not None:
        return set(ip.accepts())
    return set(getattr(e, "expected", None) or getattr(e, "allowed", None) or ())


def _describe(expected) -> str:
    terminals = {t.name: t for t in _parser().terminals}
    words = set()
    for name in expected:
        t = terminals.get(name)
        if t is not None and isinstance(t.pattern, PatternStr):
            words.add(f"'{t.pattern.value}'")
        else:
            words.add(_WORDS.get(name, name))
    ordered = sorted(words, key=lambda w: (w.startswith("'"), w))
    if len(ordered) <= 1:
        return "".join(ordered) or "nothing"
    return ", ".join(ordered[:-1]) + " or " + ordered[-1]


def _end_of(text: str) -> tuple[int, int]:
    """Line and column just after the last non-blank character."""
    lines = text.rstrip().splitlines() or [""]
    return len(lines), len(lines[-1]) + 1


# ---- tree -> ast ---------------------------------------------------------------------------


def _number(text: str) -> int | float:
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    return float(text)


@v_args(meta=True)
class _ToAst(Transformer):
    """Builds `dsl.ast` nodes. Tokens keep their positions; rules use lark's meta."""

    def __init__(self, file: str):
        super().__init__()
        self.file = file

    def _at(self, x) -> Span:
        return Span(self.file, x.line, x.column)

    def start(self, meta, forms):
        return forms

    def ruleset(self, meta, c):
        opset, domains, sums = None, [], ""
        for key, value in c[1:]:
            if key == ":opset" and value.type == "NUMBER" and re.fullmatch(r"\d+", str(value)):
                if opset is not None:
                    raise RulesSyntaxError(self._at(key), ":opset is written twice")
                opset = int(str(value))
            elif key == ":domain" and value.type == "OP_ITEM":
                domains.append(str(value))
            elif key == ":sums" and str(value) in ast.INTEGER_SUMS and not sums:
                sums = str(value)
            else:
                msg = (
                    "a ruleset takes :opset N, :domain NAME and :sums "
                    f"{'|'.join(ast.INTEGER_SUMS)} (once), not {key} {value}"
                )
                raise RulesSyntaxError(self._at(key), msg)
        return ast.Ruleset(
            str(c[0]), span=self._at(meta), opset=opset, domains=tuple(domains), sums=sums
        )

    def op_decl(self, meta, c):
        inputs = tuple(
            ast.DeclInput(x.name, many=x.many, span=x.span) if isinstance(x, ast.CaptureRef) else x
            for x in c[1:-1]
            if isinstance(x, (ast.CaptureRef, ast.DeclInput))
        )
        attrs = tuple(x for x in c[1:-1] if isinstance(x, ast.DeclAttr))
        costs = [x for x in c[1:-1] if isinstance(x, tuple) and x[:1] == ("cost",)]
        if len(costs) > 1:
            raise RulesSyntaxError(costs[1][2], ":cost is written twice")
        cost = costs[0][1] if costs else None
        return ast.OpDecl(str(c[0]), inputs, attrs, c[-1], cost, span=self._at(c[0]))

    def opt_capture(self, meta, c):
        return ast.DeclInput(str(c[0])[1:-1], optional=True, span=self._at(c[0]))

    def decl_attr(self, meta, c):
        default = c[2] if len(c) > 2 else None
        return ast.DeclAttr(str(c[0]), str(c[1]), default, span=self._at(c[0]))

    def decl_cost(self, meta, c):
        return ("cost", str(c[0]), self._at(c[0]))

    def need(self, meta, c):
        return c[0], c[1]

    def simplify(self, meta, c):
        name, fp, rest = str(c[0]), None, list(c[1:])
        if isinstance(rest[0], str):
            fp, rest = rest[0], rest[1:]
        bindings = next((x[1] for x in rest if isinstance(x, tuple) and x[:1] == ("with",)), ())
        rest = [x for x in rest if not (isinstance(x, tuple) and x[:1] == ("with",))]
        bound = next((x for x in rest if isinstance(x, ast.GuardCall)), None)
        rest = [x for x in rest if not isinstance(x, ast.GuardCall)]
        guards = rest[1] if len(rest) == 3 else ()
        return ast.Simplify(
            name, rest[0], rest[-1], guards, fp, span=self._at(meta), bindings=bindings, bound=bound
        )

    def bound(self, meta, c):
        return ast.GuardCall(str(c[0]), tuple(c[1:]), span=self._at(c[0]))

    def with_(self, meta, c):
        return ("with", tuple(c))

    def binding(self, meta, c):
        return ast.Binding(c[0].name, c[1], span=c[0].span)

    def equal(self, meta, c):
        fp = c[1] if len(c) == 4 else None
        return ast.Equal(str(c[0]), c[-2], c[-1], fp, span=self._at(meta))

    def for_form(self, meta, c):
        ops = tuple(str(t) for t in c[1:] if isinstance(t, Token))
        body = tuple(f for f in c[1:] if not isinstance(f, Token))
        return ast.For(str(c[0]), ops, body, span=self._at(meta))

    def fp(self, meta, c):
        return str(c[0])

    def guards(self, meta, c):
        return tuple(c)

    def not_guard(self, meta, c):
        g = c[0]
        return ast.GuardCall(g.fn, g.args, True, span=self._at(meta))

    def guard(self, meta, c):
        return ast.GuardCall(str(c[0]), tuple(c[1:]), span=self._at(c[0]))

    def app(self, meta, c):
        head = c[0]
        m = _HEAD.match(str(head))
        if m["flag"] not in (None, "c"):
            col = head.column + len(m["op"])
            msg = f"unknown operator flag ':{m['flag']}' (the only flag is ':c', commutative)"
            raise RulesSyntaxError(Span(self.file, head.line, col), msg)
        args = tuple(x for x in c[1:] if not isinstance(x, ast.Attr))
        attrs = [x for x in c[1:] if isinstance(x, ast.Attr)]
        rest = [a for a in attrs if a.name == "attrs"]
        if len(rest) > 1 or (rest and not isinstance(rest[0].value, ast.CaptureRef)):
            raise RulesSyntaxError(rest[-1].span, ":attrs takes one capture, like :attrs @rest")
        attrs = tuple(a for a in attrs if a.name != "attrs")
        rest_cap = rest[0].value if rest else None
        if m["opt"] and not args:
            msg = f"'{m['op']}?' needs an input to stand in its place when it is not there"
            raise RulesSyntaxError(self._at(head), msg)
        return ast.App(
            m["op"],
            args,
            attrs,
            m["flag"] == "c",
            m["bind"],
            rest_cap,
            span=self._at(head),
            optional=bool(m["opt"]),
        )

    def roots(self, meta, c):
        return ast.Roots(tuple(c), span=self._at(meta))

    def alt(self, meta, c):
        return ast.Alt(tuple(c), span=self._at(meta))

    def absent(self, meta, c):
        return ast.AbsentTerm(span=self._at(meta))

    def attr(self, meta, c):
        return ast.Attr(str(c[0])[1:], c[1], span=self._at(c[0]))

    def call(self, meta, c):
        return ast.BuilderCall(str(c[0]), tuple(c[1:]), span=self._at(meta))

    def list(self, meta, c):
        return ast.ListLit(tuple(c), span=self._at(meta))

    def capture(self, meta, c):
        return ast.CaptureRef(str(c[0])[1:], span=self._at(c[0]))

    def list_capture(self, meta, c):
        return ast.CaptureRef(str(c[0])[1:-3], span=self._at(c[0]), many=True)

    def wildcard(self, meta, c):
        return ast.Wild(span=self._at(meta))

    def number(self, meta, c):
        text = str(c[0])
        value = _number(text)
        if isinstance(value, float) and math.isinf(value) and "inf" not in text:
            raise RulesSyntaxError(
                self._at(c[0]), f"{text} is beyond a float's range (inf writes an infinity)"
            )
        if isinstance(value, float) and value == 0 and re.search(r"[1-9]", text.split("e")[0]):
            raise RulesSyntaxError(
                self._at(c[0]), f"{text} is below a float's range (it would be read as 0)"
            )
        return ast.Number(value, span=self._at(c[0]))

    def string(self, meta, c):
        return ast.String(str(c[0])[1:-1], span=self._at(c[0]))
