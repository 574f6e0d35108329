"""`rewrite.optimize_model`: the ONNX optimizer in one call, as `onnxsim.simplify(model)` and
`onnxslim.slim(model)` are.

    optimized, report = rewrite.optimize_model("model.onnx", allow=["reassoc"])

It takes a ModelProto or a path, the shipped rules unless told otherwise, and the options of
`rewrite optimize` as keywords with the same names (`Options`); the CLI is a thin layer over
the same `Options` and stages (`load`, `fix_input_shapes`, `check_outputs`), so each option has
one implementation. `frontends.onnx.optimize_model` is the engine-level call underneath (a
RuleSet, numeric classes as `fp=`, no output check).
"""

from __future__ import annotations

import contextlib
import functools
import numbers
import os
import re
import time
import warnings
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

import onnx

from dsl import RulePathError, rules_given, shipped_rules_dir
from dsl import load_rules as parse_rules
from dsl.ir import RuleSet
from engine.optimize import FP_CLASSES, Report, option_problem
from engine.provenance import replaced_names
from engine.quantize import quantized_ops
from engine.saturate import Limits
from engine.selection import pick_rules
from frontends.onnx import ModelError, external, import_model, load_model, onnx_counts, structure
from frontends.onnx import optimize_model as optimize_engine
from frontends.onnx.check import CheckError, compare
from frontends.onnx.importer import constants_by_name, default_opset, skeleton
from frontends.onnx.opset import auto_target
from frontends.onnx.quantize import (
    CALIBRATION_METHODS,
    GUARDS_DID_NOT_TAKE,
    ROUNDED,
    ROUNDINGS,
    SMOOTH,
    TAIL_MIN_INPUTS,
    CalibrationError,
    Chooser,
    Plan,
    add_note,
    add_warning,
    calibrate,
    clipped_block_products,
    divided_products,
    drawn_calibration,
    guard_refusals,
    held_out_feeds,
    load_calibration,
    nonfinite,
    nothing_quantized,
    observe,
    product_boundary,
    refused_products,
    rounding_marks,
    smoothing_divisions,
    smoothing_marks,
    strip_marks,
    subgraph_products,
)
from vocab.ops import FAMILIES, OPS, TARGETS
from vocab.registry import int8_sums_in_int32

NUMERIC_CLASSES = FP_CLASSES[1:]  # beyond `exact`, which always runs
# quantization modes: (mode, per_channel, weight bits) -> the rulesets of patterns/quant/ that
# run; the other quant rulesets are skipped. The first bits listed for a mode is its default.
QUANT_RULESETS = {
    ("dynamic", False, 8): ("quant-dynamic", "quant-embedding"),
    ("dynamic", True, 8): (
        "quant-dynamic-per-channel",
        "quant-dynamic-per-channel-rounded",
        "quant-rounded-moves",
        "quant-embedding",
    ),
    ("weight-only", False, 4): (
        "quant-weight-only-4bit",
        "quant-weight-only-4bit-rounded",
        "quant-weight-only-4bit-onnx",
        "quant-weight-only-4bit-rounded-onnx",
        "quant-weight-only-gemm",
        "quant-rounded-moves",
    ),
    ("weight-only", False, 8): (
        "quant-weight-only-8bit",
        "quant-weight-only-8bit-rounded",
        "quant-weight-only-8bit-onnx",
        "quant-weight-only-8bit-rounded-onnx",
        "quant-weight-only-gemm",
        "quant-rounded-moves",
    ),
    ("static", True, 8): (
        "quant-static",
        "quant-static-conv1d",
        "quant-static-conv",
        "quant-static-conv-rounded",
        "quant-static-matmul",
        "quant-static-matmul-rounded",
        "quant-rounded-moves",
        "quant-static-conv1d-rounded",
        "quant-embedding",
    ),
}
QUANT_MODES = tuple(dict.fromkeys(m for m, *_ in QUANT_RULESETS))
# rulesets of exact rules that only hand ops to a mode's quant rules (a Gemm as MatMul + Add,
# a 1-D Conv as a 2-D one): skipped without quantization, where they would only grow the
# e-graph
MODE_HELPER_RULESETS = ("quant-static-conv1d", "quant-weight-only-gemm")
# what the quantized file will run on (`cpu`) -> the rulesets that stand in for others there.
# `any`: weights stepped for the int16 pair sums of onnxruntime's uint8-by-int8 kernels on
# x86 CPUs without VNNI, exact everywhere; `vnni`: full-range weights per output channel or
# column (dynamic per channel, and static), exact where those kernels sum in int32 (x86 with
# AVX512-VNNI or AVX-VNNI; their rulesets say `:sums int32`, and run only for this choice)
CPU_RULESETS = {
    "any": {},
    "vnni": {
        "quant-dynamic-per-channel": "quant-dynamic-per-channel-vnni",
        "quant-dynamic-per-channel-rounded": "quant-dynamic-per-channel-vnni-rounded",
        "quant-static-conv": "quant-static-conv-vnni",
        "quant-static-conv-rounded": "quant-static-conv-vnni-rounded",
        "quant-static-matmul": "quant-static-matmul-vnni",
        "quant-static-matmul-rounded": "quant-static-matmul-vnni-rounded",
    },
}
# `asymmetric` weight-only blocks (a zero point each, `MatMulNBitsQuantizer`'s default) -> the
# rulesets that stand in for the symmetric ones (4 bits, either target, nearest rounding)
ASYMMETRIC_RULESETS = {
    "quant-weight-only-4bit": "quant-weight-only-4bit-asym",
    "quant-weight-only-4bit-onnx": "quant-weight-only-4bit-asym-onnx",
}
# ... and every mode's rulesets: without `quantize` (`rewrite optimize --allow quant`) the quant
# class lowers graphs that are quantized already (QDQ groups to integer kernels, lower.rules),
# and quantizes no float product (which would want a mode, its sites and their report)
MODE_RULESETS = tuple(
    dict.fromkeys(
        [r for rs in QUANT_RULESETS.values() for r in rs]
        + [r for m in CPU_RULESETS.values() for r in m.values()]
        + list(ASYMMETRIC_RULESETS.values())
        + list(MODE_HELPER_RULESETS)
    )
)
# `rewrite optimize --allow quant` on a model with no (De)QuantizeLinear: the quant class lowers
# quantized graphs (MODE_RULESETS), so nothing of it applies
LOWERS_NOTHING = (
    "--allow quant lowers the QuantizeLinear and DequantizeLinear groups of a quantized model, "
    "and this one has none; to quantize a float model: rewrite quantize"
)
# an output check with every output computed from a random op's draws (check.random_outputs)
NOTHING_COMPARED = (
    "the output check compared no output: each is computed from a random op's draws, which "
    "differ from run to run, so the rewrites are unchecked"
)
# one weight scale per output channel unless the user asks for one per weight: measured with
# bench/quant.py on BERT-base, GPT-2, a Llama-style decoder and ViT-B/16, the mean error per
# input is onnxruntime's quantize_dynamic's or lower per channel and 16-38% above it per
# tensor, at the same latency (docs/benchmarks.md); static mode is per channel always
PER_CHANNEL_DEFAULT = {"dynamic": True, "static": True}
# the (mode, per_channel) pairs whose rules have `*-rounded` forms (patterns/quant/rounding.rules,
# rounding_static.rules), so that `rounding` gptq applies
ROUNDED_MODES = (("dynamic", True), ("weight-only", False), ("static", True))
# SmoothQuant's pass (`smooth`) runs these rulesets alone (patterns/quant/smooth.rules): the
# cleanup runs in the quantization pass after it
SMOOTH_RULESETS = ("quant-smooth", "quant-smooth-absorb", "quant-smooth-layernorm")
# ... and these in a pass after the quantization, on the products it kept in float (never in the
# quantization's e-graph, where they would undo every smoothing)
UNSMOOTH_RULESETS = ("quant-unsmooth",)
# weight-only's standard-ONNX rulesets (DequantizeLinear with block_size) need this opset; for
# target onnxruntime, its MatMulNBits rulesets run instead
WEIGHT_ONLY_ONNX_OPSET = 21
# the output check of a quantized model without --error-budget runs on at most this many of the
# --calibration inputs (each output of both models is held for the comparison)
CHECK_FEEDS = 8
DEFAULT_TIMEOUT = 120.0  # seconds of a call, unless quantizing calibrates (below)
# ... when quantizing runs the model on calibration inputs or searches an error budget
CALIBRATING_TIMEOUT = 600.0


class OptionError(ValueError):
    """An option value that cannot be used (an unknown numeric class, an input shape for an
    input the model does not have, a limit that is not positive). One line."""


class OutputMismatch(AssertionError):
    """The optimized model's outputs differ from the original's beyond the tolerance.

    run: the `Run` (its `diffs`, one `frontends.onnx.check.OutputDiff` per output; its model,
    for a caller that wants to look at it: it must not be used as a replacement)."""

    def __init__(self, run: Run):
        bad = ", ".join(d.name for d in run.diffs if not d.ok)
        super().__init__(f"output check failed for {bad}")
        self.run = run


class InvalidResult(RuntimeError):
    """The optimized model fails onnx's full check (strict shape inference) where the input
    passes it: a rule built a graph that is not valid ONNX (a Reshape dropped whose `0` copied
    another dimension). original, rules, folder: the input (weights included), the rules after
    skip/only and the folder of its external data, for a caller that bisects for the rule."""

    def __init__(self, message: str, original: onnx.ModelProto, rules, folder: Path | None):
        super().__init__(message)
        self.original, self.rules, self.folder = original, rules, folder


@dataclass(frozen=True)
class Options:
    """The options of one optimization, by the names `rewrite optimize` gives them.

    rules: a `dsl.ir.RuleSet`, a `.rules` path or a list of paths (files or folders), or None
        for the shipped library (`patterns/`).
    allow: numeric classes to run beyond `exact`: `reassoc` (regroups float arithmetic, e.g.
        BatchNorm folded into Conv), `approx`, `quant` (affine quantization to int8; see
        `rewrite quantize`).
    skip/only: rule names, globs (`cast-*`) or `ruleset:NAME` (`engine.selection.pick_rules`).
    check: run both models under onnxruntime on random inputs and compare every output.
    check_inputs: an `.npz` path of the inputs the check runs on instead (one array per graph
        input, named as the input, its first axis the samples, as `calibration`): for a model
        whose integer inputs are shapes or axes, which the random draws (0 or 1) cannot be.
    input_shapes: input name -> dims (ints), or `"name:1,128"` strings; fixes those inputs'
        dimensions (`fix_input_shapes`).
    atol/rtol: the output check's tolerance for float outputs, |a-b| <= atol + rtol*max|b|;
        None keeps the default of the numeric class that fired (`engine.optimize.TOLERANCES`).
    max_iterations, max_nodes: saturation limits. timeout: seconds for the whole call (None:
        DEFAULT_TIMEOUT, or CALIBRATING_TIMEOUT when quantizing calibrates; `Options.seconds`).
    provenance: record on each rewritten node the rules that produced it (`rewrite explain`).
    target: the runtime the result is for (`vocab.ops.TARGETS`): `onnx` (standard ONNX) or
        `onnxruntime` (its contrib ops too: rulesets that write `com.microsoft` ops run).
    opset: convert the model to this default-domain opset first (`onnx.version_converter`) and
        optimize it with the rules whose ops exist there; None converts only a model older
        than the op table's forms (see `frontends.onnx.optimize_model`).
    quantize: a quantization mode (`QUANT_MODES`: `dynamic`, int8 weights and activations
        quantized at run time; `weight-only`, 4-bit block-wise weights: onnxruntime's
        MatMulNBits for `target` onnxruntime, else DequantizeLinear with block_size, an int4
        weight and float scales before the MatMul, the model converted to opset 21 if older)
        or None. It allows the `quant` class and runs
        that mode's ruleset (`QUANT_RULESETS`) beside the rest of the library; `per_channel`
        (None: the mode's default, `PER_CHANNEL_DEFAULT`) True picks the dynamic ruleset with
        one weight scale per output column (the default: its error is onnxruntime's per-tensor
        one or lower at the same speed, where one scale per weight, stepped for the kernels'
        int16 pairs, costs a fifth to a third more error), False the one with one scale per
        weight; `bits` the
        weight-only ruleset's width (4, the default, or 8); `asymmetric` weight-only's 4-bit
        blocks with a zero point each (`ASYMMETRIC_RULESETS`; symmetric by default).
        `static`: activations quantized with ranges calibrated ahead of time (`calibration`,
        or inputs drawn at random with a warning; `calibrate` is `minmax` or `percentile`,
        `symmetric` ranges around 0 instead of uint8 ones), weights per output channel
        (always), Convs lowered to QLinearConv, MatMuls by constant weights to QLinearMatMul
        (and, for target onnxruntime, residual Adds to QLinearAdd), embedding tables stored
        in int8.
    keep_float: node-name globs (fnmatch) whose nodes stay in float; op_types: the ops to
        quantize (`MatMul`, `Gemm`; empty: all the mode covers); error_budget: the largest
        max|q - ref| / max|ref| allowed per float output over the calibration inputs (the
        extraction keeps the nodes that err most, measured alone or estimated, in float
        until it holds (`frontends.onnx.quantize`),
        and the output check then allows exactly that); calibration: an `.npz` path with one
        array per graph input, its first axis the samples (default: drawn at random, with a
        warning; for `static`, the activations' ranges too). validation: an `.npz` like
        `calibration` (error_budget only), the inputs the budget is searched and checked on
        instead of the calibration inputs: smoothing, GPTQ and static ranges fit the
        calibration inputs, and an error measured on the inputs they were fitted to is
        smaller than on others. held_out: how many of the inputs the budget is checked on
        (validation, else calibration), the last ones, the search does not see: the written
        graph's error on them is reported (`extra["quantize"]["held_out"]`) with a 95% upper
        bound on the share of such inputs over the budget, and the output check holds them
        to the budget too. over_budget_share: a share in (0, 1), or None: the search also
        keeps sites in float until the exponential tail fitted to the searched inputs' errors
        puts at most that share of inputs like them over the budget
        (`frontends.onnx.quantize.tail_share`; at least TAIL_MIN_INPUTS searched inputs);
        the chosen graph's estimate is in `extra["quantize"]["tail"]` either way (with 16
        searched inputs or more). smooth: SmoothQuant's migration
        strength alpha in [0, 1] (modes dynamic and static), or None: before quantizing,
        each activation a normalization makes and a product by a constant weight reads is
        divided per channel by s_j = max|x_j|^alpha / max|w_j|^(1 - alpha) (from the
        calibration inputs) and the weight's rows multiplied by it, by the rules of
        patterns/quant/smooth.rules in a pass of their own (class `reassoc`). See
        `frontends.onnx.quantize`; the choices are in the report's `extra["quantize"]`.
    cpu: what the quantized file will run on (`CPU_RULESETS`): `any` (the default: int8
        weights whose neighbours along K add to at most 128 levels when of one sign, so that
        onnxruntime's int16 pair sums on x86 CPUs without VNNI cannot saturate; exact on every
        CPU) or `vnni` (modes dynamic with one scale per output column, and static:
        full-range weights per output channel or column, exact
        where onnxruntime's uint8-by-int8 kernels sum in int32, x86 with AVX512-VNNI or
        AVX-VNNI; on an older x86 CPU they can saturate). Rules whose ruleset says `:sums
        int32` run only with `vnni`.
    rounding: how weights round to their levels (`ROUNDINGS`): `nearest` (the default), or
        `gptq` (mode dynamic with one scale per output column, mode weight-only's blocks, and
        mode static's per-channel weights, of Convs of group 1 too):
        each weight is rounded by GPTQ (Frantar et al., ICLR 2023) on the calibration inputs'
        activations, row by row, each row's error spread over the rows not yet rounded onto
        the steps of the weight's own rule, at no cost at run time; each weight judged first
        on the last quarter of the calibration inputs, held out, and left at its nearest
        levels if its rounding errs more there
        (`frontends.onnx.quantize.calibrated_rounding`; patterns/quant/rounding.rules' and
        rounding_static.rules' `*-rounded` rules, whose bounds include the weight's move). In
        mode static the weights are rounded after the BatchNorm folding and the calibration
        of the activations' ranges (on the float weights). A product kept in float
        keeps its weight.
    """

    rules: object = None
    allow: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    check: bool = True
    check_inputs: str | None = None
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    atol: float | None = None
    rtol: float | None = None
    max_iterations: int = 30
    max_nodes: int = 1_000_000
    timeout: float | None = None
    provenance: bool = True
    opset: int | None = None
    target: str = "onnx"
    quantize: str | None = None
    per_channel: bool | None = None
    bits: int | None = None
    keep_float: tuple[str, ...] = ()
    op_types: tuple[str, ...] = ()
    error_budget: float | None = None
    calibration: str | None = None
    validation: str | None = None
    held_out: int = 0
    over_budget_share: float | None = None
    calibrate: str = "minmax"
    symmetric: bool = False
    smooth: float | None = None
    cpu: str = "any"
    rounding: str = "nearest"
    asymmetric: bool = False

    @classmethod
    def from_keywords(cls, keywords: dict) -> Options:
        """Options from keyword arguments. Raises TypeError naming an unknown keyword and the
        accepted ones, OptionError for a value that cannot be used."""
        names = [f.name for f in fields(cls)]
        unknown = sorted(set(keywords) - set(names))
        if unknown:
            raise TypeError(
                f"unknown option {', '.join(map(repr, unknown))}; accepted: {', '.join(names)}"
            )
        o = cls(**keywords)
        shapes = o.input_shapes
        if not isinstance(shapes, dict):  # "name:1,128" strings: commas are inside a value
            shapes = [shapes] if isinstance(shapes, str) else list(shapes or ())
            shapes = dict(parse_input_shape(s) for s in shapes)
        o = replace(
            o,
            allow=_listed(o.allow),
            skip=_listed(o.skip),
            only=_listed(o.only),
            keep_float=_listed(o.keep_float),
            op_types=_listed(o.op_types),
            input_shapes={k: tuple(v) for k, v in shapes.items()},
        )
        o.validate()
        return o.quantized()

    @property
    def quant_rulesets(self) -> tuple[str, ...]:
        """The rulesets of patterns/quant/ that quantize in this mode, for this CPU and target
        (`QUANT_RULESETS`, `CPU_RULESETS`); () without `quantize`."""
        if self.quantize is None:
            return ()
        keep = tuple(CPU_RULESETS[self.cpu].get(r, r) for r in QUANT_RULESETS[self._quant_key])
        if self.quantize == "weight-only":  # MatMulNBits for onnxruntime, else the ONNX form
            onnx_form = self.target != "onnxruntime"
            keep = tuple(r for r in keep if "bit" not in r or r.endswith("-onnx") == onnx_form)
        if self.asymmetric:  # (validated: 4 bits, nearest rounding)
            keep = tuple(ASYMMETRIC_RULESETS.get(r, r) for r in keep if "rounded" not in r)
        return keep

    def quantized(self) -> Options:
        """These options with `quantize` spelled out: the `quant` class allowed (no change
        when `quantize` is None). `run` leaves the quant rulesets of other modes out."""
        if self.quantize is None:
            return self
        # static mode folds BatchNormalization into the Conv before it (class reassoc), as
        # onnxruntime's quantization pre-processing does: a QuantizeLinear then meets the Conv
        wanted = ("quant", "reassoc") if self.quantize == "static" else ("quant",)
        allow = (*self.allow, *(c for c in wanted if c not in self.allow))
        return replace(self, allow=allow).budget_tolerance()

    def budget_tolerance(self) -> Options:
        """These options with the output check held to `error_budget` (rtol the budget, atol
        0) when neither tolerance is given; unchanged otherwise."""
        if self.error_budget is not None and self.rtol is None and self.atol is None:
            return replace(self, rtol=self.error_budget, atol=0.0)
        return self

    @property
    def _quant_key(self) -> tuple:
        """(mode, per_channel, bits) of `QUANT_RULESETS`, bits defaulting to the mode's first."""
        bits = self.bits
        if bits is None:
            bits = next((b for m, _, b in QUANT_RULESETS if m == self.quantize), None)
        per_channel = self.per_channel
        if per_channel is None or self.quantize == "static":
            per_channel = PER_CHANNEL_DEFAULT.get(self.quantize, False)
        return (self.quantize, per_channel, bits)

    @property
    def rounding_grid(self) -> str:
        """The levels `rounding` gptq rounds weights onto (`frontends.onnx.quantize.GRIDS`): the
        weight-only blocks of `bits`, else int8 per output column, full range for `cpu` vnni
        and stepped for int16 pairs otherwise."""
        if self.quantize == "weight-only":
            return f"block{self._quant_key[2]}"
        return "full" if self.cpu == "vnni" else "pairs"

    @property
    def sums(self) -> tuple[str, ...]:
        """The integer sums the result's runtime has (`engine.selection.pick_rules`): int32
        for `cpu` vnni, none known otherwise."""
        return ("int32",) if self.cpu == "vnni" else ()

    def cpu_applies(self, cpu: str) -> bool:
        """Whether `CPU_RULESETS[cpu]` replaces a ruleset of this quantization mode (False
        without one)."""
        rulesets = QUANT_RULESETS.get(self._quant_key, ()) if self.quantize else ()
        return bool(set(CPU_RULESETS[cpu]) & set(rulesets))

    @property
    def runs_model(self) -> bool:
        """Whether quantizing runs the model on the calibration inputs before the engine does
        (static ranges, SmoothQuant's factors, GPTQ's activations): it needs its weights."""
        return self.quantize == "static" or self.smooth is not None or self.rounding != "nearest"

    @property
    def plan(self) -> Plan:
        """The quantization choices (`frontends.onnx.quantize.Plan`)."""
        return Plan(
            self.keep_float,
            self.op_types,
            self.error_budget,
            self.held_out,
            self.over_budget_share,
        )

    def validate(self) -> None:
        """Raise OptionError for a value that cannot be used."""
        for name in ("calibration", "validation", "check_inputs"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, (str, os.PathLike)):
                raise OptionError(
                    f"{name.replace('_', '-')} takes the path of an .npz file, not a "
                    f"{type(v).__name__} (numpy.savez(FILE, INPUT_NAME=samples, ...))"
                )
        for name in ("error_budget", "smooth", "over_budget_share"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
                raise OptionError(f"{name.replace('_', '-')} must be a number, not {v!r}")
        if self.quantize is not None and self.quantize not in QUANT_MODES:
            raise OptionError(
                f"quantize: unknown mode {self.quantize!r} (choose from {', '.join(QUANT_MODES)})"
            )
        if self.quantize is not None and self._quant_key not in QUANT_RULESETS:
            if self.per_channel and (self.quantize, True, self._quant_key[2]) not in QUANT_RULESETS:
                raise OptionError(f"per-channel does not apply to mode {self.quantize}")
            bits = sorted({b for m, _, b in QUANT_RULESETS if m == self.quantize})
            raise OptionError(
                f"bits: mode {self.quantize} takes {' or '.join(map(str, bits))}, not {self.bits!r}"
            )
        if self.cpu not in CPU_RULESETS:
            raise OptionError(
                f"cpu: unknown choice {self.cpu!r} (choose from {', '.join(CPU_RULESETS)})"
            )
        if self.cpu != "any" and self.quantize is None:
            raise OptionError("cpu needs a quantization mode")
        if CPU_RULESETS[self.cpu] and not self.cpu_applies(self.cpu):
            raise OptionError(
                f"cpu {self.cpu} applies to modes dynamic with one weight scale per output "
                "column and static (their full-range rules); the other modes' weights are "
                "exact on any CPU"
            )
        if self.per_channel is False and self.quantize == "static":
            raise OptionError(
                "per-tensor does not apply to mode static (QLinearConv and QLinearMatMul take "
                "one weight scale per output channel)"
            )
        if self.per_channel is False and self.quantize == "weight-only":
            raise OptionError(
                "per-tensor does not apply to mode weight-only (one scale per block of 32 "
                "weights of a column)"
            )
        if (
            self.quantize == "weight-only"
            and self.target == "onnx"
            and self.opset is not None
            and self.opset < WEIGHT_ONLY_ONNX_OPSET
        ):
            raise OptionError(
                f"weight-only for target onnx writes DequantizeLinear with block_size, which "
                f"needs opset {WEIGHT_ONLY_ONNX_OPSET}, not {self.opset}"
            )
        if self.quantize is None:
            names = ("keep_float", "op_types", "error_budget", "calibration", "validation")
            names += ("held_out", "over_budget_share")
            for name in (*names, "bits", "smooth"):
                if getattr(self, name):
                    raise OptionError(f"{name.replace('_', '-')} needs a quantization mode")
        if self.validation is not None and self.error_budget is None:
            raise OptionError("validation inputs are used by error-budget only")
        if isinstance(self.held_out, bool) or not isinstance(self.held_out, numbers.Integral):
            raise OptionError(f"held-out must be a whole number >= 0, not {self.held_out!r}")
        if self.held_out < 0:
            raise OptionError(f"held-out must be a whole number >= 0, not {self.held_out!r}")
        if self.held_out and self.error_budget is None:
            raise OptionError("held-out inputs are used by error-budget only")
        if self.over_budget_share is not None:
            if self.error_budget is None:
                raise OptionError("over-budget-share is used by error-budget only")
            if not 0 < self.over_budget_share < 1:
                raise OptionError(
                    f"over-budget-share must lie strictly between 0 and 1, not "
                    f"{self.over_budget_share!r}"
                )
        if self.validation is not None and self.calibration is not None and not self.runs_model:
            raise OptionError(
                "calibration inputs are unused here: with validation inputs the budget is "
                "searched on those, and only smooth, rounding gptq and mode static fit "
                "calibration inputs"
            )
        if self.error_budget is not None and not 0 < self.error_budget:
            raise OptionError(f"error-budget must be a number > 0, not {self.error_budget}")
        if self.smooth is not None and self.quantize not in ("dynamic", "static"):
            raise OptionError(
                "smooth applies to modes dynamic and static (it moves activation "
                "range into the weights; weight-only quantizes no activation)"
            )
        if self.smooth is not None and not 0 <= self.smooth <= 1:
            raise OptionError(f"smooth must be a number in [0, 1], not {self.smooth}")
        if self.rounding not in ROUNDINGS:
            raise OptionError(
                f"rounding: unknown choice {self.rounding!r} (choose from {', '.join(ROUNDINGS)})"
            )
        if self.rounding != "nearest" and self._quant_key[:2] not in ROUNDED_MODES:
            raise OptionError(
                f"rounding {self.rounding} applies to mode dynamic with one weight scale per "
                "output column, and to modes weight-only and static"
            )
        if self.quantize != "static" and (self.symmetric or self.calibrate != "minmax"):
            raise OptionError("symmetric and calibrate apply to mode static only")
        if self.asymmetric and (
            self.quantize != "weight-only" or self._quant_key[2] != 4 or self.rounding != "nearest"
        ):
            raise OptionError(
                "asymmetric applies to mode weight-only with 4 bits and nearest rounding"
            )
        if self.calibrate not in CALIBRATION_METHODS:
            raise OptionError(
                f"calibrate: unknown method {self.calibrate!r} "
                f"(choose from {', '.join(CALIBRATION_METHODS)})"
            )
        unknown = [op for op in self.op_types if op not in OPS]
        if unknown:
            raise OptionError(f"op-types: {unknown[0]!r} is not an ONNX op")
        if self.check_inputs is not None and not self.check:
            raise OptionError("check-inputs are for the output check, which no-check skips")
        if (
            self.calibration is not None
            and not self.check
            and not self.runs_model
            and self.error_budget is None
        ):
            raise OptionError(
                f"calibration inputs are used in mode {self.quantize} (without smooth, rounding "
                "gptq or error-budget) by the output check only, which no-check skips"
            )
        problem = option_problem(
            self.allow, self.max_iterations, self.max_nodes, self.timeout, self.atol, self.rtol
        )
        if problem:
            raise OptionError(problem)
        if self.target not in TARGETS:
            raise OptionError(
                f"target: unknown target {self.target!r} (choose from {', '.join(TARGETS)})"
            )
        integral = isinstance(self.opset, numbers.Integral) and not isinstance(self.opset, bool)
        if self.opset is not None and not (integral and self.opset > 0):
            raise OptionError(f"opset must be a positive integer, not {self.opset!r}")

    @property
    def fp(self) -> tuple[str, ...]:
        """The numeric classes allowed, as the engine takes them (`exact` first)."""
        return ("exact", *(c for c in self.allow if c != "exact"))

    @property
    def seconds(self) -> float:
        """The wall-clock limit of the call: `timeout`, or by default DEFAULT_TIMEOUT, and
        CALIBRATING_TIMEOUT when quantizing runs the model on calibration inputs or searches
        an error budget (GPTQ with a budget on BERT-base takes 3 minutes)."""
        if self.timeout is not None:
            return self.timeout
        calibrating = self.runs_model or self.error_budget is not None
        return CALIBRATING_TIMEOUT if calibrating else DEFAULT_TIMEOUT

    def limits(self, start: float) -> Limits:
        """The budgets, the deadline counted from `start` (a `time.perf_counter()` value)."""
        return Limits(self.max_iterations, self.max_nodes, self.seconds, start + self.seconds)


def _listed(value) -> tuple[str, ...]:
    """A tuple of names from a string ("a,b"), or an iterable of strings each "a,b" or "a"."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else list(value)
    return tuple(p.strip() for v in items for p in str(v).split(",") if p.strip())


_SHAPE = re.compile(r"(?P<name>.+):(?P<dims>\d+(,\d+)*)")


def parse_input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`"input_ids:1,128"` -> ("input_ids", (1, 128)). The name is everything before the last
    colon (ONNX names may hold colons, `input:0`); dims are positive integers separated by
    commas. Raises OptionError."""
    m = _SHAPE.fullmatch(text.strip())
    if m is None or any(int(d) <= 0 for d in m["dims"].split(",")):
        raise OptionError(
            f"input shape {text!r}: expected NAME:DIMS with positive integer dims, "
            "e.g. input_ids:1,128"
        )
    return m["name"], tuple(int(d) for d in m["dims"].split(","))


def fix_input_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> onnx.ModelProto:
    """A copy of `model` whose named graph inputs have the given dims (ints), the way onnxsim's
    `--overwrite-input-shape` does. A symbolic dimension (`dim_param` P) fixed to n is n
    wherever P appears in the graph's inputs, outputs and value_info, so inputs that share the
    symbol (an attention mask beside the ids) agree; other symbols stay symbolic, and the shape
    analysis propagates the numbers through the graph. Raises OptionError for a name that is not
    a graph input (initializers excluded) or dims of another rank, or a fixed dimension changed.
    """
    g = model.graph
    inits = {t.name for t in g.initializer}
    inputs = {i.name: i for i in g.input if i.name not in inits}
    for name, dims in shapes.items():
        if name not in inputs:
            raise OptionError(
                f"input shape: the model has no input {name!r} (inputs: {', '.join(inputs)})"
            )
        have = inputs[name].type.tensor_type.shape.dim
        if inputs[name].type.tensor_type.HasField("shape") and len(have) != len(dims):
            raise OptionError(
                f"input shape: {name} has rank {len(have)}, got {len(dims)} dims {list(dims)}"
            )
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    symbols: dict[str, int] = {}
    for vi in g.input:
        if vi.name not in shapes:
            continue
        shape = vi.type.tensor_type.shape
        if not vi.type.tensor_type.HasField("shape"):
            shape.dim.extend(onnx.TensorShapeProto.Dimension() for _ in shapes[vi.name])
        for d, n in zip(shape.dim, shapes[vi.name]):
            if d.HasField("dim_value") and d.dim_value != n:
                raise OptionError(
                    f"input shape: {vi.name} has a fixed dimension {d.dim_value}, not {n}"
                )
            if d.HasField("dim_param"):
                if symbols.setdefault(d.dim_param, n) != n:
                    was = symbols[d.dim_param]
                    raise OptionError(f"input shape: {d.dim_param} fixed to both {was} and {n}")
            d.dim_value = n
    for vi in [*g.input, *g.output, *g.value_info]:
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_param") and d.dim_param in symbols:
                d.dim_value = symbols[d.dim_param]
    return out


def _check_shapes_taken(
    model: onnx.ModelProto, fixed: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]
) -> None:
    """Raise ModelError when `fixed` (`model` with the input `shapes`) fails onnx's full check
    (strict shape inference, on the weight-free skeleton) where `model` passes: the model's
    shapes do not take those. A `model` failing it too is reported later, as without shapes."""
    bad = (onnx.checker.ValidationError, onnx.shape_inference.InferenceError)
    try:
        onnx.checker.check_model(skeleton(fixed), full_check=True)
    except bad as e:
        try:
            onnx.checker.check_model(skeleton(model), full_check=True)
        except bad:
            return
        raise ModelError(_shapes_refused(shapes, e)) from None


def _fails_without_rules(model: onnx.ModelProto, rules: RuleSet, options, folder) -> bool:
    """Whether optimizing `model` with no rule at all (folding and the full check only) fails
    onnx's full check too: the model, not a rule, is then to blame."""
    try:
        optimize_engine(
            model,
            RuleSet((), rules.files),
            fp=options.fp,
            folder=folder,
            provenance=False,
            opset=options.opset,
            target=options.target,
        )
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError):
        return True
    return False


def _shapes_refused(shapes: dict[str, tuple[int, ...]], e: Exception) -> str:
    """The error for a result that fails onnx's strict shape inference when input shapes were
    fixed: a dimension beyond what the model's own shapes allow (a sequence longer than BERT's
    position table: its Expand of the position ids, once folded, meets 512 and 600)."""
    given = " ".join(f"{k}:{','.join(map(str, v))}" for k, v in shapes.items())
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return (
        f"the model does not take the input shapes given (--input-shape {given}): onnx's "
        f"shape inference finds {first}"
    )


def load(model: onnx.ModelProto | str | os.PathLike) -> tuple[onnx.ModelProto, Path | None]:
    """(model, folder of its external data): a path is read with `load_model` (raises
    ModelError), a ModelProto is taken as it is (its external data, if any, is read already or
    relative to the working directory)."""
    if isinstance(model, onnx.ModelProto):
        return model, None
    if isinstance(model, (str, os.PathLike)):
        return load_model(model), Path(model).parent
    raise TypeError(f"optimize_model takes a ModelProto or a path, not {type(model).__name__}")


@functools.cache
def _shipped(folder: Path):
    """The shipped library, parsed once per process (a RuleSet is immutable)."""
    return parse_rules([folder])


def load_rules(rules):
    """A RuleSet from `Options.rules`: a RuleSet as it is, paths parsed, None the shipped
    library. Raises `dsl.RulesError`, and OptionError for a path that does not exist or
    paths that hold no `.rules` file (a directory without one)."""
    if rules is None:
        return _shipped(shipped_rules_dir())
    try:
        return rules_given(rules)
    except RulePathError as e:
        raise OptionError(str(e)) from None


def with_weights(model: onnx.ModelProto, folder: Path) -> onnx.ModelProto:
    """`model` with the external data it refers to read from `folder` into it (in place)."""
    if any(True for _ in external.external_tensors(model)):
        onnx.external_data_helper.load_external_data_for_model(model, str(folder))
    return model


def check_outputs(
    original: onnx.ModelProto,
    result: onnx.ModelProto,
    report: Report,
    options: Options,
    *,
    original_source: bytes | str | None = None,
    optimized_source: bytes | str | None = None,
    feeds: list | None = None,
) -> list:
    """Compare both models' outputs under onnxruntime at the tolerance of `report.fp` (or
    `options.atol`/`rtol`), on random inputs, or on `feeds` (the calibration inputs a user
    gave, or an error budget's, where the budget is defined) with onnxruntime at its full
    optimization, as the budget was measured and as users run the model: one OutputDiff per
    output. Raises `check.CheckError` when a model cannot run."""
    return compare(
        original,
        result,
        fp=report.fp,
        original_source=original_source,
        optimized_source=optimized_source,
        rtol=options.rtol,
        atol=options.atol,
        feeds=feeds,
        full_optimization=feeds is not None,
    )


@dataclass(frozen=True)
class Run:
    """What `run` did: the model as optimized (`original`: the input with `input_shapes`
    applied, what the check compared against), the Report (`seconds` with `rules`, `load` and
    `output check` added, `skipped` with the rules skip/only excluded), the output check's
    OutputDiffs (empty without `check`), the rules after skip/only and the folder of the
    input's external data (None for a ModelProto). When `run` freed the loaded weights (a
    caller with `stage_output`), `original` of a successful run is the input's `structure`
    (no large weights); after a failed check it is the input read again, weights included."""

    model: onnx.ModelProto
    report: Report
    diffs: list
    original: onnx.ModelProto
    rules: object
    folder: Path | None


def _quantizes(rule, keep: tuple[str, ...], rounding: str) -> bool:
    """Whether `rule` quantizes in a run whose quant rulesets are `keep`: a rule of one of them
    that states a bound (the helpers that hand a Gemm or a 1-D Conv to them, and the moves of
    GPTQ's marks, quantize nothing themselves), of a `-rounded` ruleset only under
    `--rounding gptq`, whose marks its rules match."""
    if rule.ruleset not in keep or rule.bound is None:
        return False
    return rounding != "nearest" or "rounded" not in rule.ruleset


def _left_out_reason(ruleset: str, quantize: str | None) -> str:
    """Why `run` leaves out a rule of `ruleset`: UNSMOOTH_RULESETS, or one of MODE_RULESETS
    that the run (`quantize`: its mode, None outside `rewrite quantize`) does not use."""
    if ruleset in UNSMOOTH_RULESETS:
        return f"ruleset {ruleset} runs in a pass of its own (quantize --smooth, after quantizing)"
    if quantize is None:
        return f"ruleset {ruleset} runs only when quantizing (rewrite quantize)"
    return f"ruleset {ruleset} is not one this --mode {quantize} run quantizes with"


def _rulesets(rules: RuleSet, names: tuple[str, ...]) -> RuleSet:
    """The rules of `rules` in the rulesets `names` (a pass of its own: smoothing, unsmoothing)."""
    return RuleSet(tuple(r for r in rules.rules if r.ruleset in names), rules.files)


def _has_quantization(model: onnx.ModelProto) -> bool:
    """True when a node of `model`'s graph (not its subgraphs) is of family QUANTIZATION."""
    ops = set(FAMILIES["QUANTIZATION"])
    return any(n.op_type in ops and n.domain in ("", "ai.onnx") for n in model.graph.node)


def _no_stage(label: str):
    return contextlib.nullcontext()


@contextlib.contextmanager
def _calibration_runs():
    """Around a stage that runs the model on the calibration inputs: onnxruntime's refusal
    (inputs of the wrong rank or type, say) becomes an OptionError naming them."""
    try:
        yield
    except CheckError as e:
        raise OptionError(f"calibration inputs: {e}") from None


def _round_weights(model, feeds: list[dict], options: Options, choose: Chooser, stage):
    """`model` with each product's weight marked with its GPTQ rounding (`rounding_marks`:
    patterns/quant/rounding.rules' rewrite.Rounded) from the activations of `model`, the graph
    the quantization rules will see (the static rules': with Convs); what was done goes to
    `choose.record["rounding"]`."""
    with stage("rounding weights on calibration activations (GPTQ)") as detail, _calibration_runs():
        convs = options.quantize == "static"
        model, count, nearer = rounding_marks(
            model, feeds, options.rounding_grid, convs=convs, progress=detail
        )
        choose.record["rounding"] = {
            "method": options.rounding,
            "samples": len(feeds),
            "held_out": held_out_feeds(len(feeds)),
            "weights": count,
            "nearest": nearer,
        }
    return model


def run(
    model,
    options: Options,
    *,
    start: float | None = None,
    stage=_no_stage,
    stage_output=None,
) -> Run:
    """The stages of `optimize_model`, for a caller that watches or extends them (the CLI).

    start: the `time.perf_counter()` value `options.timeout` counts from (default now).
    stage(label): a context manager around each stage ("reading rules", "loading the model",
    "optimizing", "checking outputs"), for progress display; what it gives, if not None, is
    called with a line saying what the stage is doing now (the budget search's candidates).
    stage_output(result, external_data) -> source: called before the check with the
    optimized model and whether the input keeps its weights in external data files; returns
    what onnxruntime loads for the result (bytes, or the path of a staged file: the CLI checks
    the very file it writes), or None.
    Raises as `optimize_model`; OutputMismatch after the check failed and CheckError when a
    model cannot run both carry the `Run` as `.run`.
    """
    start = time.perf_counter() if start is None else start
    clock = time.perf_counter()
    with stage("reading rules"):
        rules, excluded = pick_rules(
            load_rules(options.rules), options.skip, options.only, options.sums
        )
        unsmoothing = _rulesets(rules, UNSMOOTH_RULESETS)
        keep = options.quant_rulesets
        if keep and not any(_quantizes(r, keep, options.rounding) for r in rules.rules):
            which = "--skip/--only leave" if options.skip or options.only else "the rules have"
            raise OptionError(
                f"{which} no rule of the rulesets --mode {options.quantize} quantizes with "
                f"here ({', '.join(keep)})"
            )
        left_out = UNSMOOTH_RULESETS + tuple(r for r in MODE_RULESETS if r not in keep)
        # said in the report like the rest (`rewrite optimize --explain`: why a rule did not run)
        excluded = {
            **{
                r.name: _left_out_reason(r.ruleset, options.quantize)
                for r in rules.rules
                if r.ruleset in left_out
            },
            **excluded,
        }
        rules = RuleSet(tuple(r for r in rules.rules if r.ruleset not in left_out), rules.files)
    t_rules = time.perf_counter() - clock
    with stage("loading the model"):
        path = model
        model, folder = load(model)
        external_input = any(True for _ in external.external_tensors(model))  # (read below)
        if options.input_shapes:
            fixed = fix_input_shapes(model, options.input_shapes)
            _check_shapes_taken(model, fixed, options.input_shapes)
            model = fixed
            del fixed
        given_feeds = None
        if options.check_inputs is not None:
            try:
                given_feeds = load_calibration(options.check_inputs, model, "check-inputs")
            except CalibrationError as e:
                raise OptionError(str(e)) from None
    t_load = time.perf_counter() - clock - t_rules
    if (
        options.quantize == "weight-only"
        and options.target == "onnx"
        and options.opset is None
        and 0 < default_opset(model) < WEIGHT_ONLY_ONNX_OPSET
    ):  # DequantizeLinear's block_size is opset 21's: the model is converted up to it
        options = replace(options, opset=WEIGHT_ONLY_ONNX_OPSET)
    # A caller that writes the result itself (the CLI) and whose check reads the original from
    # its file needs only the model's structure once it is imported: the loaded weights are
    # freed, one copy of them fewer at the peak (BERT-base: 1.7 -> 1.3 GB).
    # A model converted to another opset first is converted as that structure and imported
    # with the arrays. Not for a model converted automatically from an opset older than the
    # op table's (several rounds, each on the last one's result, and a fallback to the
    # original), one with no default-domain opset (it comes back byte for byte), or when the
    # time is up.
    lean = (
        stage_output is not None
        and folder is not None
        and not options.input_shapes
        and default_opset(model) > 0
        and auto_target(model) is None
        and not any(True for _ in external.external_tensors(model))
        and time.perf_counter() < options.limits(start).deadline
        and not options.runs_model  # calibrating runs the model with its weights
    )
    choose = None
    if options.quantize is not None:
        # the inputs the stages before the engine fit (smoothing, GPTQ, static ranges), and
        # those the budget is searched and checked on: the same unless validation is given
        searched = options.error_budget is not None and options.validation is None
        try:
            feeds = (
                load_calibration(options.calibration, model)
                if options.calibration
                else drawn_calibration(model)
                if searched or options.runs_model
                else []
            )
            held = (
                load_calibration(options.validation, model, "validation")
                if options.validation
                else feeds
            )
        except CalibrationError as e:
            raise OptionError(str(e)) from None
        if options.held_out and options.held_out >= len(held):
            raise OptionError(
                f"held-out {options.held_out} leaves none of the {len(held)} "
                f"{'validation' if options.validation else 'calibration'} inputs to search the "
                "budget on"
            )
        searched = len(held) - options.held_out
        if options.over_budget_share is not None and searched < TAIL_MIN_INPUTS:
            source = "--validation" if options.validation else "--calibration"
            drawn = not options.validation and not options.calibration
            raise OptionError(
                f"over-budget-share fits a tail to at least {TAIL_MIN_INPUTS} searched inputs; "
                f"the budget is searched on {searched}"
                + (f" ({options.held_out} more held out)" if options.held_out else "")
                + (" drawn at random" if drawn else "")
                + f": give {source} a file with more"
            )
        choose = Chooser(options.plan, held, None if folder is None else str(folder))
        if options.validation:
            choose.record["budget_inputs"] = "validation"
        for given, what in ((options.calibration, feeds), (options.validation, held)):
            where = nonfinite(what) if given else ""
            if where:
                add_warning(
                    choose.record,
                    f"{given} holds a NaN or an infinity ({where}): ranges are calibrated on "
                    "the finite values, and a quantized product turns a NaN into a number",
                )
        if feeds and not options.calibration:
            choose.record["warning"] = (
                f"no calibration inputs given: {len(feeds)} drawn from the input types (random "
                "floats, token ids 0 and 1); "
                + (
                    "the activations' ranges come from those"
                    if options.quantize == "static" or options.smooth is not None
                    else "the weights' rounding comes from those"
                    if not searched
                    else "the error budget holds on those"
                )
                + ", which may not be the data the model sees"
            )
    engine_input = model
    if folder is not None and options.runs_model:
        with_weights(model, folder)  # calibration runs the model with its weights
    if options.smooth is not None:
        # SmoothQuant's scale migration (patterns/quant/smooth.rules), in a pass of its own
        # (its rulesets alone) before the quantization, whose rules then see the smoothed
        # products
        with stage("smoothing activations into weights (SmoothQuant)"), _calibration_runs():
            marked, count = smoothing_marks(model, feeds, options.smooth)
            smoothed, _ = optimize_engine(
                marked,
                _rulesets(rules, SMOOTH_RULESETS),
                limits=options.limits(start),
                fp=("exact", "reassoc"),  # the smoothing rules' classes
                folder=folder,
                provenance=False,
                opset=options.opset,
                target=options.target,
            )
            engine_input, left = strip_marks(smoothed, SMOOTH)
            choose.record["smoothing"] = {
                "alpha": options.smooth,
                "samples": len(feeds),
                "activations": count,
                "smoothed": count - left,
                "divisions": smoothing_divisions(engine_input, marked),
            }
    if options.rounding == "gptq" and options.quantize != "static":
        engine_input = _round_weights(engine_input, feeds, options, choose, stage)
    if options.quantize == "static":
        # the calibrated marks go on the graph the static rules will see: BatchNormalization
        # folded into its Conv (a weight the rules can read as a constant) and a model of an
        # old opset converted, by one optimization without the quant class first (what
        # onnxruntime's quantizer asks of a model as "pre-processing")
        with stage("optimizing before calibration (BatchNorm folding, opset conversion)"):
            cleaned, cleaning = optimize_engine(
                engine_input,
                rules,
                limits=options.limits(start),
                fp=tuple(c for c in options.fp if c != "quant"),
                folder=folder,
                opset=options.opset,
                target=options.target,
            )
            choose.aliases = replaced_names(cleaning.provenance)
        with stage("calibrating activation ranges under onnxruntime"), _calibration_runs():
            boundary = product_boundary(cleaned)
            ranges = calibrate(cleaned, feeds, options.calibrate, only=boundary)
            choose.record["calibration"] = {
                "method": options.calibrate,
                "samples": len(feeds),
                "symmetric": options.symmetric,
                "activations": len(ranges),
            }
        if options.rounding == "gptq":  # the weights the static rules read: BatchNorm folded
            cleaned = _round_weights(cleaned, feeds, options, choose, stage)
        engine_input = observe(cleaned, ranges, options.symmetric, boundary)
    with stage("optimizing (import, saturate, extract, fold)") as detail:
        kw = {} if choose is None else {"choose": choose}
        if choose is not None and detail is not None:
            choose.progress = detail
        if lean:
            graph = import_model(model, folder)
            model = engine_input = structure(model, constants_by_name(graph))
            kw["graph"] = replace(graph, meta=model)
            del graph
        try:
            result, report = optimize_engine(
                engine_input,
                rules,
                limits=options.limits(start),
                fp=options.fp,
                folder=folder,
                provenance=options.provenance,
                opset=options.opset,
                target=options.target,
                sums=options.sums,
                **kw,
            )
        except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as e:
            if choose is not None:  # (a quantization run's engine input is not the model's)
                raise
            # a size the model's own shapes cannot take, where folding alone fails too (BERT's
            # position ids expanded to more than its 512 positions); else a rule's doing
            if options.input_shapes and _fails_without_rules(model, rules, options, folder):
                raise ModelError(_shapes_refused(options.input_shapes, e)) from None
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            original = load_model(path) if lean else model
            raise InvalidResult(first, original, rules, folder) from None
        kw.clear()  # the imported graph's arrays: the result holds the weights now
    if options.rounding != "nearest":  # weights kept in float read their own values again
        result, _ = strip_marks(result, ROUNDED)
    if options.smooth is not None and unsmoothing.rules and divided_products(result, marked):
        # a product kept in float gains nothing from its smoothing Div: its weight takes the
        # division back (patterns/quant/smooth.rules' quant-unsmooth), in a pass of its own
        with stage("folding smoothing divisions back into products kept in float"):
            unsmoothed, _ = optimize_engine(
                result,
                unsmoothing,
                limits=options.limits(start),
                fp=("exact", "reassoc"),
                folder=folder,
                provenance=False,
                target=options.target,
            )
            # the budget was measured on the graph with the Divs: the new one is measured
            # again, and kept only if it is within the budget too (and its tail within
            # over_budget_share when given)
            per_feed: dict[int, float] = {}
            errors = choose.measure(unsmoothed, per_feed)
            why, tail = ("", None) if errors is None else choose.verdict(errors, per_feed)
            smoothing = choose.record["smoothing"]
            if why:
                smoothing["unsmoothed"] = 0
                worst = max(errors.values(), default=0.0)
                if why == "budget":
                    smoothing["unsmoothing_over_budget"] = worst
                else:  # within the budget, its tail over the share allowed
                    smoothing["unsmoothing_error"] = worst
                    smoothing["unsmoothing_tail_share"] = tail["share"]
            else:
                result = unsmoothed
                left = smoothing_divisions(result, marked)
                smoothing["unsmoothed"] = smoothing["divisions"] - left
                smoothing["divisions"] = left
                if errors is not None:
                    choose.record["calibration_error"] = errors
                    choose.record["tail"] = tail
    if options.runs_model and options.quantize != "static":  # (static: below)
        report = onnx_counts(report, model, result)  # counted against the user's model
    if options.quantize == "static":  # marks the rules did not consume never reach the output
        result, left = strip_marks(result)
        report = onnx_counts(report, model, result)  # counted against the user's model
        if left:
            note = report.extra.get("opset", {}).get("note", "")
            warning = (
                f"{left} calibrated activations were left in float: the static rules did not "
                "run on them" + (f" ({note})" if note else "")
            )
            add_warning(choose.record, warning)
    if choose is not None:
        quant = [r for r in rules.rules if r.ruleset in options.quant_rulesets]
        ops = quantized_ops(quant)
        bounded = {r.name for r in quant if r.bound}
        if not choose.record.get("sites"):  # not one product matched
            why = nothing_quantized(model, ops, options.quantize)
            refusals = guard_refusals(report.rejected, bounded)
            if refusals and GUARDS_DID_NOT_TAKE in why:  # (not for a dtype already named)
                why += f"; the quant rules' guards refused: {refusals}"
            add_warning(choose.record, f"nothing was quantized: {why}")
        elif refused := refused_products(result, ops, report.rejected, bounded):
            add_note(choose.record, refused)
        if inside := subgraph_products(result, ops):
            add_note(
                choose.record,
                f"{inside} inside If, Loop or Scan bodies stay float: the quant rules rewrite "
                "the main graph only",
            )
    clipped = choose is not None and options.quantize == "weight-only" and options.target == "onnx"
    if clipped and (count := clipped_block_products(result)):
        warning = (
            f"{count} quantized products feed a Relu or Clip, which keeps onnxruntime 1.32 from "
            "fusing their DequantizeLinear into MatMulNBits: it dequantizes their weights at "
            "every run (OPT ran at 1.3x of float); --target onnxruntime writes MatMulNBits"
        )
        add_warning(choose.record, warning)
    if choose is not None and options.held_out:
        with stage("measuring the result on the held-out inputs") as detail:
            choose.progress = detail
            choose.record["held_out"] = choose.held_out(result)
    if options.cpu == "vnni" and not int8_sums_in_int32():
        warning = (
            "cpu vnni: this CPU has no VNNI, so onnxruntime here adds int16 pairs of products, "
            "which full-range weights can saturate; the output check runs on this CPU"
        )
        add_warning(choose.record, warning)
    if options.cpu == "any" and options.cpu_applies("vnni") and int8_sums_in_int32():
        add_note(
            choose.record,
            "this CPU sums int8 products in int32 (VNNI): for a file that will run on such a "
            "CPU, --cpu vnni gives full-range weights, with less error",
        )
    clock = time.perf_counter()
    source = stage_output(result, external_input) if stage_output is not None else None
    if source is None and folder is not None:  # the weights in the model the caller gets
        with_weights(result, folder)
    t_staged, clock = time.perf_counter() - clock, time.perf_counter()
    diffs = []
    # the inputs the user gave stand for the model's inputs better than random ones (token ids
    # 0 and 1 put a static model's activations outside their calibrated ranges): the budget's
    # inputs, all of them (the budget is defined on them), or the first CHECK_FEEDS calibration
    # inputs (every output of both models is held in memory)
    given = choose is not None and (options.error_budget is not None or bool(options.calibration))
    check_feeds = given_feeds
    if given and given_feeds is None:
        budget = options.error_budget is not None
        check_feeds = choose.calibration if budget else choose.calibration[:CHECK_FEEDS]
        if options.check:
            drawn = not options.calibration and not options.validation
            choose.record["checked_on"] = (
                "drawn" if drawn else choose.record.get("budget_inputs", "calibration")
            )
    if options.check:
        with stage("checking outputs under onnxruntime"):
            original_source = None
            if folder is not None and not options.input_shapes:
                original_source = str(Path(path))
            elif folder is not None:
                with_weights(model, folder)  # a copy made by fix_input_shapes
            try:
                diffs = check_outputs(
                    model,
                    result,
                    report,
                    options,
                    original_source=original_source,
                    optimized_source=source,
                    feeds=check_feeds,
                )
            except CheckError as e:  # with what a caller needs to look for the culprit
                e.run = Run(result, report, [], load_model(path) if lean else model, rules, folder)
                raise
    seconds = {
        "rules": t_rules,
        "load": t_load,
        **report.seconds,
        "output check": time.perf_counter() - clock,
        # writing the result where the caller stages it (its save; BERT-base: 0.3 s)
        "save": t_staged,
    }
    extra = {**report.extra, "check": [d.__dict__ for d in diffs]} if diffs else report.extra
    if choose is not None:
        extra = {**extra, "quantize": choose.finish(report.extra.get("quantized_sites"))}
    elif "quant" in options.allow and not _has_quantization(model):
        extra = {**extra, "warning": LOWERS_NOTHING}
    if diffs and all(d.random for d in diffs) and report.fired:
        extra = {**extra, "warning": NOTHING_COMPARED}
    frozen, partly = _frozen_inputs(model, result)
    if frozen or partly:
        said = [extra["warning"]] if extra.get("warning") else []
        extra = {**extra, "warning": "; ".join([*said, _frozen_warning(frozen, partly)])}
    report = replace(report, seconds=seconds, skipped={**excluded, **report.skipped}, extra=extra)
    done = Run(result, report, diffs, model, rules, folder)
    if not all(d.ok for d in diffs):
        if lean:  # the culprit search runs the original again: its weights, read anew
            done = replace(done, original=load_model(path))
        raise OutputMismatch(done)
    return done


def _frozen_inputs(model: onnx.ModelProto, result: onnx.ModelProto) -> tuple[list[str], list[str]]:
    """The graph inputs of `model` with an initializer default (a caller may feed another
    value: ONNX IR 4 and later) that the rules may have read as the constants they hold (a
    weight quantized, a BatchNorm folded): those `result` no longer takes, and those it still
    takes whose readers are not the same (by op, in the main graph: a reader rewritten reads a
    constant made from the default now, or was merged with another). IR 3 lists every
    initializer as an input: none is counted there."""
    if model.ir_version < 4:
        return [], []
    inits = {t.name for t in model.graph.initializer}
    overridable = [i.name for i in model.graph.input if i.name in inits]
    if not overridable:
        return [], []
    kept = {i.name for i in result.graph.input}

    def readers(m: onnx.ModelProto, name: str) -> list[str]:
        return sorted(n.op_type for n in m.graph.node for i in n.input if i == name)

    gone = [n for n in overridable if n not in kept]
    partly = [n for n in overridable if n in kept and readers(model, n) != readers(result, n)]
    return gone, partly


def _frozen_warning(gone: list[str], partly: list[str]) -> str:
    def listed(names: list[str]) -> str:
        return ", ".join(names[:5]) + (f", ... ({len(names) - 5} more)" if len(names) > 5 else "")

    said = []
    if gone:
        said.append(
            f"{len(gone)} graph input(s) with an initializer default ({listed(gone)}) were read "
            "as the constants they hold and are no longer inputs of the output: a caller that "
            "fed them other values cannot"
        )
    if partly:
        said.append(
            f"{len(partly)} graph input(s) with an initializer default ({listed(partly)}) are "
            "still inputs, but the rules rewrote nodes that read them, which may read the "
            "constants they hold now: a value fed to them may reach only the readers left as "
            "they were"
        )
    return "; ".join(said)


def optimize_model(model, **options) -> tuple[onnx.ModelProto, Report]:
    """Optimize an ONNX model: a ModelProto or the path of a `.onnx` file.

    Keywords are `Options`' fields: `rules`, `allow`, `skip`, `only`, `check` (default True),
    `input_shapes`, `atol`, `rtol`, `max_iterations`, `max_nodes`, `timeout` (seconds),
    `provenance`. Returns (optimized ModelProto, Report); the model is the input itself (with
    `input_shapes` applied) when nothing cheaper was found. With `check`, the report's
    `extra["check"]` lists each output's comparison (dicts of `OutputDiff`'s fields). A model
    read from a path with external data comes back with its weights in it.

    Raises TypeError for an unknown keyword (naming it and the accepted ones), OptionError for
    a bad value, ModelError for a path that is not a valid model, `dsl.RulesError` for a rules
    error, `engine.selection.UnknownRulePatternError` for a skip/only pattern matching no
    rule, OutputMismatch when the check fails, `check.CheckError` when a model cannot run.
    `InvalidResult` when the optimized model fails onnx's full check (a rule wrote invalid
    ONNX). What the CLI prints as a warning (a quantization that quantized nothing, calibration
    inputs drawn at random, `allow="quant"` on a float model, an output check that compared no
    output, graph inputs with initializer defaults read as constants and dropped) is issued as
    a RewriteWarning too, and is in the report
    (`extra["quantize"]["warning"]`, `extra["warning"]`).
    """
    done = run(model, Options.from_keywords(options))
    extra = done.report.extra
    for text in (extra.get("quantize", {}).get("warning"), extra.get("warning")):
        if text:
            warnings.warn(text, RewriteWarning, stacklevel=2)
    return done.model, done.report


class RewriteWarning(UserWarning):
    """A run that did what it was asked but not what its caller likely meant: it quantized
    nothing, drew its calibration inputs at random, lowered nothing (`optimize_model`)."""


__all__ = [
    "InvalidResult",
    "ModelError",
    "OptionError",
    "Options",
    "OutputMismatch",
    "RewriteWarning",
    "Run",
    "check_outputs",
    "fix_input_shapes",
    "load",
    "load_rules",
    "optimize_model",
    "parse_input_shape",
    "run",
]
