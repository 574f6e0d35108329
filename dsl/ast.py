"""Syntax tree of a `.rules` file, as written: what `dsl.parse` produces and `dsl.check` reads.

The tree mirrors the text: `for` is not expanded, `:c` is a flag on the application, attributes
are only the ones written. Every node carries a `Span` (file, line, col of its first token, or
of the operator name for an application). Spans are excluded from equality, so two trees
parsed from differently laid-out text compare equal when they mean the same rules; this is
what the parse -> format -> parse round trip tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dsl.ir import Span

NO_SPAN = Span("<none>", 0, 0)


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


# ---- terms ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CaptureRef:
    """`@name`: a capture, at a term or an attribute position. `many`: `@name...`, a list
    capture that binds a run of a variadic input's slots (zero or more values)."""

    name: str
    span: Span = _span()
    many: bool = False


@dataclass(frozen=True)
class Wild:
    """`_`: matches anything."""

    span: Span = _span()


@dataclass(frozen=True)
class Number:
    """An int or float literal (`3`, `-0.5`, `1e-5`, `inf`)."""

    value: int | float
    span: Span = _span()


@dataclass(frozen=True)
class String:
    """A string literal, without its quotes."""

    value: str
    span: Span = _span()


@dataclass(frozen=True)
class ListLit:
    """`(0 2 1)`: a list of numbers (an `ints` or `floats` attribute)."""

    items: tuple[Number, ...]
    span: Span = _span()


@dataclass(frozen=True)
class BuilderCall:
    """`(compose-perm @p @q)` at an attribute position of a result: a registered builder."""

    fn: str
    args: tuple[AttrValue, ...]
    span: Span = _span()


AttrValue = CaptureRef | Wild | Number | String | ListLit | BuilderCall


@dataclass(frozen=True)
class Attr:
    """`:name value`, an attribute written in an application."""

    name: str
    value: AttrValue
    span: Span = _span()


@dataclass(frozen=True)
class App:
    """`(Op[:c][@bind] ARG... :attr VALUE... [:attrs @rest])`.

    head: the operator name (or a `for` variable before expansion).
    commutative: the `:c` flag. bind: the `@name` suffix. rest: the `:attrs @rest` capture.
    """

    head: str
    args: tuple[Term, ...]
    attrs: tuple[Attr, ...] = ()
    commutative: bool = False
    bind: str | None = None
    rest: CaptureRef | None = None
    span: Span = _span()
    optional: bool = False  # `Op?`: the application, or its first input in its place


@dataclass(frozen=True)
class Alt:
    """`(or P1 P2 ...)` in a pattern: any one of the alternatives (`dsl.expand` makes one rule
    per alternative)."""

    options: tuple[Term, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Roots:
    """`(roots T1 T2 ...)`: the sides of a multi-root rule. As a pattern, terms that match
    together, sharing their captures (three MatMuls of one input); as a result, one term per
    pattern root, which replaces it."""

    terms: tuple[Term, ...]
    span: Span = _span()


@dataclass(frozen=True)
class AbsentTerm:
    """`absent`: an optional input that is not there."""

    span: Span = _span()


@dataclass(frozen=True)
class Pruned(AbsentTerm):
    """In a result, a capture that this alternative of the pattern does not bind (`dsl.expand`
    puts it there): the terms that need it are left out, down to an optional input, which is
    then absent; `(Op? A B)` whose A is left out is B."""


Term = App | CaptureRef | Wild | Alt | AbsentTerm


# ---- guards and forms ----------------------------------------------------------------------

GuardArg = CaptureRef | Number | String | ListLit


@dataclass(frozen=True)
class GuardCall:
    """`(name ARG...)` or `(not (name ARG...))` inside `(if ...)`."""

    fn: str
    args: tuple[GuardArg, ...]
    negate: bool = False
    span: Span = _span()


# `(ruleset ... :sums S)`: what integer accumulation a ruleset's results assume of the runtime
INTEGER_SUMS = ("int32",)


@dataclass(frozen=True)
class Ruleset:
    """`(ruleset NAME [:opset N] [:domain D]... [:sums int32])`: the rules that follow in this
    file belong to NAME. `opset`: the lowest default-domain opset its results are written for
    (None: any the model has); `domains`: the other domains its results write ops of; `sums`:
    what its results need of the runtime's integer kernels, `int32` for products of uint8 by
    int8 summed in int32 with no int16 pair in between (onnxruntime on x86 CPUs with VNNI;
    without it, its kernels add neighbouring pairs in int16, which full-range weights can
    saturate), "" for nothing."""

    name: str
    span: Span = _span()
    opset: int | None = None
    domains: tuple[str, ...] = ()
    sums: str = ""


@dataclass(frozen=True)
class Binding:
    """`(@name VALUE)` in `(with ...)`: a local name for a result term (an operator
    application over captures) or for a builder call's value (an application whose head is a
    builder), usable in guards (builder values) and in the result."""

    name: str
    value: Term
    span: Span = _span()


@dataclass(frozen=True)
class Simplify:
    """`(simplify NAME [:fp CLASS] MATCH [(with BINDING...)] [(if GUARD...)] [(bound FN ARG...)]
    RESULT)`; `fp` is None if not written; `bound` names the error bound of a `quant` rule
    (a function of `vocab.registry.BOUNDS`), None if not written."""

    name: str
    lhs: Term | Roots
    rhs: Term | Roots
    guards: tuple[GuardCall, ...] = ()
    fp: str | None = None
    span: Span = _span()
    bindings: tuple[Binding, ...] = ()
    bound: GuardCall | None = None


@dataclass(frozen=True)
class Equal:
    """`(equal NAME [:fp CLASS] A B)`: an identity, used in both directions."""

    name: str
    lhs: Term
    rhs: Term
    fp: str | None = None
    span: Span = _span()


@dataclass(frozen=True)
class For:
    """`(for VAR (OP...) FORM...)`: the forms, once per operator."""

    var: str
    ops: tuple[str, ...]
    body: tuple[RuleForm, ...]
    span: Span = _span()


@dataclass(frozen=True)
class DeclInput:
    """`@x` (or `@b?`, an optional input; `@xs...`, a variadic one, which `dsl.check`
    refuses) in the input list of an `(op ...)` declaration."""

    name: str
    optional: bool = False
    many: bool = False
    span: Span = _span()


@dataclass(frozen=True)
class DeclAttr:
    """`:attr (NAME KIND [DEFAULT])` of an `(op ...)` declaration; `default` None: the
    attribute is required."""

    name: str
    kind: str
    default: Number | String | ListLit | None = None
    span: Span = _span()


@dataclass(frozen=True)
class OpDecl:
    """`(op DOMAIN.NAME (INPUT...) [:attr (NAME KIND [DEFAULT])]... [:cost CLASS] BODY)`: an op
    no registry has, defined by BODY, a result term in registry ops over its inputs and
    attributes (`vocab.declared`). `cost` is None if not written."""

    name: str
    inputs: tuple[DeclInput, ...]
    attrs: tuple[DeclAttr, ...]
    body: Term
    cost: str | None = None
    span: Span = _span()


RuleForm = Simplify | Equal | For
Form = Ruleset | OpDecl | RuleForm


@dataclass(frozen=True)
class File:
    """A parsed `.rules` file: its forms in order, its name and its text (for error carets)."""

    forms: tuple[Form, ...]
    path: str = field(default="<string>", compare=False)
    source: str = field(default="", compare=False, repr=False)
