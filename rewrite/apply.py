"""The host apply step: finish the matches of rules with guards or builders.

For each new row of a host rule's match relation: evaluate the guards on the captured
e-classes' facts (`ClassInfo`) and attribute values, compute builder results, and render the
rule's result as egglog text over the captured e-classes' terms, to be unioned with the matched
root. The result's type is inferred with the op table's shape rules; if it differs from the
root's known type the rule is unsound and `UnsoundRuleError` is raised (two e-classes of
different types must never merge, DESIGN.md).
"""

from __future__ import annotations

from dsl.ir import Absent, Call, Capture, Literal, OpNode, Rule
from rewrite import registry
from rewrite.egraph import Snapshot
from rewrite.emit import HostRule, egg_string
from rewrite.infer import infer_type
from rewrite.ops import OPS, decode_attr, encode_attr
from rewrite.types import TensorType


class UnsoundRuleError(RuntimeError):
    """A rule produced a term whose type differs from the type of the term it matched."""


class _Skip(Exception):
    """A builder could not build: the match is skipped."""


def apply_matches(snap: Snapshot, host_rules: list[HostRule], processed: set, report) -> list[str]:
    """egglog `union` commands for the new, guard-passing matches in `snap`.

    processed: keys of matches already handled (updated in place). report: a SaturationReport
    whose `fired`/`rejected` counters are updated. Raises UnsoundRuleError.
    """
    unions = []
    for h in host_rules:
        kinds = attr_kinds(h.rule)
        for row in snap.rows.get(h.relation, ()):
            # e-class ids are local to one snapshot: key the match by stable terms instead
            key = (h.relation, *(snap.rep(x) if isinstance(x, int) else x for x in row))
            if key in processed:
                continue
            processed.add(key)
            m = _Match(h.rule, dict(zip(h.columns, row[1:])), kinds, snap)
            try:
                if not m.guards_hold():
                    report.rejected[h.rule.name] += 1
                    continue
                text, typ = m.build(h.rule.rhs)
            except _Skip:
                report.rejected[h.rule.name] += 1
                continue
            _check_type(h.rule, snap.type_of(row[0]), typ)
            report.fired[h.rule.name] += 1
            unions.append(f"(union {snap.rep(row[0])} {text})")
    return unions


class _Match:
    """One match of a host rule: its bindings and how to evaluate guards and the result."""

    def __init__(self, rule: Rule, binding: dict, kinds: dict, snap: Snapshot):
        self.rule, self.binding, self.kinds, self.snap = rule, binding, kinds, snap
        self.terms = set(rule.term_captures)

    def value(self, a):
        """Python value of a guard/builder argument or attribute expression."""
        if isinstance(a, Literal):
            return a.value
        if isinstance(a, Capture):
            if a.name in self.terms:
                return self.snap.info(self.binding[a.name])
            return decode_attr(self.kinds[a.name], self.binding[a.name])
        if isinstance(a, Call):
            out = registry.BUILDERS[a.fn].fn(*(self.value(x) for x in a.args))
            if out is None:
                raise _Skip(a.fn)
            return out
        return None

    def guards_hold(self) -> bool:
        for g in self.rule.guards:
            ok = bool(registry.GUARDS[g.fn].fn(*(self.value(x) for x in g.args)))
            if ok == g.negate:
                return False
        return True

    def build(self, t) -> tuple[str, TensorType | None]:
        """(egglog text, inferred type) of result term `t`."""
        if isinstance(t, Capture):
            c = self.binding[t.name]
            return self.snap.rep(c), self.snap.type_of(c)
        if isinstance(t, Absent):
            return "(Absent)", None
        if not isinstance(t, OpNode):
            raise TypeError(f"cannot build {t!r}")
        spec = OPS.get(t.op)
        args = [self.build(a) for a in t.args]
        attrs = tuple((name, self.value(v)) for name, v in t.attrs)
        texts = [a[0] for a in args]
        texts += [egg_string(encode_attr(spec.attr_index[n].kind, v)) for n, v in attrs]
        values = tuple(self._const(a) for a in t.args)
        typ = infer_type(t.op, attrs, tuple(a[1] for a in args), values)
        return f"({t.op} {' '.join(texts)})", typ

    def _const(self, a):
        if isinstance(a, Capture) and a.name in self.terms:
            return self.snap.value_of(self.binding[a.name])
        return None


def _check_type(rule: Rule, want: TensorType, got: TensorType | None) -> None:
    if got is None or not want.static or not got.static:
        return
    if want.dtype and got.dtype and (want.dtype != got.dtype or want.shape != got.shape):
        raise UnsoundRuleError(
            f"rule {rule.name} ({rule.span}) rewrote a {want} value into a {got} value"
        )


def attr_kinds(rule: Rule) -> dict[str, str]:
    """Attribute capture name -> attribute kind, from where the left side binds it."""
    kinds: dict[str, str] = {}

    def walk(t):
        if isinstance(t, OpNode):
            spec = OPS.get(t.op)
            for name, v in t.attrs:
                if isinstance(v, Capture):
                    kinds.setdefault(v.name, spec.attr_index[name].kind)
            for a in t.args:
                walk(a)

    walk(rule.lhs)
    return kinds
