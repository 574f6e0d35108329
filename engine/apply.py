"""The host apply step: finish the matches of rules with guards or builders.

For each new row of a host rule's match relation: evaluate the guards on the captured
e-classes' facts (`ClassInfo`) and attribute values, compute builder results, and render the
rule's result as import rows over the captured e-classes' handles, to be unioned with the
matched root in one bulk load. The result's type is inferred with the op table's shape rules;
if it differs from the root's known type the rule is unsound and `UnsoundRuleError` is raised
(two e-classes of different types must never merge, DESIGN.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from dsl.ir import Absent, Call, Capture, ListCapture, Literal, OpNode, Rule
from engine.egraph import Snapshot, constant_op_value
from engine.emit import HostRule, guard_text
from engine.infer import infer_type
from engine.sites import SitedRule, admits
from vocab import registry
from vocab.graph import ABSENT
from vocab.ops import OPS, decode_attr, encode_attr
from vocab.types import TensorType

SAME_ROOTS = "two roots are one value"  # a multi-root match whose roots are one e-class


class UnsoundRuleError(RuntimeError):
    """A rule produced a term whose type differs from the type of the term it matched."""


@dataclass(frozen=True)
class HostFiring:
    """One applied match of a host rule, for provenance. Handles (`(T i)` ids) stay valid
    across snapshots, so the final snapshot maps them to its e-classes.

    root: handle of the matched root. terms: term capture -> handle; attrs: attribute capture
    -> attribute string. created: the result's e-nodes as (handle, op, child handles,
    attribute strings), children first."""

    rule: Rule
    root: int
    terms: tuple[tuple[str, int], ...]
    attrs: tuple[tuple[str, str], ...]
    created: tuple[tuple[int, str, tuple[int, ...], tuple[str, ...]], ...]


class _Skip(Exception):
    """A builder could not build: the match is skipped."""


class Batch:
    """Results of host rules as import rows: new e-nodes get fresh handle ids (from
    `EGraph.next_id`), and each result is a `UnionRow` of the matched root's handle and the
    result's handle. Loaded in bulk by `EGraph.load_rows`."""

    def __init__(self, eg, snap: Snapshot):
        self.eg, self.snap = eg, snap
        self.rows: dict[str, list[str]] = {}
        self._ids: dict[int, int] = {}  # e-class -> handle id, for classes without a handle

    def __bool__(self) -> bool:
        return bool(self.rows)

    def node(self, op: str, inputs: list[int], attrs: list[str], typ: TensorType | None) -> int:
        """Append an e-node row `op(inputs..., attrs...)` with a fresh handle id; `typ`, if
        given, is recorded as the new value's type. Returns the handle id."""
        vid = self.eg.next_id
        self.eg.next_id += 1
        if typ is not None:
            self.eg.extra_types[vid] = typ
        self.rows.setdefault(f"{op}Row", []).append("\t".join(map(str, [vid, *inputs, *attrs])))
        return vid

    def union(self, a: int, b: int) -> None:
        """Append a `UnionRow` that merges the e-classes of handles `a` and `b`."""
        self.rows.setdefault("UnionRow", []).append(f"{a}\t{b}")

    def handle(self, c: int, depth: int = 0) -> int:
        """A handle id for e-class `c`: an existing handle, or a new one built from one of the
        class's e-nodes (classes created by plain egglog rules have no handle)."""
        hs = self.snap.handles_of.get(c)
        if hs:
            return min(hs)
        if c in self._ids:
            return self._ids[c]
        n = self.snap.finite_node(c)
        if depth > 50 or n is None:
            raise _Skip("a term for a deep e-class")
        kids = [self.handle(k, depth + 1) for k in n.children]
        self._ids[c] = self.node(n.op, kids, list(n.attrs), self.snap.type_of(c))
        return self._ids[c]


def apply_matches(
    eg,
    snap: Snapshot,
    host_rules: list[HostRule],
    processed: set,
    report,
    record: list | None = None,
) -> Batch:
    """The new, guard-passing matches in `snap` as a Batch of rows to load into `eg`.

    processed: keys of matches already handled (updated in place). report: a SaturationReport
    whose `fired`/`rejected` counters are updated. record: when a list, each applied match is
    appended to it as a `HostFiring` (provenance). Raises UnsoundRuleError.
    """
    batch = Batch(eg, snap)
    for h in host_rules:
        kinds = attr_kinds(h.rule)
        for row in snap.rows.get(h.relation, ()):
            m = _Match(h.rule, dict(zip(h.columns, row[1:])), kinds, snap, batch)
            roots = [row[0], *(m.binding[t.bind] for t in h.rule.roots)]
            # a root takes part in one applied match of a multi-root rule: the matches partition
            # the roots (12 MatMuls of one input pack into 4 triples, not into all 220)
            used = [(h.rule.name, "root", snap.rep(c)) for c in roots] if h.rule.roots else []
            if any(u in processed for u in used):
                continue
            # e-class ids are local to one snapshot: key the match by stable terms instead
            key = (h.relation, *(snap.rep(x) if isinstance(x, int) else x for x in row))
            if key in processed:
                continue
            processed.add(key)
            if len(set(roots)) < len(roots):
                report.rejected[h.rule.name][SAME_ROOTS] += 1
                continue
            gap = m.list_gap()
            if gap is not None:
                report.rejected[h.rule.name][f"@{gap}... has an absent input inside it"] += 1
                continue
            try:
                failed = m.failing_guard()
                if failed is not None:
                    report.rejected[h.rule.name][f"guard {guard_text(failed)} failed"] += 1
                    continue
                sited, site = isinstance(h.rule, SitedRule), None
                if sited:  # culprit bisection: only at chosen sites (engine.sites)
                    ok, site = admits(snap, row[0], h.rule)
                    if not ok:
                        report.rejected[h.rule.name]["not at a chosen site"] += 1
                        continue
                built = [(c, *m.build(result)) for c, result in zip(roots, h.rule.results_all)]
                handles = [batch.handle(c) for c in roots]
                if record is not None:
                    record += [m.firing(handle) for handle in handles]
            except _Skip as e:
                report.rejected[h.rule.name][f"{e.args[0]} could not build"] += 1
                continue
            for c, _vid, typ in built:
                _check_type(h.rule, snap.type_of(c), typ)
            report.fired[h.rule.name] += 1
            if sited:
                report.sites[h.rule.name].append(site)
            for handle, (_c, vid, _typ) in zip(handles, built):
                batch.union(handle, vid)
            if used:
                processed.update(used)
                report.groups.append(
                    tuple(
                        (handle, m.created_node(vid))
                        for handle, (_c, vid, _t) in zip(handles, built)
                    )
                )
    return batch


class _Match:
    """One match of a host rule: its bindings and how to evaluate guards and the result."""

    def __init__(self, rule: Rule, binding: dict, kinds: dict, snap: Snapshot, batch: Batch):
        self.rule, self.binding, self.kinds, self.snap, self.batch = (
            rule,
            binding,
            kinds,
            snap,
            batch,
        )
        self.terms = set(rule.term_captures)
        self.items = dict(rule.items)
        self.created: list[tuple[int, str, tuple[int, ...], tuple[str, ...]]] = []
        # result terms built, by identity: a `with` binding used twice is one term object,
        # built once (weight-only's block rules use theirs up to six times)
        self._built: dict[int, tuple[int, TensorType | None]] = {}

    def present(self, name: str) -> tuple[str, ...]:
        """The item captures of list `name` bound to present inputs (an open list's items past
        the node's last input are bound to the absent class, `dsl.lists`)."""
        return tuple(i for i in self.items[name] if not self.snap.is_absent(self.binding[i]))

    def list_gap(self) -> str | None:
        """The first list whose present items are not a leading run of its items (no match of
        a well-formed node has one), or None."""
        for name, items in self.items.items():
            if self.present(name) != items[: len(self.present(name))]:
                return name
        return None

    def created_node(self, vid: int):
        """The e-node built for handle `vid`, as (op, child handles, attribute strings), or
        None when `vid` is a captured value's handle (the result is a capture)."""
        return next(((op, kids, attrs) for v, op, kids, attrs in self.created if v == vid), None)

    def firing(self, root: int) -> HostFiring:
        """This match, applied, as a HostFiring (after `build`)."""
        terms = []
        for n in self.rule.term_captures:
            try:
                terms.append((n, self.batch.handle(self.binding[n])))
            except _Skip:  # no term for the class: provenance matches it as a wildcard
                continue
        terms = tuple(terms)
        attrs = tuple((n, self.binding[n]) for n in self.rule.attr_captures)
        return HostFiring(self.rule, root, terms, attrs, tuple(self.created))

    def value(self, a):
        """Python value of a guard/builder argument or attribute expression."""
        if isinstance(a, Literal):
            return a.value
        if isinstance(a, ListCapture):
            return [self.snap.info(self.binding[i]) for i in self.present(a.name)]
        if isinstance(a, Capture):
            if a.name in self.terms:
                return self.snap.info(self.binding[a.name])
            return decode_attr(self.kinds[a.name], self.binding[a.name])
        if isinstance(a, Call):
            args = [self.value(x) for x in a.args]
            try:
                out = registry.BUILDERS[a.fn].fn(*args)
            except (ArithmeticError, ValueError, TypeError, IndexError) as e:
                # arguments the builder cannot take (a rule giving them in another order):
                # it cannot build, as when it returns None, and the reason is kept
                raise _Skip(f"{a.fn} ({type(e).__name__}: {e})") from None
            if out is None:
                raise _Skip(a.fn)
            return out
        return None

    def guards_hold(self) -> bool:
        """True when every guard holds."""
        return self.failing_guard() is None

    def failing_guard(self):
        """The first guard that does not hold, or None when all hold."""
        for g in self.rule.guards:
            try:
                ok = registry.GUARDS[g.fn].fn(*(self.value(x) for x in g.args))
            except _Skip:  # a builder argument (a `with` binding) could not build: undecided
                ok = None
            if ok is None or bool(ok) == g.negate:  # undecided fails either way
                return g
        return None

    def build(self, t) -> tuple[int, TensorType | None]:
        """(handle id, inferred type) of result term `t`, adding its new e-nodes as rows."""
        if isinstance(t, Capture):
            c = self.binding[t.name]
            return self.batch.handle(c), self.snap.type_of(c)
        if isinstance(t, Absent):
            return ABSENT, None
        if not isinstance(t, OpNode):
            raise TypeError(f"cannot build {t!r}")
        if id(t) in self._built:
            return self._built[id(t)]
        spec = OPS.get(t.op)
        terms = self.spread(t, spec)
        args = [self.build(a) for a in terms]
        attrs = tuple((name, self.value(v)) for name, v in t.attrs)
        texts = [encode_attr(spec.attr_index[n].kind, v) for n, v in attrs]
        values = tuple(self._const(a) for a in terms)
        typ = infer_type(t.op, attrs, tuple(a[1] for a in args), values)
        vid = self.batch.node(t.op, [a[0] for a in args], texts, typ)
        self.created.append((vid, t.op, tuple(a[0] for a in args), tuple(texts)))
        self._built[id(t)] = vid, typ
        return vid, typ

    def spread(self, t: OpNode, spec) -> tuple:
        """The inputs of result node `t` with each list capture spread into its present items
        and the rest of the slots absent. Raises _Skip when they do not fit the op's slots
        or leave a required input out."""
        if not any(isinstance(a, ListCapture) for a in t.args):
            return t.args
        out: list = []
        for a in t.args:
            out += [Capture(i) for i in self.present(a.name)] if isinstance(a, ListCapture) else [a]
        if len(out) > spec.arity:
            raise _Skip(f"{t.op} of {len(out)} inputs (it has {spec.arity} slots)")
        if len(out) < spec.n_required:
            raise _Skip(f"{t.op} of {len(out)} inputs")
        return tuple(out) + (Absent(),) * (spec.arity - len(out))

    def _const(self, a):
        """Value of a constant argument (a captured constant, or a `Constant` op in the rule),
        so shape rules can use it (e.g. a Reshape's target shape)."""
        if isinstance(a, Capture) and a.name in self.terms:
            return self.snap.value_of(self.binding[a.name])
        if isinstance(a, OpNode) and a.op == "Constant":
            spec = OPS.get("Constant")
            return constant_op_value(
                tuple(encode_attr(spec.attr_index[n].kind, self.value(v)) for n, v in a.attrs)
            )
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
