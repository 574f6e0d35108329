"""pytest plugin: every rule of a `.rules` file is a test item (`rewrite verify` per rule).

    pytest --rules PATH [--rules PATH...] [--rules-examples N] [--rules-seed S]

collects each rule of the `.rules` files under PATH as its own item, with the rule's name as
id (`patterns/algebra/arith.rules::add-zero`); with no other test paths on the command line
only the rules are collected. A rule that is not verified fails with its shrunk
counterexample and the command that reproduces it.

A project can also collect rules as part of its test suite: `.rules` files under a path in
the `rules_paths` ini option are collected whenever pytest collects that path (for example,
listed in `testpaths`). This project does so for `patterns/`.

Registered as the `pytest11` entry point `verify.pytest_plugin`; in a source checkout that is
not installed, load it with `-p verify.pytest_plugin` (this project's `addopts` does). Under
`CI`, Hypothesis's `ci` profile is loaded (derandomized, no database).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# dsl, the runner and the lint are imported inside the hooks that use them: pytest loads this
# plugin at every start, in every project that installs `rewrite`, and most sessions collect no
# rules (tests/test_layers.py lists the modules allowed such imports).


def pytest_addoption(parser) -> None:
    """Add the `--rules`, `--rules-examples`, `--rules-seed` and `--rules-lint-pairs` options
    and the `rules_paths`, `rules_examples` and `rules_lint_pairs` ini keys."""
    group = parser.getgroup("rewrite-verify", "rule verification (rewrite verify)")
    group.addoption(
        "--rules",
        action="append",
        default=[],
        metavar="PATH",
        help="collect each rule of these .rules files or directories as a test item",
    )
    group.addoption(
        "--rules-examples",
        type=int,
        default=None,
        metavar="N",
        help="examples per rule and direction (default: ini rules_examples, else 50)",
    )
    group.addoption(
        "--rules-seed", type=int, default=0, metavar="S", help="random seed (default 0)"
    )
    parser.addini(
        "rules_paths",
        type="paths",
        default=[],
        help=".rules files or directories whose rules are collected as test items",
    )
    parser.addini("rules_examples", default="", help="examples per rule and direction")
    group.addoption(
        "--rules-lint-pairs",
        type=int,
        default=None,
        metavar="N",
        help="critical pairs per file checked numerically by the lint item (default: ini "
        f"rules_lint_pairs, else {LINT_PAIRS})",
    )
    parser.addini("rules_lint_pairs", default="", help="critical pairs per file the lint checks")


def pytest_configure(config) -> None:
    """Register the `rule` marker, load Hypothesis's `ci` profile under `CI`, and add the
    `--rules` paths to the paths pytest collects (only them when no test path is given)."""
    config.addinivalue_line("markers", "rule: a rule verified by the rewrite verify plugin")
    if os.environ.get("CI"):
        from hypothesis import settings

        settings.load_profile("ci")
    given = [str(Path(p)) for p in config.getoption("rules")]
    if given:
        if config.args_source == pytest.Config.ArgsSource.ARGS:
            config.args.extend(p for p in given if p not in config.args)
        else:  # no test paths given: only the rules
            config.args[:] = given


def pytest_collect_file(file_path: Path, parent):
    """A `RulesFile` for a `.rules` file under `--rules` or `rules_paths`, else None."""
    if file_path.suffix == ".rules" and _wanted(file_path, parent.config):
        return RulesFile.from_parent(parent, path=file_path)
    return None


def _wanted(path: Path, config) -> bool:
    roots = [Path(p).resolve() for p in config.getoption("rules")]
    roots += [Path(p).resolve() for p in config.getini("rules_paths")]
    path = path.resolve()
    return any(path == r or path.is_relative_to(r) for r in roots)


LINT_PAIRS = 5  # critical pairs per file checked numerically by its lint item (2 witnesses each)


class RulesFile(pytest.File):
    """One `.rules` file: one item per rule (after `for` and `:c` expansion), then its `lint`
    item (`rewrite lint` on the file alone)."""

    def collect(self):
        """One `RuleItem` per rule of the file, then its `LintItem`."""
        from dsl import load_rules

        here = Path(self.config.invocation_params.dir)
        path = self.path.relative_to(here) if self.path.is_relative_to(here) else self.path
        rules = load_rules([path])  # named as the user would type it, for the repro command
        for rule in rules.rules:
            yield RuleItem.from_parent(self, name=rule.name, rule=rule, rules=rules)
        yield LintItem.from_parent(self, name="lint", target=path)


class RuleNotVerified(Exception):
    """A rule failed verification; the message is its report."""


class RuleItem(pytest.Item):
    """One rule, verified by `verify.runner.verify_rule` when run."""

    def __init__(self, *, rule, rules, **kw):
        super().__init__(**kw)
        self.rule, self.rules = rule, rules
        self.add_marker("rule")

    def runtest(self) -> None:
        """Verify the rule; raises RuleNotVerified with its report and repro command if it does
        not pass."""
        from verify.runner import DEFAULT_EXAMPLES, verify_rule

        config = self.config
        examples = config.getoption("rules_examples") or int(
            config.getini("rules_examples") or DEFAULT_EXAMPLES
        )
        res = verify_rule(self.rule, self.rules, examples, config.getoption("rules_seed"))
        self.user_properties += [
            ("examples", res.examples),
            ("max_abs", res.max_abs),
            ("status", res.status),
        ]
        if res.status != "pass":
            f = res.failure
            body = (
                f.text
                if f and f.text
                else (f.reason if f else res.detail or "no valid example was drawn")
            )
            raise RuleNotVerified(
                f"{res.status}: {self.rule.name} ({self.rule.span})\n{body}\nreproduce: {res.repro}"
            )

    def repr_failure(self, excinfo, style=None):
        """The report alone for a rule that was not verified, else pytest's usual traceback."""
        if isinstance(excinfo.value, RuleNotVerified):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        """Where pytest reports the item: the file, the rule's line (0-based) and its name."""
        return self.path, self.rule.span.line - 1, f"rule {self.rule.name}"


class LintItem(pytest.Item):
    """`rewrite lint` of one `.rules` file alone (pairs across files are the CLI's job): all
    static checks and the growth check, and at most `--rules-lint-pairs` critical pairs
    (ini `rules_lint_pairs`, default `LINT_PAIRS`) checked numerically with 2 witnesses each,
    so that the item stays within seconds. Fails on a finding that is not acknowledged."""

    def __init__(self, *, target, **kw):
        super().__init__(**kw)
        self.target = target
        self.add_marker("rule")

    def runtest(self) -> None:
        """Lint the file; raises RuleNotVerified with the open findings if there are any."""
        from verify.lint import lint

        config = self.config
        pairs = config.getoption("rules_lint_pairs")
        if pairs is None:
            pairs = int(config.getini("rules_lint_pairs") or LINT_PAIRS)
        report = lint(
            [self.target], max_pairs=pairs, examples=2, seed=config.getoption("rules_seed")
        )
        self.user_properties += [("findings", len(report.open)), ("pairs", dict(report.pairs))]
        if report.open:
            lines = "\n".join(f.line() for f in report.open)
            raise RuleNotVerified(f"lint: {self.target}\n{lines}\n{report.summary()}")

    def repr_failure(self, excinfo, style=None):
        """The lint report alone for a failed lint, else pytest's usual traceback."""
        if isinstance(excinfo.value, RuleNotVerified):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        """Where pytest reports the item: the file and `lint PATH`."""
        return self.path, 0, f"lint {self.target}"
