"""rewrite: a combiner for tensor graphs (see README.md).

`rewrite.optimize_fx` is the torch.fx entry point (`frontends.fx.optimize_fx`); it is imported on
first use, so `import rewrite` does not import torch.
"""


def __getattr__(name: str):
    if name == "optimize_fx":
        from frontends.fx import optimize_fx

        return optimize_fx
    raise AttributeError(f"module 'rewrite' has no attribute {name!r}")
