"""ONNX frontend: load, import, optimize, export, check, save.

`optimize_model` is the whole ONNX path as a function; the `rewrite optimize` CLI is a thin
shell around it.
"""

from __future__ import annotations

import os
import secrets
import time
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

import onnx

from frontends.onnx import external
from frontends.onnx.check import compare
from frontends.onnx.exporter import MAX_OPSET, export_model
from frontends.onnx.external import ExternalDataError, check_locations, load_small_tensors
from frontends.onnx.importer import default_opset, import_model, skeleton
from frontends.onnx.opset import OpsetError, auto_target, convert_opset
from rewrite.saturate import Limits

__all__ = [
    "ModelError",
    "OpsetError",
    "Output",
    "load_model",
    "optimize_model",
    "prepare_output",
    "save_model",
    "compare",
    "import_model",
    "export_model",
]


class ModelError(ValueError):
    """A model file that cannot be used: missing, not ONNX, or rejected by onnx.checker."""


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Read and validate an ONNX model file. Raises ModelError with a one-line reason.

    External data is not read: its locations are checked first (inside the model's folder,
    not through a symlink out of it, see `frontends.onnx.external`), then the main graph's
    initializers stay in their files, to be mapped by `optimize_model(..., folder=)`; other
    external tensors (subgraphs, attributes) are read into the model."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file")
    if not p.is_file():
        raise ModelError(f"{p}: not a file")
    try:
        model = onnx.load(str(p), load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError and friends
        raise ModelError(f"{p}: not an ONNX model ({type(e).__name__})") from None
    if not model.HasField("graph") or not model.opset_import:
        raise ModelError(f"{p}: not an ONNX model (no graph or no opset import)")
    try:
        check_locations(model, p.parent)
    except ExternalDataError as e:
        raise ModelError(f"{p}: {e}") from None
    try:
        onnx.checker.check_model(str(p))  # by path: the C++ checker reads the file itself
    except onnx.checker.ValidationError as e:
        raise ModelError(
            f"{p}: rejected by onnx.checker: {str(e).strip().splitlines()[0]}"
        ) from None
    opset = default_opset(model)
    if opset > MAX_OPSET:
        raise ModelError(f"{p}: opset {opset} is newer than onnxruntime supports (<= {MAX_OPSET})")
    load_small_tensors(model, p.parent)
    return model


def optimize_model(model: onnx.ModelProto, rules, *, opset: int | None = None, **kw):
    """Optimize an ONNX model with a RuleSet: the engine-level call under
    `rewrite.optimize_model` (`frontends.onnx.api`, which takes a path, the CLI's option names
    and runs the output check). Other keyword arguments go to `rewrite.optimize`.

    opset: convert the model to this default-domain opset first (`frontends.onnx.opset`,
    `onnx.version_converter`), then optimize it with the rules whose ops exist at that opset;
    the result is at `opset` even when no rule made it cheaper. Raises OpsetError when it
    cannot be converted. Without it, a model older than the op table's forms (opset < 13) is
    converted to `UPGRADE_OPSET` so that the rules apply, and kept only if that made it
    cheaper with no more nodes (else the original comes back, at its own opset); if the
    converter fails, the model is optimized at its own opset (rules needing a newer one do not
    fire). `report.extra["opset"]` says what was done: `input`, `output`, `converted`, and
    `note` (why not) when an automatic conversion was dropped.

    Returns (optimized ModelProto, Report). When nothing cheaper is found the original model
    object is returned. Raises onnx.checker.ValidationError if the result fails the checker
    (a bug in the engine, never silently written). `report.seconds` gains the ONNX stages:
    `onnx-import` (shape inference and the TermGraph), `export` and `checker`.

    `folder`: where the model's external data is, if `load_model` left it there (see
    `import_model`). `limits` (a `rewrite.saturate.Limits`) bound the whole call: a deadline
    already past on entry (`limit_stage` "load": the caller spent the time) or after the
    import returns the model unchanged; later, the best graph found so far is exported (see
    `rewrite.optimize`).
    """
    clock = time.perf_counter()
    source = default_opset(model)
    target = opset if opset is not None else auto_target(model)
    info: dict = {"input": source, "output": source, "converted": False}
    work = model
    if target is not None and target != source:
        try:
            work = convert_opset(model, target)
            info.update(output=target, converted=True)
        except OpsetError as e:
            if opset is not None:
                raise
            info["note"] = str(e)
    t_convert = time.perf_counter() - clock
    if info["converted"]:
        result, report = _rounds(work, rules, **kw)
    else:
        result, report = _optimize_model(work, rules, **kw)
    if opset is None and info["converted"]:
        if not report.changed or len(result.graph.node) > len(model.graph.node):
            result, why = model, "no cheaper graph with no more nodes at the new opset"
            info.update(output=source, converted=False, note=why)
            report = replace(report, changed=False, provenance={}, cost_after=report.cost_before)
    report.extra["opset"] = info
    seconds = {"convert": t_convert, **report.seconds} if target is not None else report.seconds
    return result, _onnx_counts(replace(report, seconds=seconds), model, result)


MAX_ROUNDS = 3


def _rounds(model: onnx.ModelProto, rules, **kw):
    """`_optimize_model` again on its own result, up to MAX_ROUNDS times in all, while a round
    removes nodes and the budget lasts.

    A guard such as `is-constant` sees the constants of the graph that was imported, not those
    a rewrite computes: a BatchNormalization folded into a Conv gives it a weight that is a
    constant only after constant folding, so the Mul and Add that follow (DenseNet's and
    Inception v2's explicit scale and bias) fold into it in the next round, on the folded
    graph. Only models converted from an old opset get more than one round (their converted
    BatchNormalization, scale and bias chains are where it pays; a round costs a whole
    optimization, so a current model gets one). The report adds up the rounds (`fired`,
    `iterations`, `seconds`) and keeps the last round's stop reason and provenance;
    `extra["rounds"]` is how many ran."""
    clock = time.perf_counter()
    limits = kw.pop("limits", Limits())
    limits = replace(
        limits, deadline=limits.deadline if limits.deadline is not None else clock + limits.timeout
    )
    result, report = _optimize_model(model, rules, limits=limits, **kw)
    rounds = 1
    while rounds < MAX_ROUNDS and report.changed and not report.limit_stage:
        if time.perf_counter() > limits.deadline:
            break
        again, more = _optimize_model(result, rules, limits=limits, **kw)
        rounds += 1
        if not more.changed:
            break
        fewer = len(again.graph.node) < len(result.graph.node)
        result, report = again, _merge_reports(report, more)
        if not fewer:
            break
    report.extra["rounds"] = rounds
    return result, report


def _merge_reports(first, then):
    """The report of two rounds: `then`'s, with counts and seconds added up and the cost
    before the first."""
    seconds = dict(first.seconds)
    for k, v in then.seconds.items():
        seconds[k] = seconds.get(k, 0.0) + v
    fired = dict(first.fired)
    for k, v in then.fired.items():
        fired[k] = fired.get(k, 0) + v
    fp = max((first.fp, then.fp), key=("exact", "reassoc", "approx").index)
    return replace(
        then,
        seconds=seconds,
        fired=fired,
        iterations=first.iterations + then.iterations,
        cost_before=first.cost_before,
        fp=fp,
        changed=True,
        extra={**then.extra, "first_round": {"fired": first.fired}},
    )


def _optimize_model(model: onnx.ModelProto, rules, **kw):
    """`optimize_model` at the model's own opset, one round."""
    from rewrite.optimize import as_given, optimize

    clock = time.perf_counter()
    limits = kw.pop("limits", Limits())
    folder = kw.pop("folder", None)
    limits = replace(
        limits, deadline=limits.deadline if limits.deadline is not None else clock + limits.timeout
    )
    if clock > limits.deadline:
        return model, _onnx_counts(as_given(None, "time-limit", "load", {}), model, model)
    graph = import_model(model, folder)
    t_import = time.perf_counter() - clock
    if time.perf_counter() > limits.deadline:
        return model, _onnx_counts(
            as_given(graph, "time-limit", "onnx-import", {"onnx-import": t_import}), model, model
        )
    out, report = optimize(graph, rules, limits=limits, **kw)
    clock = time.perf_counter()
    result = model if out is graph else export_model(out)
    t_export = time.perf_counter() - clock
    if result is not model:
        # the full check (strict shape inference included) on the weight-free skeleton: the
        # same nodes, types and small constants, without serializing the weights
        onnx.checker.check_model(skeleton(result), full_check=True)
    t_check = time.perf_counter() - clock - t_export
    seconds = {"onnx-import": t_import, **report.seconds, "export": t_export, "checker": t_check}
    return result, _onnx_counts(replace(report, seconds=seconds), model, result)


def _onnx_counts(report, model: onnx.ModelProto, result: onnx.ModelProto):
    """`report` with nodes counted as the user sees them in ONNX (Constant nodes included)."""
    return replace(
        report,
        nodes_before=len(model.graph.node),
        ops_before=_op_counts(model),
        nodes_after=len(result.graph.node),
        ops_after=_op_counts(result),
    )


def _op_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node))


@dataclass
class Output:
    """A model ready to be written to `path`, not yet in place (`prepare_output`).

    source: what onnxruntime loads to check it: the serialized model, or the path of the
    staged copy written with external data. `commit()` puts it in place, `discard()` drops
    it; either raises OSError."""

    path: Path
    data: bytes | None = None
    staged: Path | None = None

    @property
    def source(self) -> bytes | str:
        """What onnxruntime loads: the serialized model, or the staged file's path."""
        return self.data if self.data is not None else str(self.staged)

    def commit(self) -> None:
        """Put the model (and its data file) in place at `path`. Raises OSError."""
        if self.staged is None:
            save_model(onnx.ModelProto(), self.path, self.data)
        else:
            external.commit(self.staged, self.path)

    def discard(self) -> None:
        """Drop the staged copy, if any."""
        if self.staged is not None:
            external.discard(self.staged)


def prepare_output(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    folder: Path | None = None,
    external_data: bool = False,
) -> Output:
    """Get `model` ready to be written to `path`: serialized, or, with `external_data` or when
    it would exceed `external.EXTERNAL_DATA_THRESHOLD` bytes (protobuf's 2 GB limit), staged
    beside `path` with its weights in `<name>.data`. External data the model still refers to
    (an input returned unchanged) is read from `folder` first. Raises OSError."""
    p = Path(path)
    if folder is not None and any(True for _ in external.external_tensors(model)):
        onnx.external_data_helper.load_external_data_for_model(model, str(folder))
    if external_data or external.needs_external_data(model):
        return Output(p, staged=external.stage(model, p))
    return Output(p, data=model.SerializeToString())


def save_model(model: onnx.ModelProto, path: str | os.PathLike, data: bytes | None = None) -> None:
    """Write `model` atomically: to a temporary file beside `path`, then renamed over it, so a
    failure never leaves a partly written file and `path` may be the file the model was read
    from. `data`, when given, is the model already serialized (`model.SerializeToString()`),
    written as it is. The file gets the mode a newly created file gets under the user's umask
    (0666 & ~umask), as `open(path, "wb")` would give it. Raises OSError."""
    p = Path(path)
    tmp = _create_beside(p)
    try:
        with open(tmp, "wb") as f:
            f.write(model.SerializeToString() if data is None else data)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _create_beside(p: Path) -> Path:
    """Create a new empty file with a unique name in `p`'s folder, mode 0666 & ~umask (not
    mkstemp's 0600: the file is renamed into place and keeps its mode)."""
    for _ in range(100):
        tmp = p.parent / f".{p.name}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp
    raise FileExistsError(f"{p.parent}: cannot create a temporary file")
