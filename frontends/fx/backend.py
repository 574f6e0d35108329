"""`torch.compile(model, backend="rewrite")`: optimize the captured graph, then compile it.

Options (`torch.compile(..., options={...})`):
    backend: "inductor" (default) or "eager" — what runs the optimized graph.
    allow: numeric classes beyond exact, default ("reassoc",). torch.compile already allows
        reassociation (inductor fuses and reorders float arithmetic, and folds BatchNorm into
        convolutions when freezing), so BatchNorm and scale folding are on; pass `allow=()` for
        exact rules only, as `optimize_fx` and `rewrite optimize` default to.
    freeze: treat parameters and buffers as constants so rules can fold them. Default: on
        when the graph is captured with grad disabled (`torch.no_grad()`, inference), off
        otherwise. Frozen values are those at compile time: as with inductor's freezing,
        parameters changed afterwards are not seen by the compiled graph.
    check: compare outputs against the captured graph once (default off); atol, rtol: its
        tolerance for float outputs (default: the numeric class's).
    skip, only: rule names, globs or `ruleset:NAME` to leave out / to run alone, as
        `rewrite optimize --skip/--only` (a pattern matching no rule is an error, which the
        backend turns into a warning and the captured graph).
    max_iterations, max_nodes, timeout: saturation limits.
    cache: reuse the rewrite of the same graph, example inputs (their values when frozen),
        options, rules and engine from `frontends.fx.cache`, on disk beside inductor's caches
        (default on; off with `check`). A hit appends no Report; `cache.STATS` counts hits.
The rewritten graph stays cacheable by inductor's FX graph and AOTAutograd caches (see
`constants_as_inputs`, `fill_example_values`). The backend never fails a model: if the
rewrite raises, the captured graph is used as it is (with a warning, which names an unknown
option), and so it is, with a warning, if inductor fails on the rewritten graph (torch
2.13's attention fusion refused the permute that two merged transposes become, once a
dynamic batch specialized to 1). Each compile's Report is appended to `REPORTS`. The option
names are `optimize_fx`'s (`FX_OPTIONS`), which are `rewrite optimize`'s.
"""

from __future__ import annotations

import copy
import warnings
from contextlib import nullcontext

import torch

from frontends.fx import cache
from frontends.fx.api import FX_OPTIONS, optimize_fx

NAME = "rewrite"
REPORTS: list = []


def rewrite_backend(
    gm: torch.fx.GraphModule, example_inputs, options: dict | None = None, mode: str | None = None
):
    """A torch.compile backend (see the module doc for `options`). `mode` is ignored."""
    opts = dict(options or {})
    backend = opts.pop("backend", "inductor")
    if backend not in ("inductor", "eager"):
        raise ValueError(f"rewrite backend: unknown backend {backend!r} (inductor or eager)")
    freeze = opts.pop("freeze", None)
    freeze = not torch.is_grad_enabled() if freeze is None else freeze
    allow = opts.pop("allow", ("reassoc",))
    use_cache = opts.pop("cache", True)
    check = opts.pop("check", False)
    k = None
    if use_cache and not check:
        try:
            k = cache.key(gm, example_inputs, {"allow": allow, **opts}, freeze)
        except Exception:  # an unkeyable graph compiles without the cache
            k = None
    optimized = cache.load(k, gm, example_inputs) if k else None
    unknown = sorted(set(opts) - set(FX_OPTIONS))
    if unknown:  # optimize_fx's TypeError would list its own options, not the backend's
        accepted = ", ".join(("backend", "cache", *FX_OPTIONS))
        warnings.warn(
            f"rewrite backend: graph left unchanged (unknown option "
            f"{', '.join(map(repr, unknown))}; accepted: {accepted})",
            stacklevel=2,
        )
        optimized = gm
    if optimized is None:
        try:
            optimized, report = optimize_fx(
                gm, example_inputs, allow=allow, freeze=freeze, check=check, **opts
            )
            REPORTS.append(report)
            if k and cache.store(k, optimized, gm, example_inputs):
                # compile what a later hit will load, so that inductor's and AOTAutograd's
                # caches see the same graph both times
                optimized = cache.load(k, gm, example_inputs, count=False) or optimized
        except Exception as e:  # never fail the user's model because of the rewrite
            warnings.warn(
                f"rewrite backend: graph left unchanged ({type(e).__name__}: {e})", stacklevel=2
            )
            optimized = gm
    if optimized is not gm:  # a pickled GraphModule comes back without its nodes' meta
        given = {n.name: n.meta for n in gm.graph.nodes if n.op == "placeholder"}
        for n in optimized.graph.nodes:
            if n.op == "placeholder" and n.name in given and not n.meta:
                n.meta.update(given[n.name])
    if backend == "eager":
        return optimized.forward
    from torch._inductor.compile_fx import compile_fx

    if optimized is gm:
        return compile_fx(gm, example_inputs)
    try:
        return _inductor(optimized, example_inputs, compile_fx)
    except Exception as e:  # inductor's bug on a form the rewrite wrote: the captured graph
        if type(e).__module__.startswith("torch._dynamo"):  # dynamo's restarts and skips
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        warnings.warn(
            f"rewrite backend: inductor failed on the rewritten graph ({type(e).__name__}: "
            f"{first}); the captured graph is compiled instead",
            stacklevel=2,
        )
        return compile_fx(gm, example_inputs)


def _inductor(optimized: torch.fx.GraphModule, example_inputs, compile_fx):
    """`optimized` compiled by inductor's `compile_fx`, its constants passed as inputs."""
    optimized, constants = constants_as_inputs(optimized)
    fill_example_values(optimized)
    if not constants:
        return compile_fx(optimized, example_inputs)
    compiled = compile_fx(optimized, [*example_inputs, *constants])

    def run(*args):  # compile_fx's result takes the inputs unboxed, as dynamo calls it
        return compiled(*args, *constants)

    return run


def constants_as_inputs(gm: torch.fx.GraphModule):
    """`gm` with each tensor it reads by `get_attr` (the constants the rewrite folded, e.g.
    BatchNorm folded into convolution weights) turned into a trailing placeholder, and those
    tensors in placeholder order; `(gm, [])` when it reads none.

    Inductor hashes the values of get_attr tensors into its FX graph cache key (`t.tolist()`
    of each, a cost that grows with the bytes folded, e.g. ResNet's BatchNorm-folded
    convolution weights); as graph inputs, folded weights are handled as the parameters of an
    unrewritten graph are, by shape and dtype."""
    attrs = [
        n
        for n in gm.graph.nodes
        if n.op == "get_attr" and isinstance(_attr(gm, n.target), torch.Tensor)
    ]
    if not attrs:
        return gm, []
    graph = copy.deepcopy(gm.graph)
    last = [n for n in graph.nodes if n.op == "placeholder"][-1:]
    tensors = []
    for node in [
        n for n in graph.nodes if n.op == "get_attr" and n.name in {a.name for a in attrs}
    ]:
        tensors.append(_attr(gm, node.target))
        anchor = last[0].next if last else next(iter(graph.nodes))
        with graph.inserting_before(anchor):
            p = graph.placeholder(f"{node.name}_input")
        p.meta = dict(node.meta)
        p.meta.setdefault("example_value", tensors[-1])
        node.replace_all_uses_with(p)
        graph.erase_node(node)
        last = [p]
    out = torch.fx.GraphModule(gm, graph, gm.__class__.__name__)
    out.meta = dict(getattr(gm, "meta", {}))
    return out, tensors


def fill_example_values(gm: torch.fx.GraphModule) -> bool:
    """Give every node of `gm` the `meta["example_value"]` (a fake tensor) that dynamo gives
    the nodes it captures; whether it could. The nodes the rewrite wrote have none, and
    AOTAutograd's cache refuses a graph with a method call on a node without one ("Unsupported
    call_method target"), which costs 3 s of every warm-cache first call of ViT-base. Values
    are propagated under the fake mode of the placeholders' own example values, with guards
    suppressed; a graph with symbolic sizes (dynamic shapes) is left as it is, so that nothing
    here can add a guard on dynamo's symbols (it then compiles without AOTAutograd's cache)."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    nodes = [n for n in gm.graph.nodes if n.op != "output"]
    if all("example_value" in n.meta for n in nodes):
        return True
    values = [p.meta.get("example_value") for p in nodes if p.op == "placeholder"]
    if any(not isinstance(v, torch.Tensor) or _symbolic(v) for v in values):
        return False  # symbolic sizes: propagating would issue guards on dynamo's symbols
    modes = {id(v.fake_mode): v.fake_mode for v in values if isinstance(v, FakeTensor)}
    if len(modes) != 1:  # (detect_fake_mode would prefer the tracing context's mode)
        return False
    mode = next(iter(modes.values()))
    args = [
        v if isinstance(v, FakeTensor) else mode.from_tensor(v, static_shapes=True) for v in values
    ]
    quiet = mode.shape_env.suppress_guards() if mode.shape_env is not None else nullcontext()
    try:
        with quiet:
            FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*args)
    except Exception:  # the cache is an optimization; a graph it refuses still compiles
        return False
    for n in gm.graph.nodes:
        if n.op != "output" and "example_value" not in n.meta and "val" in n.meta:
            n.meta["example_value"] = n.meta["val"]
    return True


def _symbolic(t: torch.Tensor) -> bool:
    return any(isinstance(d, torch.SymInt) for d in (*t.shape, *t.stride()))


def _attr(gm: torch.nn.Module, target: str):
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def register() -> None:
    """Register the backend under "rewrite" unless it is registered, or will be loaded from the
    `torch_dynamo_backends` entry point (which would then register it a second time)."""
    from torch._dynamo.backends import registry

    if NAME in registry._COMPILER_FNS or registry._BACKENDS.get(NAME) is not None:
        return
    registry.register_backend(rewrite_backend, name=NAME)
