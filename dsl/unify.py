"""Matching and unification of rule patterns: the term algebra behind `rewrite lint`.

Two rules overlap when their left sides unify (Knuth and Bendix, "Simple word problems in
universal algebras", 1970: critical pairs): the most general unifier instance of both is a
term that both rules match, the *witness*, and the two results on it are a *critical pair*.
A left side that is an instance of another (one-way matching) with the same guards and result
is a shadowed rule.

Rules are first made *apart* (`apart`): every capture gets a per-rule prefix (`a_x`, `b_x`),
every wildcard becomes a fresh capture and every operator node a bind (`(Op@a__n1 ...)`), so a
position of the witness can be named in the results and guards whichever rule it came from.
Everything here reads and writes `dsl.ir` terms only.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dsl.ir import Call, Capture, Guard, Literal, OpNode, Rule, Wildcard


class NoOverlap(Exception):
    """The two patterns do not unify (or the overlap cannot be expressed as a rule)."""


@dataclass(frozen=True)
class Apart:
    """A directed rule with captures prefixed, wildcards turned into captures and every
    operator node bound (see module doc). `rule` is the rule it came from."""

    rule: Rule
    lhs: OpNode
    rhs: object
    guards: tuple[Guard, ...]


@dataclass(frozen=True)
class Overlap:
    """Two rules matching one term: `witness` (a left side, binds on its nodes), `guards` (both
    rules' guards on it), and `results` (what each rule makes of it; for an overlap below the
    root, the second is the witness with that subterm rewritten). `position` is the path of
    argument indices where the second rule matches (() for the root)."""

    first: Rule
    second: Rule
    position: tuple[int, ...]
    witness: OpNode
    guards: tuple[Guard, ...]
    results: tuple[object, object]


def apart(rule: Rule, tag: str) -> Apart:
    """`rule` made apart with prefix `tag` (a short identifier such as `a`)."""
    count = [0]

    def fresh(kind: str) -> str:
        count[0] += 1
        return f"{tag}__{kind}{count[0]}"

    def name(n: str) -> str:
        return f"{tag}_{n}"

    def left(t):
        if isinstance(t, OpNode):
            attrs = tuple((k, left_attr(v)) for k, v in t.attrs)
            return OpNode(
                t.op, tuple(left(a) for a in t.args), attrs, name(t.bind) if t.bind else fresh("n")
            )
        if isinstance(t, Capture):
            return Capture(name(t.name))
        if isinstance(t, Wildcard):
            return Capture(fresh("w"))
        return t

    def left_attr(v):
        if isinstance(v, Wildcard):
            return Capture(fresh("v"))
        return Capture(name(v.name)) if isinstance(v, Capture) else v

    def right(t):
        if isinstance(t, OpNode):
            attrs = tuple((k, right(v)) for k, v in t.attrs)
            return dataclasses.replace(t, args=tuple(right(a) for a in t.args), attrs=attrs)
        if isinstance(t, Call):
            return Call(t.fn, tuple(right(a) for a in t.args))
        return Capture(name(t.name)) if isinstance(t, Capture) else t

    guards = tuple(
        dataclasses.replace(g, args=tuple(right(a) for a in g.args)) for g in rule.guards
    )
    return Apart(rule, left(rule.lhs), right(rule.rhs), guards)


# ---- one-way matching: is a term an instance of a pattern? ---------------------------------


def match(pattern, term, subst: dict | None = None) -> dict | None:
    """The substitution (capture name -> subterm of `term`) that makes `pattern` equal to
    `term`, or None. Both are left sides of rules (captures of `term` are constants here);
    a bind of `pattern` maps to the bind-free node it matched. A wildcard matches anything."""
    subst = {} if subst is None else subst
    if isinstance(pattern, Wildcard):
        return subst
    if isinstance(pattern, Capture):
        seen = subst.get(pattern.name)
        if seen is None:
            subst[pattern.name] = strip(term)
            return subst
        return subst if seen == strip(term) else None
    if isinstance(pattern, OpNode):
        if not isinstance(term, OpNode) or term.op != pattern.op:
            return None
        if pattern.bind and match(Capture(pattern.bind), term, subst) is None:
            return None
        for p, t in zip(pattern.args, term.args):
            if match(p, t, subst) is None:
                return None
        for (_, p), (_, t) in zip(pattern.attrs, term.attrs):
            if match(p, t, subst) is None:
                return None
        return subst
    return subst if _same_leaf(pattern, term) else None


def strip(t):
    """`t` without binds (the structure of a term, for comparing positions)."""
    if isinstance(t, OpNode):
        return OpNode(t.op, tuple(strip(a) for a in t.args), t.attrs)
    return t


def binds_of(t, out: dict | None = None) -> dict:
    """bind -> bind-free node, for every bound node of a left side."""
    out = {} if out is None else out
    if isinstance(t, OpNode):
        if t.bind:
            out[t.bind] = strip(t)
        for a in t.args:
            binds_of(a, out)
    return out


def substitute(t, subst: dict):
    """`t` with captures replaced by `subst` (captures not in it stay)."""
    if isinstance(t, Capture):
        return subst.get(t.name, t)
    if isinstance(t, OpNode):
        attrs = tuple((k, substitute(v, subst)) for k, v in t.attrs)
        return OpNode(t.op, tuple(substitute(a, subst) for a in t.args), attrs)
    if isinstance(t, Call):
        return Call(t.fn, tuple(substitute(a, subst) for a in t.args))
    return t


def _same_leaf(a, b) -> bool:
    if isinstance(a, Literal) and isinstance(b, Literal):
        return _norm(a.value) == _norm(b.value)
    return type(a) is type(b) and a == b


def _norm(v):
    if isinstance(v, (list, tuple)):
        return tuple(_norm(x) for x in v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


# ---- unification: the most general common instance of two patterns ------------------------


class _Unifier:
    """Syntactic unification with occurs check over apart left sides. A bind is a variable
    bound to its own node, so a capture unified with a node resolves to it."""

    def __init__(self, *lhss: OpNode):
        self.subst: dict[str, object] = {}
        for t in lhss:
            for b, node in _bound_nodes(t):
                self.subst[b] = node

    def find(self, t):
        while isinstance(t, Capture) and t.name in self.subst:
            nxt = self.subst[t.name]
            if isinstance(nxt, OpNode):
                return nxt
            t = nxt
        return t

    def unify(self, s, t) -> None:
        s, t = self.find(s), self.find(t)
        if s is t or (isinstance(s, Capture) and isinstance(t, Capture) and s.name == t.name):
            return
        if isinstance(s, Capture) or isinstance(t, Capture):
            var, other = (s, t) if isinstance(s, Capture) else (t, s)
            if self.occurs(var.name, other):
                raise NoOverlap(f"@{var.name} occurs in the term it would stand for")
            self.subst[var.name] = other
            return
        if isinstance(s, OpNode) and isinstance(t, OpNode):
            if s.op != t.op or len(s.args) != len(t.args):
                raise NoOverlap(f"{s.op} against {t.op}")
            self.subst[t.bind] = s  # the second node's bind now names the first node
            for a, b in zip(s.args, t.args):
                self.unify(a, b)
            for (_, a), (_, b) in zip(s.attrs, t.attrs):
                self.unify(a, b)
            return
        if not _same_leaf(s, t):
            raise NoOverlap(f"{s} against {t}")

    def occurs(self, name: str, t, depth: int = 0) -> bool:
        t = self.find(t) if depth else t
        if isinstance(t, Capture):
            return t.name == name
        if isinstance(t, OpNode):
            return any(self.occurs(name, a, depth + 1) for a in t.args)
        return False

    def resolve(self, t):
        """`t` fully substituted, binds stripped (the structure it stands for)."""
        t = self.find(t)
        if isinstance(t, OpNode):
            attrs = tuple((k, self.resolve(v)) for k, v in t.attrs)
            return OpNode(t.op, tuple(self.resolve(a) for a in t.args), attrs)
        if isinstance(t, Call):
            return Call(t.fn, tuple(self.resolve(a) for a in t.args))
        return t


def _bound_nodes(t):
    if isinstance(t, OpNode):
        yield t.bind, t
        for a in t.args:
            yield from _bound_nodes(a)


def subterms(t: OpNode, path: tuple[int, ...] = ()):
    """(path, node) for every operator node of `t` below the root, outermost first."""
    for i, a in enumerate(t.args):
        if isinstance(a, OpNode):
            yield (*path, i), a
            yield from subterms(a, (*path, i))


def at(t: OpNode, path: tuple[int, ...]):
    """The subterm of `t` at `path`."""
    for i in path:
        t = t.args[i]
    return t


def overlap(a: Apart, b: Apart, position: tuple[int, ...] = ()) -> Overlap:
    """The critical pair of `b`'s left side unified with `a`'s at `position` (a path into
    `a.lhs`, () for the root). Raises NoOverlap if they do not unify."""
    u = _Unifier(a.lhs, b.lhs)
    u.unify(at(a.lhs, position), b.lhs)
    witness, names = _Witness(u).build(a.lhs)

    def name(t):
        """A result or guard argument over the witness: a node becomes a capture of its bind."""
        r = u.resolve(t)
        if isinstance(r, OpNode):
            if isinstance(t, Capture):
                if r not in names:
                    raise NoOverlap("a capture stands for a node the witness does not hold")
                return Capture(names[r])
            attrs = tuple((k, name(v)) for k, v in t.attrs)
            return dataclasses.replace(t, args=tuple(name(x) for x in t.args), attrs=attrs)
        if isinstance(t, Call):
            return Call(t.fn, tuple(name(x) for x in t.args))
        return r

    guards = tuple(
        dataclasses.replace(g, args=tuple(name(x) for x in g.args)) for g in a.guards + b.guards
    )
    first = name(a.rhs)
    inner = name(b.rhs)
    second = _rewrite_at(witness, position, inner)
    return Overlap(a.rule, b.rule, position, witness, _dedup(guards), (first, second))


def _rewrite_at(t, path: tuple[int, ...], new):
    """The witness as a result, its subterm at `path` replaced by `new`: the nodes off the
    path are referred to by their binds."""
    if not path:
        return new
    args = [Capture(a.bind) if isinstance(a, OpNode) and a.bind else a for a in t.args]
    args[path[0]] = _rewrite_at(t.args[path[0]], path[1:], new)
    return OpNode(t.op, tuple(args), t.attrs)


def _dedup(guards):
    out = []
    for g in guards:
        if g not in out:
            out.append(g)
    return tuple(out)


class _Witness:
    """The unified left side as a pattern: each distinct node once with a bind (a node needed
    twice, by a capture used twice, is repeated without one)."""

    def __init__(self, u: _Unifier):
        self.u = u
        self.names: dict[OpNode, str] = {}

    def build(self, lhs: OpNode):
        return self.term(lhs), self.names

    def term(self, t):
        t = self.u.find(t)
        if not isinstance(t, OpNode):
            return self.u.resolve(t)
        key = self.u.resolve(t)
        args = tuple(self.term(a) for a in t.args)
        attrs = tuple((k, self.u.resolve(v)) for k, v in t.attrs)
        if key in self.names:
            return OpNode(t.op, args, attrs)  # a repeated node: no second bind of one name
        self.names[key] = t.bind
        return OpNode(t.op, args, attrs, t.bind)
