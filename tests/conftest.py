"""Test isolation for everything that compiles with torch, and shared fixtures.

Each test process (each xdist worker) gets its own inductor cache directory, removed at the
end, so no test reads compiled graphs, autograd-cache entries or dynamo's profile-guided
dynamic-shape records that another run or another worker left in the shared default
(`/tmp/torchinductor_$USER`). Every test starts from a clean in-process dynamo state
(`torch.compiler.reset()`), so none depends on which test file ran before it on its worker.
"""

import os
import shutil
import sys
import tempfile

import onnx
import pytest
from onnx.reference import ReferenceEvaluator

_CACHE = tempfile.mkdtemp(prefix="rewrite-tests-inductor-")
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _CACHE


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_CACHE, ignore_errors=True)


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Reset dynamo before and after the test when torch is loaded (tests that never import
    torch pay nothing)."""
    if "torch" in sys.modules:
        sys.modules["torch"].compiler.reset()
    yield
    if "torch" in sys.modules:
        sys.modules["torch"].compiler.reset()


@pytest.fixture
def reference_at_19():
    """A function of an ONNX model: onnx.reference on it with its default-domain opset raised
    to 19 (the reference implements (De)QuantizeLinear from opset 19 on, the same for 8-bit
    values as before): a quantized model's integer sums computed exactly in int32."""

    def evaluator(model: onnx.ModelProto) -> ReferenceEvaluator:
        at19 = onnx.ModelProto.FromString(model.SerializeToString())
        for o in at19.opset_import:
            o.version = max(19, o.version) if o.domain == "" else o.version
        return ReferenceEvaluator(at19)

    return evaluator
