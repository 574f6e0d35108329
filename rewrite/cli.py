"""`rewrite`: the command line.

    rewrite check FILE...            parse and type-check .rules files
    rewrite emit FILE...             print the generated egglog program
    rewrite optimize IN OUT [opts]   optimize an ONNX model with the rule library
    rewrite explain OUT NODE         print the rules that produced a node of an optimized model
    rewrite bisect IN [opts]         find the rule and node that break a model's outputs
    rewrite lint [PATH...]           find duplicate, dead, growing and conflicting rules

Every failure the user can cause (missing file, not an ONNX model, a rules error, a model
that fails the output check) is one line on stderr and a non-zero exit, never a traceback, and
no output file is written unless it passed every check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rewrite` console script. Returns the exit status."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except KeyboardInterrupt:
        err.print("rewrite: interrupted")
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rewrite",
        description="Peephole rewriting for neural-network graphs: match.pd-style .rules files, "
        "applied by equality saturation (egglog) with cost-based extraction.",
    )
    sub = p.add_subparsers(metavar="COMMAND")
    c = sub.add_parser(
        "check",
        help="parse and type-check .rules files",
        description="Parse and type-check .rules files (directories are searched for *.rules). Exit 1 with located errors, 0 with a summary line per file.",
    )
    c.add_argument("paths", nargs="+", metavar="PATH")
    c.set_defaults(func=cmd_check)
    e = sub.add_parser(
        "emit",
        help="print the egglog program generated from .rules files",
        description="Print the egglog program generated from .rules files: one block per rule with its name and file:line.",
    )
    e.add_argument("paths", nargs="+", metavar="PATH")
    e.set_defaults(func=cmd_emit)
    o = sub.add_parser(
        "optimize",
        help="optimize an ONNX model",
        description="Optimize an ONNX model with the shipped rule library (or --rules), check that its outputs still match under onnxruntime, and write it.",
    )
    o.add_argument("input", metavar="IN.onnx")
    o.add_argument("output", metavar="OUT.onnx")
    o.add_argument(
        "--rules",
        nargs="+",
        metavar="PATH",
        help="rule files or directories (default: the shipped library)",
    )
    o.add_argument("--no-check", action="store_true", help="skip the onnxruntime output comparison")
    o.add_argument("--report", metavar="R.json", help="write a JSON report")
    o.add_argument(
        "--max-iterations",
        type=int,
        default=30,
        metavar="N",
        help="saturation iterations (default 30)",
    )
    o.add_argument(
        "--max-nodes",
        type=int,
        default=1_000_000,
        metavar="N",
        help="e-node limit (default 1000000): saturation stops before an iteration that would exceed it, and the best graph found so far is written",
    )
    o.add_argument(
        "--timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="wall-clock limit of the whole run in seconds (default 120): when it runs out, the best graph found so far is checked and written (the input unchanged if none); the overshoot is at most one saturation iteration plus extraction and the check",
    )
    o.add_argument(
        "--allow",
        nargs="+",
        default=[],
        choices=["reassoc", "approx"],
        metavar="CLASS",
        help="also run rules of these numeric classes: reassoc (regroups float arithmetic, e.g. BatchNorm folded into Conv), approx; exact rules always run",
    )
    o.add_argument(
        "--external-data",
        action="store_true",
        help="write the weights to OUT.data beside OUT (automatic when OUT would exceed 2 GB)",
    )
    o.add_argument(
        "--explain",
        action="store_true",
        help="also list rules that matched but were not applied, with the guard that failed",
    )
    o.add_argument(
        "--no-provenance",
        action="store_true",
        help="write a bare model: no rewrite.rules metadata on rewritten nodes and folded constants (see `rewrite explain`)",
    )
    _add_rule_filters(o)
    o.add_argument(
        "--no-bisect",
        action="store_true",
        help="when the output check fails, do not bisect for the culprit rule (by default it does, within what is left of --timeout)",
    )
    o.set_defaults(func=cmd_optimize)
    x = sub.add_parser(
        "explain",
        help="print the rules that produced a node of an optimized model",
        description="Print, as a tree, the chain of rules (name and file:line, with the original nodes each replaced) that produced NODE of a model written by `rewrite optimize`. NODE is a node name, an output name or a folded constant's name.",
    )
    x.add_argument("model", metavar="OUT.onnx")
    x.add_argument("node", metavar="NODE")
    x.set_defaults(func=cmd_explain)
    b = sub.add_parser(
        "bisect",
        help="find the rule (and node) that breaks a model's outputs",
        description="Optimize IN.onnx as `rewrite optimize` does; if the output check fails, find a minimal set of the rules that fired, then of their match sites, that still fails it (delta debugging), and print the rule, file:line, the nodes, the counterexample's inputs, the error and the commands that reproduce it. Exit 0 when it ran to the end (culprit found, or nothing fails), 1 on bad input.",
    )
    b.add_argument("input", metavar="IN.onnx")
    b.add_argument(
        "--rules",
        nargs="+",
        metavar="PATH",
        help="rule files or directories (default: the shipped library)",
    )
    b.add_argument(
        "--allow",
        nargs="+",
        default=[],
        choices=["reassoc", "approx"],
        metavar="CLASS",
        help="also run rules of these numeric classes, as for optimize",
    )
    _add_rule_filters(b)
    b.add_argument(
        "--max-iterations",
        type=int,
        default=30,
        metavar="N",
        help="saturation iterations per optimize run (default 30)",
    )
    b.add_argument(
        "--max-nodes",
        type=int,
        default=1_000_000,
        metavar="N",
        help="e-node limit per optimize run (default 1000000)",
    )
    b.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="wall-clock limit of the whole bisection in seconds (default 600); when it runs out, what it narrowed down to is printed",
    )
    b.set_defaults(func=cmd_bisect)
    from verify.cli import add_parser as add_verify

    add_verify(sub)
    from verify.lint_cli import add_parser as add_lint

    add_lint(sub)
    return p


def _add_rule_filters(p) -> None:
    p.add_argument(
        "--skip",
        nargs="+",
        action="extend",
        default=[],
        metavar="RULE",
        help="leave these rules out: names, globs (cast-*) or ruleset:NAME",
    )
    p.add_argument(
        "--only",
        nargs="+",
        action="extend",
        default=[],
        metavar="RULE",
        help="run only these rules: names, globs or ruleset:NAME",
    )


def _begin(args):
    """Check the budgets, load the rules and apply --skip/--only: (start clock, RuleSet,
    excluded rule -> reason), or the exit status after a one-line error."""
    for name in ("max_iterations", "max_nodes", "timeout"):
        if getattr(args, name) <= 0:
            return _fail(f"--{name.replace('_', '-')} must be positive")
    start = time.perf_counter()
    rules = _load_rules(args.rules)
    if rules is None:
        return EXIT_FAIL
    picked = _pick_rules(rules, args)
    if picked is None:
        return EXIT_FAIL
    return start, *picked


def _pick_rules(rules, args):
    """(RuleSet after --skip/--only, excluded rule -> reason), or None after printing the
    one-line error for a pattern that matches no rule."""
    from rewrite.selection import UnknownRulePatternError, pick_rules

    try:
        picked, excluded = pick_rules(rules, args.skip, args.only)
    except UnknownRulePatternError as e:
        _fail(str(e))
        return None
    if excluded:
        names = sorted(excluded)
        shown = ", ".join(names[:8]) + (f", ... ({len(names) - 8} more)" if len(names) > 8 else "")
        err.print(
            f"rewrite: --skip/--only excluded {len(names)} of {len(rules.rules)} rules: {shown}",
            markup=False,
        )
    return picked, excluded


def _load_rules(paths):
    """RuleSet from paths (the shipped library when None); prints errors, returns None on them."""
    from dsl import RulesError, load_rules, shipped_rules_dir

    try:
        return load_rules([Path(p) for p in paths] if paths else [shipped_rules_dir()])
    except RulesError as e:
        err.print(str(e), markup=False)
        return None
    except (FileNotFoundError, IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        err.print(f"rewrite: {e}", markup=False)
        return None


def cmd_check(args) -> int:
    rules = _load_rules(args.paths)
    if rules is None:
        return EXIT_FAIL
    for f in rules.files:
        n = sum(1 for r in rules.rules if r.span.file == f)
        sets = sorted({r.ruleset for r in rules.rules if r.span.file == f})
        out.print(f"{f}: ok, {n} rules ({', '.join(sets) or 'no rules'})", markup=False)
    return EXIT_OK


def cmd_emit(args) -> int:
    from rewrite.emit import emit

    rules = _load_rules(args.paths)
    if rules is None:
        return EXIT_FAIL
    sys.stdout.write(emit(rules))
    return EXIT_OK


def cmd_optimize(args) -> int:
    from frontends.onnx import ModelError, load_model, optimize_model, prepare_output
    from frontends.onnx.check import CheckError, compare
    from rewrite.saturate import Limits

    # OUT may be IN: the input is read whole before anything is written, and the output is
    # renamed into place only after every check passed
    src, dst = Path(args.input), Path(args.output)
    if dst.is_dir():
        return _fail(f"output {dst} is a directory")
    if not dst.parent.is_dir():
        return _fail(f"{dst.parent}: output directory does not exist")
    begun = _begin(args)
    if isinstance(begun, int):
        return begun
    start, rules, excluded = begun
    t_rules = time.perf_counter() - start
    try:
        model = load_model(src)
    except ModelError as e:
        return _fail(str(e))
    t_load = time.perf_counter() - start - t_rules
    # --timeout bounds the whole run: the clock started before the rules were read
    limits = Limits(
        args.max_iterations, args.max_nodes, args.timeout, deadline=start + args.timeout
    )
    with err.status("optimizing (import, saturate, extract, fold)..."):
        try:
            result, report = optimize_model(
                model,
                rules,
                limits=limits,
                fp=("exact", *args.allow),
                folder=src.parent,
                provenance=not args.no_provenance,
            )
        except Exception as e:  # an engine bug: say so in one line, write nothing
            return _fail(
                f"optimization failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            )
    clock = time.perf_counter()
    try:  # serialized, or staged beside OUT with external data
        output = prepare_output(result, dst, folder=src.parent, external_data=args.external_data)
    except OSError as e:
        return _fail(f"{dst}: cannot write: {e.strerror or e}")
    except Exception as e:  # protobuf's EncodeError: an engine bug, in one line
        return _fail(f"{dst}: cannot serialize the model: {type(e).__name__}: {e}")
    t_serialize = time.perf_counter() - clock
    diffs = []
    if not args.no_check:
        with err.status("checking outputs under onnxruntime..."):
            try:
                diffs = compare(
                    model,
                    result,
                    fp=report.fp,
                    original_source=str(src),
                    optimized_source=output.source,
                )
            except CheckError as e:
                output.discard()
                return _fail(
                    f"output check: {e}{_bisect_failure(args, model, rules, report, src, start)}"
                )
    t_check = time.perf_counter() - clock - t_serialize
    bad = [d for d in diffs if not d.ok]
    clock = time.perf_counter()
    try:
        if bad:
            output.discard()
        else:
            output.commit()
    except OSError as e:
        output.discard()
        return _fail(f"{dst}: cannot write: {e.strerror or e}")
    t_save = time.perf_counter() - clock + t_serialize
    seconds = {
        "rules": t_rules,
        "load": t_load,
        **report.seconds,
        "output check": t_check,
        "save": t_save,
    }
    seconds["other"] = max(time.perf_counter() - start - sum(seconds.values()), 0.0)
    report = replace(report, seconds=seconds, skipped={**excluded, **report.skipped})
    _print_summary(report, diffs)
    if args.explain:
        _print_rejected(report)
    if args.report:
        _write_report(Path(args.report), report, diffs)
    if bad:
        culprit = _bisect_failure(args, model, rules, report, src, start)
        return _fail(
            f"output check failed for {', '.join(d.name for d in bad)}; nothing written{culprit}"
        )
    note = "" if report.changed else "; no rewrite made it cheaper, so it is the input unchanged"
    if report.limit_stage:
        best = "the best graph found so far" if report.changed else "the input unchanged"
        note = f"; {report.stop_reason} reached during {report.limit_stage}, so it is {best}"
    out.print(
        f"wrote {dst} ({report.nodes_before} -> {report.nodes_after} nodes{note})", markup=False
    )
    return EXIT_OK


def cmd_explain(args) -> int:
    from rich.markup import escape
    from rich.tree import Tree

    from frontends.onnx import ModelError, load_model
    from frontends.onnx.explain import NoProvenance, find_provenance

    try:
        what, tree = find_provenance(load_model(Path(args.model)), args.node)
    except ModelError as e:
        return _fail(str(e))
    except NoProvenance as e:
        return _fail(f"{args.model}: {e}")
    if tree is None:
        out.print(f"{what}: original node, not produced by a rewrite", markup=False)
        return EXIT_OK

    def grow(parent, t: dict, prefix: str = "") -> None:
        if t["rule"] == "original":
            label = (
                f"original {t['op']} node, standing in for the nodes of its e-class below"
                if t.get("merged")
                else f"original {t['op']} node, reading values the rules below rewrote"
            )
        else:
            label = f"{prefix}[b]{escape(t['rule'])}[/b] ({escape(t['at'])}) -> {t['op']}"
        if t.get("replaces"):
            label += f"  replaces {escape(', '.join(t['replaces']))}"
        branch = parent.add(label + ("  [dim](history cut)[/dim]" if t.get("truncated") else ""))
        for sub in t.get("after", ()):
            grow(branch, sub)
        for sub in t.get("merged", ()):
            grow(branch, sub, "same value: ")

    root = Tree(f"{escape(what)}  [dim](each rule fired after the rules under it)[/dim]")
    grow(root, tree)
    Console(highlight=False, width=max(out.width, 200)).print(root)
    return EXIT_OK


def cmd_bisect(args) -> int:
    from frontends.onnx import ModelError, load_model
    from frontends.onnx.bisect import BisectError, bisect_model, format_report
    from rewrite.saturate import Limits

    begun = _begin(args)
    if isinstance(begun, int):
        return begun
    start, rules, _ = begun
    try:
        model = load_model(args.input)
    except ModelError as e:
        return _fail(str(e))
    limits = Limits(
        args.max_iterations, args.max_nodes, args.timeout, deadline=start + args.timeout
    )
    try:
        report = bisect_model(
            model,
            rules,
            fp=("exact", *args.allow),
            limits=limits,
            folder=Path(args.input).parent,
            progress=_progress,
        )
    except BisectError as e:
        return _fail(str(e))
    for line in format_report(report, model=args.input, rule_paths=args.rules, allow=args.allow):
        out.print(line, markup=False)
    return EXIT_OK


def _progress(line: str) -> None:
    err.print(line, markup=False)


def _bisect_failure(args, model, rules, report, src, start: float) -> str:
    """After a failed output check of `optimize` (which began at `start`, a perf_counter
    value): bisect for the culprit within what is left of --timeout, print the detailed report on stderr, and return the end of the one-line
    error ("; culprit: rule R (file:line)"), or "" with --no-bisect."""
    from frontends.onnx.bisect import BisectError, bisect_model, format_report
    from rewrite.saturate import Limits

    if args.no_bisect:
        return ""
    limits = Limits(
        args.max_iterations, args.max_nodes, args.timeout, deadline=start + args.timeout
    )
    try:
        found = bisect_model(
            model,
            rules,
            fp=("exact", *args.allow),
            limits=limits,
            folder=src.parent,
            fired=report.fired,
            progress=_progress,
        )
    except BisectError as e:
        return f"; bisection failed: {e}"
    for line in format_report(found, model=str(src), rule_paths=args.rules, allow=args.allow):
        err.print(line, markup=False)
    if not found.culprits:
        return f"; bisection: {found.note}" if found.note else ""
    names = ", ".join(f"{c.rule} ({c.where})" for c in found.culprits)
    sites = [n or s for c in found.culprits for s, n in zip(c.sites, c.nodes)]
    at = f" at {', '.join(sites)}" if sites else ""
    return f"; culprit: rule {names}{at}" + ("" if found.complete else " (bisection incomplete)")


def _fail(msg: str) -> int:
    err.print(f"rewrite: error: {msg}", markup=False)
    return EXIT_FAIL


def _print_summary(report, diffs) -> None:
    ops = Table(title="ops before/after", title_justify="left")
    for col in ("op", "before", "after", "change"):
        ops.add_column(col, justify="left" if col == "op" else "right")
    names = sorted(
        set(report.ops_before) | set(report.ops_after),
        key=lambda o: (-report.ops_before.get(o, 0), o),
    )
    for op in names:
        b, a = report.ops_before.get(op, 0), report.ops_after.get(op, 0)
        ops.add_row(op, str(b), str(a), f"{a - b:+d}" if a != b else "")
    ops.add_row(
        "[b]total[/b]",
        str(report.nodes_before),
        str(report.nodes_after),
        f"{report.nodes_after - report.nodes_before:+d}",
    )
    out.print(ops)
    stages = Table(title="time per stage", title_justify="left")
    stages.add_column("stage")
    stages.add_column("seconds", justify="right")
    stages.add_column("share", justify="right")
    total = sum(report.seconds.values()) or 1.0
    for s, t in report.seconds.items():
        stages.add_row(s, f"{t:.3f}", f"{100 * t / total:.0f}%")
    stages.add_row("[b]total[/b]", f"{total:.3f}", "")
    out.print(stages)
    out.print(
        f"saturation: {report.stop_reason} after {report.iterations} iterations, "
        f"{report.enodes} e-nodes, {report.eclasses} e-classes; "
        f"cost {report.cost_before / 1e3:.1f} -> {report.cost_after / 1e3:.1f} us (model estimate)"
        + (f"; the budget ran out during {report.limit_stage}" if report.limit_stage else ""),
        markup=False,
    )
    if report.fired:
        fired = Table(title="rules fired", title_justify="left")
        fired.add_column("rule")
        fired.add_column("matches", justify="right")
        for name, n in sorted(report.fired.items(), key=lambda kv: (-kv[1], kv[0])):
            fired.add_row(name, str(n))
        out.print(fired)
    if diffs:
        check = Table(title="output check (onnxruntime, random inputs)", title_justify="left")
        for col in ("output", "dtype", "max abs err", "max err / max|b|", "status"):
            check.add_column(col)
        for d in diffs:
            check.add_row(
                d.name,
                d.dtype,
                f"{d.max_abs:.3g}",
                f"{d.max_rel:.3g}",
                "ok" if d.ok else "[red]FAIL[/red]",
            )
        out.print(check)
        for dtype, rtol, atol in sorted({(d.dtype, d.rtol, d.atol) for d in diffs}):
            rule = (
                "exact"
                if rtol == 0 and atol == 0
                else f"|a-b| <= atol + rtol*max|b| with rtol {rtol:g}, atol {atol:g}"
            )
            out.print(f"tolerance for {dtype} ({report.fp} rules fired): {rule}", markup=False)


def _print_rejected(report) -> None:
    table = Table(title="matched but not applied", title_justify="left")
    for col in ("rule", "reason", "matches"):
        table.add_column(col, justify="right" if col == "matches" else "left")
    for rule, reasons in sorted(report.rejected.items()):
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            table.add_row(rule, reason, str(n))
    if report.rejected:
        out.print(table)
    else:
        out.print("no rule matched without being applied", markup=False)
    if report.skipped:
        out.print(
            f"not run: {', '.join(f'{r} ({why})' for r, why in sorted(report.skipped.items()))}",
            markup=False,
        )


def _write_report(path: Path, report, diffs) -> None:
    data = report.to_json()
    data["check"] = [d.__dict__ for d in diffs]
    path.write_text(json.dumps(data, indent=2, default=float) + "\n")


if __name__ == "__main__":
    sys.exit(main())
