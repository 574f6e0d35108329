"""Output check: does the optimized model compute what the original computes?

Both models run under onnxruntime (CPU, its own graph optimizations disabled, so only our rewrites
are under test) on the same random inputs; when onnxruntime cannot load or run the original model
(it has no kernel for an op at the model's opset, e.g. `Mul`-6 or `BatchNormalization`-6 in
onnxruntime 1.32), both run under `onnx.reference.ReferenceEvaluator` instead, and every
`OutputDiff` names the executor that checked it; every output is compared with a tolerance per dtype
that scales with the output's magnitude: |a - b| <= atol + rtol * max|b| for every element, max over
the output's finite elements of the original (b), NaN equal to NaN and infinities equal only to
themselves. An elementwise rule (numpy.isclose's) rejects correct rewrites: a kernel that sums in
another order (MatMul + Add as Gemm) is off by a few ulps of the sum's largest terms, which is large
next to an output element that happens to be near zero. Integer and bool outputs must match exactly,
except where they are computed from float values (an ArgMax, a TopK's indices, a comparison): where
the floats may move by rtol a near-tie may flip, so at most a share rtol of such an output's
elements may differ (the float tolerance of the least precise float type it is computed from).
Outputs computed from a random op's draws (RandomNormal, Bernoulli, ...) differ from run to run:
both models are fed the original's draws instead (its random nodes cut out), and where that cannot
be done (a draw inside a subgraph) such outputs are not compared.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto

from engine.optimize import TOLERANCES  # per numeric class and dtype, shared with frontends.fx
from engine.runtime import cpu_session
from vocab.ops import FAMILIES

EXACT = (0.0, 0.0)
DIM_DEFAULT = 2  # size given to symbolic or unknown input dimensions


ORT, REFERENCE = "onnxruntime", "onnx.reference"  # the executors `compare` names


class CheckError(RuntimeError):
    """A model could not be run under onnxruntime (or, as the fallback, onnx.reference).
    `original`: it was the model given, on the check's inputs (no rewrite is to blame)."""

    original = False


@dataclass(frozen=True)
class OutputDiff:
    """Comparison of one output: max absolute error, max relative error (max |a-b| over the
    output's largest finite magnitude max|b|), the tolerance, the verdict, and the executor
    both models ran under (`ORT` or `REFERENCE`). For an integer or bool output computed from
    float values (`shares`), max_rel is the share of its elements that differ and rtol the
    largest share allowed."""

    name: str
    dtype: str
    max_abs: float
    max_rel: float
    rtol: float
    atol: float
    ok: bool
    executor: str = ORT
    shares: bool = False  # an integer output computed from floats: max_rel and rtol are shares
    nan: bool = False  # a NaN in one model's output where the other has a number
    random: bool = False  # computed from a random op's draws: not compared (ok, errors NaN)
    # which model has the NaN where the other has a number: "original", "optimized", "both"
    nan_in: str = ""


def random_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for the model's graph inputs (initializers excluded).

    Floats are standard normal; integers are 0 or 1 (valid token ids, masks and indices for
    any vocabulary); bools are random. Symbolic dimensions take `DIM_DEFAULT`.
    """
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    return {
        vi.name: _draw(vi.name, vi.type, rng) for vi in model.graph.input if vi.name not in inits
    }


def _draw(name: str, t: onnx.TypeProto, rng: np.random.Generator):
    """A random value of ONNX type `t`: a tensor as `random_inputs` says (strings "0" or "1"),
    a sequence of two, an optional's element. Raises CheckError for a type the check cannot
    draw (a map, an undefined element type)."""
    kind = t.WhichOneof("value")
    if kind == "sequence_type":
        return [_draw(name, t.sequence_type.elem_type, rng) for _ in range(2)]
    if kind == "optional_type":
        return _draw(name, t.optional_type.elem_type, rng)
    if kind != "tensor_type":
        raise CheckError(
            f"input {name!r} is a {kind or 'value of no type'}, which the output "
            "check cannot draw (--no-check writes the output unchecked)"
        )
    tt = t.tensor_type
    shape = [d.dim_value if d.HasField("dim_value") else DIM_DEFAULT for d in tt.shape.dim]
    try:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
    except KeyError:
        raise CheckError(
            f"input {name!r} has no element type the output check can draw "
            "(--no-check writes the output unchecked)"
        ) from None
    if np.issubdtype(dtype, np.floating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if dtype == np.dtype(object):  # strings
        return rng.integers(0, 2, shape).astype(str).astype(object)
    if not np.issubdtype(dtype, np.number):  # ml_dtypes' types: bfloat16, float8, ...
        return rng.standard_normal(shape).astype(np.float32).astype(dtype)
    return rng.integers(0, 2, shape).astype(dtype)


def session(
    model: onnx.ModelProto | bytes | str,
    optimized: bool = False,
    arrays: dict[str, np.ndarray] | None = None,
) -> ort.InferenceSession:
    """An onnxruntime CPU session with graph optimizations off (`optimized`: at its default,
    ORT_ENABLE_ALL, as a user runs the model, fused int8 kernels included), from a
    ModelProto, its serialized bytes, or a file path (the cheapest: nothing is serialized in
    Python). arrays: the initializers `model` holds as external data in memory
    (`exporter.export_model(g, arrays)`), by name; onnxruntime copies them in before any graph
    optimization (`SessionOptions.add_external_initializers`), so the session is the one the
    whole model makes. onnxruntime logs nothing (a failure is the CheckError's message, and
    the CLI's errors are one line). Raises CheckError."""
    try:  # (the arrays live on in the caller until the session has copied them)
        return cpu_session(model, optimized=optimized, arrays=arrays)
    except Exception as e:  # onnxruntime raises its own exception types
        raise CheckError(
            f"onnxruntime could not load the model: {str(e).splitlines()[0]}"
        ) from None


def run(
    model: onnx.ModelProto | bytes | str | ort.InferenceSession, feeds: dict[str, np.ndarray]
) -> list[np.ndarray]:
    """Run a model (or a `session`) under onnxruntime CPU with graph optimizations off.
    Raises CheckError."""
    sess = model if isinstance(model, ort.InferenceSession) else session(model)
    try:
        return sess.run(None, feeds)
    except Exception as e:  # onnxruntime raises its own exception types
        raise CheckError(f"onnxruntime could not run the model: {str(e).splitlines()[0]}") from None


def run_reference(
    model: onnx.ModelProto | bytes | str, feeds: list[dict[str, np.ndarray]]
) -> list[list[np.ndarray]]:
    """Run a model (a ModelProto, its serialized bytes or a file path, external data read from
    beside it) under `onnx.reference.ReferenceEvaluator`, the ONNX package's Python executor of
    every op at every opset, once per feed dict. Returns one list of outputs per feed. Raises
    CheckError when it cannot load or run the model."""
    from onnx.reference import ReferenceEvaluator

    try:
        if isinstance(model, bytes):
            model = onnx.load_model_from_string(model)
        elif isinstance(model, str):
            model = onnx.load(model)
        ref = ReferenceEvaluator(model)
    except Exception as e:  # the reference raises whatever its op implementation raises
        raise CheckError(f"onnx.reference could not load the model: {_first_line(e)}") from None
    try:
        # numpy's warnings from the ops' kernels (an integer division by a drawn 0, as
        # onnxruntime's kernels are silent about) are no message of ours (--quiet)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return [list(ref.run(None, f)) for f in feeds]
    except Exception as e:
        raise CheckError(f"onnx.reference could not run the model: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def compare(
    original: onnx.ModelProto,
    optimized: onnx.ModelProto,
    runs: int = 2,
    seed: int = 0,
    fp: str = "exact",
    *,
    original_source: bytes | str | None = None,
    optimized_source: bytes | str | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    feeds: list[dict[str, np.ndarray]] | None = None,
    full_optimization: bool = False,
) -> list[OutputDiff]:
    """Run both models on `runs` sets of random inputs (or on `feeds`, when given) and
    compare every output, with the tolerances of numeric class `fp` (the loosest class among
    the rules that fired), each output at the tolerance of the least precise float type it is
    computed from (`tolerance_types`). `full_optimization`: onnxruntime sessions at its
    full optimization (`session(optimized=True)`), to check what the user will measure.

    Each model gets one onnxruntime session, loaded from `*_source` when given (the file path
    or the serialized bytes, so that a large model is not serialized again) or else from the
    ModelProto. `rtol`/`atol`, when given, replace the class's tolerance for float outputs
    and, as the share of elements that may differ, for integer and bool outputs computed from
    float values (the others are compared exactly all the same). When onnxruntime cannot load
    or run the original, both models run under `onnx.reference` (`run_reference`) and the diffs
    say so (`OutputDiff.executor`). Returns one OutputDiff per output (the worst over all runs).
    Raises CheckError when either model fails to load or run (the optimized one under the
    executor that ran the original). An OutputDiff's errors are the largest over the runs,
    each taken apart (max|a - b| of one run, max|a - b| / max|b| of another, where b's scale
    differs from run to run), and it is ok only if every run is; an integer output computed
    from floats is ok when the share of its elements that differ, over all runs together, is
    within its tolerance (one flipped label of 20 single-label runs is 5%). An output computed
    from a random op's draws (`random_outputs`) is compared where both models can read the same
    draws (`_shared_draws`: the original's, fed to both with the random nodes cut out), else
    not: its OutputDiff is then ok, its errors NaN, `random` set.
    """
    worst: dict[str, OutputDiff] = {}
    given_feeds = feeds is not None
    elem = {o.name: _elem_type(o.type) for o in original.graph.output}
    tol = tolerance_types(original)
    drawn = random_outputs(original)
    if feeds is None:
        feeds = [random_inputs(original, seed + r) for r in range(runs)]
    shared = drawn and _shared_draws(original, optimized, original_source, optimized_source, feeds)
    if shared:  # both models read the same draws: compare them all
        original, optimized, feeds = shared
        original_source = optimized_source = None
        drawn = set()
    executor = ORT
    try:  # one session at a time: each holds a copy of the weights
        sess = session(original_source or original, full_optimization)
        want = [run(sess, f) for f in feeds]
        del sess
    except CheckError as e:  # no onnxruntime kernel for the original (an old opset): the reference
        executor = REFERENCE
        try:
            want = run_reference(original_source or original, feeds)
        except CheckError as r:
            given = "the given inputs" if given_feeds else "the check's random inputs"
            err = CheckError(f"the original model does not run on {given} ({e}; {r})")
            err.original = True
            raise err from None
    if executor == ORT:
        sess = session(optimized_source or optimized, full_optimization)
        got = [run(sess, f) for f in feeds]
        del sess
    else:
        got = run_reference(optimized_source or optimized, feeds)
    counted: dict[str, list[float]] = {}  # an integer output's differing elements, and all
    for outs_a, outs_b in zip(want, got):
        for name, a, b in zip(elem, outs_a, outs_b):
            if name in drawn:  # each run draws anew (onnx.reference; onnxruntime unseeded)
                dtype, nan = TensorProto.DataType.Name(elem[name]).lower(), float("nan")
                worst[name] = OutputDiff(
                    name, dtype, nan, nan, nan, nan, True, executor, random=True
                )
                continue
            if isinstance(a, list) or isinstance(b, list):  # a sequence: its tensors in order
                d = _sequence_diff(name, elem[name], b, a, TOLERANCES[fp], tol[name], rtol, atol)
                d = replace(d, executor=executor)
                worst[name] = d if name not in worst or not d.ok else worst[name]
                continue
            g, w = np.asarray(b), np.asarray(a)
            d = _diff(name, elem[name], g, w, TOLERANCES[fp], tol[name], rtol, atol)
            d = replace(d, executor=executor)
            if d.shares:  # a share over every run's elements together (inf: a shape differs)
                n = counted.setdefault(name, [0.0, 0.0])
                n[0] += d.max_rel * w.size if g.shape == w.shape else float("inf")
                n[1] += w.size
                share = n[0] / n[1] if n[1] else float(n[0] > 0) * float("inf")
                d = replace(d, max_rel=share, ok=share <= d.rtol)
            w = worst.get(name)
            if w is not None:  # the largest errors over the runs, each its own largest
                d = replace(
                    d,
                    nan=w.nan or d.nan,
                    nan_in=w.nan_in
                    if w.nan_in in (d.nan_in, "both") or not d.nan_in
                    else d.nan_in
                    if not w.nan_in
                    else "both",
                    max_abs=max(w.max_abs, d.max_abs),
                    max_rel=d.max_rel if d.shares else max(w.max_rel, d.max_rel),
                    ok=(w.ok or d.shares) and d.ok,
                )
            worst[name] = d
    return list(worst.values())


def _elem_type(t: onnx.TypeProto) -> int:
    """The element type of a tensor, of a sequence's or an optional's tensors (0 if none)."""
    while t.WhichOneof("value") in ("sequence_type", "optional_type"):
        inner = t.sequence_type if t.HasField("sequence_type") else t.optional_type
        t = inner.elem_type
    return t.tensor_type.elem_type if t.HasField("tensor_type") else 0


def _sequence_diff(name, elem_type, got, want, tolerances, tol_type, rtol, atol) -> OutputDiff:
    """A sequence output compared tensor by tensor (`_diff`), the worst; not ok when the
    lengths differ or one side is not a sequence."""
    dtype = TensorProto.DataType.Name(elem_type).lower()
    if not (isinstance(got, list) and isinstance(want, list)) or len(got) != len(want):
        return OutputDiff(name, dtype, float("inf"), float("inf"), 0.0, 0.0, False)
    diffs = [
        _diff(name, elem_type, np.asarray(g), np.asarray(w), tolerances, tol_type, rtol, atol)
        for g, w in zip(got, want)
    ]
    if not diffs:
        return OutputDiff(name, dtype, 0.0, 0.0, 0.0, 0.0, True)
    return max(diffs, key=lambda d: (not d.ok, d.max_rel))


def _diff(
    name: str,
    elem_type: int,
    got: np.ndarray,
    want: np.ndarray,
    tolerances,
    tol_type: int | None = None,
    rtol_given: float | None = None,
    atol_given: float | None = None,
) -> OutputDiff:
    rtol, atol = tolerances.get(elem_type if tol_type is None else tol_type, EXACT)
    # (bfloat16 arrays are ml_dtypes', which numpy does not count as inexact)
    floats = np.issubdtype(want.dtype, np.inexact) or elem_type in _PRECISION
    shares = not floats and tol_type in _PRECISION  # an ArgMax, a comparison: a share may differ
    if floats or shares:  # the caller's tolerance
        rtol = rtol if rtol_given is None else rtol_given
        atol = 0.0 if shares else atol if atol_given is None else atol_given
    dtype = TensorProto.DataType.Name(elem_type).lower()
    if got.shape != want.shape or got.dtype != want.dtype:
        return OutputDiff(name, dtype, float("inf"), float("inf"), rtol, atol, False, shares=shares)
    if got.size == 0:
        return OutputDiff(name, dtype, 0.0, 0.0, rtol, atol, True, shares=shares)
    if not floats:
        differ = got != want
        numeric = np.issubdtype(want.dtype, np.number) or want.dtype == np.bool_
        err = 0.0  # strings: equal or not
        if differ.any():
            err = float("inf")
            if numeric:
                err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64))))
        if shares:
            share = float(np.mean(differ))
            return OutputDiff(name, dtype, err, share, rtol, 0.0, share <= rtol, shares=True)
        return OutputDiff(name, dtype, err, err, rtol, atol, not differ.any())
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    both_nan = np.isnan(g64) & np.isnan(w64)
    with np.errstate(invalid="ignore"):
        abs_err = np.where(both_nan | (g64 == w64), 0.0, np.abs(g64 - w64))
        finite = np.abs(w64[np.isfinite(w64)])
        scale = float(finite.max()) if finite.size else 0.0
        rel_err = abs_err / max(scale, np.finfo(np.float64).tiny)
    # NaN errors (NaN against a number, or inf against a different inf) never pass
    ok = bool(np.all(abs_err <= atol + rtol * scale))
    only_want = bool(np.any(np.isnan(w64) & ~np.isnan(g64)))  # the original's NaN alone
    only_got = bool(np.any(np.isnan(g64) & ~np.isnan(w64)))
    nan = not ok and (only_want or only_got)
    nan_in = {(True, True): "both", (True, False): "original", (False, True): "optimized"}.get(
        (only_want, only_got), ""
    )
    with np.errstate(invalid="ignore"):  # (an all-NaN error: nanmax warns, and gives NaN)
        worst_abs, worst_rel = float(np.nanmax(abs_err)), float(np.nanmax(rel_err))
    return OutputDiff(
        name, dtype, worst_abs, worst_rel, rtol, atol, ok, nan=nan, nan_in=nan_in if nan else ""
    )


def output_diff(
    name: str,
    elem_type: int,
    got: np.ndarray,
    want: np.ndarray,
    fp: str = "exact",
    tol_type: int | None = None,
    atol: float | None = None,
) -> OutputDiff:
    """Compare output `name` (ONNX element type `elem_type`) of the optimized model (`got`)
    with the original's (`want`) at the tolerance of numeric class `fp`, as `compare` does;
    `tol_type` is the element type whose tolerance applies (`tolerance_types`), by default
    `elem_type`; `atol`, when given, replaces the class's absolute tolerance for a float
    output."""
    return _diff(
        name, elem_type, np.asarray(got), np.asarray(want), TOLERANCES[fp], tol_type, None, atol
    )


# least precise first: a value computed in one of these and then widened carries its error
_PRECISION = (TensorProto.BFLOAT16, TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE)


def upstream(
    graph: onnx.GraphProto, name: str, values_only: bool = False
) -> tuple[set[str], list[onnx.NodeProto]]:
    """The values `name` is computed from in `graph` (itself included: graph inputs,
    initializers and node outputs) and the nodes that compute them, through what a node's
    subgraphs read from `graph` too. `values_only`: not through the input of a node that
    reads its input's shape alone (Shape, Size)."""
    producer = {o: n for n in graph.node for o in n.output}
    seen: set[str] = set()
    nodes: list[onnx.NodeProto] = []
    stack = [name]
    while stack:
        v = stack.pop()
        if v in seen or not v:
            continue
        seen.add(v)
        n = producer.get(v)
        if n is not None:
            nodes.append(n)
            if not (values_only and n.op_type in _SHAPE_ONLY and n.domain in ("", "ai.onnx")):
                stack.extend(n.input)
                stack.extend(_outer_reads(n))
    return seen, nodes


def _outer_reads(node: onnx.NodeProto) -> set[str]:
    """The values of the enclosing graph that `node`'s subgraphs (If branches, Loop and Scan
    bodies, nested ones too) read by name without their being inputs of `node`."""
    out: set[str] = set()
    for g in subgraphs(node):
        local = {i.name for i in g.input} | {t.name for t in g.initializer}
        local |= {o for n in g.node for o in n.output}
        for n in g.node:
            out |= {i for i in n.input if i and i not in local}
            out |= _outer_reads(n) - local
    return out


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs `node` holds in its attributes: an If's branches, a Loop's or Scan's body."""
    return [
        g
        for a in node.attribute
        for g in ((a.g,) if a.type == onnx.AttributeProto.GRAPH else a.graphs)
    ]


def _is_draw(node: onnx.NodeProto) -> bool:
    """Whether `node` is a random op (the op table's RANDOM family: RandomNormal, ...)."""
    return node.op_type in FAMILIES["RANDOM"] and node.domain in ("", "ai.onnx")


_SHAPE_ONLY = ("Shape", "Size")  # ops whose output depends on their input's shape alone


def _shared_draws(original, optimized, original_source, optimized_source, feeds):
    """Both models with their main graph's random nodes cut out, their outputs made graph
    inputs, and `feeds` with the draws the original made on each (`draw_values`), so that the
    two models read the same draws and every output can be compared (a VAE's decoder, after
    its randn_like). None where that cannot be done (`draw_values`, `cut_draws`)."""
    try:
        whole = _whole(original, original_source)
        made = draw_values(whole, feeds)
        if made is None:
            return None
        cut = [cut_draws(m, made[0]) for m in (whole, _whole(optimized, optimized_source))]
    except (OSError, ValueError, onnx.checker.ValidationError):
        return None
    if None in cut:
        return None
    return cut[0], cut[1], [{**f, **d} for f, d in zip(feeds, made)]


def draw_values(model: onnx.ModelProto, feeds: list[dict]) -> list[dict] | None:
    """For each of `feeds`, the values the random nodes of `model`'s main graph draw (name ->
    array), from one onnxruntime run of `model` with those values as extra outputs. None when
    the main graph has no random node (a draw inside a subgraph only) or the run fails."""
    draws = [o for n in model.graph.node if _is_draw(n) for o in n.output]
    if not draws:
        return None
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.extend(onnx.helper.make_empty_tensor_value_info(v) for v in draws)
    try:
        sess = session(probe)
        k = len(model.graph.output)
        return [dict(zip(draws, run(sess, f)[k:])) for f in feeds]
    except CheckError:
        return None


def _whole(model: onnx.ModelProto, source) -> onnx.ModelProto:
    """The model with its weights: read from `source` (a file path, external data beside it,
    or serialized bytes) when given, else `model`."""
    if isinstance(source, bytes):
        return onnx.load_model_from_string(source)
    if isinstance(source, str):
        return onnx.load(source)
    return model


def cut_draws(model: onnx.ModelProto, drawn: dict[str, np.ndarray]) -> onnx.ModelProto | None:
    """A copy of `model` whose random nodes producing the values `drawn` are gone and those
    values graph inputs, typed as the arrays drawn for them; None when one of the values is
    not the output of a random node of its main graph (a rewrite renamed or moved it)."""
    producer = {o: n for n in model.graph.node for o in n.output}
    if any(v not in producer or not _is_draw(producer[v]) for v in drawn):
        return None
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [n for n in out.graph.node if not set(n.output) & set(drawn)]
    del out.graph.node[:]
    out.graph.node.extend(keep)
    for name, a in drawn.items():
        elem = onnx.helper.np_dtype_to_tensor_dtype(a.dtype)
        out.graph.input.append(onnx.helper.make_tensor_value_info(name, elem, a.shape))
    return out


def random_outputs(model: onnx.ModelProto) -> set[str]:
    """The outputs of `model`'s main graph computed from a random op's draws (the op table's
    RANDOM family: RandomNormal, Bernoulli, ...; in a node's subgraph too, an If branch or a
    Loop body), through values (a Shape of a draw is not random). Two runs of one model differ
    there (onnx.reference draws anew on each run, onnxruntime without a seed), so the output
    check cannot compare them."""
    g = model.graph
    out = set()
    for o in g.output:
        _, nodes = upstream(g, o.name, values_only=True)
        if any(_draws(n) for n in nodes):
            out.add(o.name)
    return out


def _draws(node: onnx.NodeProto) -> bool:
    """Whether `node` is a random op or holds one in a subgraph."""
    return _is_draw(node) or any(_draws(n) for g in subgraphs(node) for n in g.node)


def tolerance_types(model: onnx.ModelProto) -> dict[str, int]:
    """For each float output of `model`'s main graph, the ONNX element type whose tolerance
    applies: the least precise float type among the values it is computed from, its own
    included. A float32 value cast to double carries float32 rounding (the fuzzer's case: a
    LayerNormalization fused in float32, then `Cast(to=DOUBLE)`: 1.8e-7 relative, far above
    double's tolerance, for a correct rewrite). The types are read where ONNX states them:
    graph inputs, initializers, value_info, Constant values and the `to`/`dtype` attributes
    of the nodes the output depends on (every float op computes in one of its inputs' types or
    in such an attribute's). An integer or bool output maps the same way when its values are
    computed from float values (not through a shape alone: Shape and Size read no values),
    else to its own type, as outputs of other types do."""
    g = model.graph
    known: dict[str, int] = {}
    for v in [*g.input, *g.value_info, *g.output]:
        if v.type.HasField("tensor_type"):
            known[v.name] = v.type.tensor_type.elem_type
    for t in g.initializer:
        known[t.name] = t.data_type
    out: dict[str, int] = {}
    for o in g.output:
        own = o.type.tensor_type.elem_type
        values, nodes = upstream(g, o.name, values_only=own not in _PRECISION)
        types = {own, *(known.get(v, 0) for v in values)}
        for n in nodes:
            for a in n.attribute:
                if a.name in ("to", "dtype") and a.type == onnx.AttributeProto.INT:
                    types.add(a.i)
                elif a.type == onnx.AttributeProto.TENSOR:
                    types.add(a.t.data_type)
        floats = [t for t in types if t in _PRECISION]
        out[o.name] = min(floats, key=_PRECISION.index) if floats else own
    return out
