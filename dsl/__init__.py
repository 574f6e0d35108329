"""The rules DSL: `.rules` text -> syntax tree -> checked Rule IR.

    parse(text, file)      text -> dsl.ast.File             (RulesSyntaxError)
    check(files, ops)      dsl.ast.File(s) -> [dsl.ir.Rule]  (RulesError subclasses)
    load_rules(paths)      files / directories -> dsl.ir.RuleSet
    format_file(tree)      dsl.ast.File -> canonical text

The shipped rule library lives in the `patterns` package (`shipped_rules_dir()`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import patterns
from dsl.ast import OpDecl
from dsl.cache import cached_rules
from dsl.check import check
from dsl.errors import (
    ArgumentError,
    ArityError,
    AttributeTypeError,
    CaptureKindError,
    CommutativeError,
    DuplicateRuleError,
    EqualRuleError,
    ForbiddenOperatorError,
    ForError,
    MissingAttributeError,
    OpDeclarationError,
    PlacementError,
    RulesError,
    RulesErrors,
    RulesetNeedsError,
    RulesSyntaxError,
    UnboundCaptureError,
    UnknownAttributeError,
    UnknownBuilderError,
    UnknownGuardError,
    UnknownOperatorError,
)
from dsl.ir import RuleSet, Span
from dsl.parse import parse
from dsl.printer import format_file
from vocab.declared import declaration

__all__ = [
    "parse",
    "check",
    "load_rules",
    "rules_given",
    "RulePathError",
    "rule_files",
    "shipped_rules_dir",
    "format_file",
    "ArgumentError",
    "ArityError",
    "AttributeTypeError",
    "CaptureKindError",
    "CommutativeError",
    "DuplicateRuleError",
    "EqualRuleError",
    "ForbiddenOperatorError",
    "ForError",
    "MissingAttributeError",
    "OpDeclarationError",
    "PlacementError",
    "RulesError",
    "RulesErrors",
    "RulesetNeedsError",
    "RulesSyntaxError",
    "UnboundCaptureError",
    "UnknownAttributeError",
    "UnknownBuilderError",
    "UnknownGuardError",
    "UnknownOperatorError",
]


def shipped_rules_dir() -> Path:
    """The directory of the shipped rule library (the `patterns` package)."""
    return Path(patterns.__file__).parent


def rule_files(paths: Iterable[str | Path]) -> list[tuple[Path, str]]:
    """The `.rules` files named by `paths`, as (path, label) pairs: a file as given, a
    directory searched recursively for `*.rules` (sorted). The label is the name used in spans
    and messages: the path as given, and for the shipped library `patterns/<relative path>`."""
    out: list[tuple[Path, str]] = []
    shipped = shipped_rules_dir().resolve()
    for p in map(Path, paths):
        files = sorted(p.rglob("*.rules")) if p.is_dir() else [p]
        for f in files:
            label = str(f)
            if f.resolve().is_relative_to(shipped):
                label = f"patterns/{f.resolve().relative_to(shipped).as_posix()}"
            out.append((f, label))
    return out


def _read_text(f: Path, label: str) -> str:
    """The UTF-8 text of rules file `f`; RulesError at the first byte that is not UTF-8."""
    data = f.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise RulesError(
            Span(label, line, col), f"not UTF-8 text: byte 0x{data[e.start]:02x} ({e.reason})"
        ) from None


def load_rules(paths: Iterable[str | Path] | str | Path | None = None) -> RuleSet:
    """Parse and check `.rules` files together (rule names unique across all of them).

    paths: files and directories (searched recursively for `*.rules`); None means the shipped
    library. Returns a `RuleSet` with the rules in file order, then source order. Files
    checked before (the same text, and the same DSL and op table) come from the on-disk
    cache of `dsl.cache`, their op declarations registered again.
    Raises `RulesError` (a subclass, or `RulesErrors` for several); `OSError` for a missing
    file.
    """
    if paths is None:
        paths = [shipped_rules_dir()]
    elif isinstance(paths, (str, Path)):
        paths = [paths]
    texts = [(label, _read_text(f, label)) for f, label in rule_files(paths)]

    def load() -> tuple[RuleSet, list]:
        trees = [parse(text, file=label) for label, text in texts]
        rules = RuleSet(tuple(check(trees)), tuple(label for label, _ in texts))
        made = [form.name for t in trees for form in t.forms if isinstance(form, OpDecl)]
        return rules, [declaration(name) for name in made]

    return cached_rules(texts, load)


class RulePathError(ValueError):
    """Rules given as something that is not rules: a path that does not exist, paths that
    hold no `.rules` file (a directory without one), or a value that is neither a RuleSet nor
    paths. One line, naming the `rules` option."""


def rules_given(rules) -> RuleSet:
    """The RuleSet a frontend's `rules` option names: a RuleSet as it is, a path or a list of
    paths parsed (`load_rules`). Raises RulePathError (see its doc), and `RulesError` for
    rules that do not check."""
    if isinstance(rules, RuleSet):
        return rules
    if isinstance(rules, str | os.PathLike):
        paths = [rules]
    elif isinstance(rules, list | tuple) and all(isinstance(p, str | os.PathLike) for p in rules):
        paths = list(rules)
    else:
        raise RulePathError(
            f"rules: takes a RuleSet, a .rules path or a list of them, not {type(rules).__name__}"
        )
    for p in paths:
        if not Path(p).exists():
            raise RulePathError(f"rules: {p}: no such file or directory")
    loaded = load_rules(paths)
    if paths and not loaded.files:
        raise RulePathError(f"rules: {', '.join(map(str, paths))}: no .rules file in it")
    return loaded
