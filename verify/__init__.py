"""Rule verification: Hypothesis differential testing of every rule (the project's Alive2).

    from dsl import load_rules
    from verify import verify_rule, verify_rules

    rules = load_rules(["my.rules"])
    for result in verify_rules(rules, examples=50, seed=0):
        print(result.rule.name, result.status, result.examples, result.max_abs)
        if result.failure:
            print(result.failure.text, "\\nreproduce:", result.repro)

For each rule (both directions of an `equal` rule), examples of the left side are drawn
(`verify.draw`: shapes with broadcasting, size-1 and size-0 dimensions and ranks 0 to 5,
every dtype the ONNX schemas allow, values with NaN, infinities and -0.0, free attributes),
steered by the guards' hints (`verify.hints`) and bound exactly as the engine binds a match
(`verify.instance`); both sides run on onnxruntime and `onnx.reference` (`verify.check`) and
are compared bit for bit or with the rule class's tolerance (`verify.compare`). Companion
checks run the engine itself (`verify.engine`). A failure shrinks to a minimal counterexample.

Entry points: `rewrite verify` (`verify.cli`), the pytest plugin (`verify.pytest_plugin`)
and `bench/verify_rules.py`.
"""

from __future__ import annotations

__all__ = ["DEFAULT_EXAMPLES", "RuleResult", "verify_rule", "verify_rules"]


def __getattr__(name: str):
    # lazy: importing `verify.pytest_plugin` (at every pytest start) must not load the
    # executors and the engine
    if name in __all__:
        from verify import runner

        return getattr(runner, name)
    raise AttributeError(f"module 'verify' has no attribute {name!r}")
