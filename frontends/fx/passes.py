"""The rewrite engine as a torch.fx pass, for `torch.fx.passes.infra.pass_manager.PassManager`.

from torch.fx.passes.infra.pass_manager import PassManager
result = PassManager([RewritePass(example_inputs)])(gm)   # result.graph_module
"""

from __future__ import annotations

from torch import fx
from torch.fx.passes.infra.pass_base import PassBase, PassResult

from frontends.fx.api import optimize_fx


class RewritePass(PassBase):
    """Runs `optimize_fx` on the graph module it is given.

    The arguments are those of `optimize_fx` (example inputs, rules, fp, freeze, check,
    limits). `call` returns a PassResult with the optimized module (the input module itself
    when nothing changed) and `modified`; the last Report is kept in `self.report`.
    """

    def __init__(self, example_inputs=None, rules=None, **options):
        super().__init__()
        self.example_inputs, self.rules, self.options = example_inputs, rules, options
        self.report = None

    def call(self, graph_module: fx.GraphModule) -> PassResult:
        """Optimize `graph_module` with `optimize_fx`; the Report is kept in `self.report`."""
        module, self.report = optimize_fx(
            graph_module, self.example_inputs, self.rules, **self.options
        )
        return PassResult(module, self.report.changed)
