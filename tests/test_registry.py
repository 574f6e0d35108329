"""One unit test per registered guard and builder (and a check that none is left untested)."""

import numpy as np
from onnx import TensorProto as TP

from rewrite import registry
from rewrite.types import ClassInfo, TensorType

F32 = TP.FLOAT


def t(*shape, dtype=F32) -> ClassInfo:
    return ClassInfo(TensorType(dtype, tuple(shape)))


def c(array) -> ClassInfo:
    a = np.asarray(array)
    from rewrite.types import onnx_dtype

    return ClassInfo(TensorType(onnx_dtype(a.dtype), a.shape), a)


TESTED: set[str] = set()


def covers(name):
    TESTED.add(name)
    return registry.GUARDS.get(name) or registry.BUILDERS[name]


def test_identity_perm():
    f = covers("identity-perm").fn
    assert f((0, 1, 2)) and f((0,)) and f(())
    assert not f((1, 0)) and not f(None)


def test_compose_perm():
    f = covers("compose-perm").fn
    x = np.arange(24).reshape(2, 3, 4)
    for p, q in [((1, 0, 2), (0, 2, 1)), ((2, 0, 1), (2, 0, 1)), ((1, 2, 0), (1, 0, 2))]:
        r = f(p, q)
        np.testing.assert_array_equal(x.transpose(p).transpose(q), x.transpose(r))
    assert f((1, 0), (0, 2, 1)) is None and f(None, (0,)) is None


def test_is_constant():
    f = covers("is-constant").fn
    assert f(c([1.0])) and not f(t(2))


def test_all_equal():
    f = covers("all-equal").fn
    assert f(c(np.zeros((2, 3), np.float32)), 0) and f(c([1, 1]), 1)
    assert not f(c([0.0, 1.0]), 0) and not f(t(2), 0)
    assert not f(c([np.nan]), np.nan)  # NaN never equals
    assert not f(c(np.zeros((0,), np.float32)), 0)  # empty: nothing to compare


def test_one_element():
    f = covers("one-element").fn
    assert f(c(np.float32(0.25))) and f(c([[2.0]])) and not f(c([1.0, 2.0])) and not f(t())


def test_same_values():
    f = covers("same-values").fn
    assert f(c([1, 2]), c([1, 2])) and not f(c([1, 2]), c([2, 1])) and not f(c([1]), c([[1]]))
    assert not f(t(2), c([1, 2]))


def test_no_zero_dims():
    f = covers("no-zero-dims").fn
    assert f(c([2, -1])) and not f(c([0, 4])) and not f(t(2))


def test_rank():
    f = covers("rank").fn
    assert f(t(2, 3), 2) and not f(t(2, 3, 4), 2) and not f(ClassInfo(TensorType(F32, None)), 2)


def test_rank_at_least():
    f = covers("rank-at-least").fn
    assert f(t(2, 3, 4), 3) and f(t(2, 3, 4, 5), 3) and not f(t(2, 3), 3)
    assert not f(ClassInfo(TensorType(F32, None)), 0)


def test_shape_of():
    f = covers("shape-of").fn
    assert f(t(2, 3)) == (2, 3) and f(t("n", 3)) is None and f(t(0, 3)) is None


def test_rows_2d():
    f = covers("rows-2d").fn
    assert f(t(2, 5, 3)) == (-1, 3) and f(t("n", 5, 3)) == (-1, 3)
    assert f(t(2, "k")) is None and f(t(2, 0)) is None and f(t()) is None


def test_same_type():
    f = covers("same-type").fn
    assert f(t(2, 3), t(2, 3)) and not f(t(2, 3), t(3, 2)) and not f(t(2, 3), t(2, 3, dtype=TP.FLOAT16))
    assert f(t("n", 3), t("n", 3))  # one symbol is one size (ONNX dim_param)
    assert not f(t("n", 3), t("m", 3)) and not f(t(None, 3), t(None, 3)) and not f(t("n"), t(2))
    assert not f(ClassInfo(TensorType(F32, None)), ClassInfo(TensorType(F32, None)))


def test_has_dtype():
    f = covers("has-dtype").fn
    assert f(t(2), F32) and not f(t(2), TP.INT64) and not f(ClassInfo(TensorType()), 0)


def test_broadcasts_into():
    f = covers("broadcasts-into").fn
    assert f(t(1), t(4, 3)) and f(t(3), t(4, 3)) and f(t(4, 1), t(4, 3))
    assert not f(t(2, 4, 3), t(4, 3))  # would grow x
    assert not f(t(5), t(4, 3)) and not f(t("n"), t(4, 3))
    # symbolic dimensions: the same symbol is the same size; a static 1 broadcasts into any
    assert f(t(64), t("batch", "seq", 64)) and f(t(1, "seq", 1), t("batch", "seq", 64))
    assert f(t("batch", 1, 64), t("batch", "seq", 64)) and f(t(1), t(0, 3))
    assert not f(t("seq", 64), t("batch", 1, 64))  # seq may be > 1
    assert not f(t("n"), t("m")) and not f(t(3), t("n")) and not f(t("n"), t(1))
    assert not f(t(None), t(None)) and not f(t(1), ClassInfo(TensorType(F32, None)))


def test_cast_lossless():
    f = covers("cast-lossless").fn
    assert f(t(2, dtype=TP.FLOAT16), F32) and f(t(2, dtype=TP.INT32), TP.INT64)
    assert not f(t(2), TP.FLOAT16) and not f(t(2, dtype=TP.INT64), F32) and not f(t(2), TP.INT32)


def test_bn_shape():
    f = covers("bn-shape").fn
    assert f(t(8, 3, 3, 3)) == (-1, 1, 1, 1) and f(t(8, 3, 5)) == (-1, 1, 1)
    assert f(ClassInfo(TensorType(F32, None))) is None


def test_channel_bias():
    f = covers("channel-bias").fn
    y = t(1, 8, 4, 4)
    assert f(c(np.zeros((8, 1, 1))), y) and f(c(np.zeros((1, 8, 1, 1))), y)
    assert not f(c(np.zeros((8,))), y)  # broadcasts over the last axis, not channels
    assert not f(c(np.zeros((2, 8, 1, 1))), y) and not f(c(np.zeros((8, 4, 1))), y)
    assert not f(t(8, 1, 1), y)
    assert f(c(np.zeros((8, 1, 1))), t("n", 8, "h", "w"))  # dynamic batch and image size
    assert not f(c(np.zeros((8, 1, 1))), t("n", "c", 4, 4))  # channel count unknown


def test_same_dtype():
    f = covers("same-dtype").fn
    assert f(t(2), t(3, 4)) and not f(t(2), t(2, dtype=TP.FLOAT16)) and not f(ClassInfo(TensorType()), t(2))


def test_is_float():
    f = covers("is-float").fn
    assert f(t(2)) and f(t(2, dtype=TP.FLOAT16)) and not f(t(2, dtype=TP.INT64))
    assert not f(ClassInfo(TensorType()))


def test_dtype_of():
    f = covers("dtype-of").fn
    assert f(t(2, dtype=TP.FLOAT16)) == TP.FLOAT16 and f(ClassInfo(TensorType())) is None


def test_every_registered_function_has_a_test():
    names = set(registry.GUARDS) | set(registry.BUILDERS)
    missing = sorted(names - TESTED)
    assert not missing, f"registry functions without a unit test: {missing}"

