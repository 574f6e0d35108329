"""Skip and only lists: which rules of a RuleSet run.

    pick_rules(rules, skip=("cast-*",), only=("ruleset:cleanup",)) -> (RuleSet, excluded)

A pattern is a rule name, a shell-style glob over names (`fnmatch`: `matmul-add-to-gemm*`
also selects the `:c` variants `...-c1`), or `ruleset:NAME` (NAME may be a glob too), which
selects every rule written under `(ruleset NAME)`. `only` keeps the rules that match one of
its patterns (all rules when empty), then `skip` removes those that match one of its. The
rules are filtered before emission, so an excluded rule costs nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from fnmatch import fnmatchcase

from dsl.ir import Rule, RuleSet

RULESET_PREFIX = "ruleset:"


class UnknownRulePatternError(ValueError):
    """A --skip/--only pattern that matches no rule (a typo would otherwise be silent)."""


def matches(pattern: str, rule: Rule) -> bool:
    """True when `pattern` (a name, a glob, or `ruleset:NAME`) selects `rule`."""
    if pattern.startswith(RULESET_PREFIX):
        return fnmatchcase(rule.ruleset, pattern[len(RULESET_PREFIX) :])
    return fnmatchcase(rule.name, pattern)


def pick_rules(
    rules: RuleSet,
    skip: Iterable[str] | str = (),
    only: Iterable[str] | str = (),
    sums: tuple[str, ...] = (),
) -> tuple[RuleSet, dict[str, str]]:
    """The rules of `rules` that `only` keeps and `skip` does not remove, in order, and the
    excluded ones: rule name -> reason (`not in --only`, `--skip PATTERN`, `:sums S`). A
    string is one pattern (`skip="cast-*"`), not a list of letters. `sums`: the integer sums
    the result's runtime is known to have (`dsl.ast.Ruleset.sums`; `("int32",)` for
    `rewrite quantize --cpu vnni`); a rule whose ruleset needs others is excluded.

    Raises UnknownRulePatternError naming the first pattern (of `only`, then `skip`) that
    matches no rule of `rules`. With both lists empty and no rule excluded for its sums,
    `rules` itself comes back."""
    skip, only = _patterns(skip), _patterns(only)
    if not skip and not only and all(not r.sums or r.sums in sums for r in rules.rules):
        return rules, {}
    for flag, patterns in (("--only", only), ("--skip", skip)):
        for p in patterns:
            if not any(matches(p, r) for r in rules.rules):
                raise UnknownRulePatternError(
                    f"{flag} {p}: matches no rule (a name, a glob or ruleset:NAME; "
                    f"{len(rules.rules)} rules loaded)"
                )
    keep: list[Rule] = []
    excluded: dict[str, str] = {}
    for r in rules.rules:
        if r.sums and r.sums not in sums:
            excluded[r.name] = f":sums {r.sums} (the runtime is not known to sum so)"
            continue
        if only and not any(matches(p, r) for p in only):
            excluded[r.name] = "not in --only"
            continue
        hit = next((p for p in skip if matches(p, r)), None)
        if hit is not None:
            excluded[r.name] = f"--skip {hit}"
            continue
        keep.append(r)
    return RuleSet(tuple(keep), rules.files), excluded


def _patterns(p: Iterable[str] | str) -> tuple[str, ...]:
    return (p,) if isinstance(p, str) else tuple(p)
