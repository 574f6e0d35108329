"""torch.fx frontend: the engine's rules on GraphModules, as a function, a pass and a
torch.compile backend.

    optimize_fx(gm, example_inputs, rules=None, **limits) -> (GraphModule, Report)
    RewritePass(example_inputs, ...)            a PassBase for PassManager
    torch.compile(model, backend="rewrite")     registered on import (and by entry point)

import_fx / export_fx are the two halves, TermGraph in between (see importer and exporter).
"""

from frontends.fx.api import (
    FxCheckError,
    compare,
    fx_op_counts,
    op_coverage,
    optimize_fx,
    shipped_rules,
)
from frontends.fx.backend import register as _register
from frontends.fx.backend import rewrite_backend
from frontends.fx.exporter import FxExportError, export_fx
from frontends.fx.importer import import_fx
from frontends.fx.nodes import FxImportError
from frontends.fx.passes import RewritePass

__all__ = [
    "optimize_fx",
    "RewritePass",
    "rewrite_backend",
    "import_fx",
    "export_fx",
    "compare",
    "fx_op_counts",
    "op_coverage",
    "shipped_rules",
    "FxImportError",
    "FxExportError",
    "FxCheckError",
]

_register()
