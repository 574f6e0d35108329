"""`optimize_fx`: the whole fx path as one function (import, optimize, export, check).

    GraphModule --import_fx--> TermGraph --engine.optimize--> TermGraph --export_fx--> GraphModule

The fx counterpart of `frontends.onnx.optimize_model`: the same rules, the same engine, the same
Report, with node counts as the fx graph shows them (call_function, call_method and call_module
nodes by target). A graph that cannot be rewritten safely (a grad-mode or autocast switch), or
whose rewrite has no torch form, comes back unchanged, with the reason in
`report.extra["skipped"]`; nodes kept as they are around an in-place write to shared storage
are named in `report.extra["in_order"]`.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from dataclasses import replace

import torch
from torch import fx

from dsl import RulePathError, load_rules, rules_given, shipped_rules_dir
from engine.cost import CostModel
from engine.optimize import TOLERANCES, Report, optimize, option_problem
from engine.saturate import Limits
from engine.selection import pick_rules
from frontends.fx.exporter import FxExportError, export_fx
from frontends.fx.importer import import_fx
from frontends.fx.nodes import FxImportError, untouched
from frontends.fx.tensors import onnx_elem


class FxCheckError(AssertionError):
    """The optimized module's outputs differ from the original's beyond the tolerance."""


@functools.cache
def shipped_rules():
    """The shipped rule library (`patterns/`), parsed once per process."""
    return load_rules([shipped_rules_dir()])


# the keywords of `optimize_fx`, named as `rewrite optimize`'s options and
# `rewrite.optimize_model`'s keywords (`allow`, not the engine's `fp`)
FX_OPTIONS = (
    "allow",
    "skip",
    "only",
    "check",
    "atol",
    "rtol",
    "freeze",
    "cost",
    "provenance",
    "max_iterations",
    "max_nodes",
    "timeout",
)


def optimize_fx(gm, example_inputs=None, rules=None, **options):
    """Optimize a torch.fx GraphModule (or a torch.export ExportedProgram) with `.rules`.

    example_inputs: tensors for the graph's placeholders (user inputs only for an
        ExportedProgram, its args then its kwargs' values; by default the ones it was
        exported with); shapes and dtypes come from them when nodes carry no metadata.
    rules: a RuleSet, `.rules` paths, or None for the shipped library.
    Options (keywords, `FX_OPTIONS`; the names of `rewrite optimize`'s options):
    allow: numeric classes beyond `exact` (`reassoc` for BatchNorm folding and scale folding,
        `approx`), as `rewrite optimize --allow`; a string or a list.
    skip/only: rule names, globs or `ruleset:NAME`, as `rewrite optimize --skip/--only`
        (`engine.selection.pick_rules`); the excluded rules are in `report.skipped`.
    check (default True): run both modules on `example_inputs` and compare every output with
        the tolerance of the loosest numeric class that fired (`engine.optimize.TOLERANCES`),
        or `atol`/`rtol` when given (float outputs).
    freeze: take parameters that torch.compile passes as inputs as constants (inference only);
        a GraphModule's own parameters (`get_attr` nodes) are constants either way, and the
        folded ones come back as buffers, not trainable parameters.
    cost: a `engine.cost.CostModel`.
    provenance (default True): each fx node a rewrite produced (and each folded constant's node)
        gets `node.meta["rewrite"]`, the tree of rules that justify it (`engine.provenance`).
    max_iterations, max_nodes, timeout (seconds): saturation limits.
    Returns (module, Report): a new GraphModule (ExportedProgram for one), or `gm` itself when
    nothing cheaper was found. Raises TypeError for a `gm` of another type (an nn.Module), for
    an unknown keyword (naming it and the accepted ones), for example_inputs given as a tensor
    and for a check/freeze/provenance that is not a bool, ValueError for a value no option
    takes (`engine.optimize.option_problem`: an unknown numeric class, a limit that is not
    positive; `dsl.rules_given`: a rules path that does not exist or holds no `.rules` file),
    FxCheckError when the check fails, and
    `engine.selection.UnknownRulePatternError` for a skip/only pattern matching no rule.
    """
    unknown = sorted(set(options) - set(FX_OPTIONS))
    if unknown:
        raise TypeError(
            f"optimize_fx: unknown option {', '.join(map(repr, unknown))}; "
            f"accepted: {', '.join(FX_OPTIONS)}"
        )
    if not isinstance(gm, (torch.fx.GraphModule, torch.export.ExportedProgram)):
        raise TypeError(
            f"optimize_fx: takes a torch.fx.GraphModule or a torch.export.ExportedProgram, not "
            f"a {type(gm).__name__} (torch.fx.symbolic_trace(module) or "
            "torch.export.export(module, inputs) makes one; torch.compile(module, "
            "backend='rewrite') takes a module)"
        )
    if isinstance(example_inputs, torch.Tensor):
        raise TypeError("optimize_fx: example_inputs is a tuple of inputs, (x,) for one tensor")
    for flag in ("check", "freeze", "provenance"):
        if flag in options and not isinstance(options[flag], bool):
            raise TypeError(f"optimize_fx: {flag} takes True or False, not {options[flag]!r}")
    allow = _listed(options.get("allow", ()))
    limits = {k: options[k] for k in ("max_iterations", "max_nodes", "timeout") if k in options}
    problem = option_problem(allow, **limits, atol=options.get("atol"), rtol=options.get("rtol"))
    if problem:
        raise ValueError(f"optimize_fx: {problem}")
    fp = ("exact", *(c for c in allow if c != "exact"))
    skip, only = _listed(options.get("skip", ())), _listed(options.get("only", ()))
    freeze, check = options.get("freeze", False), options.get("check", True)
    cost, provenance = options.get("cost", CostModel()), options.get("provenance", True)
    rules = shipped_rules() if rules is None else _rules(rules)
    rules, excluded = pick_rules(rules, skip, only)
    if example_inputs is None and isinstance(gm, torch.export.ExportedProgram):
        example_inputs = _exported_inputs(gm)
    before = fx_op_counts(gm)
    try:
        graph = import_fx(gm, example_inputs, freeze=freeze)
    except FxImportError as e:
        return gm, skipped_report(before, str(e))
    out, report = optimize(graph, rules, Limits(**limits), cost, fp, provenance=provenance)
    report = replace(report, skipped={**excluded, **report.skipped})
    result, extra = gm, {}
    if graph.meta.in_order:
        extra["in_order"] = "; ".join(graph.meta.in_order)
    if out is not graph:
        try:
            result = export_fx(out)
        except FxExportError as e:
            extra["skipped"] = str(e)
    if result is gm:
        report = replace(report, provenance={})
    after = fx_op_counts(result)
    report = replace(
        report,
        nodes_before=sum(before.values()),
        ops_before=before,
        nodes_after=sum(after.values()),
        ops_after=after,
        changed=result is not gm,
        extra={**report.extra, **extra},
    )
    if check and result is not gm and _concrete(example_inputs):
        tolerance = (options.get("rtol"), options.get("atol"))
        clock = time.perf_counter()
        compare(gm, result, example_inputs, report.fp, tolerance)
        seconds = {**report.seconds, "output check": time.perf_counter() - clock}
        report = replace(report, seconds=seconds)
    return result, report


def _listed(value) -> tuple[str, ...]:
    """Names from a string ("a,b") or an iterable of such strings."""
    items = [value] if isinstance(value, str) else list(value or ())
    return tuple(p.strip() for v in items for p in str(v).split(",") if p.strip())


def _rules(rules):
    try:
        return rules_given(rules)
    except RulePathError as e:
        raise ValueError(f"optimize_fx: {e}") from None


def skipped_report(ops: dict[str, int], reason: str) -> Report:
    """The Report of a module left unchanged without running the engine."""
    n = sum(ops.values())
    return Report(
        "skipped",
        0,
        0,
        0,
        {},
        {},
        {},
        {},
        n,
        n,
        ops,
        ops,
        0.0,
        0.0,
        False,
        "exact",
        {"skipped": reason},
    )


def fx_op_counts(gm) -> dict[str, int]:
    """Target -> number of call nodes (call_function, call_method, call_module) in `gm`."""
    if isinstance(gm, torch.export.ExportedProgram):
        gm = gm.graph_module
    counts: Counter = Counter()
    for n in gm.graph.nodes:
        if n.op == "call_function":
            counts[_qualified(n.target)] += 1
        elif n.op == "call_method":
            counts[f"Tensor.{n.target}"] += 1
        elif n.op == "call_module":
            counts[type(gm.get_submodule(n.target)).__name__] += 1
    return dict(counts)


def op_coverage(gm, example_inputs=None, *, freeze: bool = False) -> dict[str, tuple[int, int]]:
    """Which call nodes of `gm` (GraphModule or ExportedProgram) the rules can see.

    Returns target (named as `fx_op_counts` names it) -> (nodes, opaque nodes): a node the
    importer lowers to canonical ops counts as seen (also a split or batch norm whose items are
    lowered at their `getitem`s), an opaque one as not. Raises FxImportError as `import_fx`."""
    graph = import_fx(gm, example_inputs, freeze=freeze)
    opaque = {n.name for n in graph.nodes if n.opaque}
    module = gm.graph_module if isinstance(gm, torch.export.ExportedProgram) else gm
    counts: dict[str, list[int]] = {}
    for n in module.graph.nodes:
        if n.op == "call_function":
            key = _qualified(n.target)
        elif n.op == "call_method":
            key = f"Tensor.{n.target}"
        elif n.op == "call_module":
            key = type(module.get_submodule(n.target)).__name__
        else:
            continue
        entry = counts.setdefault(key, [0, 0])
        entry[0] += 1
        entry[1] += n.name in opaque
    return {k: (v[0], v[1]) for k, v in counts.items()}


def _qualified(target) -> str:
    """`torch.conv2d`, `torch.ops.aten.add.Tensor`, `_operator.add`: what a call_function calls
    (the name fx prints in generated code)."""
    try:
        return fx.node._get_qualified_name(target)
    except (AttributeError, RuntimeError):  # an object fx cannot name: its repr
        return str(target)


def compare(original, optimized, example_inputs, fp: str = "exact", tolerance=(None, None)):
    """Run both modules on `example_inputs`; raise FxCheckError if an output differs by more
    than the tolerance of numeric class `fp` for its dtype (|a-b| <= atol + rtol*|b|), or
    `tolerance` (rtol, atol; each None for the class's) for float outputs."""
    with torch.no_grad():
        want, got = (_leaves(_untouched_call(m, example_inputs)) for m in (original, optimized))
    if len(want) != len(got):
        raise FxCheckError(f"{len(got)} outputs, expected {len(want)}")
    for i, (a, b) in enumerate(zip(got, want)):
        if not isinstance(b, torch.Tensor):
            if a != b:
                raise FxCheckError(f"output {i}: {a!r} != {b!r}")
            continue
        rtol, atol = TOLERANCES[fp].get(onnx_elem(b.dtype), (0.0, 0.0))
        if b.is_floating_point():
            rtol = rtol if tolerance[0] is None else tolerance[0]
            atol = atol if tolerance[1] is None else tolerance[1]
        if a.shape != b.shape or a.dtype != b.dtype or not torch.allclose(a, b, rtol, atol, True):
            err = (a.double() - b.double()).abs().max().item() if a.shape == b.shape else "shape"
            raise FxCheckError(f"output {i} differs (max |a-b| {err}; rtol {rtol}, atol {atol})")


def _untouched_call(m, inputs):
    """`m` run on `inputs` under `frontends.fx.nodes.untouched`: a Dropout in training mode
    drew anew in each module and failed the check of a correct rewrite (the black-box
    tester's BERT in training mode)."""
    with untouched(m):
        return _call(m, inputs)


def _concrete(inputs) -> bool:
    """True when the inputs can be run: real tensors and Python numbers (no fake tensors or
    SymInts, which torch.compile passes for dynamic shapes)."""
    if inputs is None:
        return False
    for x in inputs:
        if isinstance(x, torch.Tensor):
            if isinstance(x, torch._subclasses.FakeTensor) or x.device.type == "meta":
                return False
        elif not isinstance(x, (int, float, bool)) or isinstance(x, torch.SymInt):
            return False
    return True


def _exported_inputs(ep) -> tuple | None:
    """The user inputs an ExportedProgram was exported with (`ep.example_inputs`: its args
    and kwargs), flattened in the order of its placeholders; None when it kept none."""
    if ep.example_inputs is None:
        return None
    return tuple(torch.utils._pytree.tree_leaves(ep.example_inputs))


def _call(m, inputs):
    """`m` run on `inputs`: a module's positional arguments; an ExportedProgram's user inputs
    flattened (its args, then its kwargs' values), unflattened by its call spec into the args
    and kwargs its module takes. Raises FxCheckError when their number is not the program's."""
    if not isinstance(m, torch.export.ExportedProgram):
        return m(*inputs)
    spec = m.call_spec.in_spec
    if spec is None:
        return m.module()(*inputs)
    if spec.num_leaves != len(inputs):
        raise FxCheckError(
            f"the program takes {spec.num_leaves} user inputs (its args, then its kwargs), "
            f"example_inputs gives {len(inputs)}"
        )
    args, kwargs = torch.utils._pytree.tree_unflatten(list(inputs), spec)
    return m.module()(*args, **kwargs)


def _leaves(out) -> list:
    return torch.utils._pytree.tree_leaves(out)
