"""rewrite: a combiner for tensor graphs (see README.md).

Two entry points, imported on first use so that `import rewrite` imports neither onnx nor
torch:

    optimized, report = rewrite.optimize_model("model.onnx")       # frontends.onnx.api
    gm, report = rewrite.optimize_fx(gm, example_inputs)            # frontends.fx

Both take the options of `rewrite optimize` as keywords (`allow=`, `skip=`, `only=`,
`check=`, `atol=`, `rtol=`, `max_iterations=`, `max_nodes=`, `timeout=`).
"""


# Lazy on purpose (PEP 562): `import rewrite` stays light, and the public API is the only place
# above `verify` that imports a frontend inside a function (tests/test_layers.py allows it here).
def __getattr__(name: str):
    if name == "__version__":  # pyproject.toml's, as installed (one place for the number)
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("rewrite")
        except PackageNotFoundError:
            return "unknown (not installed)"
    if name == "optimize_fx":
        from frontends.fx import optimize_fx

        return optimize_fx
    if name == "optimize_model":
        from frontends.onnx.api import optimize_model

        return optimize_model
    if name == "RewriteWarning":  # what optimize_model warns with (nothing quantized, ...)
        from frontends.onnx.api import RewriteWarning

        return RewriteWarning
    raise AttributeError(f"module 'rewrite' has no attribute {name!r}")
