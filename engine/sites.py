"""Match sites: a rule applied only where the caller says, for culprit bisection.

A site is named by an original value of the imported graph: the value at the root of a match
(the output of the node the rule's left side matched), by its name in the source graph. That
name is the same in every run on the same model, whichever other rules run, which is what
bisecting over the sites of a rule needs. A match whose root holds no original value (a term
built by another rewrite) has no site (`None`).

`SitedRule` is a rule that runs as a host rule (its matches go through `engine.apply`) and is
applied only at `sites`; with `sites` None it is applied everywhere. Either way the site of
every match it applies is recorded in the saturation report (`SaturationReport.sites`), so one
run lists the sites a rule fired at.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from weakref import WeakKeyDictionary

from dsl.ir import OpNode, Rule
from vocab.graph import TermGraph

_PRODUCER_OPS: WeakKeyDictionary = WeakKeyDictionary()


@dataclass(frozen=True)
class SitedRule(Rule):
    """A rule applied only at the match sites `sites` (value names; None: everywhere)."""

    sites: frozenset[str] | None = None

    @property
    def needs_host(self) -> bool:
        """Always: the site check runs in Python (`engine.apply`)."""
        return True


def sited(rule: Rule, sites: frozenset[str] | None = None) -> list[SitedRule]:
    """`rule` as SitedRules at `sites`: one for a `simplify` rule, two for an `equal` rule
    (host rules run one way, so the reverse direction is its own rule, named
    `NAME (reverse)` as the saturation report names it)."""
    fields = {f: getattr(rule, f) for f in Rule.__dataclass_fields__}
    forward = SitedRule(**{**fields, "kind": "simplify"}, sites=sites)
    if rule.kind != "equal":
        return [forward]
    return [forward, replace(forward, name=f"{rule.name} (reverse)", lhs=rule.rhs, rhs=rule.lhs)]


def site_of(snap, c: int, rule: Rule) -> str | None:
    """The site of a match of `rule` rooted at e-class `c` of Snapshot `snap`: the name of an
    original value in `c`, preferring one whose original node has the rule's root op (other
    values join the class when other rules merge it); None when `c` holds none."""
    graph: TermGraph = snap.graph
    vids = sorted(v for v in snap.handles_of.get(c, ()) if 0 <= v < len(graph.values))
    if not vids:
        return None
    ops = _PRODUCER_OPS.get(graph)
    if ops is None:
        ops = _PRODUCER_OPS[graph] = {v: n.op for n in graph.nodes for v in n.outputs}
    root = rule.lhs.op if isinstance(rule.lhs, OpNode) else None
    best = next((v for v in vids if ops.get(v) == root), vids[0])
    return graph.values[best].name


def admits(snap, c: int, rule: SitedRule) -> tuple[bool, str | None]:
    """(whether SitedRule `rule` may be applied at the match rooted at `c`, its site). A match
    is admitted when any original value in `c` is one of `rule.sites` (its class may have
    grown by other rules' merges since the sites were listed)."""
    site = site_of(snap, c, rule)
    if rule.sites is None:
        return True, site
    graph = snap.graph
    names = {graph.values[v].name for v in snap.handles_of.get(c, ()) if 0 <= v < len(graph.values)}
    return bool(names & rule.sites), site
