"""`rewrite lint PATH...`: the rule-set lint on the command line (see `verify.lint`).

Prints one line per finding, `file:line: kind: rule: reason` (acknowledged ones marked
`(allowed: ...)`), then a summary line. Exit 0 when every finding is acknowledged, 1 when one
is not, 2 for bad input (a missing file, rules that do not check, a malformed
acknowledgement), with a one-line error on stderr.
"""

from __future__ import annotations

import sys

# The lint and dsl are imported inside `cmd_lint`, so that `rewrite --help` does not load them
# (tests/test_layers.py lists the modules allowed such imports).


def add_parser(subparsers) -> None:
    """Register the `lint` subcommand on `rewrite`'s subparsers."""
    p = subparsers.add_parser(
        "lint",
        help="find duplicate, shadowed, dead, growing and conflicting rules",
        description="Lint a rule set as a whole: duplicate and shadowed rules, rules that can "
        "never fire, rules that grow the e-graph without bound (alone or in pairs), and "
        "critical pairs (two rules matching one term) whose results differ on the verifier. "
        "Acknowledge a finding with ';; lint: allow KIND because REASON' above the rule. "
        "Exit 1 if a finding is not acknowledged, 2 for bad input.",
    )
    p.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="rule files or directories (default: the shipped library)",
    )
    p.add_argument(
        "--no-numeric",
        action="store_true",
        help="do not check critical pairs on the verifier (static checks only)",
    )
    p.add_argument(
        "--max-pairs",
        type=int,
        default=50,
        metavar="N",
        help="critical pairs checked numerically at most, sampled with --seed (default 50)",
    )
    p.add_argument(
        "--examples",
        type=int,
        default=2,
        metavar="N",
        help="witnesses drawn per critical pair (default 2)",
    )
    p.add_argument(
        "--subterm-pairs",
        action="store_true",
        help="also overlaps below the root (many more pairs, same budget)",
    )
    p.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    p.set_defaults(func=cmd_lint)


def cmd_lint(args) -> int:
    """Run the lint for the parsed arguments; returns the exit status."""
    from dsl import RulesError, shipped_rules_dir
    from verify.lint import LintInputError, lint

    if args.max_pairs < 0 or args.examples < 1:
        print(
            "error: lint: --max-pairs must be 0 or more and --examples 1 or more", file=sys.stderr
        )
        return 2
    paths = args.paths or [shipped_rules_dir()]
    try:
        report = lint(
            paths,
            numeric=not args.no_numeric,
            max_pairs=args.max_pairs,
            examples=args.examples,
            subterm_pairs=args.subterm_pairs,
            seed=args.seed,
        )
    except RulesError as e:
        print(str(e).splitlines()[0], file=sys.stderr)  # `FILE:LINE:COL: error: ...`
        return 2
    except (LintInputError, OSError) as e:
        print(f"error: lint: {e}", file=sys.stderr)
        return 2
    for f in report.findings:
        print(f.line())
    print(report.summary())
    return 1 if report.open else 0
