"""ONNX frontend: load, import, optimize, export, check, save.

`optimize_model` is the whole ONNX path as a function; the `rewrite optimize` CLI is a thin
shell around it.
"""

from __future__ import annotations

import mmap
import os
import secrets
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx.external_data_helper import uses_external_data
from onnx.serialization import registry

from engine.optimize import FP_CLASSES, as_given, optimize
from engine.saturate import Limits
from frontends.onnx import external
from frontends.onnx.check import compare, subgraphs
from frontends.onnx.exporter import export_model, lift_unlisted_initializers
from frontends.onnx.external import ExternalDataError, check_locations, load_small_tensors
from frontends.onnx.importer import (
    SKELETON_MAX_ELEMENTS,
    constants_by_name,
    default_opset,
    import_model,
    is_weight,
    skeleton,
    value_fields,
)
from frontends.onnx.opset import OLDEST_TABLE_OPSET, OpsetError, auto_target, convert_opset
from vocab.ops import TARGETS

__all__ = [
    "ModelError",
    "OpsetError",
    "Output",
    "load_model",
    "optimize_model",
    "prepare_output",
    "save_model",
    "structure",
    "write_serialized",
    "compare",
    "import_model",
    "export_model",
    "onnx_counts",
]


class ModelError(ValueError):
    """A model file that cannot be used: missing, not ONNX, or rejected by onnx.checker."""


def load_model(path: str | os.PathLike) -> onnx.ModelProto:
    """Read and validate an ONNX model file. Raises ModelError with a one-line reason.

    External data is not read: its locations are checked first (inside the model's folder,
    not through a symlink out of it, see `frontends.onnx.external`), then the main graph's
    initializers stay in their files, to be mapped by `optimize_model(..., folder=)`; other
    external tensors (subgraphs, attributes) are read into the model. An IR 3 model whose
    initializers are not all graph inputs is read as IR 4
    (`exporter.lift_unlisted_initializers`)."""
    p = Path(path)
    if not p.exists():
        raise ModelError(f"{p}: no such file")
    if not p.is_file():
        raise ModelError(f"{p}: not a file")
    try:
        model = _read_proto(p)
    except Exception as e:  # protobuf raises DecodeError and friends
        raise ModelError(f"{p}: not an ONNX model ({type(e).__name__})") from None
    if not model.HasField("graph") or not model.opset_import:
        raise ModelError(f"{p}: not an ONNX model (no graph or no opset import)")
    try:
        check_locations(model, p.parent)
    except ExternalDataError as e:
        raise ModelError(f"{p}: {e}") from None
    lift_unlisted_initializers(model)
    try:
        # weights in the file: the weight-free skeleton (the weights as typed inputs), since
        # checking by path made the C++ checker read and parse the whole file again beside
        # the loaded model, 3x the file at the peak; the weights are checked by
        # `_check_weights`
        if any(uses_external_data(t) for t in model.graph.initializer):
            onnx.checker.check_model(str(p))  # by path: it checks the data files' paths too
        else:
            onnx.checker.check_model(skeleton(model))
            _check_weights(model)
    except onnx.checker.ValidationError as e:
        raise ModelError(
            f"{p}: rejected by onnx.checker: {str(e).strip().splitlines()[0]}"
        ) from None
    load_small_tensors(model, p.parent)
    return model


def used_domains(graph: onnx.GraphProto) -> set[str]:
    """The domains other than the default one of the nodes of `graph` and its subgraphs. A
    domain the model only imports does not count: onnxruntime's `quant_pre_process` imports
    com.microsoft and six others into every model it writes, and a `--target onnx` run then
    wrote com.microsoft.QLinearAdd into a model of standard ops."""
    out: set[str] = set()
    for n in graph.node:
        if n.domain not in ("", "ai.onnx"):
            out.add(n.domain)
        for sub in subgraphs(n):
            out |= used_domains(sub)
    return out


def _read_proto(p: Path) -> onnx.ModelProto:
    """The model in file `p`, its external data not read. A binary protobuf file (any name but
    the text formats' `.textproto`, `.json`, ... that `onnx.load` tells by their extension) is
    parsed from a read-only memory map of the file, not from a copy of it in a bytes object as
    `onnx.load` reads it: the parsed message holds its own copy either way, and the read was a
    third of loading (BERT-base's 438 MB: 0.85 s -> 0.40-0.52 s, beside another process).
    Raises what reading and parsing raise."""
    fmt = registry.get_format_from_file_extension(p.suffix)
    if fmt not in (None, "protobuf"):
        return onnx.load(str(p), format=fmt, load_external_data=False)
    model = onnx.ModelProto()
    with open(p, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:  # an empty file parses as an empty model
            return model
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            model.ParseFromString(memoryview(mapped))
    return model


def _check_weights(model: onnx.ModelProto) -> None:
    """What `onnx.checker` checks of an initializer that `skeleton` turned into an input: a
    defined element type, and its values in exactly one place (raw_data, one typed field, or
    external data), of the size its dims say where that is known (raw_data of a type that
    fills whole bytes, `external.RAW_ITEMSIZE`). Raises onnx.checker.ValidationError."""
    for t in model.graph.initializer:
        numel = int(np.prod(t.dims)) if t.dims else 1
        if numel <= SKELETON_MAX_ELEMENTS:
            continue  # kept in the skeleton, checked there
        if t.data_type == onnx.TensorProto.UNDEFINED:
            raise onnx.checker.ValidationError(f"initializer {t.name}: data type UNDEFINED")
        fields = value_fields(t)
        in_files = uses_external_data(t)
        if len(fields) + in_files != 1:
            raise onnx.checker.ValidationError(
                f"initializer {t.name} should contain one and only one value field"
            )
        if fields == ["raw_data"] and t.data_type in external.RAW_ITEMSIZE:
            if len(t.raw_data) != numel * external.RAW_ITEMSIZE[t.data_type]:
                raise onnx.checker.ValidationError(
                    f"initializer {t.name}: raw_data of {len(t.raw_data)} bytes for "
                    f"{numel} elements"
                )


def optimize_model(model: onnx.ModelProto, rules, *, opset: int | None = None, **kw):
    """Optimize an ONNX model with a RuleSet: the engine-level call under
    `rewrite.optimize_model` (`frontends.onnx.api`, which takes a path, the CLI's option names
    and runs the output check). Other keyword arguments go to `engine.optimize`.

    target: the runtime the result is for, a key of `vocab.ops.TARGETS` (`onnx`: standard
    ONNX; `onnxruntime`: also its contrib domains): rules whose ruleset writes ops of a domain
    that neither the model's nodes use (`used_domains`) nor the target runs are skipped.
    opset: convert the model to this default-domain opset first (`frontends.onnx.opset`,
    `onnx.version_converter`), then optimize it with the rules whose ops exist at that opset;
    the result is at `opset` even when no rule made it cheaper. Raises OpsetError when it
    cannot be converted. Without it, a model older than the op table's forms (opset < 13) is
    converted to `UPGRADE_OPSET` so that the rules apply, and kept only if that made it
    cheaper with no more nodes (cheaper is enough when `fp` allows `quant`: quantizing adds
    nodes) (else the original comes back, at its own opset); if the
    converter fails, the model is optimized at its own opset (rules needing a newer one do not
    fire). `report.extra["opset"]` says what was done: `input`, `output`, `converted`, and
    `note` (why not) when an automatic conversion was dropped.

    Returns (optimized ModelProto, Report). When nothing cheaper is found the original model
    object is returned. Raises onnx.checker.ValidationError if the result fails the checker
    (a bug in the engine, never silently written). `report.seconds` gains the ONNX stages:
    `onnx-import` (shape inference and the TermGraph), `export` and `checker`.

    `folder`: where the model's external data is, if `load_model` left it there (see
    `import_model`). `limits` (a `engine.saturate.Limits`) bound the whole call: a deadline
    already past on entry (`limit_stage` "load": the caller spent the time) or after the
    import returns the model unchanged; later, the best graph found so far is exported (see
    `engine.optimize`).

    `graph`: the model already imported (`import_model(model, folder)`), its `meta` possibly
    a `structure` copy of `model` (then `model` may be that copy too); its import seconds are
    then the caller's to count. A `structure` converted to another opset is imported again
    (its nodes changed), its weights taken from `graph`'s arrays.
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
            # optimized at its own opset: an op whose form changed after the table's newest
            # (Cast-28 of an opset-28 model) has no spec there, so it is opaque to the rules
            info["note"] = str(e)
    t_convert = time.perf_counter() - clock
    if info["converted"]:
        graph = kw.pop("graph", None)  # an import of the unconverted model
        if graph is not None and _is_structure(work):
            # the converted structure is imported with the weights the caller imported, as
            # arrays: none is copied into the converted model and out again (BERT-base's
            # 440 MB took 0.4 s and a second copy at the peak)
            kw["arrays"] = constants_by_name(graph)
        del graph
    if info["converted"] and source < OLDEST_TABLE_OPSET:
        result, report = _rounds(work, rules, **kw)
    else:
        result, report = _optimize_model(work, rules, **kw)
    if opset is None and info["converted"]:
        # quantizing adds nodes (DynamicQuantizeLinear, the rescale) by design: cheaper is enough
        more_ok = "quant" in kw.get("fp", ())
        if not report.changed or (not more_ok and len(result.graph.node) > len(model.graph.node)):
            result, why = model, "no cheaper graph with no more nodes at the new opset"
            info.update(output=source, converted=False, note=why)
            report = replace(report, changed=False, provenance={}, cost_after=report.cost_before)
    report.extra["opset"] = info
    seconds = {"convert": t_convert, **report.seconds} if target is not None else report.seconds
    return result, onnx_counts(replace(report, seconds=seconds), model, result)


MAX_ROUNDS = 3


def _rounds(model: onnx.ModelProto, rules, **kw):
    """`_optimize_model` again on its own result, up to MAX_ROUNDS times in all, while a round
    removes nodes and the budget lasts.

    A guard such as `is-constant` sees the constants of the graph that was imported, not those
    a rewrite computes: a BatchNormalization folded into a Conv gives it a weight that is a
    constant only after constant folding, so the Mul and Add that follow (DenseNet's and
    Inception v2's explicit scale and bias) fold into it in the next round, on the folded
    graph. Only models converted from an opset older than OLDEST_TABLE_OPSET get more than one
    round (their converted BatchNormalization, scale and bias chains are where it pays; a round
    costs a whole optimization, so a current model, converted up or not, gets one). The report
    adds up the rounds (`fired`, `iterations`, `seconds`) and keeps the last round's stop
    reason and provenance; `extra["rounds"]` is how many ran."""
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
    fp = max((first.fp, then.fp), key=FP_CLASSES.index)
    return replace(
        then,
        seconds=seconds,
        fired=fired,
        iterations=first.iterations + then.iterations,
        cost_before=first.cost_before,
        fp=fp,
        changed=True,
        # the quantization sites are those of the round that had some (the first, usually)
        extra={
            **{k: v for k, v in first.extra.items() if k == "quantized_sites"},
            **then.extra,
            "first_round": {"fired": first.fired},
        },
    )


def _optimize_model(model: onnx.ModelProto, rules, **kw):
    """`optimize_model` at the model's own opset, one round."""
    clock = time.perf_counter()
    limits = kw.pop("limits", Limits())
    folder = kw.pop("folder", None)
    limits = replace(
        limits, deadline=limits.deadline if limits.deadline is not None else clock + limits.timeout
    )
    graph = kw.pop("graph", None)
    arrays = kw.pop("arrays", None)
    target = kw.pop("target", "onnx")
    kw["domains"] = TARGETS[target] | used_domains(model.graph)
    if clock > limits.deadline and graph is None:
        return model, onnx_counts(as_given(None, "time-limit", "load", {}), model, model)
    if graph is None:
        graph = import_model(model, folder, arrays)
        del arrays
    t_import = time.perf_counter() - clock
    if time.perf_counter() > limits.deadline:
        given = export_model(graph) if _is_structure(model) else model
        return given, onnx_counts(
            as_given(graph, "time-limit", "onnx-import", {"onnx-import": t_import}), model, given
        )
    out, report = optimize(graph, rules, limits=limits, **kw)
    clock = time.perf_counter()
    # a model that holds only its structure (`structure`) cannot be returned as the result
    result = model if out is graph and not _is_structure(model) else export_model(out)
    t_export = time.perf_counter() - clock
    if result is not model:
        # the full check (strict shape inference included) on the weight-free skeleton: the
        # same nodes, types and small constants, without serializing the weights
        try:
            onnx.checker.check_model(skeleton(result), full_check=True)
        except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
            _fails_full_check(model, e)
            raise
    t_check = time.perf_counter() - clock - t_export
    seconds = {"onnx-import": t_import, **report.seconds, "export": t_export, "checker": t_check}
    return result, onnx_counts(replace(report, seconds=seconds), model, result)


def _fails_full_check(model: onnx.ModelProto, e: Exception) -> None:
    """Raise ModelError when the input `model` fails onnx's full check (strict shape
    inference) as the result did with `e`: the input is invalid, not the rewrite (load_model
    checks without strict shape inference). Returns when the input passes."""
    try:
        onnx.checker.check_model(skeleton(model), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as mine:
        first = str(mine).strip().splitlines()[0] if str(mine).strip() else type(mine).__name__
        raise ModelError(f"the input fails onnx.checker's full check: {first}") from e


_STRUCTURE = "rewrite.structure"  # metadata key marking a `structure` copy


def _without_initializers(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` with every field but `graph.initializer` (field by field, so the
    weights are never copied)."""
    out = onnx.ModelProto()
    for field, value in model.ListFields():
        if field.name != "graph":
            _set_field(out, field, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            _set_field(out.graph, field, value)
    return out


def structure(model: onnx.ModelProto, held: Collection[str] | None = None) -> onnx.ModelProto:
    """A copy of `model` whose large initializers (over SKELETON_MAX_ELEMENTS elements) keep
    their name, type and shape but no values: what `export_model` reads of the original (a
    TermGraph's `meta`) and the output check reads (types, inputs), without the weights, so
    that a caller holding the weights as arrays (`import_model`) can free the loaded model
    (the protobuf arena of a loaded model is freed only with the whole model). Passed to
    `optimize_model` as `graph`'s meta, it makes the result always a newly exported model.

    held: the names of the initializers the caller holds as arrays (the constants of its
    `import_model` graph); the others stay whole. The import shares byte-identical small
    constants under one name, so an initializer it aliased is not held under its own name,
    and a structure converted to another opset is imported with the held arrays alone."""
    out = _without_initializers(model)
    for t in model.graph.initializer:
        whole = not is_weight(t) or uses_external_data(t)
        if whole or (held is not None and t.name not in held):
            out.graph.initializer.append(t)
        else:
            out.graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
    out.metadata_props.add(key=_STRUCTURE, value="1")
    return out


def _is_structure(model: onnx.ModelProto) -> bool:
    return any(p.key == _STRUCTURE for p in model.metadata_props)


def onnx_counts(report, model: onnx.ModelProto, result: onnx.ModelProto):
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

    source: what onnxruntime loads to check it: the path of the staged copy (written beside
    `path`, single-file in `tmp` or with external data in `staged`), or the serialized model
    (`data`). `commit()` puts it in place, `discard()` drops it; either raises OSError."""

    path: Path
    data: bytes | None = None
    staged: Path | None = None
    tmp: Path | None = None

    @property
    def source(self) -> bytes | str:
        """What onnxruntime loads: the serialized model, or the staged file's path."""
        if self.tmp is not None:
            return str(self.tmp)
        return self.data if self.data is not None else str(self.staged)

    def commit(self) -> None:
        """Put the model (and its data file) in place at `path`. Raises OSError."""
        if self.tmp is not None:
            os.replace(self.tmp, self.path)
        elif self.staged is None:
            save_model(onnx.ModelProto(), self.path, self.data)
        else:
            external.commit(self.staged, self.path)

    def discard(self) -> None:
        """Drop the staged copy, if any."""
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)
        if self.staged is not None:
            external.discard(self.staged)


def prepare_output(
    model: onnx.ModelProto,
    path: str | os.PathLike,
    *,
    folder: Path | None = None,
    external_data: bool = False,
) -> Output:
    """Get `model` ready to be written to `path`: serialized into a temporary file beside
    `path` (so that the bytes need not stay in memory while onnxruntime checks it), or, with
    `external_data` or when it would exceed `external.EXTERNAL_DATA_THRESHOLD` bytes
    (protobuf's 2 GB limit), staged beside `path` with its weights in `<name>.data`. External
    data the model still refers to (an input returned unchanged) is read from `folder` first.
    Raises OSError."""
    p = Path(path)
    if folder is not None and any(True for _ in external.external_tensors(model)):
        onnx.external_data_helper.load_external_data_for_model(model, str(folder))
    if external_data or external.needs_external_data(model):
        return Output(p, staged=external.stage(model, p))
    tmp = _create_beside(p)
    try:
        with open(tmp, "wb") as f:
            write_serialized(model, f)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return Output(p, tmp=tmp)


def write_serialized(model: onnx.ModelProto, f) -> None:
    """Write `model` to binary file `f` as `model.SerializeToString()` would, except that the
    graph's initializers come one at a time, after the rest of the graph, so that memory never
    holds the whole serialized model (SerializeToString of a 400 MB model peaks at twice
    that, beside the model).

    Protobuf merges a message field that occurs more than once and appends repeated fields, so
    a ModelProto followed by records `graph { initializer: T }` parses as the same model with
    the initializers last in `graph.initializer` (their order is all that differs)."""
    head = _without_initializers(model)
    if not model.HasField("graph"):
        head.ClearField("graph")
    f.write(head.SerializeToString())
    for t in model.graph.initializer:
        data = t.SerializeToString()
        graph = _GRAPH_INITIALIZER + _varint(len(data))
        f.write(_MODEL_GRAPH + _varint(len(graph) + len(data)) + graph)
        f.write(data)


_MODEL_GRAPH = bytes([(7 << 3) | 2])  # ModelProto.graph = 7, length-delimited
_GRAPH_INITIALIZER = bytes([(5 << 3) | 2])  # GraphProto.initializer = 5


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _set_field(msg, field, value) -> None:
    if getattr(field, "is_repeated", None) or getattr(field, "label", None) == 3:
        getattr(msg, field.name).extend(value)
    elif field.type == field.TYPE_MESSAGE:
        getattr(msg, field.name).CopyFrom(value)
    else:
        setattr(msg, field.name, value)


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
