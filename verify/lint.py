"""Rule-set lint: findings about a set of rules as a whole, each with `file:line` and a reason.

    lint(paths) -> LintReport

Kinds of finding (`KINDS`):

- `duplicate`: two rules with the same pattern up to renaming of captures, the same guards
  and the same result (an `equal` rule counts as its two directions).
- `shadowed`: a rule whose pattern is an instance of another rule's, whose guards include the
  other's and whose result is the other's on that instance: the other rule already does it.
- `never-fires`: no opset has every op of the rule (`vocab.ops`, opsets 13 to `MAX_OPSET`),
  an attribute value on the left is outside the ONNX spec (`ATTR_VALUES`), or two guards
  contradict each other (`(g x)` with `(not (g x))`, `(rank x 2)` with `(rank x 3)`, ...).
- `grows`: the rule alone (guards dropped), or with another guard-free rule that builds its
  ops, still adds e-nodes after a bounded saturation of its own pattern (`verify.lint_growth`).
- `critical-pair`: two rules match one term (Knuth-Bendix critical pairs, `dsl.unify`) and
  their results differ in value on a drawn witness (`verify.lint_pairs`).

A finding is acknowledged by a comment in the rule's gloss (the comment lines above the rule,
or above its enclosing `for`): `;; lint: allow KIND because REASON` (several kinds separated by
commas). A critical pair may be acknowledged on either rule. Acknowledged findings are
reported but do not fail the lint.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import time
from collections import Counter
from dataclasses import dataclass, field

from dsl import load_rules, rule_files
from dsl.ir import Guard, Literal, OpNode, Rule, RuleSet
from dsl.lists import concrete
from dsl.unify import binds_of, match, substitute
from verify.findings import KINDS, Finding, contradiction, source_name
from verify.lint_growth import growth_findings
from verify.lint_pairs import critical_pairs
from vocab.ops import OPS

MAX_OPSET = 26  # the newest opset onnxruntime 1.31 runs
_ALLOW = re.compile(r";+\s*lint:\s*allow\s+(.*)$")
_ALLOW_BODY = re.compile(r"([a-z-]+(?:\s*,\s*[a-z-]+)*)\s+because\s+\S.*")

_BOOL = frozenset({0, 1})
_PADS = frozenset({"NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"})
# attribute values the ONNX spec allows (https://onnx.ai/onnx/operators/), where it restricts
ATTR_VALUES: dict[str, frozenset] = {
    "auto_pad": _PADS,
    "mode": frozenset({"constant", "reflect", "edge", "wrap"}),
    "approximate": frozenset({"none", "tanh"}),
    "to": frozenset(range(1, 24)) - {8},  # TensorProto data types, strings excluded
    **dict.fromkeys(
        (
            "saturate",
            "allowzero",
            "keepdims",
            "noop_with_empty_axes",
            "transA",
            "transB",
            "ceil_mode",
            "count_include_pad",
            "storage_order",
            "training_mode",
            "fmod",
        ),
        _BOOL,
    ),
}


class LintInputError(Exception):
    """Bad input to the lint: a malformed `lint: allow` comment (message is one line)."""


@dataclass
class LintReport:
    """The lint of some rule files: findings (acknowledged ones included), counts and
    wall-clock seconds per stage. `pairs`: critical-pair counts (`overlaps` found, `trivial`
    with syntactically equal results, `checked` numerically, `agree`, `differ`, `unsat`,
    `degenerate`, `unsupported`, `unchecked` over the budget, `approximate` between two
    `quant` rules, each verified against its own bound instead)."""

    files: int
    rules: int
    findings: list[Finding] = field(default_factory=list)
    pairs: Counter = field(default_factory=Counter)
    growth: Counter = field(default_factory=Counter)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def open(self) -> list[Finding]:
        """The findings not acknowledged: each one fails the lint."""
        return [f for f in self.findings if not f.allowed]

    def summary(self) -> str:
        """One line: rule and file counts, open findings by kind, acknowledged ones, and the
        critical-pair counts."""
        by_kind = Counter(f.kind for f in self.open)
        kinds = ", ".join(f"{n} {k}" for k, n in sorted(by_kind.items())) or "no findings"
        allowed = len(self.findings) - len(self.open)
        p = self.pairs
        return (
            f"{self.rules} rules in {self.files} files: {kinds}"
            + (f" ({allowed} acknowledged)" if allowed else "")
            + f"; critical pairs: {p['overlaps']} overlaps, {p['trivial']} trivially joinable, "
            f"{p['checked']} checked numerically ({p['agree']} agree, {p['differ']} differ, "
            f"{p['unsat']} without a witness satisfying both guards, {p['degenerate']} with "
            f"all-zero witnesses only, {p['unsupported']} "
            f"unsupported, {p['timeout']} out of time), {p['infeasible']} infeasible (guards "
            f"that contradict, or ask for an operator output's value or an absent input), "
            f"{p['approximate']} between two quant rules (each verified against its bound), "
            f"{p['unchecked']} over the budget; {sum(self.seconds.values()):.1f} s"
        )


def lint(
    paths,
    numeric: bool = True,
    max_pairs: int = 50,
    examples: int = 2,
    subterm_pairs: bool = False,
    seed: int = 0,
) -> LintReport:
    """Lint the `.rules` files under `paths` (files or directories; the rules are checked
    together, so pairs across files are found).

    numeric: check critical pairs on the verifier: at most `max_pairs` of them, sampled with
    `seed`, `examples` witnesses each; subterm_pairs: also overlaps below the root (more
    pairs, same budget).
    Returns a `LintReport`. Raises `dsl.RulesError` for rules that do not check,
    `LintInputError` for a malformed acknowledgement, `OSError` for a missing file.
    """
    clock = time.perf_counter()
    files = rule_files(paths)
    rules = load_rules([p for p, _ in files])
    report = LintReport(len(files), len(rules.rules))
    acks = {label: acknowledgements(p.read_text(encoding="utf-8"), label) for p, label in files}
    directed = directions(rules)

    def stage(name: str) -> None:
        nonlocal clock
        report.seconds[name] = time.perf_counter() - clock
        clock = time.perf_counter()

    found = list(never_fires(rules)) + list(duplicates(directed))
    stage("static")
    found += growth_findings(rules, report.growth)
    stage("growth")
    found += critical_pairs(
        directed, report.pairs, numeric, max_pairs, examples, subterm_pairs, seed
    )
    stage("pairs")
    report.findings = [_acknowledge(f, acks, rules) for f in _unique(found)]
    return report


def directions(rules: RuleSet) -> list[Rule]:
    """Every rule as a directed rule: an `equal` rule gives both directions, and a rule with
    list captures its instances with every list of 0 and of 1 item (`dsl.lists.concrete`,
    named `NAME[xs=1,...]`; the ones that fit their ops' slots). Multi-root rules are left
    out: overlaps and critical pairs are computed between one-root patterns."""
    out = []
    for r in rules.rules:
        if r.roots:  # critical pairs are of one-root patterns (dsl.unify)
            continue
        if r.lists:
            for n in (0, 1):
                c = concrete(r, dict.fromkeys(r.lists, n))
                if c is not None:
                    out.append(dataclasses.replace(c, name=f"{r.name}[{c.instance}]"))
            continue
        out.append(r)
        if r.kind == "equal":  # named as `verify.instance.reversed_rule` and the engine do
            out.append(dataclasses.replace(r, name=f"{r.name} (reverse)", lhs=r.rhs, rhs=r.lhs))
    return out


# ---- acknowledgements ----------------------------------------------------------------------


def acknowledgements(text: str, label: str) -> dict[int, dict[str, str]]:
    """line of a form (1-based) -> kind -> reason, from the `;; lint: allow` comments in the
    comment block right above it (`for` heads are looked through). Raises LintInputError for
    a `lint: allow` comment without a known kind or a `because` reason."""
    lines = text.splitlines()
    out: dict[int, dict[str, str]] = {}
    pending: dict[str, str] = {}
    for i, line in enumerate(lines, 1):
        s = line.strip()
        m = _ALLOW.search(s) if s.startswith(";") else None
        if m:
            body = _ALLOW_BODY.fullmatch(m[1].strip())
            kinds = [k.strip() for k in body[1].split(",")] if body else []
            bad = [k for k in kinds if k not in KINDS]
            if not body or bad:
                raise LintInputError(
                    f"{label}:{i}: malformed acknowledgement, expected "
                    f"';; lint: allow KIND[, KIND] because REASON' with KIND in {', '.join(KINDS)}"
                )
            reason = body[0].split("because", 1)[1].strip()
            pending.update(dict.fromkeys(kinds, reason))
        elif s.startswith("(for"):
            continue
        elif s.startswith(("(simplify", "(equal")):
            out[i] = pending
            pending = {}
        elif not s.startswith(";"):
            pending = {}
    return out


def _acknowledge(f: Finding, acks: dict, rules: RuleSet) -> Finding:
    spans = [f.span] + [r.span for r in rules.rules if f.other and r.name == f.other]
    for span in spans:
        reason = acks.get(span.file, {}).get(span.line, {}).get(f.kind)
        if reason:
            return Finding(f.kind, f.rule, f.span, f.reason, reason, f.other)
    return f


def _unique(found):
    seen, out = set(), []
    for f in found:
        key = (f.kind, f.rule, f.other)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


# ---- never fires ---------------------------------------------------------------------------


def never_fires(rules: RuleSet):
    """`never-fires` findings: no opset for the rule's ops, attribute values outside the
    spec on the left, contradictory guards."""
    for r in rules.rules:
        ops = r.lhs_ops | r.rhs_ops
        opsets = [o for o in range(13, MAX_OPSET + 1) if all(OPS.get(op, o) for op in ops)]
        if not opsets:
            yield Finding(
                "never-fires",
                r.name,
                r.span,
                f"no opset in 13-{MAX_OPSET} has all of {', '.join(sorted(ops))}",
            )
        for op, name, value in _literal_attrs(r.lhs):
            allowed = ATTR_VALUES.get(name)
            if allowed is not None and value not in allowed:
                yield Finding(
                    "never-fires",
                    r.name,
                    r.span,
                    f"{op} :{name} {value!r} is not a value ONNX allows",
                )
        clash = contradiction(r.guards)
        if clash:
            yield Finding("never-fires", r.name, r.span, f"the guards contradict: {clash}")


def _literal_attrs(t):
    if isinstance(t, OpNode):
        for name, v in t.attrs:
            if isinstance(v, Literal) and v.value is not None:
                yield t.op, name, v.value
        for a in t.args:
            yield from _literal_attrs(a)


# ---- duplicates and shadowed rules ---------------------------------------------------------


def duplicates(directed: list[Rule]):
    """`duplicate` and `shadowed` findings over directed rules (see module doc); rules from
    one source form (a `:c` family, an `equal` rule's two directions) are not compared."""
    for a, b in itertools.permutations(directed, 2):
        if a.span == b.span or a.lhs.op != b.lhs.op or not subsumes(a, b):
            continue
        name_a, name_b = source_name(a), source_name(b)
        if subsumes(b, a):
            later = b if (b.span.file, b.span.line) > (a.span.file, a.span.line) else None
            if later is not None:
                yield Finding(
                    "duplicate",
                    name_b,
                    b.span,
                    f"same pattern, guards and result as {name_a} ({a.span})",
                    other=name_a,
                )
        else:
            yield Finding(
                "shadowed",
                name_b,
                b.span,
                f"an instance of {name_a} ({a.span}) with its guards and result",
                other=name_a,
            )


def subsumes(a: Rule, b: Rule) -> bool:
    """True if `a` does what `b` does wherever `b` fires: `b`'s left side is an instance of
    `a`'s, `a`'s guards (instantiated) are among `b`'s, and the results are the same."""
    subst = match(a.lhs, b.lhs)
    if subst is None:
        return False
    na, nb = binds_of(a.lhs), binds_of(b.lhs)

    def on_b(t):
        return substitute(substitute(t, na), subst)

    b_guards = {_guard_key(g, lambda t: substitute(t, nb)) for g in b.guards}
    if any(_guard_key(g, on_b) not in b_guards for g in a.guards):
        return False
    return on_b(a.rhs) == substitute(b.rhs, nb)


def _guard_key(g: Guard, f):
    return g.fn, g.negate, tuple(f(x) for x in g.args)
