"""Which nodes `rewrite quantize` quantizes: `--keep-float`, `--op-types` and `--error-budget`.

The quant rules fire wherever they match; after saturation each matched node's e-class holds
its float and its quantized form (an `engine.quantize.Site`). `Chooser` is the
`engine.optimize.optimize(choose=...)` callback that decides which sites stay in float:

* a site whose node name (or the name of an original node it was rewritten from) matches a
  `--keep-float` glob, or whose op is not among `--op-types`, stays in float;
* with `--error-budget E`, the rest are ranked and the fewest of them are kept in float such
  that the measured error of every float output over the calibration inputs, max|q - ref| /
  max|ref| (per input, the worst over the inputs, as the output check measures it), is at
  most E. When the graph with every site quantized is within E, nothing is searched. Else
  each site is measured alone: the error of the graph with it alone quantized, on the
  `ALONE_INPUTS` inputs that the graph with every site quantized errs most on. Each site also
  has an estimate: its rule's stated bound (`(bound FN ...)`, `vocab.registry.BOUNDS`)
  evaluated on the calibration values of the rule's captures, over the largest magnitude of
  the node's own output, the relative error the node itself may add (a worst case that does
  not say how an error grows on its way to the outputs). The search keeps the first k sites
  of an order in float, k found by bisection (each step extracts the graph anew from the same
  e-graph and runs it under onnxruntime, ORT_ENABLE_ALL as a user runs it, up to the first
  input that takes it over the budget: a step's recorded error over the budget is a lower
  bound), for five orders: the largest errors alone first, and the largest estimates first,
  each also per nanosecond of the site's float work (`Site.float_ns`, the cost model's), and
  graph order; it keeps the one that leaves the fewest in float, then the one whose float
  sites cost least (an order is first tried at the fewest an order before it kept: over the
  budget there, it cannot be chosen, and its search ends). Measuring each site alone costs
  one graph per site; on DistilBERT it keeps 5 of 38 products in float where the estimates
  kept 14 (docs/benchmarks.md).
  Each candidate's large constants reach onnxruntime as arrays, not through protobuf
  (`export_model(g, arrays)`): that halved DistilBERT's budget run (111 s -> 51 s).
* with `--over-budget-share P` (`Plan.over_budget_share`), a candidate fits only when, besides
  its worst searched input, the exponential tail fitted to its searched inputs' errors
  (`tail_share`) puts at most a share P of inputs like them over the budget: the worst of a
  few dozen inputs is a tail statistic, and another set of inputs has a worse one about as
  often as not. The chosen graph's estimate is recorded either way (`record["tail"]`).
* with `--held-out N` (`Plan.held_out`), the last N calibration inputs are kept from the
  search (the estimates, the orders and every step); the written graph is measured on them
  after it (`Chooser.held_out`), with a bound on the share of such inputs over the budget.

Calibration inputs come from `--calibration FILE.npz` (one array per graph input, its first
axis the samples) or are drawn like the output check's (`check.random_inputs`), with a warning:
random token ids and noise are not the data the model will see.
"""

from __future__ import annotations

import fnmatch
import zipfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.external_data_helper import (
    ExternalDataInfo,
    load_external_data_for_tensor,
    uses_external_data,
)

from engine.quantize import Site
from frontends.onnx import external
from frontends.onnx.check import CheckError, random_inputs, run, session, subgraphs, upstream
from frontends.onnx.exporter import IN_MEMORY, export_model
from frontends.onnx.importer import is_weight, skeleton
from vocab.graph import TermGraph, unique_name
from vocab.ops import FAMILIES
from vocab.registry import (
    BOUNDS,
    PAIR_LEVELS,
    SMOOTHING_RANGE,
    WEIGHT_ONLY_BLOCK,
    block_steps,
    conv2d_ints_of_1d,
    conv2d_pads_of_1d,
    full_range_steps,
    pair_steps,
)

DRAWN_SAMPLES = 8  # calibration inputs drawn when the user gives none
OBSERVED = ("rewrite", "Observed")  # patterns/quant/static.rules' activation mark
SMOOTH = ("rewrite", "Smooth")  # patterns/quant/smooth.rules' mark
SMOOTH_ALPHA = 0.5  # SmoothQuant's migration strength, the paper's default for most models
# the products smoothed (their weight's K axis: rows of MatMul's, of Gemm's unless transB)
SMOOTHED_PRODUCTS = ("MatMul", "Gemm")
ROUNDED = ("rewrite", "Rounded")  # patterns/quant/rounding.rules' weight mark
ROUNDINGS = ("nearest", "gptq")  # how weights round to their levels (`rounding_marks`)
# the fraction of the mean of diag(H) added to H's diagonal. GPTQ's paper uses 0.01 with
# 128 x 2048 calibration tokens; with the few inputs users give here (8 of 128 tokens: fewer
# rows than K = 3072), 0.01 overfits them: on GPT-2 (bench/quant.py's weights and inputs) the
# worst of 32 held-out inputs was 4.3% at 0.01 and 3.4% at 0.1 (8 calibration inputs), 3.3%
# at either with 32
GPTQ_DAMPING = 0.1
# the grids whose rows GPTQ rounds in decreasing order of H_kk (its "act-order"): weight-only's
# blocks. Measured (docs/benchmarks.md): BERT-base 4-bit weight-only 16.4% / 11.5% -> 12.9% /
# 10.8% (worst / mean of 32 inputs), but BERT-base --cpu vnni 4.8% / 3.9% -> 6.0% / 4.0%; the
# pair grid's neighbours along K constrain each other, so they keep K's order
GPTQ_ACT_ORDER = ("block4", "block8")
GPTQ_BLOCK = 128  # rows rounded between two block updates of the rest (GPTQ's lazy batches)
GPTQ_SIDE_BY_SIDE = 1 << 24  # weight elements rounded together at most (64 MB of float32)
CHOLESKY_BLOCK = 384  # columns per step of `_cholesky` (0.19 s at K = 3072 against 0.32 s at 128)
# the largest K rounded by GPTQ: H is K x K (float32, a few copies while it is factorized), so
# VGG-19's first fully connected layer (K = 25088, 2.5 GB per copy) keeps its nearest levels
GPTQ_MAX_K = 8192
# the auto_pad values of a Conv whose patches GPTQ takes (`conv_patches`)
AUTO_PADS = ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER")
# a Conv's patches GPTQ reads at most (float32 elements over all calibration inputs: 512 MB);
# beyond, a sample of the output positions (`conv_patches`)
GPTQ_PATCH_ELEMENTS = 1 << 27
CALIBRATION_METHODS = ("minmax", "percentile")
# the inputs a site's error alone is measured on (the Chooser's order by it): those the graph
# with every site quantized errs most on
ALONE_INPUTS = 4
CONFIDENCE = 0.95  # of the bound on the share of held-out-like inputs over the budget
# the fewest searched inputs a tail is fitted to (`tail_share`): ceil(sqrt(16)) = 4 of them
# above the threshold
TAIL_MIN_INPUTS = 16
PERCENTILE = 99.999  # the percentile method's range: [the 0.001th, the 99.999th] percentile


class CalibrationError(ValueError):
    """A calibration file that cannot be read or does not fit the model's inputs."""


@dataclass(frozen=True)
class Plan:
    """What to keep in float and how much error to allow.

    keep_float: fnmatch globs of node names. op_types: the ops to quantize (empty: every op the
    mode's rules cover). error_budget: the largest max|q - ref| / max|ref| allowed per float
    output over the calibration inputs, or None (quantize every site left). held_out: how
    many of those inputs, the last ones, the budget search does not see (`Chooser.held_out`).
    over_budget_share: with error_budget, the largest share of inputs like the searched ones
    that may err over the budget by `tail_share`'s estimate (None: the budget holds on the
    searched inputs only).
    """

    keep_float: tuple[str, ...] = ()
    op_types: tuple[str, ...] = ()
    error_budget: float | None = None
    held_out: int = 0
    over_budget_share: float | None = None

    @property
    def active(self) -> bool:
        """True when the plan chooses anything (else every site is quantized)."""
        return bool(self.keep_float or self.op_types or self.error_budget is not None)


def load_calibration(
    path: str, model: onnx.ModelProto, what: str = "calibration"
) -> list[dict[str, np.ndarray]]:
    """Feeds from an `.npz` file: one array per graph input of `model` (initializers aside),
    named as the input, its first axis the samples (all of the same count). Raises
    CalibrationError naming the problem and `what` the file is for (`calibration`,
    `validation`). NaN and infinite values are taken (a model may read NaN as missing data;
    `nonfinite` says where they are)."""
    how = "numpy.savez(FILE, INPUT_NAME=samples, ...): one array per input"
    try:
        with open(path, "rb") as f:  # a missing file is said so, not "not an archive"
            archive = zipfile.is_zipfile(f)
        if not archive:  # np.load would try a .npy, then a pickle
            raise CalibrationError(f"{what} file {path} is not an .npz archive ({how})")
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except CalibrationError:
        raise
    except Exception as e:  # numpy raises OSError, ValueError, zipfile errors, ...
        raise CalibrationError(f"cannot read {what} file {path}: {e}") from None
    inits = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in inits]
    missing = [n for n in names if n not in arrays]
    if missing:
        raise CalibrationError(
            f"{what} file {path} has no array for input {missing[0]!r} "
            f"(it has {', '.join(sorted(arrays)) or 'none'})"
        )
    counts = {len(arrays[n]) if arrays[n].ndim else 0 for n in names}
    if len(counts) != 1 or 0 in counts:
        raise CalibrationError(
            f"{what} file {path}: every input needs the same number of samples "
            "(the arrays' first axis), at least one"
        )
    for vi in model.graph.input:
        if vi.name in names and vi.type.HasField("tensor_type"):
            arrays[vi.name] = _unpacked(arrays[vi.name], vi.type.tensor_type.elem_type)
            _check_samples(arrays[vi.name], vi.type.tensor_type, f"{what} file {path}", vi.name)
    # np.asarray: a scalar input's sample is a 0-d array (onnxruntime takes no numpy scalar)
    return [{n: np.asarray(arrays[n][i]) for n in names} for i in range(counts.pop())]


def nonfinite(feeds: list[dict[str, np.ndarray]]) -> str:
    """Where `feeds` (`load_calibration`'s) first hold a NaN or an infinity, for a warning:
    "input 'x', sample 5", or "" when every float value is finite. The activations' ranges
    are calibrated on their finite values; a quantized product turns a NaN into a number."""
    for i, feed in enumerate(feeds):
        for name, a in feed.items():
            if np.issubdtype(a.dtype, np.inexact) and not np.isfinite(a).all():
                return f"input {name!r}, sample {i}"
    return ""


def _unpacked(array: np.ndarray, elem_type: int) -> np.ndarray:
    """`array` as the input's element type where numpy's own .npz cannot hold it (bfloat16,
    the float8s: ml_dtypes' types, which `numpy.savez` writes as raw bytes of the same size,
    dtype |V2 or |V1, and loads back so): those bytes read as that type; any other array as
    it is (`_check_samples` then judges it)."""
    try:
        dtype = np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except KeyError:
        return array
    if array.dtype.kind == "V" and dtype.kind == "V" and array.dtype.itemsize == dtype.itemsize:
        return array.view(dtype)
    return array


def _check_samples(array: np.ndarray, tensor_type, where: str, name: str) -> None:
    """Raise CalibrationError when the samples of `array` (its first axis) cannot feed a
    graph input of ONNX type `tensor_type`: another rank, a fixed dimension of another size,
    or another element type (a one-line message that gives the shape the file needs). A
    string input's samples are not checked for their type (an .npz holds them as str)."""
    sample = array.shape[1:]
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
    if tensor_type.HasField("shape") and (
        len(sample) != len(dims) or any(d is not None and d != n for d, n in zip(dims, sample))
    ):
        want = ", ".join("?" if d is None else str(d) for d in dims)
        raise CalibrationError(
            f"{where}: input {name!r} has samples of shape {tuple(sample)}, the model's input "
            f"is ({want}); the samples go along a new first axis: an array of shape "
            f"(N, {want})"
        )
    dtype = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
    if dtype != np.dtype(object) and array.dtype != dtype:  # strings load as numpy's str
        hint = f" (an ml_dtypes.{np.dtype(dtype)} array)" if np.dtype(dtype).kind == "V" else ""
        raise CalibrationError(
            f"{where}: input {name!r} is {array.dtype}, the model's input is "
            f"{np.dtype(dtype)}{hint}"
        )


def add_warning(record: dict, warning: str) -> None:
    """Add `warning` to a quantization record's warnings (one line, `; `-joined)."""
    _add(record, "warning", warning)


def add_note(record: dict, note: str) -> None:
    """Add `note` to a quantization record's notes (one line, `; `-joined)."""
    _add(record, "note", note)


def _add(record: dict, key: str, text: str) -> None:
    earlier = record.get(key)
    record[key] = f"{earlier}; {text}" if earlier else text


def drawn_calibration(model: onnx.ModelProto, n: int = DRAWN_SAMPLES) -> list[dict]:
    """`n` feeds drawn from the input types (`check.random_inputs`, seeds 1000..)."""
    return [random_inputs(model, 1000 + i) for i in range(n)]


@dataclass
class Chooser:
    """The `choose` callback of `engine.optimize.optimize` for a Plan; after the call,
    `record` says per site what was chosen and why, and the calibration error per output.

    calibration: the feeds (see `load_calibration`); folder: where the model's external data
    is, for models whose weights stay in files (None when none); progress: called with a
    line saying which candidate the budget search measures (a search runs one onnxruntime
    session per site and per step: minutes on a full-size model); aliases: for a node of the
    graph an earlier pass wrote (static mode's BatchNorm folding), the names of the user's
    nodes it stands for, which `--keep-float` matches too."""

    plan: Plan
    calibration: list = field(default_factory=list)
    folder: str | None = None
    record: dict = field(default_factory=dict)
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    matched: set[str] = field(default_factory=set)  # the --keep-float patterns that matched
    # the float model's outputs on the calibration feeds, once a budget search has run
    reference: tuple | None = None
    # the feeds' indexes, those that erred most on the last candidate measured first
    hardest: list[int] = field(default_factory=list)
    progress: Callable[[str], None] | None = None

    def __call__(self, sites: list[Site], build) -> frozenset[int]:
        """The indexes of the sites to keep in float (see the module docstring); `build(keep)`
        extracts the graph with those in float. Raises CheckError when onnxruntime cannot run
        a candidate."""
        if not sites and self.record.get("sites"):
            return frozenset()  # a later round (`frontends.onnx._rounds`): nothing left to choose
        keep = {s.index for s in sites if self._why_float(s)}
        free = [s for s in sites if s.index not in keep]
        estimates: dict[int, float | None] = {}
        alone: dict[int, float] = {}  # a site's error measured with it alone quantized
        errors: dict[str, float] = {}
        if self.plan.error_budget is not None and sites:
            n = len(self._searched())
            self._say(f"the float model's outputs on {len(self.calibration)} inputs")
            reference, arrays = self._exported(build(frozenset(s.index for s in sites)))
            want, values = self._reference(reference, arrays, free)
            del arrays
            self.reference = want
            estimates = {s.index: _estimate(s, values) for s in free}
            measured: dict[frozenset, dict[str, float]] = {}
            per_feed: dict[frozenset, dict[int, float]] = {}  # each feed's worst output's

            def error(kept: frozenset) -> dict[str, float]:
                """The candidate's error per output; over the budget, only as far as the first
                feed that took it over (all the search needs to know)."""
                if kept not in measured:
                    sess = self._candidate(build(frozenset(keep | kept)))
                    per_feed[kept] = {}
                    measured[kept] = self._errors(
                        sess, want, self.plan.error_budget, per_feed=per_feed[kept]
                    )
                return measured[kept]

            def tried(kept: frozenset, k: int) -> tuple[bool, dict]:
                """Whether the candidate fits the plan (`verdict`), and its search step: the
                number kept in float, the worst output's error, and with
                `Plan.over_budget_share` the tail's share when it was estimated."""
                step = {"kept_float": k, "error": max(error(kept).values(), default=0.0)}
                why, tail = self.verdict(measured[kept], per_feed[kept])
                if self.plan.over_budget_share is not None and tail is not None:
                    step["over_budget_share"] = tail["share"]
                return not why, step

            def fewest(
                name: str, order: list[Site], cap: int | None
            ) -> tuple[frozenset | None, list[dict]]:
                """The fewest first sites of `order` kept in float within budget (bisection;
                the error falls as more are kept, near enough), and the steps taken; None
                when more than `cap` (the fewest an order searched before keeps) would be:
                such an order cannot be chosen, and its step at `cap` says so."""
                prefix = lambda k: frozenset(s.index for s in order[:k])  # noqa: E731
                lo, hi = 0, len(order)  # the answer lies in [lo, hi]
                steps = []
                ok, step = tried(prefix(0), 0)
                if ok:
                    hi = 0  # every site quantized fits (measured first, above)
                    steps.append(step)
                elif cap is not None and cap < hi:
                    self._say(f"{name}: {cap} of {len(order)} sites kept in float")
                    ok, step = tried(prefix(cap), cap)
                    steps.append(step)
                    if not ok:
                        return None, steps
                    hi = cap
                while lo < hi:
                    mid = (lo + hi) // 2
                    self._say(f"{name}: {mid} of {len(order)} sites kept in float")
                    ok, step = tried(prefix(mid), mid)
                    steps.append(step)
                    if ok:
                        hi = mid
                    else:
                        lo = mid + 1
                return prefix(lo), steps

            # each site's error measured alone (it quantized, every other site in float), on
            # the ALONE_INPUTS inputs the graph with every site quantized errs most on: the
            # estimates are worst-case bounds, and how far a site's bound lies above the
            # error it causes at the outputs varies by 50x between sites (DistilBERT's
            # attention projections against its FFN's: 0.35 both, 0.0001-0.0006 and
            # 0.004-0.007 measured), so an order by measured error keeps fewer in float
            # (the graph with every site quantized runs on every input first: it orders them
            # hardest first, and when it is within the budget there is nothing to search)
            everything = frozenset(s.index for s in free)
            self._say(f"every site quantized, on {n} inputs")
            per_feed[frozenset()] = {}
            measured[frozenset()] = self._errors(
                self._candidate(build(frozenset(keep))), want, per_feed=per_feed[frozenset()]
            )
            few = self.hardest[:ALONE_INPUTS]
            if self.verdict(measured[frozenset()], per_feed[frozenset()])[0]:
                for k, s in enumerate(free, 1):
                    self._say(f"site {k} of {len(free)} quantized alone ({s.name})")
                    only = self._candidate(build(frozenset(keep | (everything - {s.index}))))
                    alone[s.index] = max(self._errors(only, want, feeds=few).values(), default=0.0)
            # five orders: the largest errors measured alone first, and per nanosecond of
            # float work (a small product that errs much is cheap to keep: BERT's pooler reads
            # one row); the largest estimates first, and per nanosecond; graph order (the
            # first nodes first). None wins everywhere (BERT-base at 3.6%: 47 of 76 sites kept
            # in float by estimate, 73 in graph order; ResNet-50 static at 15%: 55 and 37), so
            # the search runs each and keeps the one that leaves the fewest in float, then the
            # one whose float sites cost least (`Site.float_ns`). Cost first was tried: the
            # cost model prices an embedding Gather by its whole table, so GPT-2's 5 sites
            # kept in graph order (its embeddings and first layer) lost to 17 Gemms, 0.355x
            # -> 0.515x of float
            by_alone = sorted(free, key=lambda s: -alone.get(s.index, 0.0))
            by_alone_rate = sorted(free, key=lambda s: -alone.get(s.index, 0.0) / _ns(s))
            by_estimate = sorted(free, key=lambda s: -(estimates[s.index] or 0.0))
            by_rate = sorted(free, key=lambda s: -(estimates[s.index] or 0.0) / _ns(s))
            orders = {
                "largest error alone first": by_alone,
                "largest error alone per float nanosecond first": by_alone_rate,
                "largest estimate first": by_estimate,
                "largest estimate per float nanosecond first": by_rate,
                "graph order": free,
            }
            # in turn, each order capped at the fewest kept by those before (it cannot win with
            # more; one over the budget at that count costs one candidate, mostly stopped at
            # its first input)
            found: dict[str, tuple[frozenset | None, list[dict]]] = {}
            for name, order in orders.items():
                counts = [len(k) for k, _ in found.values() if k is not None]
                found[name] = fewest(name, order, min(counts, default=None))
            float_ns = {s.index: s.float_ns for s in free}
            chosen = min(
                (name for name, (k, _) in found.items() if k is not None),
                key=lambda name: (
                    len(found[name][0]),
                    sum(float_ns[i] for i in found[name][0]),
                ),
            )
            kept, _ = found[chosen]
            keep |= kept
            errors = error(kept)
            # the chosen graph's tail (None when too few inputs; when even every site in float
            # is over the budget, its feeds up to the first over it only)
            self.record["tail"] = tail_share(per_feed[kept].values(), self.plan.error_budget)
            self.record["over_budget_share"] = self.plan.over_budget_share
            quantized = [s for s in free if s.index not in keep]
            self.record["estimated_error"] = _estimated_per_output(reference, quantized, estimates)
            self.record["evaluations"] = len(measured) + len(alone)
            self.record["alone_inputs"] = len(few) if alone else 0
            self.record["order"] = chosen
            # the searches: how many sites were kept in float, and the worst output's error (over
            # the budget: the worst up to the input that took it over, a lower bound)
            self.record["search"] = found[chosen][1]
            self.record["searches"] = {name: steps for name, (_, steps) in found.items()}
            self.record["calibration_samples"] = n
        self.record["budget"] = self.plan.error_budget
        self.record["calibration_error"] = errors
        self.record["sites"] = [
            {
                "node": s.name,
                "op": s.op,
                "rule": s.rules[0],
                "quantized": s.index not in keep,
                "estimate": estimates.get(s.index),
                "alone": alone.get(s.index),
                "float_ns": s.float_ns,
                "why": self._why_float(s)
                or (
                    f"kept in float for the budget (the search's {self.record.get('order')})"
                    if s.index in keep
                    else "quantized"
                ),
            }
            for s in sites
        ]
        return frozenset(keep)

    def finish(self, quantized: list[int] | None) -> dict:
        """The record, with what the final extraction took (`report.extra["quantized_sites"]`
        of `engine.optimize`): a site the chooser left free may still be float when the cost
        model finds its quantized form no cheaper (a small product)."""
        taken = set(quantized or ())
        rows = self.record.get("sites", ())
        for index, row in enumerate(rows):
            if row["quantized"] and index not in taken:
                row["quantized"] = False
                row["why"] = "float: the cost model found the quantized form no cheaper"
        for pattern in (p for p in self.plan.keep_float if p not in self.matched):
            add_warning(
                self.record,
                f"--keep-float {pattern} matches no node the quant rules matched (the summary "
                "and --report name them)",
            )
        if rows and not any(row["quantized"] for row in rows):
            whys = Counter(row["why"].split(" matches ")[0].removeprefix("float: ") for row in rows)
            add_warning(
                self.record,
                f"nothing was quantized: the {len(rows)} nodes the quant rules matched stay in "
                f"float ({'; '.join(f'{n}: {why}' for why, n in whys.most_common())})",
            )
        return self.record

    def held_out(self, model: onnx.ModelProto) -> dict | None:
        """`model`'s error on the inputs the search did not see (`Plan.held_out`, the last of
        the calibration feeds), or None when there are none or no search ran: per float
        output the worst over them, how many of them err over the budget, and, when none
        does, an upper bound at 95% confidence on the share of inputs like them that would:
        the one-sided Clopper-Pearson limit for no failures in k trials, 1 - 0.05^(1/k) (Clopper
        and Pearson, Biometrika 26, 1934; about 3/k): it holds for inputs drawn as the held-out
        ones were, independently, because neither the search nor the fits saw them (the
        search's own inputs give no such bound: it chose the graph on them). Raises
        CheckError when onnxruntime cannot run `model`."""
        held = list(range(len(self._searched()), len(self.calibration)))
        if not held or self.reference is None:
            return None
        self._say(f"the chosen graph on {len(held)} held-out inputs")
        per_feed: dict[int, float] = {}
        sess = session(self._with_weights(model), optimized=True)
        errors = self._errors(sess, self.reference, feeds=held, per_feed=per_feed)
        over = sum(e > self.plan.error_budget for e in per_feed.values())
        return {
            "inputs": len(held),
            "error": errors,
            "over_budget": over,
            "over_budget_share_at_most": None if over else 1 - (1 - CONFIDENCE) ** (1 / len(held)),
            "confidence": CONFIDENCE,
        }

    def verdict(
        self, errors: dict[str, float], per_feed: dict[int, float]
    ) -> tuple[str, dict | None]:
        """Whether a graph with `errors` (per float output, `_errors`) and `per_feed` (each
        searched feed's worst output's error) fits the plan: "" when it does, "budget" when an
        output is over the error budget, "tail" when within it but the tail of `per_feed`
        (`tail_share`) puts more than `Plan.over_budget_share` of inputs over it; and that
        tail (None when over the budget, or with too few feeds to fit one)."""
        if max(errors.values(), default=0.0) > self.plan.error_budget:
            return "budget", None
        tail = tail_share(per_feed.values(), self.plan.error_budget)
        allowed = self.plan.over_budget_share
        if allowed is not None and tail is not None and tail["share"] > allowed:
            return "tail", tail
        return "", tail

    def measure(
        self, model: onnx.ModelProto, per_feed: dict[int, float] | None = None
    ) -> dict[str, float] | None:
        """The error per float output of `model` (a result of the same float model) on the
        calibration feeds the search runs on, as it measured its candidates; None when no
        search ran. For a rewrite after the search: in a model whose quantization errors compound
        (ViT-B/16), a float32 regrouping of one float product moved the worst of 32 inputs
        from 4.08% to 5.01% (docs/benchmarks.md), so the search's measurement does not carry
        over. per_feed: filled with each feed's worst output's error (for `tail_share`).
        Raises CheckError when onnxruntime cannot run it."""
        if self.reference is None:
            return None
        sess = session(self._with_weights(model), optimized=True)
        return self._errors(sess, self.reference, per_feed=per_feed)

    def _searched(self) -> list[int]:
        """The indexes of the calibration feeds the budget search runs on (all but the last
        `Plan.held_out`)."""
        return list(range(len(self.calibration) - self.plan.held_out))

    def _say(self, text: str) -> None:
        if self.progress is not None:
            self.progress(f"error budget search: {text}")

    def _names(self, s: Site) -> list[str]:
        """The names `--keep-float` matches for `s`: its nodes' and those they stand for."""
        return [*s.names, *(a for n in s.names for a in self.aliases.get(n, ()))]

    def _why_float(self, s: Site) -> str:
        """Why the user's options keep `s` in float ("" if they do not): the first pattern
        that matches (every one that does is recorded as matching)."""
        why = ""
        for pattern in self.plan.keep_float:
            hit = next((n for n in self._names(s) if fnmatch.fnmatchcase(n, pattern)), None)
            if hit is not None:
                self.matched.add(pattern)
                why = why or f"--keep-float {pattern} matches {hit}"
        if why:
            return why
        if self.plan.op_types and s.op not in self.plan.op_types:
            return f"--op-types: {s.op} not listed"
        return ""

    def _exported(self, g: TermGraph) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
        """`g` for a session of the search: the model, and its large constants left out of the
        proto and given as arrays (`export_model`'s `arrays`)."""
        arrays: dict[str, np.ndarray] = {}
        return self._with_weights(export_model(g, arrays)), arrays

    def _candidate(self, g: TermGraph) -> ort.InferenceSession:
        """A session of `g` at ORT_ENABLE_ALL, as a user runs it (`_exported`'s arrays)."""
        model, arrays = self._exported(g)
        return session(model, optimized=True, arrays=arrays)

    def _with_weights(self, m: onnx.ModelProto) -> onnx.ModelProto:
        """`m` with the weights it keeps in the model's external data files read in (those
        `export_model` left in memory aside)."""
        if self.folder is not None:
            for t in list(external.external_tensors(m)):
                if ExternalDataInfo(t).location != IN_MEMORY:
                    load_external_data_for_tensor(t, self.folder)
        return m

    def _reference(self, model: onnx.ModelProto, arrays: dict[str, np.ndarray], free: list[Site]):
        """The float model's outputs on the calibration feeds, and the values the estimates
        read (each site's captures and output: graph inputs, node outputs or initializers)
        per feed the search runs on (`_searched`). model, arrays: as `_exported` gives them
        (`model` is as it was on return)."""
        made = {o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
        inits = {i.name: i for i in model.graph.initializer}
        wanted = {
            v
            for s in free
            for o in (s.output, s.level, *s.operands.values())
            if o is not None
            for v in o.wanted()
        }
        outs = [o.name for o in model.graph.output]
        extra = sorted(n for n in wanted if n in made and n not in outs)
        # The outputs the candidates are measured against come from the model as a user runs
        # it, as the candidates run; the captured values from a session that also returns
        # them. Asking onnxruntime for an inner value changes what its optimizations may do:
        # a Dropout in training mode whose output is returned is not removed, and drew at
        # random against the candidates' removed one (45% "errors" of a model quantized
        # at 2.2%), and a fusion that would hide a returned value is not made.
        # (one session at a time: each holds its own copy of the weights, prepacked)
        plain = session(model, optimized=True, arrays=arrays)
        want = [run(plain, feeds) for feeds in self.calibration]
        searched = len(self._searched())
        got = want[:searched]
        if extra:
            del plain
            model.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in extra)
            try:
                probe = session(model, optimized=True, arrays=arrays)
            finally:
                del model.graph.output[len(outs) :]
            got = [run(probe, feeds) for feeds in self.calibration[:searched]]
            del probe
        weights = {  # read once
            n: arrays[n] if n in arrays else numpy_helper.to_array(inits[n])
            for n in wanted
            if n in inits
        }
        values = [dict(zip(outs + extra, g)) | weights for g in got]
        return (outs, want), values

    def _errors(
        self,
        sess: ort.InferenceSession,
        reference,
        stop_over: float | None = None,
        feeds: list[int] | None = None,
        per_feed: dict[int, float] | None = None,
    ) -> dict[str, float]:
        """max|q - ref| / max|ref| per float output of `sess` (a candidate: `_candidate`), the
        worst over the calibration feeds (each feed's error relative to its own largest
        output, as the output check has it).

        stop_over: stop after the first feed on which an output's error exceeds it; the
        errors are then those of the feeds run so far (a candidate over the budget is over
        it whatever the other feeds give: 10 of DistilBERT's 15 candidates and 7 of GPT-2's 17
        were, in their budget rows). The feeds run hardest first (`hardest`: by their error on
        the candidate measured before), so a candidate over the budget mostly stops at the
        first; the worst over all feeds does not depend on the order. feeds: the indexes of
        the feeds to run (default: those the search runs on, `_searched`; a subset leaves
        `hardest` as it was). per_feed: filled with each feed's worst output's error."""
        outs, want = reference
        worst = dict.fromkeys(outs, 0.0)
        order = self.hardest or self._searched()
        if feeds is not None:  # (held-out feeds are not in `hardest`: they follow)
            wanted, known = set(feeds), set(order)
            order = [i for i in order if i in wanted] + [i for i in feeds if i not in known]
        ran = {} if per_feed is None else per_feed  # feed index -> its worst output's error
        for i in order:
            errors = []
            for name, got, ref in zip(outs, run(sess, self.calibration[i]), want[i]):
                if not np.issubdtype(np.asarray(ref).dtype, np.floating):
                    continue
                err = float(np.abs(got - ref).max(initial=0))
                big = float(np.abs(ref).max(initial=0))
                errors.append(err / big if big else err)
                worst[name] = max(worst[name], errors[-1])
            ran[i] = max(errors, default=0.0)
            if stop_over is not None and ran[i] > stop_over:
                break
        if feeds is None:
            self.hardest = sorted(ran, key=lambda i: -ran[i]) + [i for i in order if i not in ran]
        return worst


def tail_share(errors, limit: float) -> dict | None:
    """An estimate of the share of inputs, drawn like those that gave `errors` (one per input:
    its worst output's max|q - ref| / max|ref|), whose error exceeds `limit`, from the tail of
    `errors`; None for fewer than TAIL_MIN_INPUTS of them.

    The worst error of a few dozen inputs is a tail statistic (on 160 inputs no stage saw, the
    budget rows' worst was 3.4-4.4 standard deviations above their mean: docs/benchmarks.md),
    so a share of inputs over `limit` beyond the worst seen is extrapolated. The excesses over
    a high threshold u, the (k+1)-th largest error with k = ceil(sqrt(n)), are taken to be
    exponential (the generalized Pareto distribution with shape 0, the limit for tails like
    the normal's and the exponential's: Pickands, Annals of Statistics 3, 1975; Davison and
    Smith, JRSS B 52, 1990), their scale b the mean excess of the k errors above u (its
    maximum-likelihood estimate); then P(error > limit) = (k / n) exp(-(limit - u) / b) for
    limit > u. At or below u (or with b = 0) the share is the empirical one, the fraction of
    `errors` above `limit`. Not a bound: a tail heavier than exponential puts more inputs
    over it, and a search that chose the graph on these inputs made their worst small.

    Returns {"share", "inputs": n, "tail": k, "threshold": u, "scale": b} (errors as
    fractions)."""
    e = np.sort(np.fromiter(errors, np.float64))[::-1]
    n = len(e)
    if n < TAIL_MIN_INPUTS:
        return None
    k = int(np.ceil(np.sqrt(n)))
    u = float(e[k])
    b = float(e[:k].mean() - u)
    if limit > u and b > 0:
        share = k / n * float(np.exp(-(limit - u) / b))
    else:
        share = float(np.mean(e > limit))
    return {"share": share, "inputs": n, "tail": k, "threshold": u, "scale": b}


def _ns(s: Site) -> float:
    """A site's float work in nanoseconds (`Site.float_ns`), at least 1 (a site whose
    products the cost model could not price)."""
    return max(s.float_ns, 1.0)


def _estimated_per_output(
    model: onnx.ModelProto, quantized: list[Site], estimates: dict[int, float | None]
) -> dict[str, float | None]:
    """Per float output of `model` (the float graph), the sum of the estimates of the
    `quantized` sites it depends on: a first-order estimate of its relative error that takes
    each site's relative error to pass through the layers after it unchanged (not a bound:
    a layer can amplify it, and the bounds are worst cases that typical errors stay far
    below). None when a site it depends on, or one whose place in the graph is unknown, has no
    estimate."""
    out: dict[str, float | None] = {}
    for o in model.graph.output:
        seen, _ = upstream(model.graph, o.name)
        parts = []
        for s in quantized:
            names = {*s.values, *(s.output.names if s.output is not None else ())}
            if not names or names & seen:
                parts.append(estimates.get(s.index))
        out[o.name] = None if any(p is None for p in parts) else float(sum(parts))
    return out


def _estimate(s: Site, values: list[dict]) -> float | None:
    """The site's rule bound on the calibration values of its operands (`Site.operands`), in
    float units (levels times `Site.level`), over the largest magnitude of the float output it
    is relative to (`Site.output`), the worst over the feeds; None when a value cannot be
    read."""
    if s.bound is None or s.output is None or not values:
        return None
    fn, args = s.bound
    operands = [s.operands.get(a) for a in args]
    worst = 0.0
    for got in values:
        args_now = [o.read(got) if o is not None else None for o in operands]
        out = s.output.read(got)
        level = s.level.read(got) if s.level is not None else np.float64(1.0)
        if out is None or level is None or any(a is None for a in args_now):
            return None
        bound = np.asarray(BOUNDS[fn].fn(*args_now), np.float64) * abs(float(np.max(level)))
        big = float(np.abs(out).max(initial=0.0))
        worst = max(worst, float(bound.max(initial=0.0)) / big if big else 0.0)
    return worst


def _activations(model: onnx.ModelProto, feeds: list[dict], only=None):
    """For each feed, {name: value} of every activation of `model` (graph inputs and node
    outputs that depend on an input; not constants), or of those in `only`, run under
    onnxruntime with its optimizations off (every node's output is there to read). Raises
    CheckError when onnxruntime cannot run the model.

    The session is made from the model's `skeleton`, its large initializers fed with each
    input as arrays: onnxruntime then neither parses the weights' bytes nor Python serializes
    them (BERT-base: 2.9 s to make a session of the whole model, 0.05 s of its skeleton). A
    model whose weights are in external files or of a type numpy lacks (bfloat16, float8,
    int4), or one whose skeleton onnxruntime cannot run, is run whole."""
    g = model.graph
    inits = {i.name for i in g.initializer}
    varying = {i.name for i in g.input if i.name not in inits}
    for n in g.node:  # topological order (ONNX requires it)
        if any(i in varying for i in n.input):
            varying.update(o for o in n.output if o)
    if only is not None:
        varying &= set(only)
    outs = [o.name for o in g.output]
    extra = [o for n in g.node for o in n.output if o in varying and o not in outs]
    large = [t for t in g.initializer if is_weight(t)]
    lean = not any(uses_external_data(t) for t in g.initializer) and all(
        t.data_type in _NUMPY_TYPES for t in large
    )
    sess, weights = _probe_session(model, extra, lean)
    names = [o.name for o in sess.get_outputs()]
    inputs = [i for i in varying if i in feeds[0]] if feeds else []
    for k, f in enumerate(feeds):
        try:
            values = run(sess, {**weights, **f})
        except CheckError:
            if not lean or k:
                raise
            # a kernel that needs its weight constant (a contrib op's): the whole model
            lean = False
            sess, weights = _probe_session(model, extra, False)
            values = run(sess, f)
        got = dict(zip(names, values))
        got.update({i: np.asarray(f[i]) for i in inputs})
        yield {n: v for n, v in got.items() if n in varying}


def _probe_session(model: onnx.ModelProto, extra: list[str], lean: bool):
    """A session of `model` with the values `extra` as outputs too, and the arrays to feed it
    besides the inputs: with `lean`, of its `skeleton` and its large initializers; else of the
    whole model and none. Raises CheckError."""
    if not lean:
        probe = onnx.ModelProto()
        probe.CopyFrom(model)
    else:
        probe = skeleton(model)
    probe.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in extra)
    if not lean:
        return session(probe), {}
    weights = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer if is_weight(t)}
    return session(probe), weights


# the element types numpy holds natively (onnxruntime takes no ml_dtypes array: bfloat16,
# float8, int4 weights stay initializers of a whole-model session)
_NUMPY_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.DOUBLE,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.INT8,
    onnx.TensorProto.INT16,
    onnx.TensorProto.INT32,
    onnx.TensorProto.INT64,
    onnx.TensorProto.UINT8,
    onnx.TensorProto.UINT16,
    onnx.TensorProto.UINT32,
    onnx.TensorProto.UINT64,
    onnx.TensorProto.BOOL,
}


@dataclass(frozen=True)
class Range:
    """The calibrated range of one activation, lo <= 0 <= hi (float, the activation's units)."""

    lo: float
    hi: float

    def params(self, symmetric: bool) -> tuple[np.ndarray, np.ndarray]:
        """(scale, zero point) of QuantizeLinear for this range: uint8 asymmetric, s = (hi -
        lo) / 255 and zp = round(-lo / s), so that 0 is a level (a padded zero, a ReLU's floor
        are exact); or symmetric around 0 (`symmetric`), s = max(|lo|, |hi|) / 127 and zp =
        128: int8's levels [-128, 127] with zero point 0, shifted into uint8 (the same values
        dequantized; onnxruntime's own symmetric uint8 activations), because onnxruntime's
        kernels with int8 activations ran 3.3-7.5x slower than float on this CPU (`python
        bench/quant.py --kernels`). A range of one point gets s = 1. Scalars: float32 and
        uint8."""
        if symmetric:
            big = max(-self.lo, self.hi)
            s = np.float32(big / 127 if big > 0 else 1.0)
            return np.array(s, np.float32), np.array(128, np.uint8)
        width = self.hi - self.lo
        s = np.float32(width / 255 if width > 0 else 1.0)
        zp = np.clip(np.rint(-self.lo / float(s)), 0, 255)
        return np.array(s, np.float32), np.array(zp, np.uint8)


def calibrate(
    model: onnx.ModelProto, feeds: list[dict], method: str = "minmax", only=None
) -> dict[str, Range]:
    """The range of every float32 activation of `model` (graph inputs and node outputs that
    depend on an input; not constants), or of those named in `only` (static mode: the
    `product_boundary`, the activations `observe` marks), over the calibration `feeds`, run
    under onnxruntime with its optimizations off (every node's output is there to read):
    `minmax` takes the smallest and largest value seen, `percentile` the PERCENTILE-th
    percentiles of all values seen (outliers clipped, as onnxruntime's percentile calibrator
    does). Both widened to include 0. Raises CheckError when onnxruntime cannot run the
    model, ValueError for an unknown method."""
    if method not in CALIBRATION_METHODS:
        raise ValueError(f"unknown calibration method {method!r}")
    lo: dict[str, float] = {}
    hi: dict[str, float] = {}
    seen: dict[str, list[np.ndarray]] = {}
    for got in _activations(model, feeds, only):
        for name, v in got.items():
            if v.dtype != np.float32 or v.size == 0:
                continue
            finite = v[np.isfinite(v)]
            if finite.size == 0:
                continue
            if method == "percentile":
                seen.setdefault(name, []).append(finite.ravel())
            lo[name] = min(lo.get(name, 0.0), float(finite.min()))
            hi[name] = max(hi.get(name, 0.0), float(finite.max()))
    if method == "percentile":
        for name, parts in seen.items():
            every = np.concatenate(parts)
            a, b = np.percentile(every, [100 - PERCENTILE, PERCENTILE])
            lo[name], hi[name] = min(float(a), 0.0), max(float(b), 0.0)
    return {n: Range(lo[n], hi[n]) for n in lo}


WEIGHT_INPUT = {"Gather": 0}  # where an op quantized by its constant operand reads it (else 1)


def refused_products(
    result: onnx.ModelProto, ops: set[str], rejected: dict[str, dict[str, int]], quant: set[str]
) -> str:
    """What to tell a user whose quantized `result` still holds float products a quant
    rule's guard refused ("" when none did): the float nodes of `ops` (the products the mode
    quantizes, families CONV and MATMUL, but not one whose weight a DequantizeLinear makes) in
    its main graph counted by op, and the guards that
    failed (`Report.rejected`: rule -> "guard ... failed" -> matches) of the quantizing rules
    named in `quant` (those stating a bound), e.g. a static Conv of more products a sum than
    int32 holds (`conv-accumulates-in-int32`)."""
    refusals = guard_refusals(rejected, quant)
    products = ops & (set(FAMILIES["CONV"]) | set(FAMILIES["MATMUL"]))
    # a product whose weight (input 1) a DequantizeLinear makes is the quantized form
    # (weight-only's standard-ONNX weights, a QDQ weight), not a float one
    dequantized = {
        o for n in result.graph.node if n.op_type == "DequantizeLinear" for o in n.output
    }
    left = Counter(
        n.op_type
        for n in result.graph.node
        if n.op_type in products
        and not n.domain
        and not (len(n.input) > 1 and n.input[1] in dequantized)
    )
    if not refusals or not left:
        return ""
    nodes = ", ".join(f"{n} {op}" for op, n in sorted(left.items()))
    return (
        f"the output has {nodes} in float (kept by options, by design, or refused); the quant "
        f"rules' guards refused: {refusals}"
    )


def subgraph_products(model: onnx.ModelProto, ops: set[str]) -> str:
    """The nodes of `ops` (the products the mode quantizes, families CONV and MATMUL) inside
    the subgraphs of `model`'s nodes (If branches, Loop and Scan bodies), counted by op, as
    "2 MatMul, 1 Conv" ("" when there are none): the engine rewrites the main graph only, so
    those stay float."""
    products = ops & (set(FAMILIES["CONV"]) | set(FAMILIES["MATMUL"]))
    found: Counter = Counter()

    def walk(graph: onnx.GraphProto, inside: bool) -> None:
        for n in graph.node:
            if inside and n.op_type in products and not n.domain:
                found[n.op_type] += 1
            for g in subgraphs(n):
                walk(g, True)

    walk(model.graph, False)
    return ", ".join(f"{c} {op}" for op, c in sorted(found.items()))


GUARDS_DID_NOT_TAKE = "have a float32 constant weight the rules' guards did not take"


def guard_refusals(rejected: dict[str, dict[str, int]], quant: set[str]) -> str:
    """The guards that failed (`Report.rejected`: rule -> "guard ... failed" -> matches) of
    the rules named in `quant`, as "RULE's guard (G ...) (N matches); ..." ("" when none)."""
    guards = {
        f"{rule}'s {why.removesuffix(' failed')}": n
        for rule, whys in rejected.items()
        if rule.removesuffix(" (reverse)") in quant
        for why, n in whys.items()
    }
    return "; ".join(f"{g} ({n} matches)" for g, n in sorted(guards.items()))


def nothing_quantized(model: onnx.ModelProto, ops: set[str], mode: str) -> str:
    """Why a quantization run in `mode` quantized nothing in `model`, for a user's warning:
    the nodes of `ops` (the op types the mode's rulesets quantize, `engine.quantize.
    quantized_ops`) that read a weight, products (families CONV and MATMUL) and a Gather's
    table, whose weight operand (input 1; the table, input 0; or the constant it is a view of,
    through Transpose and the VIEW family) is not a float32 constant, counted by op and
    reason, or that the model has none of those ops. The rules read a weight's values to
    quantize it (scales from its range), in float32."""
    g = model.graph
    types = {t.name: t.data_type for t in g.initializer}
    for n in g.node:  # Constant nodes hold constants too
        if n.op_type == "Constant" and n.output and not n.domain:
            value = next((a.t for a in n.attribute if a.name == "value"), None)
            if value is not None:
                types[n.output[0]] = value.data_type
    weighted = set(FAMILIES["CONV"]) | set(FAMILIES["MATMUL"]) | set(WEIGHT_INPUT)
    ops = ops & weighted  # (not the lowering of QDQ groups, which needs no weight)
    found = [n for n in g.node if n.op_type in ops and not n.domain]
    if not found:
        return f"the model has none of the ops --mode {mode} quantizes ({', '.join(sorted(ops))})"
    # a weight read through views of a constant (a dynamo export's Transpose of a shared
    # weight, TorchScript's Identity): the rules see through them, so the constant is its type
    producer = {o: n for n in g.node for o in n.output}
    views = {*FAMILIES["VIEW"], "Transpose"}

    def source(name: str) -> str:
        seen = set()
        while name not in types and name in producer and name not in seen:
            seen.add(name)
            n = producer[name]
            if n.op_type not in views or n.domain or not n.input:
                break
            name = n.input[0]
        return name

    reasons: dict[tuple[str, str], int] = {}
    for n in found:
        k = WEIGHT_INPUT.get(n.op_type, 1)
        w = source(n.input[k]) if len(n.input) > k else ""
        if n.op_type == "Gemm" and _unusual_gemm(n):
            why = "have transA = 1 or alpha or beta other than 1, which no quant rule matched"
        elif w not in types and w in producer and producer[w].op_type in _MAKERS:
            why = f"read a weight a {producer[w].op_type} node computes, not a stored constant"
        elif w not in types:
            why = "read no constant weight"
        elif types[w] != onnx.TensorProto.FLOAT:
            dtype = onnx.TensorProto.DataType.Name(types[w]).lower()
            why = f"compute {dtype} (the rules take float32)"
        else:
            why = GUARDS_DID_NOT_TAKE
        reasons[(n.op_type, why)] = reasons.get((n.op_type, why), 0) + 1
    return "; ".join(f"{c} {op} {why}" for (op, why), c in sorted(reasons.items()))


# ops that make a tensor from constants alone (and the op table's random draws): a weight one
# computes (onnx's light model zoo files make theirs with ConstantOfShape) is not a stored
# constant to the rules
_MAKERS = {"ConstantOfShape", "EyeLike", "Range", *FAMILIES["RANDOM"]}


def _unusual_gemm(n: onnx.NodeProto) -> bool:
    """Whether Gemm `n` has transA = 1, alpha other than 1, or beta other than 1 with a C."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
    has_c = len(n.input) > 2 and bool(n.input[2])
    return (
        attrs.get("transA", 0) == 1
        or attrs.get("alpha", 1.0) != 1.0
        or (has_c and attrs.get("beta", 1.0) != 1.0)
    )


def clipped_block_products(model: onnx.ModelProto) -> int:
    """How many MatMul and Gemm nodes of `model` (a weight-only result for standard ONNX) read
    their weight from a DequantizeLinear with `block_size` and hand their output to a Relu or
    Clip alone, whose output some node reads. onnxruntime 1.32 fuses such a DequantizeLinear
    into its product as MatMulNBits everywhere else, but its QDQ selectors take the Relu or
    Clip for part of a quantized group and leave these unfused: the weights are dequantized at
    every run (measured on OPT's two FFN layers: the file ran at 1.29-1.31x of float's time,
    its `--target onnxruntime` file with MatMulNBits at 0.94-0.96x)."""
    g = model.graph
    blocked = {
        n.output[0]
        for n in g.node
        if n.op_type == "DequantizeLinear" and not n.domain and _attrs(n).get("block_size")
    }
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    outputs = {o.name for o in g.output}
    count = 0
    for n in g.node:
        if n.domain or n.op_type not in ("MatMul", "Gemm") or len(n.input) < 2:
            continue
        after = readers.get(n.output[0], [])
        clipped = (
            len(after) == 1
            and n.output[0] not in outputs
            and after[0].op_type in FAMILIES["CLIPPING"]
            and not after[0].domain
            and after[0].output[0] in readers
        )
        count += n.input[1] in blocked and clipped
    return count


def product_boundary(model: onnx.ModelProto) -> set[str]:
    """The names of the activations static mode quantizes: the first two inputs and the
    output of every Conv, MatMul and Gemm (families CONV and MATMUL of the default domain),
    and what an op that selects elements (family SELECTING: MaxPool, Reshape, Transpose, ...)
    or clips them (Relu, Clip) links to those, in either direction, so that a chain Conv ->
    Relu -> MaxPool -> Conv stays one quantization. A residual Add between Convs reads and
    writes such activations, a SiLU's Sigmoid and a squeeze-excitation's pooling do not."""
    products = set(FAMILIES["CONV"]) | set(FAMILIES["MATMUL"])
    links = set(FAMILIES["SELECTING"]) | set(FAMILIES["CLIPPING"])
    found: set[str] = set()
    linked: dict[str, list[str]] = {}  # a value -> the values a link op joins it to
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type in products:
            found.update(v for v in n.input[:2] if v)
            found.update(n.output[:1])
        elif n.op_type in links and n.input and n.output:
            linked.setdefault(n.input[0], []).append(n.output[0])
            linked.setdefault(n.output[0], []).append(n.input[0])
    todo = list(found)  # each value visited once: linear in the graph's size
    while todo:
        for v in linked.get(todo.pop(), ()):
            if v not in found:
                found.add(v)
                todo.append(v)
    return found - {i.name for i in model.graph.initializer}


def observe(
    model: onnx.ModelProto,
    ranges: dict[str, Range],
    symmetric: bool = False,
    boundary: set[str] | None = None,
) -> onnx.ModelProto:
    """A copy of `model` in which every activation with a calibrated range that some node
    reads is read through `rewrite.Observed(x, scale, zero point)` (patterns/quant/
    static.rules), the parameters of `Range.params`, shared as initializers among activations
    of equal parameters, each mark's output declared with its input's type (shape inference
    does not see through the mark). The output of an op of family SELECTING (MaxPool, Pad,
    Reshape, ...: its elements are some of its input's) takes its input's parameters, so that
    no requantization lies between them. Graph outputs stay as they are.

    Only the activations `product_boundary` names are marked: an integer product needs its
    operands and result quantized, and an elementwise op (QLinearAdd, QLinearMul,
    QLinearSigmoid, ...) runs on integers only where its operands and result are so already.
    Each other mark would be a quantization of its own, one more rounding and clipping of the
    values, for little time: onnxruntime 1.32's QLinearSigmoid took as long as its float
    Sigmoid (299 against 287 us on a [1, 96, 112, 112] tensor, 1 thread) and its QLinearMul
    twice a float Mul's time; on EfficientNet-B0 (SiLU, squeeze-excitation) marking every
    activation took `--target onnxruntime` from 32% to 48% mean error at the same latency
    (bench/quant.py). `boundary`: `product_boundary(model)`, when the caller has it."""
    boundary = product_boundary(model) if boundary is None else boundary
    ranges = {n: r for n, r in ranges.items() if n in boundary}
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    # each mark's output has its input's type, declared: shape inference does not see through
    # an op of a domain it does not know, and the cost model needs the shapes after it
    known = _known_types(model)
    params: dict[str, tuple[np.ndarray, np.ndarray]] = {
        n: r.params(symmetric) for n, r in ranges.items()
    }
    for n in g.node:
        if n.op_type in FAMILIES["SELECTING"] and not n.domain and n.input and n.input[0] in params:
            for o in n.output[:1]:
                if o in params:
                    params[o] = params[n.input[0]]
    used = {i for n in g.node for i in n.input}
    taken = _taken_names(g)
    shared: dict[tuple, tuple[str, str]] = {}
    renamed: dict[str, str] = {}
    marks = []
    for name, (s, zp) in params.items():
        if name not in used:
            continue
        key = (s.tobytes(), zp.tobytes(), zp.dtype.str)
        if key not in shared:
            k = len(shared)
            shared[key] = (
                unique_name(f"observed_scale_{k}", taken),
                unique_name(f"observed_zp_{k}", taken),
            )
            inits = [
                numpy_helper.from_array(s, shared[key][0]),
                numpy_helper.from_array(zp, shared[key][1]),
            ]
            _add_initializers(out, inits)
        renamed[name] = unique_name(f"{name}_observed", taken)
        _declare_like(g, renamed[name], name, known)
        marks.append(
            helper.make_node(
                OBSERVED[1],
                [name, *shared[key]],
                [renamed[name]],
                name=unique_name(f"{name}/observed", taken),
                domain=OBSERVED[0],
            )
        )
    if not marks:
        return out
    for n in g.node:
        for i, v in enumerate(n.input):
            if v in renamed:
                n.input[i] = renamed[v]
    _place_marks(out, marks)
    return out


def _taken_names(g: onnx.GraphProto) -> set[str]:
    """Every value name of graph `g` (initializers, inputs, node outputs): new names avoid
    them."""
    return {i.name for i in (*g.initializer, *g.input)} | {v for n in g.node for v in n.output}


def _add_initializers(model: onnx.ModelProto, tensors: list[onnx.TensorProto]) -> None:
    """Add `tensors` to `model`'s initializers (and, at IR 3, where every initializer is a
    graph input too, to its inputs)."""
    model.graph.initializer.extend(tensors)
    if model.ir_version < 4:
        model.graph.input.extend(
            helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in tensors
        )


def _place_marks(model: onnx.ModelProto, marks: list[onnx.NodeProto]) -> None:
    """Insert `marks` (nodes of the `rewrite` domain, each reading a value as its first input)
    into `model`'s graph, each right after the node that makes its value (graph inputs'
    marks first), so that the graph stays in topological order; import the domain."""
    g = model.graph
    by_value: dict[str, list[onnx.NodeProto]] = {}
    for m in marks:
        by_value.setdefault(m.input[0], []).append(m)
    made = {o for n in g.node for o in n.output}
    nodes = [m for m in marks if m.input[0] not in made]
    for n in g.node:
        nodes.append(n)
        nodes.extend(m for o in n.output for m in by_value.get(o, ()))
    del g.node[:]
    g.node.extend(nodes)
    if not any(o.domain == OBSERVED[0] for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(OBSERVED[0], 1))


def _declare_like(g: onnx.GraphProto, name: str, like: str, known: dict) -> None:
    """Declare value `name` with the type of value `like` (from `known`, name -> TypeProto),
    if that type is known: shape inference does not see through a mark."""
    if like in known and known[like].tensor_type.elem_type:
        info = onnx.ValueInfoProto(name=name)
        info.type.CopyFrom(known[like])
        g.value_info.append(info)


def _known_types(model: onnx.ModelProto) -> dict:
    """name -> TypeProto of every value whose type ONNX shape inference finds (the declared
    ones when inference fails). Inferred on the model's `skeleton` (onnx's C++ inference is
    handed the whole model serialized: 1.3 s a call for DistilBERT's weights)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton(model)).graph
    except Exception:  # InferenceError: the declared types only
        inferred = model.graph
    return {v.name: v.type for v in (*inferred.value_info, *inferred.input, *inferred.output)}


def strip_marks(
    model: onnx.ModelProto, mark: tuple[str, str] = OBSERVED
) -> tuple[onnx.ModelProto, int]:
    """`model` without `mark` nodes (`rewrite.Observed`, or `SMOOTH`; each use of a mark's
    output reads its input again; their parameter initializers dropped when nothing else reads
    them), and how many there were: the marks of activations the rules could not rewrite (a
    model at an opset the rules do not run at, say). The marks' opset import goes too when no
    node of its domain is left (also when the rules consumed every mark). Changes `model` in
    place."""
    g = model.graph
    marks = [n for n in g.node if (n.domain, n.op_type) == mark]
    if not marks:
        _drop_unused_mark_domain(model)
        return model, 0
    source = {m.output[0]: m.input[0] for m in marks}
    params = {i for m in marks for i in m.input[1:]}
    kept = [n for n in g.node if (n.domain, n.op_type) != mark]
    for n in kept:
        for i, v in enumerate(n.input):
            if v in source:
                n.input[i] = source[v]
    del g.node[:]
    g.node.extend(kept)
    read = {i for n in kept for i in n.input} | {o.name for o in g.output}
    dead = params - read
    inits = [t for t in g.initializer if t.name not in dead]
    del g.initializer[:]
    g.initializer.extend(inits)
    inputs = [i for i in g.input if i.name not in dead]
    del g.input[:]
    g.input.extend(inputs)
    _drop_unused_mark_domain(model)
    return model, len(marks)


def _drop_unused_mark_domain(model: onnx.ModelProto) -> None:
    """Remove the marks' opset import (`rewrite`) from `model` when no node uses it."""
    if not any(n.domain == OBSERVED[0] for n in model.graph.node):
        imports = [o for o in model.opset_import if o.domain != OBSERVED[0]]
        del model.opset_import[:]
        model.opset_import.extend(imports)


def smoothing_marks(
    model: onnx.ModelProto, feeds: list[dict], alpha: float = SMOOTH_ALPHA
) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` in which each activation x that SmoothQuant can smooth is read by its
    products through `rewrite.Smooth(x, s)` (patterns/quant/smooth.rules), and how many were
    marked. Such an x is the first input of a MatMul or Gemm (transA 0) whose weight is a 2-D
    float32 initializer. Where x is made by a normalization or a Mul by a constant (through
    view ops), the rules fold x / s into that op's constants; elsewhere (attention's merged
    heads, a Gelu op's output, GPT-2's 0.5 * x * (1 + tanh(...))) x / s
    stays a Div of its own (`smoothing_divisions` counts them), one elementwise op over x,
    and a product the quantization keeps in float gets it folded back into its weight
    (`divided_products`). Measured (docs/benchmarks.md): with every product quantized,
    BERT-base's worst error 4.40% -> 4.07% at 0.323x -> 0.332x of float's latency.
    s_j = max|x_j|^alpha / max|W_j|^(1 - alpha) (Xiao et al. 2023, eq. 4): max|x_j| over the
    calibration `feeds` (channel j of x's last axis), max|W_j| over row j of every marked
    product's weight; 1 where either is 0, clipped to `vocab.registry.SMOOTHING_RANGE`.
    float32, one per channel. Raises CheckError when onnxruntime cannot run the model."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    weights = {t.name: t for t in g.initializer}
    readers: dict[str, list[tuple[onnx.NodeProto, np.ndarray]]] = {}
    for n in g.node:
        w = _smoothable_weight(n, weights)
        if w is not None:
            readers.setdefault(n.input[0], []).append((n, w))
    if not readers:
        return out, 0
    amax: dict[str, np.ndarray] = {}
    for got in _activations(out, feeds, readers):
        for name, v in got.items():
            if v.dtype == np.float32 and v.ndim >= 1 and v.size:
                m = np.abs(np.nan_to_num(v)).reshape(-1, v.shape[-1]).max(axis=0)
                amax[name] = np.maximum(amax[name], m) if name in amax else m
    known = _known_types(out)
    taken = _taken_names(g)
    lo, hi = SMOOTHING_RANGE
    marks = []
    for x, uses in readers.items():
        a = amax.get(x)
        if a is None or any(w.shape[0] != a.shape[0] for _, w in uses):
            continue
        wmax = np.max([np.abs(w).max(axis=1) for _, w in uses], axis=0)
        with np.errstate(divide="ignore", invalid="ignore"):
            factors = a.astype(np.float64) ** alpha / wmax.astype(np.float64) ** (1 - alpha)
        factors = np.where((a > 0) & (wmax > 0) & np.isfinite(factors), factors, 1.0)
        factors = np.clip(factors, lo, hi).astype(np.float32)
        scale = numpy_helper.from_array(factors, unique_name(f"{x}_smoothing", taken))
        _add_initializers(out, [scale])
        read = unique_name(f"{x}_smoothed", taken)
        _declare_like(g, read, x, known)
        for n, _ in uses:
            n.input[0] = read
        marks.append(
            helper.make_node(
                SMOOTH[1],
                [x, scale.name],
                [read],
                name=unique_name(f"{x}/smooth", taken),
                domain=SMOOTH[0],
            )
        )
    _place_marks(out, marks)
    return out, len(marks)


def _smoothable_weight(
    n: onnx.NodeProto, weights: dict, arrays: dict | None = None
) -> np.ndarray | None:
    """The weight of product `n` as K x N (rows per channel of its first input), if `n` is a
    MatMul or a Gemm (transA 0) by a 2-D float32 initializer; else None. `arrays`, when given,
    keeps each initializer's array by name, so that products of one weight share one."""
    if n.domain or n.op_type not in SMOOTHED_PRODUCTS or len(n.input) < 2:
        return None
    t = weights.get(n.input[1])
    if t is None or t.data_type != onnx.TensorProto.FLOAT or len(t.dims) != 2:
        return None
    attrs = _attrs(n)
    if attrs.get("transA", 0):
        return None
    w = _array(t, arrays)
    return w.T if attrs.get("transB", 0) else w


def _transposed_weights(g: onnx.GraphProto, weights: dict) -> dict[str, onnx.NodeProto]:
    """The Transpose nodes of `g` that swap the two axes of a 2-D float32 initializer (perm
    (1, 0) or none), by their output: how the dynamo exporter leaves a Linear layer's weight
    that several products read (ALBERT's shared layers; a language model's head tied to its
    embedding table), MatMul(x, Transpose(w)), where it folds the Transpose of one read."""
    out = {}
    for n in g.node:
        if n.op_type != "Transpose" or n.domain or not n.input or not n.output:
            continue
        t = weights.get(n.input[0])
        flat = t is not None and t.data_type == onnx.TensorProto.FLOAT and len(t.dims) == 2
        if flat and tuple(_attrs(n).get("perm", (1, 0))) == (1, 0):
            out[n.output[0]] = n
    return out


def _array(t: onnx.TensorProto, arrays: dict | None) -> np.ndarray:
    """`numpy_helper.to_array(t)`, kept in `arrays` by the tensor's name when given."""
    if arrays is None:
        return numpy_helper.to_array(t)
    if t.name not in arrays:
        arrays[t.name] = numpy_helper.to_array(t)
    return arrays[t.name]


def smoothing_divisions(model: onnx.ModelProto, marked: onnx.ModelProto) -> int:
    """How many nodes of `model` (the smoothing pass's result) still divide an activation by
    the factors of a mark of `marked` (`smoothing_marks`' model): the divisions no op before
    them took into its constants."""
    return len(_divisions(model, marked))


def _divisions(model: onnx.ModelProto, marked: onnx.ModelProto) -> set[str]:
    """The outputs of the Div nodes of `model` whose divisor is the factors of a mark of
    `marked`."""
    factors = {n.input[1] for n in marked.graph.node if (n.domain, n.op_type) == SMOOTH}
    return {n.output[0] for n in model.graph.node if n.op_type == "Div" and n.input[1] in factors}


def divided_products(model: onnx.ModelProto, marked: onnx.ModelProto) -> int:
    """How many MatMul and Gemm nodes of `model` (a quantization's result) read an activation
    divided by the factors of a mark of `marked` (`smoothing_marks`' model): products the
    quantization kept in float behind their smoothing Div, which patterns/quant/smooth.rules'
    quant-unsmooth folds back into their weights."""
    divided = _divisions(model, marked)
    return sum(
        n.op_type in SMOOTHED_PRODUCTS and not n.domain and n.input[0] in divided
        for n in model.graph.node
    )


def _feedback(h: np.ndarray) -> np.ndarray:
    """The strictly upper triangular F [K, K] (float32) of H = (I + F) D (I + F)^T, D diagonal,
    for a symmetric positive definite H [K, K] (float32): GPTQ's rounding in its LDL form
    (LDLQ, Chee et al., "QuIP: 2-Bit Quantization of Large Language Models With Guarantees",
    NeurIPS 2023, section 3.2, where it is shown to round as GPTQ does): row k of the weight
    is rounded after adding sum_j<k F_jk (w_j - w~_j). With P the reversal of the K axis and
    L the Cholesky factor of P H P, P L P is upper triangular with H = (P L P)(P L P)^T, and
    I + F is it with its columns divided by their diagonal entries: one Cholesky factorization,
    no inverse. Raises numpy.linalg.LinAlgError when H is not positive definite."""
    upper = _cholesky(np.ascontiguousarray(h[::-1, ::-1]))[::-1, ::-1]
    out = upper / np.diag(upper)[None, :]
    np.fill_diagonal(out, 0.0)
    return np.ascontiguousarray(out, dtype=np.float32)


def _cholesky(a: np.ndarray) -> np.ndarray:
    """The lower Cholesky factor of the symmetric positive definite `a` [K, K], by blocks of
    CHOLESKY_BLOCK columns (right-looking: each block's factor, the panel below it by its
    inverse, the rest updated by one matrix product), so that nearly all the work is in
    matrix products: K = 3072 in 0.19-0.25 s against numpy.linalg.cholesky's 0.50 s (float32,
    2 cores, by hand). Raises numpy.linalg.LinAlgError when `a` is not positive definite."""
    k = a.shape[0]
    rest = a.copy()
    lower = np.zeros_like(a)
    for j in range(0, k, CHOLESKY_BLOCK):
        e = min(j + CHOLESKY_BLOCK, k)
        block = np.linalg.cholesky(rest[j:e, j:e])
        lower[j:e, j:e] = block
        if e < k:
            panel = rest[e:, j:e] @ np.linalg.inv(block).T
            lower[e:, j:e] = panel
            rest[e:, e:] -= panel @ panel.T
    return lower


# the levels a quantization rule rounds a weight onto (`calibrated_rounding`'s `grid`): "pairs",
# int8 per output column stepped for int16 pair sums (`pair_steps`, the dynamic rules);
# "full", int8 per output column over the full range (`full_range_steps`, `--cpu vnni`);
# "block4" and "block8", blocks of 32 along K in 4 or 8 bits (`block_steps`, weight-only)
GRID_HALF = {"block4": 8, "block8": 128}  # a block grid's levels: [-half, half - 1]
GRIDS = ("pairs", "full", *GRID_HALF)


def grid_steps(w: np.ndarray, grid: str) -> np.ndarray:
    """The steps of `grid` (`GRIDS`) for a float32 weight [K, N], per entry as it broadcasts:
    [1, N] for the per-column grids, [K, N] for the block grids (signed: a block's entry of the
    largest magnitude is the level -half, `vocab.registry.block_steps`)."""
    if grid == "pairs":
        return pair_steps(w, per_column=True)[None]
    if grid == "full":
        return full_range_steps(w)[None]
    return np.repeat(block_steps(w, GRID_HALF[grid]), WEIGHT_ONLY_BLOCK, axis=0)


def _grid_levels(grid: str) -> tuple[np.float32, np.float32]:
    """The lowest and highest level of `grid`: +-127 (int8 rules), [-half, half - 1] (blocks)."""
    half = GRID_HALF.get(grid)
    if half is None:
        return -np.float32(PAIR_LEVELS), np.float32(PAIR_LEVELS)
    return np.float32(-half), np.float32(half - 1)


def _nearest_levels(w32: np.ndarray, steps: np.ndarray, grid: str) -> np.ndarray:
    """Each entry of `w32` at its nearest level of `grid` (its `steps`), clipped to the grid's
    levels: the integers q (float32) of round-to-nearest."""
    low, high = _grid_levels(grid)
    return np.clip(np.rint(w32 / steps), low, high)


def nearest_rounding(w: np.ndarray, grid: str) -> np.ndarray:
    """`w` [K, N] rounded to the nearest levels of `grid` (`GRIDS`), as its rule rounds it
    without `--rounding gptq`: q * step, float32 [K, N]."""
    w32 = w.astype(np.float32)
    steps = grid_steps(w32, grid)
    return (_nearest_levels(w32, steps, grid) * steps).astype(np.float32)


def calibrated_rounding(w: np.ndarray, hessian: np.ndarray, grid: str) -> np.ndarray:
    """GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative
    Pre-trained Transformers", ICLR 2023, Algorithm 1): the weight `w` [K, N] (float32) rounded
    to the levels of a quantization rule's `grid` (`GRIDS`: int8 steps per output column,
    `vocab.registry.pair_steps(w, per_column=True)` for "pairs" and `full_range_steps` for
    "full"; weight-only's blocks of 32 along K, `block_steps`, for "block4" and "block8"), row by
    row along K, each row's rounding error spread over the rows not yet rounded so that
    ||X (w~ - w)|| stays small on the calibration activations X whose H = X^T X is `hessian`
    [K, K] (float32). Returns w~ = q * step, float32 [K, N], q integers within the grid's levels
    (`_grid_levels`). The errors are spread in GPTQ's LDL form (`_feedback`), which needs no
    inverse of H, by blocks of GPTQ_BLOCK rows (GPTQ's lazy batches: the rows after a block get
    its errors in one matrix product). The steps are w's, fixed before the rounding (for blocks,
    GPTQ's "static groups").

    The rules that quantize w~ compute their steps from it; so that they find these steps and
    round w~ to exactly q, the entries that define each step keep their levels
    (`_step_defining_levels`: 127 for a column's largest |w|; for pairs, a neighbour pair whose
    sum defines the step sums to 127 levels; a block's entry of the largest magnitude at -half,
    a block of zeros at 0), and no other entry exceeds them: |q_k| <= 127 and, for pairs,
    |q_k + q_k+1| <= 127; a block's levels are [-half, half - 1]. A column where this does not
    hold in float32 (it always has here) keeps its nearest-level rounding. H gets GPTQ_DAMPING
    of its mean diagonal added (10 and 100 times that if the factorization fails in float32;
    the nearest levels if it still does); rows that no calibration input reaches (H_kk = 0)
    round to nearest. The columns are independent: weights that read one activation may be
    rounded together, side by side. Raises ValueError for a grid not in `GRIDS`."""
    if grid not in GRIDS:
        raise ValueError(f"calibrated_rounding: unknown grid {grid!r} (one of {', '.join(GRIDS)})")
    k, n = w.shape
    w32 = w.astype(np.float32)
    steps = grid_steps(w32, grid).astype(np.float32)
    pairs = grid == "pairs"
    low, high = _grid_levels(grid)
    nearest = _nearest_levels(w32, steps, grid)
    h = np.array(hessian, np.float32)
    unseen = np.diag(h) == 0
    h[unseen, unseen] = 1.0
    mean = float(np.mean(np.diag(h)))
    # GPTQ's act-order: rows of larger H_kk (activations that weigh more) first, while most rows
    # are left to take their errors (`GPTQ_ACT_ORDER`)
    by_weight = grid in GPTQ_ACT_ORDER
    order = np.argsort(-np.diag(h), kind="stable") if by_weight else np.arange(k)
    h = h[np.ix_(order, order)]
    f = None
    for damping in (GPTQ_DAMPING, 10 * GPTQ_DAMPING, 100 * GPTQ_DAMPING):
        try:  # float32; more damping if the factorization fails
            f = _feedback(h + np.float32(damping * mean) * np.eye(k, dtype=np.float32))
        except np.linalg.LinAlgError:
            continue
        if np.all(np.isfinite(f)):
            break
        f = None
    if f is None:  # H too far from positive definite even damped: the nearest levels
        return (nearest * steps).astype(np.float32)
    fixed = _step_defining_levels(w32, steps, grid)
    natural, rows = (w32, steps), len(steps) == k  # steps per row (blocks) or per column
    w32, unseen, fixed, nearest = w32[order], unseen[order], fixed[order], nearest[order]
    steps = steps[order] if rows else steps
    target = w32.copy()  # each row plus the errors of the rows rounded before it
    q = np.zeros((k, n), np.float32)
    prev = np.zeros(n, np.float32)
    has_fixed = ~np.isnan(fixed).all(axis=1)  # rows holding a step-defining entry
    inverse_steps = np.float32(1) / steps
    row_of = (lambda r: r) if rows else (lambda r: 0)  # a row's steps
    for i1 in range(0, k, GPTQ_BLOCK):
        i2 = min(i1 + GPTQ_BLOCK, k)
        errors = np.zeros((i2 - i1, n), np.float32)
        block = f[i1:i2, i1:i2].T.copy()  # row j: the feedback from the block's rows before j
        for j in range(i2 - i1):
            r = i1 + j
            if unseen[r]:
                here = nearest[r]
            else:  # the row plus the errors of this block's rows before it (one gemv)
                here = np.rint((target[r] + block[j, :j] @ errors[:j]) * inverse_steps[row_of(r)])
                if pairs:  # this row's pair with the one before, and with a fixed one after
                    lo, hi = np.maximum(-high - prev, low), np.minimum(high - prev, high)
                    if r + 1 < k and has_fixed[r + 1]:
                        after = fixed[r + 1]
                        known = ~np.isnan(after)
                        lo = np.where(known, np.maximum(lo, -high - after), lo)
                        hi = np.where(known, np.minimum(hi, high - after), hi)
                    here = np.clip(here, lo, hi)
                else:
                    here = np.clip(here, low, high)
                if has_fixed[r]:
                    here = np.where(np.isnan(fixed[r]), here, fixed[r])
            q[r] = prev = here
            errors[j] = w32[r] - here * steps[row_of(r)]
        target[i2:] += f[i1:i2, i2:].T @ errors
    w32, steps = natural
    q[order], nearest[order] = q.copy(), nearest.copy()  # back to K's order
    out = (q * steps).astype(np.float32)
    differs = (np.rint(out / grid_steps(out, grid)) != q).any(axis=0)
    if differs.any():  # keep the rules' rounding exact: such a column rounds to nearest
        out[:, differs] = (nearest * steps)[:, differs]
    return out


def _side_by_side(ids: list[int], sizes: list[int]) -> list[list[int]]:
    """`ids` in runs of consecutive items whose `sizes` (weight elements) add up to at most
    GPTQ_SIDE_BY_SIDE (an item larger than that alone): the weights rounded together, so that
    the rounding's [K, N] work arrays (about eight) stay bounded when many products read one
    activation (a mixture of experts)."""
    runs: list[list[int]] = []
    total = 0
    for i, size in zip(ids, sizes):
        if runs and total + size <= GPTQ_SIDE_BY_SIDE:
            runs[-1].append(i)
            total += size
        else:
            runs.append([i])
            total = size
    return runs


def _step_defining_levels(w: np.ndarray, steps: np.ndarray, grid: str) -> np.ndarray:
    """Per column of `w` [K, N], the levels of the entries that define its steps `steps`
    (`grid_steps`; NaN elsewhere): its largest |w_k| at +-127, or for pairs, when a neighbour
    pair's |w_k + w_k+1| is larger, w_k's nearest level and w_k+1's the rest of +-127; for
    blocks, each block's entry of the largest magnitude at -half (its step is that entry over
    -half), and every entry of a block of zeros at 0 (its step, 1, is the rule's for zeros)."""
    k, n = w.shape
    levels = np.float32(PAIR_LEVELS)
    fixed = np.full((k, n), np.nan, np.float32)
    cols = np.arange(n)
    half = GRID_HALF.get(grid)
    if half is not None:  # the entry equal to its block's -half levels (the first, on a tie)
        blocks = w.reshape(k // WEIGHT_ONLY_BLOCK, WEIGHT_ONLY_BLOCK, n)
        m = (steps * np.float32(-half)).reshape(k // WEIGHT_ONLY_BLOCK, WEIGHT_ONLY_BLOCK, n)
        at = (blocks == m).argmax(axis=1)
        rows = np.arange(k // WEIGHT_ONLY_BLOCK)[:, None] * WEIGHT_ONLY_BLOCK + at
        fixed[rows, cols[None, :]] = np.float32(-half)
        zero = np.repeat((blocks == 0).all(axis=1), WEIGHT_ONLY_BLOCK, axis=0)
        fixed[zero] = 0.0
        return fixed
    a = np.abs(w)
    top = a.argmax(axis=0)
    if grid != "pairs" or k == 1:
        fixed[top, cols] = np.sign(w[top, cols]) * levels
        return fixed
    sums = np.abs(w[:-1] + w[1:])
    by_pair = sums.max(axis=0) > a.max(axis=0)
    top = np.where(by_pair, sums.argmax(axis=0), top)
    after = np.minimum(top + 1, k - 1)
    sign = np.sign(np.where(by_pair, w[top, cols] + w[after, cols], w[top, cols]))
    first = np.clip(np.rint(w[top, cols] / steps[0]), -levels, levels)
    fixed[top, cols] = np.where(by_pair, first, sign * levels)
    fixed[after[by_pair], cols[by_pair]] = (sign * levels - first)[by_pair]
    return fixed


def held_out_feeds(n: int) -> int:
    """How many of `n` calibration feeds `rounding_marks` holds out to judge GPTQ's rounding
    against the nearest levels: the last quarter, at least one, of two or more (none of one)."""
    return 0 if n < 2 else max(1, n // 4)


def _activation_values(
    model: onnx.ModelProto, feeds: list[dict], names: set[str]
) -> dict[str, list[np.ndarray]]:
    """The value of each activation in `names` per feed (float32, NaN as 0; a feed that does not
    give one as float32 of rank >= 1 and some elements leaves it out): {name: [value, ...]}."""
    values: dict[str, list[np.ndarray]] = {}
    for got in _activations(model, feeds, names):
        for name, v in got.items():
            if v.dtype == np.float32 and v.ndim >= 1 and v.size:
                values.setdefault(name, []).append(np.nan_to_num(v))
    return values


def _gram(parts: list[np.ndarray]) -> np.ndarray | float:
    """sum X^T X over the row blocks `parts` (float32 [R_i, K]) as one product of them
    concatenated (a product per calibration input would write the whole [K, K] each time,
    most of the work where an input gives few rows for a large K: ResNet-50's last Convs, 49
    rows, K = 4608; `conv_patches`' limit keeps them within GPTQ_PATCH_ELEMENTS). 0.0 for no
    parts."""
    if not parts:
        return 0.0
    x = np.concatenate(parts) if len(parts) > 1 else parts[0]
    return x.T @ x


def _read_weights_directly(g: onnx.GraphProto, weights: dict) -> None:
    """Make the nodes of `g` that read an initializer through Identity nodes (TorchScript
    exports ALBERT's shared layers so: one Identity per layer and weight) read the initializer
    itself, in place; graph outputs and the Identity nodes stay (the cleanup drops them)."""
    alias: dict[str, str] = {}
    for n in g.node:
        if n.op_type == "Identity" and not n.domain and n.input and n.output:
            source = alias.get(n.input[0], n.input[0])
            if source in weights:
                alias[n.output[0]] = source
    if alias:
        for n in g.node:
            if n.op_type != "Identity":
                for i, v in enumerate(n.input):
                    if v in alias:
                        n.input[i] = alias[v]


def _unit_values(
    values: dict[str, list[np.ndarray]], names: tuple[str, ...], n_feeds: int, geometry
) -> list | None:
    """The activation values a unit of products reads, per feed: one activation's as they are;
    several activations' (the layers that share a weight) per feed: for a MatMul their rows
    [R, K] one after the other, for a Conv (`geometry`) a tuple of their [B, C, H, W] values,
    whose sizes may differ (a detection head's Convs shared across pyramid levels): their
    patches are taken one by one (`_Hessians`). None when a feed gave one of them no value."""
    if len(names) == 1:
        return values[names[0]]
    per = [values[n] for n in names]
    if any(len(p) != n_feeds for p in per):
        return None
    if geometry is not None:
        return [tuple(p[i] for p in per) for i in range(n_feeds)]
    return [np.concatenate([p[i].reshape(-1, p[i].shape[-1]) for p in per]) for i in range(n_feeds)]


def _patches(v, geometry: tuple, limit: int) -> np.ndarray:
    """`conv_patches` of one feed's value `v` [B, C, H, W], or of each of a tuple of them (the
    activations of Convs that share a weight, `_unit_values`), their rows one after the other,
    each within its share of `limit`."""
    if isinstance(v, tuple):
        return np.concatenate([conv_patches(a, *geometry, limit=limit // len(v)) for a in v])
    return conv_patches(v, *geometry, limit=limit)


class _Hessians:
    """H = X^T X of one activation's products over the calibration feeds (`values`, one per feed
    of `n_feeds`; for Convs that share a weight a tuple of their activations, `_unit_values`),
    on the feeds but the last `held` (`fit`) and on all of them (`every`), and the held-out
    feeds' rows (`check`, float32 [R, K]; `fitted`: how many rows the others give,
    0 when a feed gave no value). Without `geometry`, a product's rows: every leading axis, K
    the last, all kept (few: tokens), and each H one product of the rows it covers (a sum of
    per-feed products would round other float32 sums, which moved a budget row, docs/
    benchmarks.md). With a Conv's `geometry` (`_conv_geometry`), its patches in QLinearConv's
    K order (`conv_patches`; a sample of a feed's output positions when all of them would be
    more than GPTQ_PATCH_ELEMENTS / n_feeds elements), H on all the feeds is the fitted ones'
    (`_gram`) plus the held-out ones': a Conv's rows are many (one per output position), and
    one product over all of them again would be most of the rounding's time."""

    def __init__(self, values: list, n_feeds: int, held: int, geometry: tuple | None = None):
        self._fit = self._every = None
        first = max(0, n_feeds - held)  # the first held-out feed
        if len(values) != n_feeds:
            self.check, self.fitted = np.zeros((0, 0), np.float32), 0
        elif geometry is None:
            x = [v.reshape(-1, v.shape[-1]) for v in values]
            self.fitted = sum(len(r) for r in x[:first])
            self._rows = np.concatenate(x) if len(x) > 1 else x[0]
            self.check = self._rows[self.fitted :]
        else:
            limit = GPTQ_PATCH_ELEMENTS // n_feeds
            fit = [_patches(v, geometry, limit) for v in values[:first]]
            self.fitted = sum(len(r) for r in fit)
            self._fit = _gram(fit)
            check = [_patches(v, geometry, limit) for v in values[first:]]
            self._every = self._fit + _gram(check) if check else self._fit
            self.check = np.concatenate(check) if check else np.zeros((0, 0), np.float32)

    def fit(self) -> np.ndarray:
        """H over the fitted feeds' rows, float32 [K, K] (0.0 with none)."""
        if self._fit is None:
            self._fit = self._rows[: self.fitted].T @ self._rows[: self.fitted]
        return self._fit

    def every(self) -> np.ndarray:
        """H over every feed's rows, float32 [K, K]."""
        if self._every is None:
            self._every = self._rows.T @ self._rows
        return self._every


def _conv_geometry(n: onnx.NodeProto, w: np.ndarray, one_d: bool = False) -> tuple | None:
    """(kernel, strides, pads, dilations) of Conv `n` by the 4-D weight `w` [C_out, C_in, kh,
    kw] when GPTQ rounds it (group 1); else None. `one_d`: `n` is a 1-D Conv and `w` its weight
    as the 2-D form's over (1, L) (kh = 1; without auto_pad: `vocab.registry.conv2d_ints_of_1d`
    and `conv2d_pads_of_1d` give the attributes). The pads are explicit [top, left, bottom,
    right], or with auto_pad its name (VALID, SAME_UPPER, SAME_LOWER), which `conv_patches`
    turns into pads for its input's size."""
    attrs = _attrs(n)
    auto = attrs.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if one_d and auto != "NOTSET":
        return None
    if one_d:
        attrs = {
            "kernel_shape": conv2d_ints_of_1d(attrs.get("kernel_shape") or w.shape[3:]),
            "strides": conv2d_ints_of_1d(attrs.get("strides")),
            "pads": conv2d_pads_of_1d(attrs.get("pads")),
            "dilations": conv2d_ints_of_1d(attrs.get("dilations")),
            "group": attrs.get("group", 1),
        }
    if w.ndim != 4 or attrs.get("group", 1) != 1 or auto not in AUTO_PADS:
        return None
    kernel = tuple(w.shape[2:])
    if tuple(attrs.get("kernel_shape", kernel)) != kernel:
        return None
    return (
        kernel,
        tuple(attrs.get("strides", (1, 1))),
        tuple(attrs.get("pads", (0, 0, 0, 0))) if auto == "NOTSET" else auto,
        tuple(attrs.get("dilations", (1, 1))),
    )


def _auto_pads(auto: str, size, kernel, strides, dilations) -> tuple[int, int, int, int]:
    """Explicit pads [top, left, bottom, right] of an ONNX Conv's `auto_pad` on an input of
    spatial `size` (H, W). ONNX Conv spec: VALID pads nothing; SAME_UPPER and SAME_LOWER pad
    so that the output is ceil(size / stride), the odd one at the end for SAME_UPPER and at
    the beginning for SAME_LOWER."""
    if auto == "VALID":
        return (0, 0, 0, 0)
    head, tail = [], []
    for n, k, s, d in zip(size, kernel, strides, dilations):
        total = max(0, (-(-n // s) - 1) * s + (k - 1) * d + 1 - n)
        small = total // 2
        head.append(small if auto == "SAME_UPPER" else total - small)
        tail.append(total - head[-1])
    return (head[0], head[1], tail[0], tail[1])


def conv_patches(
    x: np.ndarray, kernel, strides, pads, dilations, limit: int | None = None
) -> np.ndarray:
    """The patches a 2-D Conv (ONNX Conv: group 1, `pads` [top, left, bottom, right] or an
    auto_pad's name, `_auto_pads`) multiplies
    its weight by, as rows [B * OH * OW, kh * kw * C] of `x` [B, C, H, W] (or [B, C, L], a 1-D
    Conv's input, as [B, C, 1, L]; float32): one row per
    output position, its K in QLinearConv's order (kernel positions, input channels fastest:
    `vocab.registry.conv_pair_steps`), so that Conv(x, w)[b, :, i, j] is the row's product with
    `conv_weight_rows(w)`. With `limit`, when all of them would be more than `limit` elements,
    limit // K of the positions (at least one), drawn without replacement by a fixed seed and
    kept in order (a fixed stride would take the same columns of every output row), copied
    alone."""
    (kh, kw), (sh, sw), (dh, dw) = kernel, strides, dilations
    x = x[:, :, None, :] if x.ndim == 3 else x  # a 1-D Conv's input [B, C, L] as (1, L) images
    if isinstance(pads, str):
        pads = _auto_pads(pads, x.shape[2:], kernel, strides, dilations)
    x = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    reach = ((kh - 1) * dh + 1, (kw - 1) * dw + 1)
    win = np.lib.stride_tricks.sliding_window_view(x, reach, axis=(2, 3))
    win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # [B, C, OH, OW, kh, kw], a view
    b, _, oh, ow = win.shape[:4]
    k = kh * kw * x.shape[1]
    if limit is not None and b * oh * ow * k > limit:
        keep = max(1, limit // k)
        picked = np.sort(np.random.default_rng(0).choice(b * oh * ow, keep, replace=False))
        n, i, j = np.unravel_index(picked, (b, oh, ow))
        return np.ascontiguousarray(win[n, :, i, j].transpose(0, 2, 3, 1).reshape(keep, k))
    rows = win.transpose(0, 2, 3, 4, 5, 1).reshape(-1, k)
    return np.ascontiguousarray(rows, dtype=np.float32)


def conv_weight_rows(w: np.ndarray) -> np.ndarray:
    """A Conv weight [C_out, C_in, kh, kw] as the [K, C_out] matrix `conv_patches`' rows
    multiply, K in QLinearConv's order (kernel positions, input channels fastest)."""
    return np.moveaxis(w, 1, -1).reshape(w.shape[0], -1).T


def conv_weight_of_rows(rows: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The Conv weight of `shape` [C_out, C_in, kh, kw] whose `conv_weight_rows` are `rows`."""
    c_out, c_in, kh, kw = shape
    return np.ascontiguousarray(np.moveaxis(rows.T.reshape(c_out, kh, kw, c_in), -1, 1))


def _split(together: np.ndarray, ws: list[np.ndarray]) -> list[np.ndarray]:
    """The columns of `together` [K, sum N] back as one array per weight of `ws`."""
    return np.split(together, np.cumsum([w.shape[1] for w in ws])[:-1], axis=1)


def _held_out_error(rounded: np.ndarray, w: np.ndarray, x: np.ndarray) -> float:
    """||X (rounded - w)||^2 over the held-out rows `x` [R, K] (float32; R is a few hundred, so
    this costs R K N where the same through H = X^T X would cost K^2 N)."""
    return float(np.square(x @ (rounded - w.astype(np.float32))).sum(dtype=np.float64))


def _product_name(n: onnx.NodeProto) -> str:
    return n.name or n.output[0]


def rounding_marks(
    model: onnx.ModelProto,
    feeds: list[dict],
    grid: str,
    convs: bool = False,
    progress: Callable[[str], None] | None = None,
) -> tuple[onnx.ModelProto, int, list[str]]:
    """A copy of `model` in which the weight w of each product a quantization rule of `grid`
    (`GRIDS`) quantizes is read through `rewrite.Rounded(w, w~)` (patterns/quant/rounding.rules),
    w~ its GPTQ rounding onto that grid (`calibrated_rounding`, H = X^T X of the product's
    activation X over the calibration `feeds`, rows over every leading axis), and how many were
    marked. Such a product is, for the int8 grids (the dynamic per-column rules and the static
    rules), a MatMul or a Gemm (transA 0, alpha and beta 1), and for the block grids (the
    weight-only rules) such a MatMul or Gemm whose K is a multiple of 32, by a 2-D float32
    initializer of 1 <= K <= GPTQ_MAX_K that is not all zeros, whose activation is float32 of K
    on its last axis (a larger K keeps its nearest levels). With `convs` (the static rules), a
    2-D Conv of group 1 (explicit pads or auto_pad) by a 4-D float32 initializer [C_out, C_in,
    kh, kw] too: its weight rounded as the [K, C_out] matrix of QLinearConv's K order
    (`conv_weight_rows`, K = kh kw C_in), X its input's patches (`conv_patches`); and a 1-D
    Conv (group 1, explicit pads) as its 2-D form over (1, L), the one quantize-conv-static
    takes. The products of one weight (ALBERT's layers share theirs, read through an Identity
    each in TorchScript's export) in one layout (a Gemm's transB, a Conv's geometry) get one
    w~, rounded on the rows of all their activations (H the sum of theirs), so that the weight
    stays one initializer, rounded once;
    the weights of products that read the same activations (an attention block's Q, K and V;
    Convs of one input and geometry) are rounded together, side by side, with one
    factorization of their H.

    GPTQ fits the calibration inputs; with few of them for a large K it fits them and not
    others (a Llama-style decoder, 8 inputs of 128 tokens, K = 1024 and 2816: 46 of 56 weights
    erred more on other inputs than their nearest levels, docs/benchmarks.md). So the last
    `held_out_feeds` feeds are held out first: each weight is rounded on the others' H and
    judged on theirs, ||X (w~ - w)|| against the nearest levels'; a weight that errs more keeps
    its nearest levels (no mark), the rest are rounded again on every feed's H. Returns (the
    model, the number of weights marked, the names of the products kept at their nearest
    levels that way). `progress`, when given, is called with how many of the weights are done
    before each activation's are rounded ("12 of 53 weights"). Raises CheckError when
    onnxruntime cannot run the model."""
    blocks = grid in GRID_HALF
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    weights = {t.name: t for t in g.initializer}
    _read_weights_directly(g, weights)
    flipped = _transposed_weights(g, weights)
    # (node, weight [K, N], its layout: "transposed", a Conv's geometry or None, and where it
    # reads the initializer: (node, input slot), the product's own or a Transpose's)
    products = []
    arrays: dict[str, np.ndarray] = {}  # one array per initializer, however many products
    for n in g.node:
        attrs = _attrs(n)
        w, layout, at = _smoothable_weight(n, weights, arrays), None, (n, 1)
        matmul = n.op_type == "MatMul" and not n.domain and n.input[1:2]
        t = flipped.get(n.input[1]) if matmul else None
        if w is None and t is not None:  # MatMul(x, Transpose(w)): a shared or tied weight
            w, layout, at = _array(weights[t.input[0]], arrays).T, "transposed", (t, 0)
        if w is None and convs:
            w, layout = _conv_weight(n, weights, arrays)
        elif w is not None and attrs.get("transB", 0):  # a Gemm's weight stored [N, K]
            layout = "transposed"
        if w is None or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            continue
        if blocks and (isinstance(layout, tuple) or w.shape[0] % WEIGHT_ONLY_BLOCK):
            # the weight-only rules quantize a MatMul in whole blocks, and a Gemm as its
            # MatMul plus the bias (patterns/quant/weight_only.rules' gemm-as-matmul-add; a
            # transB = 1 Gemm's MatMul reads Transpose(Rounded(w, w~)), which
            # rounding.rules' transpose-of-rounded makes Rounded(w^T, w~^T))
            continue
        if 1 <= w.shape[0] <= GPTQ_MAX_K and w.size and np.any(w != 0):
            products.append((n, w, layout, at))
    if not products:
        return out, 0, []
    held = held_out_feeds(len(feeds))
    values = _activation_values(out, feeds, {p[0].input[0] for p in products})
    # the products of one weight (ALBERT's layers share theirs) are one unit: one w~, rounded
    # on the rows of all their activations (H the sum), so the weight stays one initializer
    units: dict[tuple, list[int]] = {}
    for i, (n, w, layout, (holder, slot)) in enumerate(products):
        geometry = layout if isinstance(layout, tuple) else None
        v = values.get(n.input[0], [None])[0]
        if v is None or (geometry is not None and v.ndim not in (3, 4)):
            continue
        k = v.shape[-1] if geometry is None else v.shape[1] * int(np.prod(geometry[0]))
        if k == w.shape[0]:
            units.setdefault((holder.input[slot], layout), []).append(i)
    readers: dict[tuple, list[tuple[int, ...]]] = {}  # (activations, geometry) -> units
    for (_, layout), ids in units.items():
        geometry = layout if isinstance(layout, tuple) else None
        names = tuple(sorted({products[i][0].input[0] for i in ids}))
        readers.setdefault((names, geometry), []).append(tuple(ids))
    rounding: dict[tuple[int, ...], np.ndarray] = {}
    nearer: list[str] = []  # products whose GPTQ rounding erred more on the held-out inputs
    total, done = sum(len(us) for us in readers.values()), 0
    for (names, geometry), group in readers.items():  # one H: one factorization
        if progress is not None:
            progress(f"{done} of {total} weights")
        done += len(group)
        rows = _unit_values(values, names, len(feeds), geometry)
        h = _Hessians(rows, len(feeds), held, geometry) if rows is not None else None
        if h is None or not h.fitted:
            continue
        for chunk in _side_by_side(group, [products[u[0]][1].size for u in group]):
            ws = [products[u[0]][1] for u in chunk]
            if held:  # rounded on the other inputs, judged on the held-out ones
                trial = _split(calibrated_rounding(np.concatenate(ws, axis=1), h.fit(), grid), ws)
                better = [
                    _held_out_error(t, w, h.check)
                    < _held_out_error(nearest_rounding(w, grid), w, h.check)
                    for t, w in zip(trial, ws)
                ]
                nearer += [
                    _product_name(products[i][0]) for u, b in zip(chunk, better) if not b for i in u
                ]
                chunk = [u for u, b in zip(chunk, better) if b]
                ws = [products[u[0]][1] for u in chunk]
            if chunk:  # rounded again on every input's rows
                together = calibrated_rounding(np.concatenate(ws, axis=1), h.every(), grid)
                rounding.update(zip(chunk, _split(together, ws)))
        del h, rows
    del values
    taken = _taken_names(g)
    marks = []
    for unit, rounded in rounding.items():
        _, _, layout, (holder, slot) = products[unit[0]]
        weight = holder.input[slot]
        if layout == "transposed":
            rounded = rounded.T
        elif layout is not None:  # a Conv's, or a 1-D Conv's in its (1, k) form
            dims = tuple(weights[weight].dims)
            shape = (*dims[:2], 1, dims[2]) if len(dims) == 3 else dims
            rounded = conv_weight_of_rows(rounded, shape).reshape(dims)
        tensor = numpy_helper.from_array(rounded, unique_name(f"{weight}_rounded", taken))
        _add_initializers(out, [tensor])
        read = unique_name(f"{weight}_marked", taken)
        g.value_info.append(  # the weight's type: shape inference does not see through a mark
            helper.make_tensor_value_info(read, onnx.TensorProto.FLOAT, list(tensor.dims))
        )
        marks.append(
            helper.make_node(
                ROUNDED[1],
                [weight, tensor.name],
                [read],
                name=unique_name(f"{weight}/rounded", taken),
                domain=ROUNDED[0],
            )
        )
        for i in unit:
            holder, slot = products[i][3]
            holder.input[slot] = read
    _place_marks(out, marks)
    return out, len(marks), nearer


def _attrs(n: onnx.NodeProto) -> dict:
    """Node `n`'s attributes, {name: value}."""
    return {a.name: helper.get_attribute_value(a) for a in n.attribute}


def _conv_weight(
    n: onnx.NodeProto, weights: dict, arrays: dict | None = None
) -> tuple[np.ndarray | None, tuple | None]:
    """(`conv_weight_rows` of Conv `n`'s weight, its `_conv_geometry`) when `n` is a Conv
    `rounding_marks` rounds (by a 4-D float32 initializer, or a 3-D one of a 1-D Conv, taken
    as its 2-D form over (1, L) with kernel (1, k), static.rules' conv1d-as-conv2d); else
    (None, None). `arrays` as `_smoothable_weight`'s."""
    if n.domain or n.op_type != "Conv" or len(n.input) < 2:
        return None, None
    t = weights.get(n.input[1])
    if t is None or t.data_type != onnx.TensorProto.FLOAT or len(t.dims) not in (3, 4):
        return None, None
    w = _array(t, arrays)
    one_d = w.ndim == 3
    w = w[:, :, None, :] if one_d else w  # a 1-D Conv's weight as its (1, k) form's
    geometry = _conv_geometry(n, w, one_d)
    return (None, None) if geometry is None else (conv_weight_rows(w), geometry)
