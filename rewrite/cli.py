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
import contextlib
import json
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

from rich.console import Console
from rich.table import Table

import rewrite
from verify.cli import add_parser as add_verify
from verify.cli_common import load_rules
from verify.lint_cli import add_parser as add_lint
from vocab.ops import TARGETS

# Each command imports the project's modules it needs inside its function, so that `rewrite
# --help` and `rewrite check` do not load the engine, egglog and onnxruntime (0.3 s instead of
# 2 s). Such imports stay in the command-line entry points (tests/test_layers.py lists them).

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
INTERNAL_ERROR = "optimization failed"  # how a one-line error names an engine bug

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class _Terminated(BaseException):
    """SIGTERM, raised where the process is (as Ctrl-C raises KeyboardInterrupt), so that what
    a command staged is removed on the way out (a BaseException: no `except Exception` takes
    it for an internal error)."""


def _terminate(signum, frame) -> NoReturn:
    raise _Terminated


@contextlib.contextmanager
def _terminable():
    """SIGTERM raises _Terminated while the block runs (in the main thread; elsewhere signal
    handlers cannot be set, and the default stays). For the commands that stage an output
    (optimize, quantize): the others (verify's worker pool) keep the default."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if before is None else before)


_STOPS = {signal.SIGTERM, signal.SIGINT}


@contextlib.contextmanager
def _uninterrupted():
    """SIGTERM and SIGINT held back while the block runs (in the main thread), delivered when
    it ends: the output's rename into place (model and data file) and the removal of what was
    staged are not cut in half."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `rewrite` console script: parse `argv` (default `sys.argv[1:]`), run
    the subcommand, return the exit status (0 ok, 1 failure, 2 usage, 130 interrupted, 143
    terminated by SIGTERM). An optimize or quantize run interrupted or terminated before it
    put its output in place leaves nothing staged beside it, and the output as it was."""
    try:
        parser = _parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:
        err.print("error: interrupted", markup=False)
        return 130
    except _UsageError as e:
        err.print(f"error: {e}", markup=False)
        return EXIT_USAGE
    except SystemExit as e:  # --help, --version
        return int(e.code or 0)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE

    try:
        with _terminable() if args.func is cmd_optimize else contextlib.nullcontext():
            return args.func(args)
    except KeyboardInterrupt:
        err.print("error: interrupted", markup=False)
        return 130
    except _Terminated:
        err.print("error: terminated", markup=False)
        return 143


def run() -> NoReturn:
    """The `rewrite` console script: `main()`, then the process ends without Python's
    teardown, which frees a model's arrays, the e-graph and onnxruntime's sessions object by
    object (0.4 s of quantizing DistilBERT's 3.4 s, measured). Every file a command writes is
    in place and closed when `main` returns; stdout and stderr are flushed first. Nor do
    atexit handlers run (a profiler's or coverage's report): `python -m rewrite.cli` exits
    the usual way. A run interrupted (130) or terminated (143) ends by the signal itself,
    once its output is cleaned up, as a shell's or a supervisor's `wait` expects of it."""
    status = main()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except OSError:  # a closed pipe (`rewrite ... | head`): nothing more to say there
            pass
    stop = _SIGNAL_OF.get(status)
    if stop is not None and threading.current_thread() is threading.main_thread():
        signal.signal(stop, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {stop})
        os.kill(os.getpid(), stop)
    os._exit(status)


_SIGNAL_OF = {130: signal.SIGINT, 143: signal.SIGTERM}  # exit status -> the signal it stands for


class _UsageError(Exception):
    """A command line argparse refuses (raised instead of argparse's two-line exit)."""


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error as one `error:` line (`main` prints it) instead of the
    usage text and `PROG: error:`; subcommand parsers are of this class too."""

    def error(self, message: str):
        """Raise _UsageError with `message` and where to get help (argparse's hook)."""
        raise _UsageError(f"{self.prog}: {message} (see {self.prog} --help)")


def _names(text: str) -> list[str]:
    """An option value of comma-separated names: `"a,b"` -> ["a", "b"] (with action="extend",
    so the option is also repeatable). One value per option: it never takes the positionals."""
    names = [p.strip() for p in text.split(",") if p.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"expected one or more comma-separated names: {text!r}")
    return names


def _classes(text: str) -> list[str]:
    """`--allow` values: comma-separated numeric classes, each reassoc, approx or quant."""
    from frontends.onnx.api import NUMERIC_CLASSES

    names = _names(text)
    for n in names:
        if n not in NUMERIC_CLASSES:
            raise argparse.ArgumentTypeError(
                f"unknown numeric class {n!r} (choose from {', '.join(NUMERIC_CLASSES)})"
            )
    return names


def _version() -> str:
    return f"rewrite {rewrite.__version__}"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="rewrite",
        description="Peephole rewriting for neural-network graphs: match.pd-style .rules "
        "files, applied by equality saturation (egglog) with cost-based extraction.",
    )
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(metavar="COMMAND")
    c = sub.add_parser(
        "check",
        help="parse and type-check .rules files",
        description="Parse and type-check .rules files (directories are searched for "
        "*.rules). Exit 1 with located errors, 0 with a summary line per file.",
    )
    c.add_argument("paths", nargs="+", metavar="PATH", help="rule files or directories")
    c.set_defaults(func=cmd_check)
    e = sub.add_parser(
        "emit",
        help="print the egglog program generated from .rules files",
        description="Print the egglog program generated from .rules files: one block per "
        "rule with its name and file:line.",
    )
    e.add_argument("paths", nargs="+", metavar="PATH", help="rule files or directories")
    e.set_defaults(func=cmd_emit)
    _optimize_parser(sub)
    _quantize_parser(sub)
    _ops_parser(sub)
    x = sub.add_parser(
        "explain",
        help="print the rules that produced a node of an optimized model",
        description="Print, as a tree, the chain of rules (name and file:line, with the "
        "original nodes each replaced) that produced NODE of a model written by `rewrite "
        "optimize`. NODE is a node name, an output name or a folded constant's name; give "
        "several to explain each (the model is read once).",
    )
    x.add_argument("model", metavar="OUT.onnx", help="a model written by rewrite optimize")
    x.add_argument("node", metavar="NODE", nargs="+", help="a node, output or initializer name")
    x.set_defaults(func=cmd_explain)
    _bisect_parser(sub)
    add_verify(sub)
    add_lint(sub)
    return p


def _optimize_parser(sub) -> None:
    o = sub.add_parser(
        "optimize",
        help="optimize an ONNX model",
        description="Optimize an ONNX model with the shipped rule library (or --rules), check "
        "that its outputs still match under onnxruntime, and write it. Options that take "
        "several values are repeatable or comma-separated (--allow reassoc,approx); they "
        "never take the file names after them. The same options are the keywords of "
        "rewrite.optimize_model() in Python.",
    )
    o.add_argument("input", metavar="IN.onnx", help="the model to optimize")
    o.add_argument("output", metavar="OUT.onnx", help="where to write it (may be IN.onnx)")
    _add_optimize_options(o)
    o.set_defaults(
        func=cmd_optimize,
        quantize=None,
        per_channel=None,
        bits=None,
        keep_float=[],
        op_types=[],
        error_budget=None,
        calibration=None,
        validation=None,
        held_out=0,
        over_budget_share=None,
        calibrate="minmax",
        symmetric=False,
        smooth=None,
        cpu="any",
        rounding="nearest",
        asymmetric=False,
    )


def _quantize_parser(sub) -> None:
    q = sub.add_parser(
        "quantize",
        help="quantize an ONNX model to int8 (affine quantization, as rules)",
        description="Quantize an ONNX model: `rewrite optimize` with the quant rules of the mode "
        "(patterns/quant/) allowed beside the rest of the library, so the output is also the "
        "smallest graph. Each quant rule states its error bound, which `rewrite verify` checks; "
        "the output check allows 10% of each output's largest magnitude (--rtol to change; with "
        "--error-budget E, E), on the --calibration inputs when given (the first 8 without a "
        "budget), else on random ones. The summary lists the nodes kept in float and why; "
        "--report has every node's choice.",
    )
    q.add_argument("input", metavar="IN.onnx", help="the model to quantize")
    q.add_argument("output", metavar="OUT.onnx", help="where to write it (may be IN.onnx)")
    q.add_argument(
        "--mode",
        dest="quantize",
        metavar="MODE",
        default="dynamic",
        help="the quantization mode; dynamic, the default: MatMuls and Gemms by constant "
        "float32 weights become int8 MatMulInteger with the activations quantized to uint8 at "
        "run time (onnxruntime fuses them into DynamicQuantizeMatMul); weight-only: the "
        "weights of MatMuls and Gemms stored in 4 bits, blocks of 32, the product in float "
        "(8x smaller weights), as onnxruntime's MatMulNBits with --target onnxruntime, else as "
        "an int4 DequantizeLinear with block_size before the product (opset 21: an older "
        "model is converted), which onnxruntime fuses itself (1.32: not where a Relu or Clip "
        "reads the product; the run warns); static: activations quantized "
        "with ranges measured on --calibration inputs, weights per output channel, Convs (1-D "
        "and 2-D) lowered to QLinearConv chained in uint8, MatMuls to QLinearMatMul, or to "
        "MatMulInteger rescaled to float where the output is a Gemm's with a bias or a graph "
        "output (with --target onnxruntime, residual Adds to QLinearAdd too). A run that "
        "quantizes nothing says why",
    )
    scales = q.add_mutually_exclusive_group()
    scales.add_argument(
        "--per-channel",
        dest="per_channel",
        action="store_const",
        const=True,
        help="one weight scale per output column (the default in modes dynamic and static)",
    )
    scales.add_argument(
        "--per-tensor",
        dest="per_channel",
        action="store_const",
        const=False,
        help="dynamic: one weight scale per weight (onnxruntime quantize_dynamic's default; "
        "here a fifth to a third more error at the same speed, because the step is chosen so "
        "that the kernels' int16 pair sums cannot saturate)",
    )
    q.add_argument(
        "--cpu",
        choices=("any", "vnni"),  # frontends.onnx.api.CPU_RULESETS
        default="any",
        help="what the file will run on. any (default): int8 weights stepped so that the "
        "int16 pair sums of onnxruntime's uint8-by-int8 kernels on x86 CPUs without VNNI "
        "cannot saturate, exact on every CPU; vnni (modes dynamic per output column, and "
        "static): "
        "full-range weights, finer, exact where those kernels sum in int32 (x86 with "
        "AVX512-VNNI or AVX-VNNI: `grep -o 'avx512_vnni\\|avx_vnni' /proc/cpuinfo`); on an "
        "older x86 CPU they can saturate",
    )
    q.add_argument(
        "--bits",
        type=int,
        choices=(4, 8),
        help="weight-only: the weights' width (default 4: 8x smaller; 8: 4x smaller and 16x "
        "more precise)",
    )
    q.add_argument(
        "--keep-float",
        action="append",
        default=[],
        metavar="NAME|GLOB",
        help="keep the nodes of this name (a glob: '/encoder/layer.11/*') in float; a node "
        "fused with others (MatMul + Add into Gemm, a Conv with its BatchNormalization) is "
        "kept when any of them matches; a pattern that matches no node the rules quantize is "
        "warned of (repeatable)",
    )
    q.add_argument(
        "--op-types",
        action="append",
        default=[],
        metavar="OPS",
        help="quantize only these ops (MatMul,Gemm); default: every op the mode covers",
    )
    q.add_argument(
        "--error-budget",
        type=float,
        metavar="E",
        help="the largest error allowed per float output, max|q - ref| / max|ref| over the "
        "calibration inputs, or --validation's (0.05 = 5%%): the nodes that err most "
        "(measured each alone quantized, or estimated by their rule's bound on the "
        "calibration values) stay in float until the measured error fits; "
        "the output check then holds the output to E and exits non-zero, writing nothing, "
        "if it does not",
    )
    q.add_argument(
        "--calibration",
        metavar="FILE.npz",
        help="calibration inputs for --error-budget, --mode static, --smooth and --rounding "
        "gptq, and the output check's inputs (its first 8 without --error-budget): one array "
        "per graph input, named as the input, its first axis the samples (default: 8 drawn "
        "at random, with a warning)",
    )
    q.add_argument(
        "--validation",
        metavar="FILE.npz",
        help="--error-budget: search and check the budget on these inputs (laid out as "
        "--calibration's) instead of the calibration inputs, which --smooth, --rounding gptq "
        "and --mode static fit: an error measured on the inputs a stage was fitted to is "
        "smaller than on others",
    )
    q.add_argument(
        "--held-out",
        type=int,
        default=0,
        metavar="N",
        help="--error-budget: keep the last N of the inputs the budget is checked on "
        "(--validation's, else --calibration's) from the search; the written graph's error "
        "on them is reported, with a 95%% upper bound on the share of such inputs over the "
        "budget (the search chose the graph on its own inputs, so those give no such bound), "
        "and the output check holds them to the budget too (default 0)",
    )
    q.add_argument(
        "--over-budget-share",
        type=float,
        metavar="P",
        help="--error-budget: also keep nodes in float until an exponential tail fitted to "
        "the searched inputs' errors estimates that at most a share P of inputs like them "
        "would err over the budget (0.001 = 0.1%%; needs 16 searched inputs or more). The "
        "worst of a few dozen inputs is a tail statistic: without this another set of "
        "inputs has a worse one about as often as not (default: off; the estimate is "
        "shown either way)",
    )
    q.add_argument(
        "--calibrate",
        choices=("minmax", "percentile"),
        default="minmax",
        help="static: how an activation's range is taken from the calibration values "
        "(minmax, the default: smallest to largest; percentile: the 0.001th to the 99.999th "
        "percentile, outliers clipped)",
    )
    q.add_argument(
        "--symmetric",
        action="store_true",
        help="static: activation ranges symmetric around 0 (uint8 with zero point 128, int8's "
        "levels shifted) instead of ones spanning each range",
    )
    q.add_argument(
        "--asymmetric",
        action="store_true",
        help="weight-only, 4 bits: blocks with a zero point each, their range "
        "[min(w, 0), max(w, 0)] in 16 levels (MatMulNBitsQuantizer's default), instead of "
        "symmetric ones around 0: less error where a block's weights lean to one sign",
    )
    q.add_argument(
        "--smooth",
        type=float,
        metavar="ALPHA",
        help="dynamic and static: first move part of each activation channel's range into the "
        "weights of the products that read it (SmoothQuant, patterns/quant/smooth.rules), by "
        "s_j = max|x_j|^ALPHA / max|w_j|^(1-ALPHA) from the calibration inputs; ALPHA in "
        "[0, 1], 0.5 is the paper's default. x / s folds into a LayerNormalization or a "
        "product by a constant that makes x; elsewhere (after a GELU, say) it stays a Div",
    )
    q.add_argument(
        "--rounding",
        choices=("nearest", "gptq"),  # frontends.onnx.quantize.ROUNDINGS
        default="nearest",
        help="modes dynamic (per output column), weight-only and static: how weights round to "
        "their levels. nearest (default); gptq: GPTQ on the calibration inputs' activations (each "
        "row's rounding error spread over the rows not yet rounded), less error at the same "
        "speed, for seconds more per weight of K = 3072; each weight is judged first on the "
        "last quarter of the inputs, held out, and keeps its nearest levels if it errs more "
        "there. In mode static, Convs of group 1 too (through their input's patches)",
    )
    _add_optimize_options(q)
    q.set_defaults(func=cmd_optimize)


def _add_optimize_options(o) -> None:
    """The options `rewrite optimize` and `rewrite quantize` share."""
    _add_rule_options(o)
    o.add_argument(
        "--target",
        choices=sorted(TARGETS),
        default="onnx",
        help="the runtime the output is for: onnx (standard ops only, the default; a model "
        "that already has nodes of another domain may get more of them) or onnxruntime (its "
        "contrib ops too: rulesets declaring :domain com.microsoft run)",
    )
    o.add_argument(
        "--opset",
        type=int,
        metavar="N",
        help="convert the model to default-domain opset N first (onnx.version_converter), then "
        "optimize it with the rules that exist at N; the output is at opset N. Without it, a "
        "model older than opset 13 is converted to 18, and kept there only if that made it "
        "cheaper",
    )
    o.add_argument(
        "--input-shape",
        action="append",
        default=[],
        metavar="NAME:DIMS",
        help="fix the dims of graph input NAME, e.g. input_ids:1,128 (repeatable); a symbolic "
        "dim fixed here is fixed wherever its name appears, other dims stay symbolic",
    )
    o.add_argument("--no-check", action="store_true", help="skip the onnxruntime output comparison")
    _add_check_inputs(o)
    o.add_argument(
        "--atol",
        type=float,
        metavar="A",
        help="absolute tolerance of the output check for float outputs (default: by dtype and "
        "by the loosest numeric class that fired, e.g. 1e-6 for float32 with exact rules)",
    )
    o.add_argument(
        "--rtol",
        type=float,
        metavar="R",
        help="tolerance relative to the output's largest magnitude, |a-b| <= atol + "
        "rtol*max|b| (default: by dtype and class, e.g. 1e-5 for float32 with exact rules); "
        "for an integer output computed from floats (an ArgMax), the share of its elements "
        "that may differ",
    )
    o.add_argument("--report", metavar="R.json", help="write a JSON report")
    _add_limits(
        o,
        timeout=None,  # frontends.onnx.api.Options.seconds
        what="the whole run",
        default="120; 600 when quantizing runs the model on calibration inputs or searches "
        "an --error-budget",
    )
    o.add_argument(
        "--external-data",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="write the weights to OUT.data beside OUT (--external-data) or into OUT "
        "(--no-external-data); default: as the input has them. Always external above 2 GB",
    )
    o.add_argument(
        "--explain",
        action="store_true",
        help="list what each rule did to which node, and the rules that matched but were not "
        "applied, with the guard that failed",
    )
    o.add_argument(
        "--no-provenance",
        action="store_true",
        help="write a bare model: no rewrite.rules metadata on rewritten nodes and folded "
        "constants (see `rewrite explain`)",
    )
    o.add_argument(
        "--no-bisect",
        action="store_true",
        help="when the output check fails, do not bisect for the culprit rule (by default it "
        "does, within what is left of --timeout)",
    )
    o.add_argument(
        "-q", "--quiet", action="store_true", help="print nothing on stdout, errors only"
    )
    o.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="more detail: each stage's time as it ends (stderr), saturation per iteration, "
        "the rules not run and why",
    )


def _bisect_parser(sub) -> None:
    b = sub.add_parser(
        "bisect",
        help="find the rule (and node) that breaks a model's outputs",
        description="Optimize IN.onnx as `rewrite optimize` does; if the output check fails, "
        "find a minimal set of the rules that fired, then of their match sites, that still "
        "fails it (delta debugging), and print the rule, file:line, the nodes, the "
        "counterexample's inputs, the error and the commands that reproduce it. Exit 0 when "
        "it ran to the end (culprit found, or nothing fails), 1 on bad input.",
    )
    b.add_argument("input", metavar="IN.onnx", help="the model whose optimization fails")
    _add_check_inputs(b)
    _add_rule_options(b)
    _add_limits(b, timeout=600.0, what="the whole bisection")
    b.set_defaults(func=cmd_bisect)


def _add_check_inputs(p) -> None:
    p.add_argument(
        "--check-inputs",
        metavar="FILE.npz",
        help="the inputs the output check runs on (one array per graph input, named as the "
        "input, its first axis the samples), instead of random ones: for a model whose integer "
        "inputs are shapes or axes (random draws are 0 or 1)",
    )


def _add_rule_options(p) -> None:
    p.add_argument(
        "--rules",
        type=_names,
        action="extend",
        metavar="PATH[,PATH...]",
        help="rule files or directories, repeatable or comma-separated (default: the shipped "
        "library); they replace the library, --add-rules adds to it",
    )
    p.add_argument(
        "--add-rules",
        type=_names,
        action="extend",
        metavar="PATH[,PATH...]",
        help="rule files or directories run beside --rules (by default beside the shipped "
        "library): your own rules with the library's",
    )
    p.add_argument(
        "--allow",
        type=_classes,
        action="extend",
        default=[],
        metavar="CLASS[,CLASS...]",
        help="also run rules of these numeric classes: reassoc (regroups float arithmetic, "
        "e.g. BatchNorm folded into Conv), approx, quant (a quantized model's QDQ groups "
        "lowered to integer kernels, patterns/quant/lower.rules; to quantize a float model, "
        "rewrite quantize); exact rules always run",
    )
    p.add_argument(
        "--skip",
        type=_names,
        action="extend",
        default=[],
        metavar="RULE[,RULE...]",
        help="leave these rules out: names, globs (cast-*) or ruleset:NAME",
    )
    p.add_argument(
        "--only",
        type=_names,
        action="extend",
        default=[],
        metavar="RULE[,RULE...]",
        help="run only these rules: names, globs or ruleset:NAME (--only first, then --skip)",
    )


def _add_limits(p, *, timeout: float | None, what: str, default: str = "") -> None:
    """--max-iterations, --max-nodes and --timeout (default `timeout` seconds; None: the API's,
    which `default` states)."""
    p.add_argument(
        "--max-iterations",
        type=int,
        default=30,
        metavar="N",
        help="saturation iterations per optimize run (default 30)",
    )
    p.add_argument(
        "--max-nodes",
        type=int,
        default=1_000_000,
        metavar="N",
        help="e-node limit (default 1000000): saturation stops before an iteration that "
        "would exceed it, and the best graph found so far is used",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=timeout,
        metavar="S",
        help=f"wall-clock limit of {what} in seconds (default {default or f'{timeout:g}'}): "
        "when it runs out, the best result so far is used (the overshoot is at most one "
        "saturation iteration plus extraction and the check)",
    )


def _options(args, **extra):
    """`frontends.onnx.api.Options` from the parsed arguments: the CLI's flags are the API's
    keywords, validated in one place. Raises OptionError."""
    from frontends.onnx.api import Options

    return Options.from_keywords(
        dict(
            rules=_rule_paths(args),
            allow=args.allow,
            skip=args.skip,
            only=args.only,
            max_iterations=args.max_iterations,
            max_nodes=args.max_nodes,
            timeout=args.timeout,
            **extra,
        )
    )


def _rule_paths(args) -> list[str] | None:
    """The rule paths a command runs: --rules (None: the shipped library) and, beside them,
    --add-rules."""
    if not getattr(args, "add_rules", None):
        return args.rules
    from dsl import shipped_rules_dir

    return [*(args.rules or [str(shipped_rules_dir())]), *args.add_rules]


def _load_rules(paths):
    """RuleSet from paths (the shipped library when None or empty); prints the error and
    returns None on a rules error or a path that does not exist (`verify.cli_common`)."""
    return load_rules(paths, err)


def cmd_check(args) -> int:
    """`rewrite check PATH...`: parse and type-check, print one summary line per file."""
    rules = _load_rules(args.paths)
    if rules is None:
        return EXIT_FAIL
    for f in rules.files:
        n = sum(1 for r in rules.rules if r.span.file == f)
        sets = sorted({r.ruleset for r in rules.rules if r.span.file == f})
        out.print(f"{f}: ok, {n} rules ({', '.join(sets) or 'no rules'})", markup=False)
    return EXIT_OK


def _ops_parser(sub) -> None:
    o = sub.add_parser(
        "ops",
        help="list the operator vocabulary that rules can match and write",
        description="List the operators rules can name: every op of the ONNX registry "
        "(onnx.defs) and of onnxruntime's contrib domains, with its since-version, inputs "
        "(`?` optional, `...` variadic), outputs, attributes with defaults, families, how its "
        "output type is computed (its own shape rule, `direct` from the input types or "
        "`symbolic`, or `onnx` shape inference on the node) and whether the "
        "engine can match it (and why not). The reference for rule authors; see docs/dsl.md.",
    )
    o.add_argument(
        "--domain",
        action="extend",
        type=_names,
        metavar="D",
        help="only these domains ('' or ai.onnx is the default domain; com.microsoft, "
        "ai.onnx.ml); repeatable or comma-separated",
    )
    o.add_argument(
        "--opset",
        type=int,
        metavar="N",
        help="the forms in force at opset N of the default domain (default: the newest); "
        "ops that do not exist at N are left out",
    )
    o.add_argument("--json", action="store_true", help="print JSON instead of a table")
    o.add_argument(
        "--family", metavar="NAME", help="only the ops of one family (UNARY_ELEMENTWISE, ...)"
    )
    o.set_defaults(func=cmd_ops)


def cmd_ops(args) -> int:
    """`rewrite ops`: the vocabulary as a table or JSON (`vocab.ops.vocabulary`)."""
    from vocab.ops import FAMILIES, MIN_OPSET, OPS, REQUIRED, VARIADIC_SLOTS, vocabulary
    from vocab.shape_rules import rule_kind

    domains = None
    if args.domain:
        domains = {"" if d in ("ai.onnx", "default", "''") else d for d in args.domain}
    if args.family and args.family not in FAMILIES:
        err.print(
            f"error: unknown op family {args.family!r} (families: {', '.join(sorted(FAMILIES))})",
            markup=False,
        )
        return EXIT_USAGE
    if args.opset is not None and not MIN_OPSET <= args.opset <= 26:
        err.print(f"error: --opset must be between {MIN_OPSET} and 26", markup=False)
        return EXIT_USAGE
    entries = vocabulary(None)
    if domains is not None:
        known = {e.spec.domain for e in entries}
        unknown = sorted(domains - known)
        if unknown:
            names = ", ".join(sorted(d or "ai.onnx" for d in known))
            err.print(f"error: unknown domain {unknown[0]!r} (domains: {names})", markup=False)
            return EXIT_USAGE
        entries = [e for e in entries if e.spec.domain in domains]
    rows = []
    for e in entries:
        spec, reason = e.spec, e.reason
        if args.family and args.family not in spec.families:
            continue
        if args.opset is not None and spec.domain == "":
            form = OPS.get(spec.name, args.opset)
            if form is None and not reason:
                continue
            spec = form or spec
        inputs = []
        seen_variadic = False
        for i, name in enumerate(spec.inputs):
            if not spec.has_input(i):
                break
            if spec.variadic and i >= spec.arity - VARIADIC_SLOTS:
                if not seen_variadic:
                    inputs.append(name.rsplit("_", 1)[0] + "...")
                    seen_variadic = True
                continue
            inputs.append(name + ("?" if i >= spec.n_required else ""))
        attrs = {
            a.name: ("required" if a.default is REQUIRED else a.default)
            for a in spec.attrs
            if spec.has_attr(a.name)
        }
        rows.append(
            {
                "domain": spec.domain or "ai.onnx",
                "op": spec.name,
                "since": spec.version,
                "inputs": inputs,
                "outputs": list(spec.outputs),
                "attributes": {k: _jsonable(v) for k, v in attrs.items()},
                "families": list(spec.families),
                "shape_rule": rule_kind(spec.qualname) if not reason else None,
                "matchable": not reason,
                "reason": reason or None,
            }
        )
    if args.json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return EXIT_OK
    table = Table(title="operator vocabulary", title_justify="left")
    for col in ("domain", "op", "since", "inputs", "outputs", "attributes", "families", "type"):
        table.add_column(col, overflow="fold")
    table.add_column("matchable")
    for r in rows:
        attrs = ", ".join(f"{k}={'-' if v is None else v}" for k, v in r["attributes"].items())
        table.add_row(
            r["domain"],
            r["op"],
            str(r["since"]),
            " ".join(r["inputs"]),
            " ".join(r["outputs"]),
            attrs,
            " ".join(r["families"]),
            r["shape_rule"] or "",
            "yes" if r["matchable"] else f"no: {r['reason']}",
        )
    wide = out if out.is_terminal else Console(highlight=False, width=220)
    wide.print(table)
    matchable = sum(r["matchable"] for r in rows)
    out.print(f"{len(rows)} ops, {matchable} matchable", markup=False)
    return EXIT_OK


def _jsonable(v):
    if isinstance(v, tuple) and hasattr(v, "_fields"):  # a TensorValue
        return {"dtype": v.dtype, "shape": list(v.shape), "values": list(v.values)}
    if isinstance(v, tuple):
        return list(v)
    return v


def cmd_emit(args) -> int:
    """`rewrite emit PATH...`: print the generated egglog program on stdout."""
    from engine.emit import emit

    rules = _load_rules(args.paths)
    if rules is None:
        return EXIT_FAIL
    sys.stdout.write(emit(rules))
    return EXIT_OK


def cmd_explain(args) -> int:
    """`rewrite explain OUT NODE...`: for each NODE, print what the rules that produced it did,
    one line per rule firing, the last first (`engine.provenance.describe`). Stops at the
    first name the model does not have, with a one-line error."""
    from engine.provenance import describe
    from frontends.onnx import ModelError, load_model
    from frontends.onnx.explain import NoProvenance, find_provenance

    try:
        model = load_model(Path(args.model))
    except ModelError as e:
        return _fail(str(e))
    for node in args.node:
        try:
            what, tree = find_provenance(model, node)
        except NoProvenance as e:
            return _fail(f"{args.model}: {e}")
        if tree is None:
            out.print(f"{what}: original node, not produced by a rewrite", markup=False)
            continue
        name, op = _name_and_op(what, node)
        out.print(f"{what}: the last rule first; indented rules fired before it", markup=False)
        for line in describe(name, op, tree):
            out.print(f"  {line}", markup=False)
    return EXIT_OK


def _name_and_op(what: str, fallback: str) -> tuple[str, str]:
    """("rw_3", "Conv") from `find_provenance`'s "node rw_3 (Conv)"; (NAME, "") for a
    constant."""
    kind, _, rest = what.partition(" ")
    if kind == "node" and rest.endswith(")"):
        name, _, op = rest[:-1].rpartition(" (")
        return name, op
    return (rest or fallback), ""


def cmd_optimize(args) -> int:
    """`rewrite optimize IN OUT`: `frontends.onnx.api.run` with the options from the command
    line, the output staged beside OUT and checked as written, then renamed into place; the
    summary on stdout (none with --quiet). Returns the exit status."""
    from dsl import RulesError
    from engine.selection import UnknownRulePatternError
    from frontends.onnx import ModelError, OpsetError, prepare_output
    from frontends.onnx.api import InvalidResult, OptionError, OutputMismatch, run
    from frontends.onnx.check import CheckError

    start = time.perf_counter()
    # OUT may be IN: the input is read whole before anything is written, and the output is
    # renamed into place only after every check passed
    src, dst = Path(args.input), Path(args.output)
    if dst.is_dir():
        return _fail(f"output {dst} is a directory")
    if not dst.parent.is_dir():
        return _fail(f"{dst.parent}: output directory does not exist")
    problem = _path_problem(src, dst, args.report)
    if problem:
        return _fail(problem)
    try:
        options = _options(
            args,
            check=not args.no_check,
            check_inputs=args.check_inputs,
            input_shapes=args.input_shape,
            atol=args.atol,
            rtol=args.rtol,
            provenance=not args.no_provenance,
            opset=args.opset,
            target=args.target,
            quantize=args.quantize,
            per_channel=args.per_channel,
            bits=args.bits,
            keep_float=args.keep_float,
            op_types=args.op_types,
            error_budget=args.error_budget,
            calibration=args.calibration,
            validation=args.validation,
            held_out=args.held_out,
            over_budget_share=args.over_budget_share,
            calibrate=args.calibrate,
            symmetric=args.symmetric,
            smooth=args.smooth,
            cpu=args.cpu,
            rounding=args.rounding,
            asymmetric=args.asymmetric,
        )
    except OptionError as e:
        return _fail(str(e))
    if options.rules is not None and _missing(options.rules):
        return _fail(_missing(options.rules))
    staged = []

    def stage_output(result, external_input):  # serialized, or staged beside OUT with its data
        keep = external_input if args.external_data is None else args.external_data
        staged.append(prepare_output(result, dst, folder=src.parent, external_data=keep))
        return staged[-1].source

    stages = _Stages(quiet=args.quiet, verbose=args.verbose)
    try:
        done = run(src, options, start=start, stage=stages.stage, stage_output=stage_output)
    except (OptionError, ModelError, UnknownRulePatternError) as e:
        return _fail(str(e))
    except OpsetError as e:
        return _fail(f"--opset {args.opset}: {e}")
    except RulesError as e:
        err.print(str(e), markup=False)
        return EXIT_FAIL
    except OSError as e:
        return _fail(f"{dst}: cannot write: {e.strerror or e}")
    except OutputMismatch as e:
        _discard(staged)
        return _mismatch(args, e.run, src, start)
    except CheckError as e:
        _discard(staged)
        done = e.run
        if e.original and options.input_shapes:  # the shapes the user fixed, most likely
            return _fail(
                f"output check: with the input shapes given (--input-shape), {e}; the model may "
                "not take these shapes"
            )
        if e.original or not done.report.fired:  # no rule to blame: nothing to bisect
            return _fail(f"output check: {e}; --no-check writes the output unchecked")
        culprit = _bisect_failure(
            args, done.original, done.rules, done.report.fired, done.folder, start
        )
        return _fail(f"output check: {e}{culprit}")
    except InvalidResult as e:  # a rule wrote a graph that is not valid ONNX: which one?
        _discard(staged)
        culprit = _bisect_failure(args, e.original, e.rules, None, e.folder, start)
        return _fail(f"the optimized model fails onnx's full check: {e}{culprit}")
    except UnicodeDecodeError as e:
        return _fail(f"rules: cannot read a rules file: {e}")
    except Exception as e:  # an engine bug: say so in one line, write nothing
        _discard(staged)
        first = str(e).splitlines()[0] if str(e) else ""
        return _fail(f"{INTERNAL_ERROR}: {type(e).__name__}: {first}")
    except BaseException:  # Ctrl-C, SIGTERM: nothing staged is left beside OUT
        _discard(staged)
        raise
    clock = time.perf_counter()
    try:
        with _uninterrupted():
            staged[-1].commit()
    except OSError as e:
        _discard(staged)
        return _fail(f"{dst}: cannot write: {e.strerror or e}")
    except BaseException:
        _discard(staged)
        raise
    report = _timed(done.report, start, save=time.perf_counter() - clock)
    _print_excluded(report, done.rules, quiet=args.quiet)
    if not args.quiet:
        _print_summary(report, done.diffs, options, verbose=args.verbose)
        if args.explain:
            _print_explained(report, done.model, done.rules)
            _print_rejected(report)
    _print_warning(report)
    if args.report:
        _write_report(Path(args.report), report, done.diffs)
    if not args.quiet:
        out.print(f"wrote {dst} ({_outcome(report)})", markup=False)
    return EXIT_OK


def _path_problem(src: Path, dst: Path, report: str | None) -> str:
    """Why writing OUT (and its data file) and the --report file would destroy a file the run
    reads or writes ("" when it would not): a report onto the input or the output model, into
    a folder that does not exist; OUT's data file (`OUT.data`, `external.data_name`) being one
    the input reads its weights from, unless OUT is IN (then the new file replaces it only
    once every check passed)."""
    from frontends.onnx import external

    if report:
        r = Path(report)
        if r.is_dir():
            return f"--report {r} is a directory"
        if not r.parent.is_dir():
            return f"--report {r}: directory {r.parent} does not exist"
        for name, model in (("IN", src), ("OUT", dst)):
            if r.resolve() == model.resolve():
                return f"--report {r} is the model {name}"
    data = dst.parent / external.data_name(dst)
    if data.exists() and src.resolve() != dst.resolve() and src.is_file():
        for location in external.data_files(src):
            if location.resolve() == data.resolve():
                return (
                    f"{dst}: its weights would go to {data}, which {src} reads its weights "
                    "from; give OUT another name (or OUT = IN)"
                )
    return ""


def _missing(paths) -> str:
    """The one-line error for the first rules path that does not exist, or ""."""
    for p in [paths] if isinstance(paths, (str, Path)) else paths:
        if not Path(p).exists():
            return f"--rules {p}: no such file or directory"
    return ""


def _print_excluded(report, kept, quiet: bool) -> None:
    """How many rules --skip/--only left out (stderr), from the reasons in `report.skipped`;
    `kept`: the RuleSet they left."""
    names = sorted(
        r for r, why in report.skipped.items() if why.startswith(("--skip", "not in --only"))
    )
    if names and not quiet:
        shown = ", ".join(names[:8]) + (f", ... ({len(names) - 8} more)" if len(names) > 8 else "")
        # every rule loaded: those kept and those the selection left out, for any reason (the
        # other modes' rulesets and a runtime's sums too), so that the total is the same
        # whatever the patterns (it was kept + these, which moved with the patterns)
        total = len({r.name for r in kept.rules} | set(report.skipped))
        err.print(
            f"--skip/--only excluded {len(names)} of the {total} rules loaded: {shown}",
            markup=False,
        )


def _discard(staged: list) -> None:
    with _uninterrupted():
        for output in staged:
            output.discard()


def _timed(report, start: float, save: float):
    """`report` with `save` (added to the staging of the output that `api.run` timed) and
    `other` (what no stage accounts for) added to its seconds."""
    seconds = {**report.seconds, "save": report.seconds.get("save", 0.0) + save}
    seconds["other"] = max(time.perf_counter() - start - sum(seconds.values()), 0.0)
    return replace(report, seconds=seconds)


def _outcome(report) -> str:
    """`N -> M nodes`, and why the model is unchanged or the best so far. An unchanged model
    written anew (the CLI writes what it imported) holds its Constant nodes as initializers."""
    same = "the input unchanged"
    conv = report.extra.get("opset", {})
    if conv.get("converted"):  # --opset asked for it: the conversion is kept all the same
        same = f"the input converted to opset {conv['output']}"
    constants = report.ops_before.get("Constant", 0)
    if not report.changed and constants and report.nodes_before - report.nodes_after == constants:
        same = f"the input's graph, its {constants} Constant nodes as initializers"
    note = "" if report.changed else f"; no rewrite made it cheaper, so it is {same}"
    if report.limit_stage:
        best = "the best graph found so far" if report.changed else same
        note = f"; {report.stop_reason} reached during {report.limit_stage}, so it is {best}"
    return f"{report.nodes_before} -> {report.nodes_after} nodes{note}"


def _mismatch(args, done, src: Path, start: float) -> int:
    """After a failed output check: the summary (unless --quiet), the report, the bisection,
    and the one-line error."""
    report = _timed(done.report, start, save=0.0)
    _print_excluded(report, done.rules, quiet=args.quiet)
    if not args.quiet:
        from frontends.onnx.api import Options

        options = Options(
            atol=args.atol,
            rtol=args.rtol,
            check_inputs=getattr(args, "check_inputs", None),
            error_budget=getattr(args, "error_budget", None),
        ).budget_tolerance()
        _print_summary(report, done.diffs, options, False)
    _print_warning(report)
    if args.report:
        _write_report(Path(args.report), report, done.diffs)
    bad = ", ".join(d.name for d in done.diffs if not d.ok)
    budget = getattr(args, "error_budget", None)
    measured = _measured([d for d in done.diffs if not d.ok])
    failed = [d for d in done.diffs if not d.ok]
    if report.fp == "quant" and all(d.nan and d.nan_in == "original" for d in failed):
        # not the quantization's error: the original gives NaN on the check's inputs (random
        # ones: a fully masked attention row), which the new model, quantizing them, may not
        given = getattr(args, "check_inputs", None) or getattr(args, "calibration", None)
        why = (
            "the inputs given; a quantized product turns a NaN into a number"
            if given
            else "random inputs; give inputs it takes with --check-inputs FILE.npz"
        )
        return _fail(
            f"{measured}: the original model gives NaN on the check's inputs, where no error "
            f"can be measured ({why}); nothing written"
        )
    if budget is not None:  # quantization error, not a wrong rule: nothing to bisect
        held = report.extra.get("quantize", {}).get("held_out") or {}
        return _fail(
            f"{measured} exceeds --error-budget "
            f"{100 * budget:.2f}% on the {_budget_inputs(report)} inputs"
            + (
                f" ({held['over_budget']} of the {held['inputs']} held out from the search over it)"
                if held.get("over_budget")
                else ""
            )
            + "; nothing written"
        )
    if report.fp == "quant":  # the quant rules' error, each within its verified bound
        return _fail(
            f"{measured} exceeds the output check's tolerance "
            "for quantized models (--rtol R to accept more, --error-budget E to keep nodes "
            "in float until it fits, --keep-float NAME to choose them); nothing written"
        )
    culprit = _bisect_failure(args, done.original, done.rules, report.fired, done.folder, start)
    return _fail(f"output check failed for {bad}; nothing written{culprit}")


def _measured(failed) -> str:
    """What the failed OutputDiffs measured, for a one-line error: the largest relative error
    of the float outputs, and each integer output's share of elements that differ."""
    floats = [d for d in failed if not d.shares]
    parts = []
    for who, says in (
        ("original", "a NaN in the original model's output where the new one has a number"),
        ("optimized", "a NaN in the new model's output where the original has a number"),
        ("both", "NaNs in each model's output where the other has a number"),
    ):
        nan = [d.name for d in floats if d.nan and (d.nan_in or "both") == who]
        if nan:
            parts.append(f"{says} in {', '.join(nan)}")
    floats = [d for d in floats if not d.nan]
    if floats:
        worst = max(d.max_rel for d in floats)
        parts.append(f"measured error {100 * worst:.2f}% of {', '.join(d.name for d in floats)}")
    parts += [
        f"{100 * d.max_rel:.2f}% of the elements of {d.name} differing" for d in failed if d.shares
    ]
    return "; ".join(parts)


class _Stages:
    """Progress on stderr: a stage that has run for `delay` seconds shows a spinner with its
    name until it ends (rich's status line, erased after), and what the stage reports it is
    doing (the budget search's candidate); with `verbose` each stage's time is printed as it
    ends. Off with `quiet` or when stderr is not a terminal (rich's
    `is_terminal`), so logs and pipes get no control characters."""

    def __init__(
        self, quiet: bool = False, verbose: bool = False, delay: float = 1.0, console=None
    ):
        self.console = console or err
        self.live = not quiet and self.console.is_terminal
        self.verbose, self.delay = verbose and not quiet, delay

    @contextlib.contextmanager
    def stage(self, label: str):
        """Context manager around one stage named `label`; it gives a function that shows
        one line of detail after the label (what the stage is doing now)."""
        clock = time.perf_counter()
        status = self.console.status(f"{label}...") if self.live else None

        def detail(text: str) -> None:
            if status is not None:
                status.update(f"{label}: {text}")

        lock, shown = threading.Lock(), []

        def show():
            with lock:
                if shown == []:
                    status.start()
                    shown.append(True)

        timer = threading.Timer(self.delay, show) if status is not None else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        try:
            yield detail
        finally:
            if timer is not None:
                timer.cancel()
                with lock:
                    if shown:
                        status.stop()
                    shown.append(False)
            if self.verbose:
                seconds = time.perf_counter() - clock
                self.console.print(f"{label}: {seconds:.2f} s", markup=False)


def cmd_bisect(args) -> int:
    """`rewrite bisect IN`: look for the rules (and sites) that break the outputs; print the
    report on stdout. Returns the exit status."""
    from engine.selection import UnknownRulePatternError, pick_rules
    from frontends.onnx import ModelError, load_model
    from frontends.onnx.api import OptionError
    from frontends.onnx.bisect import BisectError
    from frontends.onnx.quantize import CalibrationError

    start = time.perf_counter()
    try:
        options = _options(args)
    except OptionError as e:
        return _fail(str(e))
    rules = _load_rules(options.rules)
    if rules is None:
        return EXIT_FAIL
    try:
        rules, _ = pick_rules(rules, options.skip, options.only)
        model = load_model(args.input)
        report = _run_bisect(args, model, rules, options, start, Path(args.input).parent)
    except (UnknownRulePatternError, ModelError, BisectError, CalibrationError) as e:
        return _fail(str(e))
    for line in _bisect_lines(report, args):
        out.print(line, markup=False)
    return EXIT_OK


def _progress(line: str) -> None:
    """Bisection progress: one line on stderr."""
    err.print(line, markup=False)


def _bisect_failure(args, model, rules, fired, folder, start: float) -> str:
    """After a failed output check of `optimize` (which began at `start`, a perf_counter
    value), or a result that is not valid ONNX: bisect for the culprit within what is left of
    --timeout, print the detailed report on stderr, and return the end of the one-line error
    ("; culprit: rule R (file:line)"), or "" with --no-bisect. fired: the failing run's
    `report.fired` (None: the bisection finds out)."""
    from frontends.onnx.bisect import BisectError
    from frontends.onnx.quantize import CalibrationError

    if args.no_bisect:
        return ""
    options = _options(args)
    try:
        found = _run_bisect(args, model, rules, options, start, folder, fired)
    except (BisectError, CalibrationError) as e:
        return f"; bisection failed: {e}"
    for line in _bisect_lines(found, args):
        err.print(line, markup=False)
    if not found.culprits:
        return f"; bisection: {found.note}" if found.note else ""
    names = ", ".join(f"{c.rule} ({c.where})" for c in found.culprits)
    sites = [n or s for c in found.culprits for s, n in zip(c.sites, c.nodes)]
    at = f" at {', '.join(sites)}" if sites else ""
    return f"; culprit: rule {names}{at}" + ("" if found.complete else " (bisection incomplete)")


def _run_bisect(args, model, rules, options, start: float, folder, fired=None):
    """`bisect_model` with the command's options, on the `--check-inputs` given (where the
    check compared) or random inputs. Raises BisectError, CalibrationError."""
    from frontends.onnx.bisect import bisect_model
    from frontends.onnx.quantize import load_calibration

    given = getattr(args, "check_inputs", None)
    feeds = None if given is None else load_calibration(given, model, "check-inputs")
    return bisect_model(
        model,
        rules,
        fp=options.fp,
        limits=options.limits(start),
        folder=folder,
        fired=fired,
        progress=_progress,
        feeds=feeds,
    )


def _bisect_lines(found, args) -> list[str]:
    """A bisection's report as lines, its reproduce commands with this command's rules."""
    from frontends.onnx.bisect import format_report

    added = getattr(args, "add_rules", None)
    return format_report(
        found,
        model=args.input,
        rule_paths=args.rules,
        added=added,
        allow=args.allow,
        check_inputs=getattr(args, "check_inputs", None),
    )


def _fail(msg: str) -> int:
    """Print `error: msg` (one line) on stderr; return EXIT_FAIL."""
    err.print(f"error: {msg}", markup=False)
    return EXIT_FAIL


def _budget_inputs(report) -> str:
    """What the error budget was searched and checked on: `calibration` or `validation`."""
    return report.extra.get("quantize", {}).get("budget_inputs", "calibration")


def _print_quantized(record: dict, verbose: bool) -> None:
    """`rewrite quantize`'s choices (`frontends.onnx.quantize.Chooser.record`): the sites kept
    in float and why (every site with `verbose`), with their estimates and, after a budget
    search, their error measured alone; the calibration error per output against the budget,
    and the warning about drawn calibration inputs."""
    sites = record.get("sites", [])
    done = sum(s["quantized"] for s in sites)
    if sites:  # (none: the warning after the summary says why nothing was quantized)
        out.print(f"quantized {done} of {len(sites)} nodes the quant rules matched", markup=False)
    else:
        out.print("quantized nothing: no node matched a quantizing rule", markup=False)
    smooth = record.get("smoothing")
    if smooth:
        divisions = smooth.get("divisions", 0)
        out.print(
            f"smoothed {smooth['smoothed']} of {smooth['activations']} activations into the "
            f"weights of their products (SmoothQuant, alpha {smooth['alpha']:g}, "
            f"{smooth['samples']} calibration inputs)"
            + (
                f"; {divisions} of them divided by their factors in a Div of their own "
                "(no op before them takes the division)"
                if divisions
                else ""
            )
            + (
                f"; {smooth['unsmoothed']} folded back into the weights of products kept in "
                "float (a division they would not gain from)"
                if smooth.get("unsmoothed")
                else ""
            )
            + _unsmoothing_refused(smooth),
            markup=False,
        )
    rounding = record.get("rounding")
    if rounding:
        nearer, weights = rounding.get("nearest", []), rounding["weights"]
        one = len(nearer) == 1
        out.print(
            f"rounded {weights} weight{'' if weights == 1 else 's'} by "
            f"{rounding['method'].upper()} on {rounding['samples']} calibration inputs"
            + (
                f"; {len(nearer)} kept {'its' if one else 'their'} nearest levels: rounded on "
                f"the first {rounding['samples'] - rounding['held_out']}, "
                f"{'it' if one else 'they'} erred more on the last {rounding['held_out']} than "
                "the nearest levels do (more calibration inputs help)"
                if nearer
                else ""
            ),
            markup=False,
        )
    shown = sites if verbose else [s for s in sites if not s["quantized"]]
    if shown:
        t = Table(
            title="quantization per node" if verbose else "kept in float", title_justify="left"
        )
        alone = any(s.get("alone") is not None for s in shown)  # measured by a budget search
        cols = ("node", "op", "quantized", "estimate") + (("alone",) if alone else ()) + ("why",)
        for col in cols:
            t.add_column(col, justify="right" if col in ("estimate", "alone") else "left")
        for s in shown:
            row = [s["node"], s["op"], "yes" if s["quantized"] else "no"]
            for key in ("estimate",) + (("alone",) if alone else ()):
                row.append("" if s.get(key) is None else f"{100 * s[key]:.1f}%")
            t.add_row(*row, s["why"])
        out.print(t)
    if record.get("budget") is not None:
        errors = record.get("calibration_error", {})
        estimated = record.get("estimated_error", {})
        t = Table(
            title=f"error per output on {record.get('calibration_samples', 0)} "
            f"{record.get('budget_inputs', 'calibration')} "
            f"inputs ({record.get('evaluations', 0)} graphs measured, kept in float "
            f"{record.get('order', '-')}; estimated: the sum of the quantized nodes' estimates "
            "it depends on)",
            title_justify="left",
        )
        for col in ("output", "estimated", "measured max|q - ref| / max|ref|", "budget"):
            t.add_column(col, justify="left" if col == "output" else "right")
        for name, e in errors.items():
            est = estimated.get(name)
            t.add_row(
                name,
                "-" if est is None else f"{100 * est:.2f}%",
                f"{100 * e:.2f}%",
                f"{100 * record['budget']:.2f}%",
            )
        out.print(t)
    tail = record.get("tail")
    if tail:
        allowed = record.get("over_budget_share")
        out.print(
            f"tail of the {tail['inputs']} searched inputs' errors (exponential above the "
            f"{tail['tail'] + 1}th worst, {100 * tail['threshold']:.2f}%, scale "
            f"{100 * tail['scale']:.3f}%): about {100 * tail['share']:.3g}% of inputs like them "
            f"would err over the budget"
            + (
                " (--over-budget-share P keeps nodes in float until it is at most P)"
                if allowed is None
                else f" (--over-budget-share {100 * allowed:.3g}%)"
            ),
            markup=False,
        )
    held = record.get("held_out")
    if held:
        worst = max(held["error"].values(), default=0.0)
        share = held["over_budget_share_at_most"]
        out.print(
            f"held out from the search: {held['inputs']} inputs, worst {100 * worst:.2f}% "
            f"against the budget's {100 * record['budget']:.2f}%; "
            + (
                f"{held['over_budget']} of them over it"
                if held["over_budget"]
                else f"none over it: at most {100 * share:.1f}% of inputs drawn like them "
                f"would be ({100 * held['confidence']:.0f}% confidence, Clopper-Pearson)"
            ),
            markup=False,
        )
    if record.get("note"):
        err.print(f"note: {record['note']}", markup=False)


def _print_warning(report) -> None:
    """A run's warning on stderr, printed with --quiet too, like an error: a quantization
    run's (`Chooser.record["warning"]`: nothing quantized, drawn calibration inputs, ...) or
    an optimization's (`report.extra["warning"]`: --allow quant on a float model)."""
    for warning in (report.extra.get("quantize", {}).get("warning"), report.extra.get("warning")):
        if warning:
            err.print(f"warning: {warning}", markup=False)


def _unsmoothing_refused(smooth: dict) -> str:
    """Why the smoothing Divs before products kept in float stayed ("" if they did not)."""
    stay = "; the Divs before products kept in float stay: without them the error measured "
    if "unsmoothing_over_budget" in smooth:
        return f"{stay}{100 * smooth['unsmoothing_over_budget']:.2f}%, over the budget"
    if "unsmoothing_tail_share" in smooth:
        return (
            f"{stay}{100 * smooth['unsmoothing_error']:.2f}%, within the budget, but its tail "
            f"puts about {100 * smooth['unsmoothing_tail_share']:.3g}% of inputs over it, more "
            "than --over-budget-share allows"
        )
    return ""


def _print_summary(report, diffs, options, verbose: bool = False) -> None:
    """The summary on stdout: op counts before/after, seconds per stage, why saturation
    stopped, the rules that fired, the output check and its tolerances (`options.atol`/`rtol`
    when given); with `verbose` also each saturation iteration and the rules not run."""
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
    reason = report.stop_reason
    if reason == "node-limit" and report.enodes <= options.max_nodes:  # a stop predicted
        reason += f" (the next iteration would have grown it past {options.max_nodes:,})"
    out.print(
        f"saturation: {reason} after {report.iterations} iterations, "
        f"{report.enodes} e-nodes, {report.eclasses} e-classes; "
        f"cost {report.cost_before / 1e3:.1f} -> {report.cost_after / 1e3:.1f} us (model estimate)"
        + (f"; the budget ran out during {report.limit_stage}" if report.limit_stage else ""),
        markup=False,
    )
    if verbose:
        for i, (seconds, enodes) in enumerate(report.extra.get("history", ()), 1):
            out.print(f"  iteration {i}: {seconds:.3f} s, {enodes} e-nodes", markup=False)
        for rule, why in sorted(report.skipped.items()):
            out.print(f"  not run: {rule} ({why})", markup=False)
    if "quantize" in report.extra:
        _print_quantized(report.extra["quantize"], verbose)
    if report.fired:
        fired = Table(title="rules fired", title_justify="left")
        fired.add_column("rule")
        fired.add_column("matches", justify="right")
        for name, n in sorted(report.fired.items(), key=lambda kv: (-kv[1], kv[0])):
            fired.add_row(name, str(n))
        out.print(fired)
    conv = report.extra.get("opset", {})
    if conv.get("converted") or conv.get("note"):
        done = f"converted to opset {conv['output']}" if conv.get("converted") else "not converted"
        why = f" ({conv['note']})" if conv.get("note") else ""
        out.print(f"opset {conv['input']}: {done} by onnx.version_converter{why}", markup=False)
    if diffs:
        executors = ", ".join(sorted({d.executor for d in diffs}))
        checked_on = report.extra.get("quantize", {}).get("checked_on")
        if options.check_inputs is not None:
            checked_on = "--check-inputs"
        inputs = f"the {checked_on} inputs" if checked_on else "random inputs"
        check = Table(title=f"output check ({executors}, {inputs})", title_justify="left")
        for col in ("output", "dtype", "max abs err", "max err / max|b|", "status"):
            check.add_column(col)
        for d in diffs:
            if d.random:
                check.add_row(d.name, d.dtype, "-", "-", "not compared: random draws")
                continue
            check.add_row(
                d.name,
                d.dtype,
                f"{d.max_abs:.3g}",
                f"{d.max_rel:.3g} of elements differ" if d.shares else f"{d.max_rel:.3g}",
                "ok" if d.ok else "[red]FAIL[/red]",
            )
        out.print(check)
        for dtype, rtol, atol, shares in sorted(
            {(d.dtype, d.rtol, d.atol, d.shares) for d in diffs if not d.random}
        ):
            if shares:
                rule = f"computed from floats: at most a share rtol {rtol:g} of elements differ"
            elif rtol == 0 and atol == 0:
                rule = "exact"
            else:
                rule = f"|a-b| <= atol + rtol*max|b| with rtol {rtol:g}, atol {atol:g}"
            given = ""
            if options.error_budget is not None and options.rtol == options.error_budget:
                given = " (--error-budget)"  # (`Options.quantized` sets it when no --rtol is)
            elif (options.atol, options.rtol) != (None, None):
                given = " (--atol/--rtol)"
            out.print(
                f"tolerance for {dtype} ({report.fp} rules fired){given}: {rule}", markup=False
            )


def _print_explained(report, model, rules) -> None:
    """What each rule did to each node of the optimized `model` (`engine.provenance.describe`,
    with each rule's source pattern from `rules`)."""
    from engine.provenance import describe, pattern_text

    patterns = {r.name: pattern_text(r.lhs, r.rhs) for r in rules.rules}
    ops = {n.name: n.op_type for n in model.graph.node}
    ops.update({o: n.op_type for n in model.graph.node for o in n.output if o not in ops})
    if not report.provenance:
        out.print("no node was produced by a rewrite", markup=False)
    for name, tree in report.provenance.items():
        for line in describe(name, ops.get(name, ""), tree, patterns):
            out.print(line, markup=False)


def _print_rejected(report) -> None:
    """The host-rule matches that were not applied, with the failing guard, and the rules
    not run."""
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
    """The JSON report: `Report.to_json()` and the output check (an output not compared,
    computed from random draws: its errors and tolerances null)."""
    data = report.to_json()
    nan = lambda v: isinstance(v, float) and v != v  # noqa: E731
    data["check"] = [{k: None if nan(v) else v for k, v in d.__dict__.items()} for d in diffs]
    path.write_text(json.dumps(data, indent=2, default=float) + "\n")


if __name__ == "__main__":  # `python -m rewrite.cli`: Python's own exit (profilers, coverage)
    sys.exit(main())
