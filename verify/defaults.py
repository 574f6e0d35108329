"""Defaults shared by the verifier's entry points, in a module light enough for the `rewrite`
command line to import at start-up (the runner imports Hypothesis, onnxruntime and the engine)."""

DEFAULT_EXAMPLES = 50  # examples per rule and direction
