"""Rule IR -> egglog program text.

The e-graph has one sort, `Term`. Every op of the op table is a constructor with one `Term`
argument per input slot and one `String` per attribute (canonical attribute strings, see
`vocab.ops.encode_attr`), so a rule's attribute literal (e.g. a default) is an egglog
literal and matching on it runs in Rust. `(T i)` is the handle of imported value `i`,
`(Leaf i)` an imported input, constant or opaque output, `(Absent)` a missing optional input.

A rule without guards or builders compiles to a plain egglog rule. A rule with them compiles to
a rule that records each match as a row of its own relation (the matched root, then the term
captures, then the attribute captures); the engine reads new rows between iterations,
evaluates guards and builders in Python and adds the results (`engine.saturate`).

With provenance on (`emit(..., provenance=True)`), each plain rule's action also inserts a row
into its own relation `prov-NAME`, laid out as a host rule's match relation (root, term
captures, attribute captures): the firings that `engine.provenance` explains the extracted
graph with. Host rules' firings are recorded in Python by `engine.apply`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from dsl.ir import Absent, Capture, ListCapture, Literal, OpNode, Rule, RuleSet, Term, Wildcard
from dsl.lists import engine_rules
from vocab.ops import OPS, encode_attr

COMBINED = "all-rules"


def schema(ops: Iterable[str] | None = None) -> str:
    """The egglog declarations for the e-graph: sorts, op constructors, import relations and the
    `load` ruleset that turns import rows into terms in one pass (bulk import).

    ops: the op-table ops to declare (all when None). Declaring an op costs ~0.2 ms, so a
    graph whose nodes and rules use few ops declares only those (unknown names are ignored)."""
    lines = [
        "(datatype Term)",
        "(constructor T (i64) Term)        ; handle of imported value i",
        "(constructor Leaf (i64) Term)     ; graph input, constant or opaque output",
        "(constructor Absent () Term)      ; missing optional input",
        "(ruleset load)",
        "(relation LeafRow (i64))",
        "(rule ((LeafRow v)) ((union (T v) (Leaf v))) :ruleset load)",
        "(relation UnionRow (i64 i64))   ; results of host rules: union two handles",
        "(rule ((UnionRow a b)) ((union (T a) (T b))) :ruleset load)",
    ]
    if ops is None:  # every op, and every output of the multi-output ones (`Op#K`)
        ops = [f"{n}#{k}" if k else n for n in OPS.names() for k in range(OPS.get(n).n_outputs)]
    names = sorted(n for n in set(ops) if OPS.get(n) is not None)
    for name in names:
        spec = OPS.get(name)
        sig = " ".join(["Term"] * spec.arity + ["String"] * len(spec.attrs))
        lines.append(f"(constructor {name} ({sig}) Term)")
        ins = [f"a{i}" for i in range(spec.arity)]
        ats = [f"s{i}" for i in range(len(spec.attrs))]
        row = " ".join(["v", *ins, *ats])
        term = " ".join([name, *(f"(T {a})" for a in ins), *ats])
        columns = " ".join(["i64"] * (1 + spec.arity) + ["String"] * len(spec.attrs))
        lines.append(f"(relation {name}Row ({columns}))")
        lines.append(f"(rule (({name}Row {row})) ((union (T v) ({term}))) :ruleset load)")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class HostRule:
    """A rule whose matches are finished in Python: its match relation and column layout."""

    rule: Rule
    relation: str
    columns: tuple[str, ...]  # capture names after the root column


def relation_name(rule: Rule) -> str:
    """The egglog relation a host rule's left side fills: `match-NAME` (`match-NAME--COUNTS`
    for a rule made of a rule with list captures, `Rule.instance`), with characters egglog
    does not allow in names replaced by `_`."""
    name = rule.name + (f"--{rule.instance}" if rule.instance else "")
    return "match-" + re.sub(r"[^A-Za-z0-9_-]", "_", name)


def egg_rule_name(rule: Rule) -> str:
    """The egglog `:name` of a host rule: its name, and `[COUNTS]` for one of the rules made
    of a rule with list captures (egglog names must be unique)."""
    return rule.name + (f" [{rule.instance}]" if rule.instance else "")


def prov_relation(name: str) -> str:
    """The provenance relation of plain rule (or `equal` direction) `name`."""
    return "prov-" + re.sub(r"[^A-Za-z0-9_-]", "_", name)


def captures(lhs: Term) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(term captures, attribute captures) of a left side, in order of first appearance; an
    `Op@name` bind counts as a term capture."""
    terms: dict[str, None] = {}
    attrs: dict[str, None] = {}

    def walk(t: Term) -> None:
        if isinstance(t, Capture):
            terms[t.name] = None
        elif isinstance(t, OpNode):
            if t.bind:
                terms[t.bind] = None
            for a in t.args:
                walk(a)
            for _, v in t.attrs:
                if isinstance(v, Capture):
                    attrs[v.name] = None

    walk(lhs)
    return tuple(terms), tuple(a for a in attrs if a not in terms)


def host_rule(rule: Rule) -> HostRule:
    """The HostRule of `rule` (a rule without list captures, or one of `engine_rules`): its
    match relation and column layout (term captures, then attribute captures)."""
    return HostRule(rule, relation_name(rule), rule.term_captures + rule.attr_captures)


def host_rules(rules: Iterable[Rule], most: dict[str, int] | None = None) -> list[HostRule]:
    """The HostRules of the rules in `rules` that go through Python, a rule with list
    captures as the rules the engine runs for it (`dsl.lists.engine_rules`, with `most` as
    there: the same as given to `emit`)."""
    return [host_rule(e) for r in rules if r.needs_host for e in engine_rules(r, most)]


def emit(rules: RuleSet, provenance: bool = False, most: dict[str, int] | None = None) -> str:
    """The egglog text for `rules`: ruleset declarations, then one block per rule (a comment
    with the rule's name and `file:line`, then the egglog rule), then the combined ruleset that
    saturation runs. `equal` rules give two blocks, one per direction. provenance: plain rules
    also record each firing in a `prov-NAME` relation (see the module docstring). most: the
    graph's largest input count per variadic op (`dsl.lists.engine_rules`)."""
    rulesets = list(dict.fromkeys(r.ruleset for r in rules.rules)) or ["default"]
    out = [f"(ruleset {rs})" for rs in rulesets]
    for r in rules.rules:
        out.append("")
        out.append(emit_rule(r, provenance, most))
    out.append("")
    out.append(f"(unstable-combined-ruleset {COMBINED} {' '.join(rulesets)})")
    return "\n".join(out) + "\n"


def emit_rule(r: Rule, provenance: bool = False, most: dict[str, int] | None = None) -> str:
    """One rule as an egglog block (see `emit`); a rule with list captures as one block per
    rule the engine runs for it (`dsl.lists.engine_rules`)."""
    if r.lists and not r.items:
        return "\n".join(emit_rule(e, provenance) for e in engine_rules(r, most))
    head = f";; {r.name}  ({r.span.file}:{r.span.line})"
    if r.instance:
        head += f"  [{r.instance}]"
    if r.needs_host:
        h = host_rule(r)
        sig = " ".join(
            ["Term"] + ["Term"] * len(r.term_captures) + ["String"] * len(r.attr_captures)
        )
        cols = " ".join(["root", *(_var(c) for c in h.columns)])
        guards = " ".join(guard_text(g) for g in r.guards)
        return "\n".join(
            [
                head + f"  host: {guards or 'builders'}",
                f"(relation {h.relation} ({sig}))",
                f"(rule ({_query(r.lhs, r.roots, needed_inputs(r.results_all))})",
                f"      (({h.relation} {cols}))",
                f'      :ruleset {r.ruleset} :name "{egg_rule_name(r)}")',
            ]
        )
    blocks = [_plain(r.name, r.lhs, r.rhs, r.ruleset, head, provenance)]
    if r.kind == "equal":
        reverse = f"{r.name} (reverse)"
        blocks.append(_plain(reverse, r.rhs, r.lhs, r.ruleset, head + " reverse", provenance))
    return "\n".join(blocks)


def guard_text(g) -> str:
    """A guard as written in a rule, e.g. `(all-equal @z 0)`."""

    def arg(a) -> str:
        if isinstance(a, Capture):
            return "@" + a.name
        if isinstance(a, Literal):
            v = a.value
            return (
                "(" + " ".join(map(str, v)) + ")"
                if isinstance(v, tuple)
                else repr(v)
                if isinstance(v, str)
                else str(v)
            )
        return "_"

    text = f"({g.fn} {' '.join(arg(a) for a in g.args)})"
    return f"(not {text})" if g.negate else text


def _plain(name: str, lhs: Term, rhs: Term, ruleset: str, head: str, provenance: bool) -> str:
    action = f"(union root {term_text(rhs, _var, _attr_pattern)})"
    lines = [head]
    if provenance:
        terms, attrs = captures(lhs)
        rel = prov_relation(name)
        sig = " ".join(["Term"] * (1 + len(terms)) + ["String"] * len(attrs))
        lines.append(f"(relation {rel} ({sig}))")
        action += f" ({' '.join([rel, 'root', *(_var(c) for c in terms + attrs)])})"
    lines += [
        f"(rule ({_query(lhs, needed=needed_inputs((rhs,)))})",
        f"      ({action})",
        f'      :ruleset {ruleset} :name "{name}")',
    ]
    return "\n".join(lines)


def _query(lhs: Term, roots: tuple[Term, ...] = (), needed: frozenset[str] = frozenset()) -> str:
    """Query atoms binding `root` to the left side; `Op@name` binds become extra atoms, and so
    do a multi-root rule's other roots (each binds its `Op@name`). `needed`: captures that
    must not bind an absent input (`needed_inputs`)."""
    atoms: list[str] = []
    atoms.insert(0, f"(= root {_pattern(lhs, atoms, needed)})")
    for t in roots:  # matches whose roots are one value are dropped by the host step
        _pattern(t, atoms, needed)  # (engine.apply), which reports them: `verify` reads that
    return " ".join(atoms)


def _pattern(t: Term, atoms: list[str], needed: frozenset[str] = frozenset()) -> str:
    if isinstance(t, OpNode):
        spec = OPS.get(t.op)
        for i, a in enumerate(t.args):  # an optional slot's capture that a result needs
            if isinstance(a, Capture) and i >= spec.n_required and a.name in needed:
                atoms.append(f"(!= {_var(a.name)} (Absent))")  # present: not an absent input
        text = _apply(t, lambda a: _pattern(a, atoms, needed), _attr_pattern)
        if t.bind:
            atoms.append(f"(= {_var(t.bind)} {text})")
            return _var(t.bind)
        return text
    return _leaf(t, _var)


def needed_inputs(results: tuple[Term, ...]) -> frozenset[str]:
    """The captures the `results` use as values: a result itself, or an op's required input.
    Such a capture bound in an optional input slot of the pattern must be a present input
    there: `(Mean @a @b) -> @b` or `(Sum @a @b) -> (Add @a @b)` on a one-input Mean or Sum
    would bind @b to the absent second input (the root made equal to `Absent`; an Add of one
    input). A capture the results pass on in optional slots only (`(Conv @x @w @b)` to a Conv
    with @b) still matches an absent input, which the result leaves absent."""
    out: set[str] = set()

    def walk(t: Term, required: bool) -> None:
        if isinstance(t, Capture) and required:
            out.add(t.name)
        elif isinstance(t, OpNode):
            spec = OPS.get(t.op)
            for i, a in enumerate(t.args):
                walk(a, i < spec.n_required)

    for r in results:
        walk(r, True)
    return frozenset(out)


def term_text(t: Term, var, attr) -> str:
    """egglog text of a result term. `var(name)` renders a term capture and `attr(value, kind)`
    an attribute (`Literal`, `Capture` or `Call`): egglog variables when emitting rules, an
    e-class's term and concrete literals when the host applies a match."""
    if isinstance(t, OpNode):
        return _apply(t, lambda a: term_text(a, var, attr), attr)
    return _leaf(t, var)


def _apply(t: OpNode, arg, attr) -> str:
    spec = OPS.get(t.op)
    kinds = {a.name: a.kind for a in spec.attrs}
    parts = [t.op, *(arg(a) for a in t.args), *(attr(v, kinds[n]) for n, v in t.attrs)]
    return "(" + " ".join(parts) + ")"


def _leaf(t: Term, var) -> str:
    if isinstance(t, ListCapture):
        raise TypeError(f"list capture @{t.name}... cannot be emitted (host rules only)")
    if isinstance(t, Capture):
        return var(t.name)
    if isinstance(t, Wildcard):
        return "_"
    if isinstance(t, Absent):
        return "(Absent)"
    raise TypeError(f"not a term: {t!r}")


def _attr_pattern(v, kind: str) -> str:
    """An attribute in emitted rule text: a literal string, a variable or `_`."""
    if isinstance(v, Literal):
        return egg_string(encode_attr(kind, v.value))
    if isinstance(v, Capture):
        return _var(v.name)
    if isinstance(v, Wildcard):
        return "_"
    raise TypeError(f"builder call {v!r} cannot be emitted as egglog (host rules only)")


def _var(name: str) -> str:
    return (
        "v_" + name.replace(".", "_")
        if name in _RESERVED or name[0].isupper()
        else name.replace(".", "__")
    )


_RESERVED = {"root", "T", "Leaf", "Absent"}


def egg_string(s: str) -> str:
    """`s` as an egglog string literal (backslashes and double quotes escaped)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
