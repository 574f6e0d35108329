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
    check: compare outputs against the captured graph once (default off).
    skip, only: rule names, globs or `ruleset:NAME` to leave out / to run alone, as
        `rewrite optimize --skip/--only` (a pattern matching no rule is an error, which the
        backend turns into a warning and the captured graph).
    max_iterations, max_nodes, timeout: saturation limits.
The backend never fails a model: if the rewrite raises, the captured graph is used as it is
(with a warning). Each compile's Report is appended to `REPORTS`.
"""

from __future__ import annotations

import warnings

import torch

from frontends.fx.api import optimize_fx

NAME = "rewrite"
REPORTS: list = []


def rewrite_backend(gm: torch.fx.GraphModule, example_inputs, options: dict | None = None,
                    mode: str | None = None):
    """A torch.compile backend (see the module doc for `options`). `mode` is ignored."""
    opts = dict(options or {})
    backend = opts.pop("backend", "inductor")
    if backend not in ("inductor", "eager"):
        raise ValueError(f"rewrite backend: unknown backend {backend!r} (inductor or eager)")
    freeze = opts.pop("freeze", None)
    freeze = not torch.is_grad_enabled() if freeze is None else freeze
    fp = ("exact", *opts.pop("allow", ("reassoc",)))
    try:
        optimized, report = optimize_fx(gm, example_inputs, fp=fp, freeze=freeze,
                                        check=opts.pop("check", False), **opts)
        REPORTS.append(report)
    except Exception as e:  # never fail the user's model because of the rewrite
        warnings.warn(f"rewrite backend: graph left unchanged ({type(e).__name__}: {e})",
                      stacklevel=2)
        optimized = gm
    if backend == "eager":
        return optimized.forward
    from torch._inductor.compile_fx import compile_fx  # noqa: PLC0415

    return compile_fx(optimized, example_inputs)


def register() -> None:
    """Register the backend under "rewrite" unless it is registered, or will be loaded from the
    `torch_dynamo_backends` entry point (which would then register it a second time)."""
    from torch._dynamo.backends import registry  # noqa: PLC0415

    if NAME in registry._COMPILER_FNS or registry._BACKENDS.get(NAME) is not None:
        return
    registry.register_backend(rewrite_backend, name=NAME)
