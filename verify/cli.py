"""`rewrite verify [PATHS...] [--examples N] [--seed S] [--rule NAME] [--jobs J]`.

Verifies every rule of the given `.rules` files and directories (the shipped library when
none are given; `verify.runner` says what is checked), with a progress bar on stderr, then
prints each failure's counterexample and a table: rule, `file:line`, examples tried (for a
failure: the examples it took to catch it), max abs and rel error, status, seconds. Exits 1
if any rule is not verified: `FAIL` (a counterexample), `unsat` (no valid example could be
drawn) or `unsupported` (an op has no example generator); 2 for a usage error.

Rules are verified in `--jobs` worker processes (default: one per CPU).
"""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from verify.cli_common import load_rules
from verify.defaults import DEFAULT_EXAMPLES

# The command imports the project's modules it needs inside its functions, so that `rewrite
# --help` and `rewrite check` do not load the engine, egglog and onnxruntime (0.3 s instead of
# 2 s). Such imports stay in the command-line entry points (tests/test_layers.py lists them).

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def add_parser(subparsers) -> None:
    """Register the `verify` subcommand on `rewrite`'s subparsers."""
    v = subparsers.add_parser(
        "verify",
        help="check every rule numerically (Hypothesis differential tests)",
        description="Verify rules: draw examples of each rule's left side (shapes, dtypes, values "
        "and attributes that satisfy its guards), run both sides on onnxruntime and "
        "onnx.reference, check that the engine applies the rule, and shrink any failure to a "
        "minimal counterexample. "
        "Exit 1 if any rule is not verified.",
    )
    v.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="rule files or directories (default: the shipped library)",
    )
    v.add_argument(
        "--examples",
        type=int,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help=f"examples per rule and direction (default {DEFAULT_EXAMPLES})",
    )
    v.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default 0)")
    v.add_argument(
        "--rule",
        action="append",
        metavar="NAME",
        help="verify only this rule (repeatable; NAME also selects its :c variants)",
    )
    v.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="J",
        help="worker processes (default: one per CPU, and one per 8 rules at most: a worker's "
        "start-up, a few seconds, outweighs a few rules)",
    )
    v.set_defaults(func=cmd_verify)


def cmd_verify(args) -> int:
    """`rewrite verify`: verify the selected rules and print a table; exit 0 if every rule
    passes, 1 if one does not (or the rules do not load), 2 on bad arguments."""
    if args.examples <= 0 or (args.jobs is not None and args.jobs <= 0):
        return _usage("--examples and --jobs must be positive")
    rules = load_rules(args.paths, err)
    if rules is None:
        return EXIT_FAIL
    if not rules.rules:
        err.print(f"error: no rules in {', '.join(rules.files)}: nothing to verify", markup=False)
        return EXIT_FAIL
    names = select(rules, args.rule)
    if names is None:
        return _usage(
            f"no rule named {', '.join(args.rule)} in {', '.join(rules.files) or 'the library'}"
        )
    start = time.perf_counter()
    results = run(args.paths, names, args.examples, args.seed, args.jobs)
    _print(results, time.perf_counter() - start, args)
    return EXIT_OK if all(r.status == "pass" for r in results) else EXIT_FAIL


def select(rules, wanted: list[str] | None) -> list[str] | None:
    """Names of the rules to verify: all, or those named (or whose `:c` base is named);
    None if a name matches nothing."""
    from verify.engine import base_name

    if not wanted:
        return rules.names()
    names = [r.name for r in rules.rules if r.name in wanted or base_name(r.name) in wanted]
    return names or None


def run(paths, names: list[str], examples: int, seed: int, jobs: int | None) -> list:
    """`verify.runner.RuleResult`s of the rules `names` of the rules at `paths` (the shipped
    library when empty), verified in `jobs` processes (None: one per CPU, one per
    RULES_PER_WORKER rules at most), with a progress bar on stderr."""
    paths = tuple(str(Path(p)) for p in paths)
    if jobs is None:  # a second worker pays off from about 16 rules on (measured: 15 rules
        # 3.4 s in one process, 3.6 s in two; 22 rules 9.4 s against 7.0 s)
        jobs = min(os.cpu_count() or 1, max(1, len(names) // RULES_PER_WORKER))
    jobs = min(jobs, len(names))
    results = {}
    columns = (
        TextColumn("verifying"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}"),
    )
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("", total=len(names))
        if jobs == 1:
            for name in names:
                bar.update(task, description=name)
                results[name] = _verify_one(paths, name, examples, seed)
                bar.advance(task)
        else:
            with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
                futures = {pool.submit(_verify_one, paths, n, examples, seed): n for n in names}
                for f in as_completed(futures):
                    results[futures[f]] = f.result()
                    bar.update(task, description=futures[f])
                    bar.advance(task)
    return [results[n] for n in names]


RULES_PER_WORKER = 8  # the default --jobs starts a worker per 8 rules at most

_CACHE: dict = {}


def _verify_one(paths: tuple[str, ...], name: str, examples: int, seed: int):
    """Verify rule `name` of the rules at `paths` (in a worker process: rules loaded once)."""
    from dsl import load_rules, shipped_rules_dir
    from verify.runner import verify_rule

    if paths not in _CACHE:
        _CACHE[paths] = load_rules([Path(p) for p in paths] if paths else [shipped_rules_dir()])
    rules = _CACHE[paths]
    rule = next(r for r in rules.rules if r.name == name)
    return verify_rule(rule, rules, examples, seed)


def _print(results, seconds: float, args) -> None:
    _print_failures(results)
    out.print(_table(results))
    failed = [r for r in results if r.status != "pass"]
    out.print(
        f"{len(results)} rules, {len(results) - len(failed)} verified, {len(failed)} not "
        f"({args.examples} examples per rule, seed {args.seed}, {seconds:.1f} s)",
        markup=False,
    )
    swept = [c for r in results for c in r.checks if c.name.startswith("every value")]
    if swept:
        ran = [c for c in swept if c.examples]
        four = [c for r in results for c in r.checks if c.name.startswith("every 4-bit value")]
        also = (
            f" ({len(four)} also 4-bit inputs over all 16 values, on onnx.reference)"
            if four
            else ""
        )
        ran += four
        out.print(
            f"every value: {len(ran) - len(four)} of {len(swept)} quantization checks swept 8-bit "
            f"inputs over all 256 values and floats over a grid of ties{also} "
            f"({sum(c.examples for c in ran)} inputs); QuantizeLinear met "
            f"{sum(c.ties for c in ran)} rounding ties and saturated "
            f"{sum(c.saturated for c in ran)} elements",
            markup=False,
        )
    notes = sum((r.notes for r in results), Counter())
    if notes:
        out.print(
            f"notes (executor limits and disagreements, not rule failures): {len(notes)} kinds; "
            "the most frequent:",
            markup=False,
        )
        for text, n in notes.most_common(5):
            out.print(f"  {n:>4} x {text}", markup=False)


def _print_failures(results) -> None:
    for r in results:
        if r.status != "pass":
            out.rule(
                f"{r.status}: {r.rule.name} ({r.rule.span.file}:{r.rule.span.line})", style="red"
            )
            f = r.failure
            out.print(
                f.text if f and f.text else (f.reason if f else r.detail or "no valid example"),
                markup=False,
            )
            out.print(f"reproduce: {r.repro}", markup=False)


def _table(results) -> Table:
    """rule, file:line, examples, max abs/rel error, how compared, status, seconds."""
    from verify.check import ALONE_SEES, ALONE_SEES_END
    from verify.compare import mode_of

    table = Table(title="rule verification", title_justify="left")
    cols = (
        "rule",
        "file:line",
        "examples",
        "max abs err",
        "max rel err",
        "compared",
        "status",
        "s",
    )
    for col in cols:
        table.add_column(
            col, justify="right" if "err" in col or col in ("examples", "s") else "left"
        )
    for r in results:
        f = r.failure
        examples = f"caught after {f.caught_after}" if f and f.caught_after else str(r.examples)
        style = "green" if r.status == "pass" else "red"
        status = r.status
        alone = [t for t in r.notes if t.startswith(ALONE_SEES)]
        if status == "pass" and alone:  # right by onnx.reference, not on onnxruntime
            who = alone[0].removeprefix(ALONE_SEES).removesuffix(ALONE_SEES_END)
            status, style = f"pass ({who}: the sides differ)", "yellow"
        errors = (f.max_abs, f.max_rel) if f else (r.max_abs, r.max_rel)
        abs_err, rel_err = ("-" if e is None else f"{e:.3g}" for e in errors)
        table.add_row(
            r.rule.name,
            f"{r.rule.span.file}:{r.rule.span.line}",
            examples,
            abs_err,
            rel_err,
            "bit-exact"
            if mode_of(r.rule) == "bitwise"
            else f"bound {r.rule.bound.fn}"
            if r.rule.bound
            else f"{r.rule.fp} tolerance",
            f"[{style}]{status}[/{style}]",
            f"{r.seconds:.2f}",
        )
    return table


def _usage(msg: str) -> int:
    err.print(f"error: verify: {msg}", markup=False)
    return EXIT_USAGE
