"""One unit test per registered guard and builder (and a check that none is left untested)."""

import numpy as np
import onnx.parser
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import rewrite
from vocab import registry
from vocab.types import ClassInfo, TensorType

F32 = TP.FLOAT


def t(*shape, dtype=F32) -> ClassInfo:
    return ClassInfo(TensorType(dtype, tuple(shape)))


def c(array) -> ClassInfo:
    a = np.asarray(array)
    from vocab.types import onnx_dtype

    return ClassInfo(TensorType(onnx_dtype(a.dtype), a.shape), a)


TESTED: set[str] = set()


def covers(name):
    TESTED.add(name)
    return registry.GUARDS.get(name) or registry.BOUNDS.get(name) or registry.BUILDERS[name]


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


def test_negative_and_positive_zeros():
    neg, pos = covers("negative-zeros").fn, covers("positive-zeros").fn
    assert neg(c(np.full((2,), -0.0, np.float32))) and not neg(c(np.zeros(2, np.float32)))
    assert pos(c(np.zeros(2, np.float32))) and not pos(c(np.full((2,), -0.0, np.float32)))
    assert not neg(c(np.array([-0.0, 0.0], np.float32)))  # mixed signs: neither
    assert not pos(c(np.array([-0.0, 0.0], np.float32)))
    assert neg(c(np.zeros(3, np.int64))) and pos(c(np.zeros(3, np.int64)))  # one integer zero
    assert not neg(c(np.float32(1.0))) and not pos(c([np.nan])) and not pos(t(2))


def test_one_element():
    f = covers("one-element").fn
    assert f(c(np.float32(0.25))) and f(c([[2.0]])) and not f(c([1.0, 2.0])) and not f(t())


def test_normal_product():
    f = covers("normal-product").fn
    f32 = np.float32
    assert f(c(f32([2.0, -3.0])), c(f32(0.5)))
    assert f(c(f32([0.0, 1.0])), c(f32(1e-30)))  # a zero factor may give 0
    assert not f(c(f32(2.08e-36)), c(f32(2.08e-36)))  # underflows to 0 (the verifier's case)
    assert not f(c(f32(1e-20)), c(f32(1e-20)))  # 1e-40 is subnormal in float32
    assert f(c(np.float64(1e-20)), c(np.float64(1e-20)))  # normal in float64
    assert not f(c(f32(1e30)), c(f32(1e30)))  # overflows
    assert not f(c(np.float16(300)), c(np.float16(300)))  # overflows in float16
    assert f(c(np.int32([7])), c(np.int32([1 << 30])))  # integers wrap: always holds
    assert not f(c(f32([1, 2])), c(f32([1, 2, 3])))  # does not broadcast
    assert not f(c(f32(1)), t())  # not a constant


def test_finite_sum():
    f = covers("finite-sum").fn
    big = np.finfo(np.float32).max
    assert f(c(np.float32([1.0, -2.0])), c(np.float32(3.0)))
    assert not f(c(np.float32(big)), c(np.float32(-big)))  # |a| + |b| overflows
    assert f(c(np.int8(100)), c(np.int8(100)))  # integers wrap: always holds
    assert not f(c(np.float32(1)), c(np.float64(1)))  # mixed dtypes
    assert not f(t(), c(np.float32(1)))


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
    assert (
        f(t(2, 3), t(2, 3))
        and not f(t(2, 3), t(3, 2))
        and not f(t(2, 3), t(2, 3, dtype=TP.FLOAT16))
    )
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
    # a scalar broadcasts into any shape, even one of unknown rank
    assert f(t(), t("n", 3)) and f(t(), ClassInfo(TensorType(F32, None))) and f(t(), t())


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
    assert (
        f(t(2), t(3, 4))
        and not f(t(2), t(2, dtype=TP.FLOAT16))
        and not f(ClassInfo(TensorType()), t(2))
    )


def test_is_float():
    f = covers("is-float").fn
    assert f(t(2)) and f(t(2, dtype=TP.FLOAT16)) and not f(t(2, dtype=TP.INT64))
    assert not f(ClassInfo(TensorType()))


def test_dtype_of():
    f = covers("dtype-of").fn
    assert f(t(2, dtype=TP.FLOAT16)) == TP.FLOAT16 and f(ClassInfo(TensorType())) is None


def test_all_equal_into():
    f = covers("all-equal-into").fn
    x = t("batch", "seq", 4)
    assert f(c(np.float32(0.5)), 0.5, x) and f(c(np.full((1, 4), 2, np.int64)), 2, x)
    assert not f(c(np.full((2, 4), 0.5, np.float32)), 0.5, x)  # grows x
    assert not f(c(np.float32(0.25)), 0.5, x) and not f(t(), 0.5, x)
    # the value is rounded to the constant's dtype: sqrt(2) as float32, float16 and double
    for dtype in (np.float32, np.float16, np.float64):
        assert f(c(np.asarray(np.sqrt(2), dtype)), 1.4142135623730951, x)
    assert not f(c(np.float32(1.4142)), 1.4142135623730951, x)


def test_scalar_of():
    f = covers("scalar-of").fn
    assert (
        f(c(np.float32(1e-5))) == float(np.float32(1e-5))
        and f(c(np.full((1, 1), 0.5, np.float16))) == 0.5
    )
    assert f(c(np.float64(0.25))) == 0.25  # a double that is a float32 too
    assert f(c(np.float64(1e-5))) is None  # the attribute is a float32: 1e-5 would change
    assert (
        f(c(np.array([1.0, 2.0], np.float32))) is None
        and f(c(np.int64(1))) is None
        and f(t()) is None
    )


def test_last_axis():
    f = covers("last-axis").fn
    x = t("batch", "seq", 64)
    assert f(c([-1]), x) and f(c([2]), x) and f(c(np.int64(-1)), x)
    assert not f(c([1]), x) and not f(c([-2]), x) and not f(c([1, 2]), x) and not f(t(1), x)
    assert not f(c([-1]), ClassInfo(TensorType(F32, None))) and not f(c([-1]), t())


def test_last_dim_vector():
    f = covers("last-dim-vector").fn
    assert f(t(64), t("batch", "seq", 64)) and f(t("d"), t(2, "d"))
    assert not f(t(1), t(2, 64)) and not f(t(1, 64), t(2, 64)) and not f(t(None), t(2, None))
    assert not f(t(64), ClassInfo(TensorType(F32, None))) and not f(t(64), t())


def test_spatial_pads():
    f = covers("spatial-pads").fn
    x = t("n", 3, "h", "w")
    assert f(c([0, 0, 1, 1, 0, 0, 1, 1]), x) and f(c([0, 0, 0, 2, 0, 0, 0, 0]), x)
    assert not f(c([0, 1, 1, 1, 0, 0, 1, 1]), x)  # pads channels
    assert not f(c([0, 0, 1, -1, 0, 0, 1, 1]), x)  # crops
    assert not f(c([0] * 8), x) and not f(c([0, 0, 1, 1]), x) and not f(t(8), x)
    assert not f(c([0, 0, 0, 0]), t(2, 3)) and not f(c([0] * 8), ClassInfo(TensorType(F32, None)))


def test_merge_pads():
    f = covers("merge-pads").fn
    x = t("n", 3, "h", "w")
    assert f(c([0, 0, 1, 2, 0, 0, 3, 4]), None, x) == (1, 2, 3, 4)
    assert f(c([0, 0, 1, 2, 0, 0, 3, 4]), (1, 1, 1, 1), x) == (2, 3, 4, 5)
    assert f(c([0, 0, 1, 2, 0, 0, 3, 4]), (1, 1), x) is None  # pads of another rank
    assert f(c([0, 1, 1, 2, 0, 0, 3, 4]), None, x) is None  # not spatial-pads

    # the merged Conv computes what Pad + Conv computes
    import onnx.reference
    from onnx import helper

    rng = np.random.default_rng(0)
    xv, w = (
        rng.standard_normal((1, 2, 5, 4), np.float32),
        rng.standard_normal((3, 2, 3, 2), np.float32),
    )
    pads, conv_pads = np.array([0, 0, 2, 0, 0, 0, 1, 3]), (1, 0, 0, 1)
    merged = f(c(pads), conv_pads, t(1, 2, 5, 4))

    def run(nodes, inits):
        g = helper.make_graph(
            nodes,
            "g",
            [helper.make_tensor_value_info("x", F32, None)],
            [helper.make_tensor_value_info("y", F32, None)],
            inits,
        )
        return onnx.reference.ReferenceEvaluator(helper.make_model(g)).run(None, {"x": xv})[0]

    want = run(
        [
            helper.make_node("Pad", ["x", "p"], ["t"]),
            helper.make_node("Conv", ["t", "w"], ["y"], pads=list(conv_pads)),
        ],
        [onnx.numpy_helper.from_array(pads, "p"), onnx.numpy_helper.from_array(w, "w")],
    )
    got = run(
        [helper.make_node("Conv", ["x", "w"], ["y"], pads=list(merged))],
        [onnx.numpy_helper.from_array(w, "w")],
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_merge_pool_pads():
    f = covers("merge-pool-pads").fn
    x = t(1, 3, 6, 6)
    assert f(c([0, 0, 1, 0, 0, 0, 1, 1]), None, x, (3, 3)) == (1, 0, 1, 1)
    assert f(c([0, 0, 1, 0, 0, 0, 1, 1]), (1, 1, 0, 0), x, (3, 3)) == (2, 1, 1, 1)
    # onnxruntime wants every pad smaller than the kernel along its axis
    assert f(c([0, 0, 1, 0, 0, 0, 1, 1]), (1, 1, 0, 0), x, (2, 3)) is None
    assert f(c([0, 0, 1, 0, 0, 0, 1, 1]), None, x, (1, 3)) is None
    assert f(c([0, 0, 1, 0, 0, 0, 1, 1]), None, x, None) is None  # no kernel
    assert f(c([0, 1, 1, 0, 0, 0, 1, 1]), None, x, (3, 3)) is None  # pads a channel


def test_static_nonempty_features():
    f = covers("static-nonempty-features").fn
    assert f(t("n", 3, 6, 6)) and f(t(0, 3, 6)) and f(t(1, 1, 1))  # only N may be 0
    assert not f(t(1, 3, 0, 6)) and not f(t(1, 0, 6, 6)) and not f(t(1, 3, "h", 6))
    assert not f(t(1, 3)) and not f(ClassInfo(TensorType(F32, None)))


def test_merge_unsqueeze_axes():
    f = covers("merge-unsqueeze-axes").fn
    rng = np.random.default_rng(0)
    for _ in range(200):
        r, k1, k2 = rng.integers(0, 3), rng.integers(1, 3), rng.integers(1, 3)
        a = rng.choice(r + k1, k1, replace=False) - rng.integers(0, 2) * (r + k1)
        b = rng.choice(r + k1 + k2, k2, replace=False) - rng.integers(0, 2) * (r + k1 + k2)
        x = np.zeros(tuple(rng.integers(2, 4, r)))
        want = np.expand_dims(np.expand_dims(x, tuple(a)), tuple(b)).shape
        got = f(c(a), c(b), t(*x.shape))
        assert np.expand_dims(x, got).shape == want, (x.shape, a, b, got)
    assert f(c([0]), c([0]), ClassInfo(TensorType(F32, None))) is None
    assert f(c([0, 0]), c([1]), t(2)) is None and f(t(1), c([1]), t(2)) is None


def test_merge_squeeze_axes():
    f = covers("merge-squeeze-axes").fn
    x = np.zeros((1, 3, 1, 1, 4))
    assert f(c([0]), c([1]), t(*x.shape)) == (0, 2)  # second squeeze sees (3, 1, 1, 4)
    assert f(c([-2]), c([-2]), t(*x.shape)) == (2, 3)
    assert (
        np.squeeze(np.squeeze(x, (0,)), (-2,)).shape
        == np.squeeze(x, f(c([0]), c([-2]), t(*x.shape))).shape
    )
    assert f(c([0]), c([4]), t(*x.shape)) is None and f(c([0]), t(1), t(*x.shape)) is None


def test_unsqueeze_shape():
    f = covers("unsqueeze-shape").fn
    assert f(c([2, -1, 4]), c([0, -1])) == (1, 2, -1, 4, 1) and f(c([6]), c([1])) == (6, 1)
    assert (
        f(c([0, 4]), c([0])) is None and f(c([2, 4]), c([0, 0])) is None and f(t(2), c([0])) is None
    )


def test_squeeze_shape():
    f = covers("squeeze-shape").fn
    assert f(c([2, 1, -1, 1]), c([1, -1])) == (2, -1) and f(c([1]), c([0])) == ()
    assert f(c([2, -1]), c([1])) is None  # -1 may not be 1
    assert (
        f(c([0, 1]), c([1])) is None and f(c([2, 1]), c([2])) is None and f(c([2, 1]), t(1)) is None
    )


def _ints(v):
    return c(np.asarray(v, np.int64))


def test_slice_merge():
    f = covers("slice-merge").fn
    rng = np.random.default_rng(0)
    ends = [0, 1, 2, 3, 5, -1, -2, -7, 2**62, -(2**62)]
    for _ in range(400):
        shape = tuple(int(d) for d in rng.integers(0, 5, rng.integers(1, 4)))
        x = np.arange(int(np.prod(shape))).reshape(shape)
        r = len(shape)
        slices, y = [], x
        for _ in range(2):
            k = int(rng.integers(1, r + 1))
            axes = [int(a) for a in rng.choice(r, k, replace=False)]
            st = [int(rng.choice(ends)) for _ in axes]
            en = [int(rng.choice(ends)) for _ in axes]
            sp = [int(rng.choice([1, 1, 2, -1, -2])) for _ in axes]
            index = [slice(None)] * r
            for a, s0, e0, t0 in zip(axes, st, en, sp):
                index[a] = slice(s0, e0, t0)
            y = y[tuple(index)]
            slices.append(
                [
                    _ints(st),
                    _ints(en),
                    _ints([a - r * int(rng.integers(0, 2)) for a in axes]),
                    _ints(sp),
                ]
            )
        args = [w for s in slices for w in s]
        for xt in (t(*shape), t(*(f"s{i}" for i in range(r)))):
            parts = [f(p, xt, *args) for p in ("starts", "ends", "axes", "steps")]
            if parts[0] is None:
                assert not xt.type.static  # static lengths always compose
                continue
            index = [slice(None)] * r
            for s0, e0, a, t0 in zip(*parts):
                index[a] = slice(s0, e0, t0)
            np.testing.assert_array_equal(x[tuple(index)], y)
    # without static lengths: non-negative, unit-step slices compose
    one = _ints([1])
    parts = [
        f(
            p,
            t("n"),
            _ints([2]),
            _ints([2**62]),
            _ints([0]),
            one,
            _ints([1]),
            _ints([3]),
            _ints([0]),
            one,
        )
        for p in ("starts", "ends", "axes", "steps")
    ]
    assert parts == [(3,), (5,), (0,), (1,)]
    assert (
        f("starts", t("n"), _ints([-2]), _ints([9]), _ints([0]), one, one, one, _ints([0]), one)
        is None
    )
    assert f("starts", t(4), t(1), one, one, one, one, one, one, one) is None  # not a constant


# ---- list captures (`@xs...`) and the slices of a Concat ----


def _list_info(shape, value=None, dtype=TP.FLOAT):
    return ClassInfo(TensorType(dtype, shape), value)


def test_list_guards():
    a, b = _list_info((2, 3)), _list_info((2, 3))
    c = _list_info((2, 3), np.zeros((2, 3), np.float32))
    assert covers("length").fn([a, b], 2) and not covers("length").fn([a], 2)
    assert covers("all-constant").fn([c]) and not covers("all-constant").fn([c, a])
    assert covers("all-constant").fn([])
    assert covers("all-same-type").fn([a, b, c]) and not covers("all-same-type").fn(
        [a, _list_info((3, 2))]
    )
    assert not covers("all-same-type").fn([a, _list_info((2, 3), dtype=TP.INT64)])


def _list_i64(v):
    return _list_info((len(v),), np.array(v, np.int64), TP.INT64)


def test_slice_guards_compute_onnx_clamping():
    x = _list_info((2, 10))
    one, axis1 = _list_i64([1]), _list_i64([1])
    # x[:, 2:5] ++ x[:, 5:99] == x[:, 2:99] (99 is clamped to 10)
    assert covers("slices-meet").fn(
        x, _list_i64([2]), _list_i64([5]), _list_i64([99]), axis1, one, 1
    )
    # x[:, 2:5] ++ x[:, 5:4] is x[:, 2:5], not x[:, 2:4]
    assert not covers("slices-meet").fn(
        x, _list_i64([2]), _list_i64([5]), _list_i64([4]), axis1, one, 1
    )
    # concatenated on axis 0 while sliced on axis 1
    assert not covers("slices-meet").fn(
        x, _list_i64([2]), _list_i64([5]), _list_i64([9]), axis1, one, 0
    )
    parts = [_list_info((2, 3)), _list_info((2, 4)), _list_info((2, 5))]
    take = covers("slice-takes-part").fn
    assert take(_list_i64([3]), _list_i64([7]), axis1, one, parts[:1], parts[1], parts[2:], 1)
    assert take(_list_i64([-9]), _list_i64([-5]), axis1, one, parts[:1], parts[1], parts[2:], 1)
    assert not take(_list_i64([3]), _list_i64([8]), axis1, one, parts[:1], parts[1], parts[2:], 1)
    assert not take(
        _list_i64([3]), _list_i64([7]), axis1, _list_i64([2]), parts[:1], parts[1], parts[2:], 1
    )
    symbolic = [_list_info((2, "n")), parts[1], parts[2]]
    assert not take(
        _list_i64([3]), _list_i64([7]), axis1, one, symbolic[:1], parts[1], parts[2:], 1
    )


def test_zero_pads():
    f = covers("zero-pads").fn
    assert f(t(8, 1, 3, 3)) == (0, 0, 0, 0)
    assert f(t(8, 1, 3)) == (0, 0)
    assert f(t(8, 1)) is None
    assert f(ClassInfo(TensorType(F32, None))) is None


def test_accumulates_in_int32():
    f = covers("accumulates-in-int32").fn
    assert f(t(768, 3072)) and f(t(66311, 8)) and not f(t(66312, 8)) and not f(t(0, 8))
    assert not f(t("k", 8)) and not f(t(2, 3, 4)) and not f(ClassInfo(TensorType(F32, None)))


def _dynamic_int8_error(x, w, scale):
    """|x @ w - dq(q(x)) @ dq(q(w))| computed as ONNX defines DynamicQuantizeLinear and a
    symmetric QuantizeLinear with 127 levels each side, in float64."""
    lo, hi = min(x.min(), 0.0), max(x.max(), 0.0)
    sx = (hi - lo) / 255
    zp = np.clip(np.round(-lo / sx), 0, 255) if sx else 0.0
    xq = (np.clip(np.round(x / sx) + zp, 0, 255) - zp) * sx if sx else x * 0
    wq = np.clip(np.round(w / scale), -127, 127) * scale
    return np.abs(x @ w - xq @ wq)


def test_matmul_dynamic_bounds_hold_and_are_not_loose():
    rng = np.random.default_rng(0)
    per_tensor = covers("matmul-dynamic-8bit").fn
    per_column = covers("matmul-dynamic-8bit-per-column").fn
    # full-range columns: exact int32 sums, as onnx.reference and onnxruntime with VNNI have
    full_range = covers("matmul-dynamic-8bit-full-range").fn
    ratios = []
    for _ in range(200):
        k, n = rng.integers(1, 64, 2)
        x = rng.normal(0, 1, (4, k)) * rng.choice([0.01, 1, 100])
        w = rng.normal(0, 1, (k, n)) * rng.uniform(0.01, 2, n)  # columns of other sizes
        for bound, scale in (
            (per_tensor, registry.pair_steps(w)),
            (per_column, registry.pair_steps(w, per_column=True)),
            (full_range, registry.full_range_steps(w)),
        ):
            err, b = _dynamic_int8_error(x, w, scale), bound(x, w)
            assert np.all(err <= b), (k, n)
            ratios.append(float(err.max() / b.max()))
    assert max(ratios) > 0.2  # the bound is attained within a small factor somewhere


def test_pair_steps_keep_every_neighbouring_pair_within_int16_and_use_the_range():
    # |q_k| <= 127 and |q_k + q_k+1| <= 128 for all k, so x_k q_k + x_k+1 q_k+1 fits an int16
    # pair sum for uint8 x (same signs: <= 255 * 128; opposite: <= 255 * 127), and the step is
    # tight: the largest |q| or same-sign pair lands at 126-128 levels (rounding either way)
    rng = np.random.default_rng(5)
    for _ in range(300):
        k, n = rng.integers(1, 40, 2)
        w = rng.normal(0, 1, (k, n)) * rng.choice([1e-3, 1, 1e3])
        if rng.integers(0, 2):  # outliers next to each other
            w[rng.integers(0, k)] *= 50
        for per_column in (False, True):
            step = registry.pair_steps(w, per_column=per_column)
            q = np.clip(np.rint(w.astype(np.float32) / step), -127, 127).astype(np.int64)
            pairs = np.maximum(np.abs(q), np.abs(q + np.concatenate([q[1:], 0 * q[:1]])))
            assert pairs.max() <= 128 and np.abs(q).max() <= 127
            xq = np.full(k, 255)  # the worst activations for same-sign pairs
            worst = np.abs(xq[:-1, None] * q[:-1] + xq[1:, None] * q[1:]) if k > 1 else 0 * q
            assert np.max(worst, initial=0) <= 32767
            top = pairs.max(axis=0) if per_column else pairs.max()
            assert np.all(top >= 126), (k, n, per_column)
    assert registry.pair_steps(np.zeros((3, 2)), per_column=True).tolist() == [1.0, 1.0]


def test_pair_step_builders_give_the_rules_scales_as_attributes():
    one, per_column = covers("pair-step").fn, covers("pair-steps").fn
    # columns [1, 3, -1] (|w| <= 3, neighbour sums 4 and -2), [-2, 0.5, 4] (|w| <= 4, sums -1.5
    # and 4.5) and zeros
    w = np.array([[1.0, -2.0, 0.0], [3.0, 0.5, 0.0], [-1.0, 4.0, 0.0]], np.float32)
    l127 = np.float32(127)
    assert one(c(w), 0) == one(c(w.T.copy()), 1) == float(np.float32(4.5) / l127)
    # along rows, [-1, 4, 0]'s neighbours -1 and 4 have opposite signs: they partly cancel
    # (sum 3), so its |4| sets the step, not 1 + 4; [3, 0.5, 0]'s sum is 3.5
    assert one(c(w), 1) == float(np.float32(4.0) / l127)
    want = [float(np.float32(4) / l127), float(np.float32(4.5) / l127), 1.0]
    assert per_column(c(w), 0) == tuple(want)
    assert per_column(c(w.T.copy()), 1) == tuple(want)  # [N, K]: K on axis 1
    assert one(c(np.zeros((2, 2), np.float32)), 0) is None  # no scale quantizes nothing
    assert one(t(3, 3), 0) is None and per_column(t(3, 3), 0) is None  # not constants
    assert one(c(np.ones((2, 2, 2), np.float32)), 0) is None and per_column(c(w), 2) is None
    assert one(c(np.array([[np.inf, 1.0]], np.float32)), 0) is None
    assert per_column(c(np.zeros((0, 3), np.float32)), 0) is None  # K = 0: no products


def test_full_range_steps_use_every_level_per_column():
    # max|w| / 127 per column: the largest weight of each column lands on +-127, finer than
    # the pair steps wherever a same-sign pair outgrows the largest weight
    f = covers("full-range-steps").fn
    w = np.array([[1.0, -2.0, 0.0], [3.0, 0.5, 0.0], [-1.0, 4.0, 0.0]], np.float32)
    l127 = np.float32(127)
    want = [float(np.float32(3) / l127), float(np.float32(4) / l127), 1.0]
    assert f(c(w), 0) == tuple(want) and f(c(w.T.copy()), 1) == tuple(want)
    assert registry.full_range_steps(w).tolist() == want
    pair = registry.pair_steps(w, per_column=True)
    assert pair[0] > want[0] and pair[1] > want[1]  # 1 + 3 and -2 + 4.5 pairs: coarser
    rng = np.random.default_rng(2)
    for _ in range(100):
        k, n = rng.integers(1, 40, 2)
        w = rng.normal(0, 1, (k, n)) * rng.choice([1e-3, 1, 1e3])
        q = np.rint(w.astype(np.float32) / registry.full_range_steps(w))
        assert np.abs(q).max() <= 127 and np.all(np.abs(q).max(axis=0) == 127)
    assert f(t(3, 3), 0) is None and f(c(w), 2) is None  # not a constant; no such axis
    assert f(c(np.ones((2, 2, 2), np.float32)), 0) is None
    assert f(c(np.zeros((0, 3), np.float32)), 0) is None  # K = 0: no products
    assert f(c(np.array([[np.inf, 1.0]], np.float32)), 0) is None


def test_full_range_gemm_bounds_add_the_bias_rounding_either_layout():
    # the Gemm bounds hold the product's error (the MatMul's bound is tested above) in both
    # weight layouts, and agree between them
    rng = np.random.default_rng(3)
    gemm = covers("gemm-dynamic-8bit-full-range").fn
    gemm_t = covers("gemm-dynamic-8bit-transposed-full-range").fn
    for _ in range(50):
        k, n = rng.integers(1, 64, 2)
        x = rng.normal(0, 1, (4, k)) * rng.choice([0.01, 1, 100])
        w = rng.normal(0, 1, (k, n)) * rng.uniform(0.01, 2, n)
        cst = rng.normal(0, 1, n)
        err = _dynamic_int8_error(x, w, registry.full_range_steps(w))
        assert np.all(err <= gemm(x, w, cst))
        assert np.allclose(gemm(x, w, cst), gemm_t(x, w.T.copy(), cst))
        assert np.all(gemm(x, w, 100 * cst) > gemm(x, w, cst))  # the bias's rounding counts


@pytest.mark.parametrize("steps", ["per-column", "full-range"])
def test_rounded_bounds_add_the_weights_move_either_layout(steps):
    # MatMul(x, orig) computed from w, a rounding of orig onto its own levels (the GPTQ rules,
    # patterns/quant/rounding.rules): the error holds within the bound, which is the plain
    # bound of w plus sum_k |x_k| |w_k - orig_k| (exactly, up to the float32 rounding term)
    rng = np.random.default_rng(4)
    matmul = covers(f"matmul-dynamic-8bit-{steps}-rounded").fn
    gemm = covers(f"gemm-dynamic-8bit-{steps}-rounded").fn
    gemm_t = covers(f"gemm-dynamic-8bit-transposed-{steps}-rounded").fn
    plain = covers(f"matmul-dynamic-8bit-{steps}").fn
    step_of = registry.full_range_steps if steps == "full-range" else registry.pair_steps
    for _ in range(50):
        k, n = rng.integers(1, 64, 2)
        x = rng.normal(0, 1, (4, k)) * rng.choice([0.01, 1, 100])
        orig = rng.normal(0, 1, (k, n)) * rng.uniform(0.01, 2, n)
        scale = step_of(orig) if steps == "full-range" else step_of(orig, per_column=True)
        w = (np.rint(orig / scale) + rng.integers(-2, 3, (k, n))) * scale  # moved 0-2 levels
        cst = rng.normal(0, 1, n)
        w_scale = step_of(w) if steps == "full-range" else step_of(w, per_column=True)
        err = _dynamic_int8_error(x, w, w_scale) + np.abs(x @ (w - orig))
        assert np.all(err <= matmul(x, w, orig))
        moved = np.abs(x) @ np.abs(w - orig)
        extra = matmul(x, w, orig) - plain(x, w) - moved
        assert np.all(extra >= 0) and np.all(extra <= 1e-5 * (np.abs(x) @ np.abs(orig)) + 1e-30)
        assert np.all(err <= gemm(x, w, cst, orig))
        assert np.allclose(gemm(x, w, cst, orig), gemm_t(x, w.T.copy(), cst, orig.T.copy()))
        # the move is the point: a w farther from orig has the larger bound
        assert np.all(matmul(x, w + 10 * scale, orig) > matmul(x, w, orig))


def test_int8_sums_in_int32_reads_the_cpus_vnni_flags(tmp_path):
    f = registry.int8_sums_in_int32.__wrapped__  # not the cached answer for this machine
    info = tmp_path / "cpuinfo"
    info.write_text("processor : 0\nflags : fpu sse avx2 avx512f avx512bw\n")
    assert not f(str(info))  # AVX512BW without VNNI: int16 pairs
    info.write_text("processor : 0\nflags : fpu avx2 avx512f avx512_vnni\n")
    assert f(str(info))
    info.write_text("processor : 0\nflags : fpu avx2 avx_vnni\n")
    assert f(str(info))
    assert not f(str(tmp_path / "absent"))  # not known: not assumed


def test_conv_pair_steps_take_the_pairs_in_qlinearconvs_k_order():
    f = covers("conv-pair-steps").fn
    # channel 0 of output 0: the weight [C_out=2, C_in=2, 1, 2] read as positions, then
    # channels: (w[0,0,0,0], w[0,1,0,0], w[0,0,0,1], w[0,1,0,1]) = (1, 3, -4, 0.5): neighbour
    # sums 4, -1, -3.5 and |w| <= 4, so the step is 4 / 127 (3 and -4 are neighbours of
    # opposite signs: they cannot saturate a pair, so they do not add to 7). Output 1 has its
    # large neighbours on the kernel axis only: (0, 2, 0, 2) in K order (sums 2, 2, 2) but
    # (0, 0, 2, 2) along the layout (sum 4)
    w = np.zeros((2, 2, 1, 2), np.float32)
    w[0, 0, 0] = [1.0, -4.0]
    w[0, 1, 0] = [3.0, 0.5]
    w[1, 1, 0] = [2.0, 2.0]
    l127 = np.float32(127)
    want = (float(np.float32(4) / l127), float(np.float32(2) / l127))
    assert f(c(w)) == want
    assert registry.conv_pair_steps(w).tolist() == list(want)
    assert f(c(np.zeros((3, 2, 1, 1), np.float32))) == (1.0, 1.0, 1.0)  # zeros: step 1
    assert f(t(2, 2, 3, 3)) is None  # not a constant
    assert f(c(np.ones((2, 2), np.float32))) is None  # not a Conv weight
    assert f(c(np.full((1, 1, 1, 1), np.inf, np.float32))) is None


def test_gemm_dynamic_bound_adds_the_bias_rounding():
    rng = np.random.default_rng(1)
    gemm, matmul = covers("gemm-dynamic-8bit").fn, registry.BOUNDS["matmul-dynamic-8bit"].fn
    x, w = rng.normal(0, 1, (4, 16)), rng.normal(0, 0.1, (16, 8))
    c = rng.normal(0, 1e4, 8)  # a bias far larger than the product: its rounding dominates
    err = _dynamic_int8_error(x, w, registry.pair_steps(w))
    b = gemm(x, w, c)
    assert np.all(err <= b) and np.all(b >= matmul(x, w) + 2.0**-22 * np.abs(c))


def test_gemm_dynamic_per_column_bound_adds_the_bias_rounding_per_column():
    rng = np.random.default_rng(2)
    gemm = covers("gemm-dynamic-8bit-per-column").fn
    per_column = registry.BOUNDS["matmul-dynamic-8bit-per-column"].fn
    x = rng.normal(0, 1, (4, 16))
    w = rng.normal(0, 0.1, (16, 8)) * rng.uniform(0.01, 1, 8)  # columns of unlike scales
    c = rng.normal(0, 1e4, 8)
    err = _dynamic_int8_error(x, w, registry.pair_steps(w, per_column=True))
    b = gemm(x, w, c)
    assert np.all(err <= b) and np.all(b >= per_column(x, w) + 2.0**-22 * np.abs(c))
    # tighter than one scale per tensor where a column's weights are small
    assert np.all(b <= covers("gemm-dynamic-8bit").fn(x, w, c) + 1e-12)


def test_whole_blocks_and_dim():
    blocks, dim = covers("whole-blocks").fn, covers("dim").fn
    x = t(4, 64)
    assert blocks(x, t(64, 8), 32) and blocks(x, t(32, 1), 32)
    assert not blocks(x, t(48, 8), 32) and not blocks(x, t(16, 8), 32)
    assert not blocks(x, t(64, 0), 32) and not blocks(x, t("k", 8), 32)
    assert not blocks(x, t(2, 32, 8), 32) and not blocks(x, t(64, 8), 0)
    assert dim(t(64, 8), 0) == 64 and dim(t(64, 8), -1) == 8
    assert dim(t("k", 8), 0) is None and dim(t(64, 8), 2) is None
    assert dim(ClassInfo(TensorType(F32, None)), 0) is None


def _blockwise_error(x, w, half):
    """|x @ w - x @ dq(q(w))| with w quantized per block of 32 along K to [-half, half - 1]
    by s = m / -half, m the block's weight of the largest magnitude (sign kept), in float64."""
    k, n = w.shape
    b = w.reshape(k // 32, 32, n)
    hi, lo = b.max(axis=1), b.min(axis=1)
    m = np.where(hi >= -lo, hi, lo)
    s = np.repeat(np.where(m == 0, 1, m / -half), 32, axis=0)
    q = np.clip(np.round(w / s), -half, half - 1)
    return np.abs(x @ w - x @ (q * s))


@pytest.mark.parametrize("bits, levels", [(4, 8), (8, 128)])
def test_weight_only_bounds_hold_and_are_not_loose(bits, levels):
    f = covers(f"matmul-weight-{bits}bit-block32").fn
    rng = np.random.default_rng(bits)
    ratios = []
    for _ in range(200):
        k, n = 32 * int(rng.integers(1, 4)), int(rng.integers(1, 6))
        x = rng.normal(0, 1, (int(rng.integers(1, 4)), k))
        w = rng.normal(0, 1, (k, n)) * rng.uniform(0.01, 1, n)
        if rng.integers(0, 2):  # a block whose extremes are equal and opposite: one saturates
            w[:2, 0] = (1.5, -1.5)
        err, b = _blockwise_error(x, w, levels), f(x, w)
        assert np.all(err <= b)
        ratios.append(float((err / b).max()))
    assert max(ratios) > 0.2  # attained within a small factor somewhere


def test_weight_only_asymmetric_bound_holds_and_is_not_loose():
    """quantize-matmul-weight-4bit-asym's blocks, [min(lo, 0), max(hi, 0)] in 16 levels with a
    zero point each, computed as the rule computes them (in float32): the error of x @ w is
    within the bound, which is attained within a small factor, and for weights of one sign
    the asymmetric blocks err less than the symmetric ones."""
    f = covers("matmul-weight-4bit-block32-asym").fn
    rng = np.random.default_rng(7)
    ratios, gains = [], []
    for _ in range(200):
        k, n = 64 * int(rng.integers(1, 3)), int(rng.integers(1, 6))
        x = rng.normal(0, 1, (int(rng.integers(1, 4)), k))
        w = (rng.normal(0, 1, (k, n)) * rng.uniform(0.01, 1, n)).astype(np.float32)
        if rng.integers(0, 2):
            w = np.abs(w) + np.float32(0.1)  # a block of one sign: zero point 0
        b = w.reshape(k // 32, 32, n)
        lo = np.minimum(b.min(axis=1, keepdims=True), np.float32(0))
        hi = np.maximum(b.max(axis=1, keepdims=True), np.float32(0))
        s = np.where(hi == lo, np.float32(1), (hi - lo) / np.float32(15))
        z = np.clip(np.rint(-lo / s), 0, 15)
        q = np.clip(np.rint(b / s) + z, 0, 15)
        dq = ((q - z) * s).reshape(k, n).astype(np.float64)
        err, bound = np.abs(x @ w.astype(np.float64) - x @ dq), f(x, w)
        assert np.all(err <= bound)
        ratios.append(float((err / bound).max()))
        if w.min() > 0:
            gains.append(float(_blockwise_error(x, w.astype(np.float64), 8).max() / err.max()))
    assert max(ratios) > 0.2  # attained within a small factor somewhere
    # one-signed weights: the symmetric blocks use half their levels (per example the sums'
    # rounding varies, so the typical one)
    assert np.median(gains) > 1.5, np.median(gains)


@pytest.mark.parametrize("bits, levels", [(4, 8), (8, 128)])
def test_weight_only_rounded_bounds_add_the_weights_move(bits, levels):
    # MatMul(x, orig) computed from w, a rounding of orig onto its blocks' levels (GPTQ's,
    # patterns/quant/rounding_weight_only.rules): the error holds within the bound,
    # which is the plain bound of w plus sum_k |x_k| |w_k - orig_k| (up to float32 rounding)
    f = covers(f"matmul-weight-{bits}bit-block32-rounded").fn
    plain = covers(f"matmul-weight-{bits}bit-block32").fn
    rng = np.random.default_rng(10 + bits)
    for _ in range(100):
        k, n = 32 * int(rng.integers(1, 4)), int(rng.integers(1, 6))
        x = rng.normal(0, 1, (int(rng.integers(1, 4)), k)) * rng.choice([0.01, 1, 100])
        orig = rng.normal(0, 1, (k, n)) * rng.uniform(0.01, 1, n)
        s = np.repeat(registry.block_steps(orig, levels), 32, axis=0).astype(np.float64)
        q = np.clip(np.rint(orig / s) + rng.integers(-2, 3, (k, n)), -levels, levels - 1)
        w = (q * s).astype(np.float32)  # moved 0-2 levels (some blocks' scales move too)
        err = _blockwise_error(x, w.astype(np.float64), levels) + np.abs(x @ (w - orig))
        assert np.all(err <= f(x, w, orig))
        moved = np.abs(x) @ np.abs(w - orig)
        rounding = (k + 8) * 2.0**-23 * (np.abs(x) @ np.abs(orig))  # of x @ orig in float32
        np.testing.assert_allclose(f(x, w, orig) - plain(x, w), moved + rounding, rtol=1e-9)


def test_gather_8bit_per_row_bound_holds_and_is_not_loose():
    f = covers("gather-8bit-per-row").fn
    rng = np.random.default_rng(5)
    w = rng.normal(0, 1, (6, 16)) * rng.uniform(0.01, 1, (6, 1))
    w[2] = 0  # a row of zeros quantizes exactly
    i = np.array([[0, -1, 2], [5, 3, -6]])
    s = np.abs(w).max(axis=1, keepdims=True) / 127
    s[2] = 1
    err = np.abs(w - np.round(w / s) * s)[i % 6]
    b = f(w, i)
    assert b.shape == (2, 3, 16) and np.all(err <= b) and np.all(b[0, 2] == 0)
    assert (err / np.where(b > 0, b, 1)).max() > 0.5
    assert f(np.zeros((0, 4)), np.zeros((0,), np.int64)).shape == (0, 4)


def test_exact_scale():
    f = covers("exact-scale").fn

    def c(v, dtype=np.float32):
        return ClassInfo(TensorType(F32, ()), np.asarray(v, dtype))

    assert f(c(0.02)) and f(c(-3.5)) and f(c(2.0**-100)) and f(c(2.0**100))
    assert not f(c(0.0)) and not f(c(np.nan)) and not f(c(np.inf)) and not f(c(2.0**-101))
    assert not f(c(0.02, np.float64)) and not f(c([0.1, 0.2]))
    assert not f(ClassInfo(TensorType(F32, ())))  # not a constant


def test_accumulates_in_int32_transposed_and_its_bound():
    f = covers("accumulates-in-int32-transposed").fn
    assert f(t(3072, 768)) and f(t(8, 66311)) and not f(t(8, 66312)) and not f(t(8, 0))
    assert not f(t(8, "k")) and not f(t(2, 3, 4))
    bound = covers("gemm-dynamic-8bit-transposed").fn
    rng = np.random.default_rng(4)
    x, w, c = rng.normal(0, 1, (4, 16)), rng.normal(0, 0.1, (8, 16)), rng.normal(0, 1, 8)
    np.testing.assert_array_equal(
        bound(x, w, c), registry.BOUNDS["gemm-dynamic-8bit"].fn(x, w.T, c)
    )
    per_column = covers("gemm-dynamic-8bit-transposed-per-column").fn
    want = registry.BOUNDS["gemm-dynamic-8bit-per-column"].fn(x, w.T, c)
    np.testing.assert_array_equal(per_column(x, w, c), want)


def _q(v, dtype):
    """A constant ClassInfo of numpy value `v` in `dtype`."""
    return c(np.asarray(v, dtype))


def test_static_quantization_scale_and_zero_point_guards():
    per_tensor, positive = covers("per-tensor").fn, covers("positive-scale").fn
    eight, at_min = covers("eight-bit").fn, covers("zero-point-at-min").fn
    assert per_tensor(_q(0.5, np.float32)) and per_tensor(_q([0.5], np.float32))
    assert not per_tensor(_q([[0.5]], np.float32)) and not per_tensor(_q([1, 2], np.float32))
    assert not per_tensor(t())  # not a constant
    assert positive(_q(0.02, np.float32)) and not positive(_q(-0.02, np.float32))
    assert not positive(_q(0.0, np.float32)) and not positive(_q(0.02, np.float64))
    assert not positive(_q([[0.02]], np.float32))  # per axis to onnxruntime
    assert positive(_q(2.0**-24, np.float32)) and not positive(_q(2.0**-25, np.float32))
    assert positive(_q(2.0**24, np.float32)) and not positive(_q(2.0**25, np.float32))
    assert eight(t(2, dtype=TP.UINT8)) and eight(t(2, dtype=TP.INT8)) and not eight(t(2))
    assert at_min(_q(0, np.uint8)) and at_min(_q(-128, np.int8))
    assert not at_min(_q(1, np.uint8)) and not at_min(_q(0, np.int8))
    assert not at_min(_q([0, 0], np.uint8))


def test_quantize_saturates_only_when_both_ends_saturate_with_room():
    f = covers("quantize-saturates").fn
    z = _q(0, np.uint8)
    lo, hi = _q(0.0, np.float32), _q(6.0, np.float32)
    assert f(_q(6 / 255, np.float32), z, lo, hi)  # 6 / s = 255: the top level exactly
    assert not f(_q(6 / 250, np.float32), z, lo, hi)  # Q(6) = 250 < 255
    assert not f(_q(6 / 255, np.float32), _q(3, np.uint8), lo, hi)  # Q(0) = 3
    assert f(_q(0.1, np.float32), _q(-128, np.int8), _q(-1.0, np.float32), _q(30.0, np.float32))
    assert not f(_q(-0.1, np.float32), z, lo, hi)


def test_requantization_guards_and_the_saturation_ends():
    multiple, within = covers("scale-multiple").fn, covers("dequantized-within").fn
    end = covers("dequantized-end").fn
    f32 = np.float32
    assert multiple(_q(0.5, f32), _q(0.25, f32)) and multiple(_q(0.3, f32), _q(0.3, f32))
    assert multiple(_q(0.75, f32), _q(0.25, f32))  # k = 3
    assert not multiple(_q(0.3, f32), _q(0.2, f32))  # 1.5: the requantization rounds
    assert not multiple(_q(0.25, f32), _q(0.5, f32))  # k = 1/2: coarser, rounds
    assert not multiple(_q(0.1, f32), _q(np.float32(0.1) / 3, f32))  # 3 b is not exactly a
    assert multiple(_q(256.0, f32), _q(1.0, f32)) and not multiple(_q(257.0, f32), _q(1.0, f32))
    assert not multiple(_q(-0.5, f32), _q(-0.25, f32)) and not multiple(t(), _q(0.25, f32))
    # the ends QuantizeLinear(., s, zp) saturates to, in float32: (qmin - zp) s, (qmax - zp) s
    assert (end(_q(0.25, f32), _q(0, np.int8), 0), end(_q(0.25, f32), _q(0, np.int8), 1)) == (
        -32.0,
        31.75,
    )
    assert end(_q(0.1, f32), _q(10, np.uint8), 1) == float(np.float32(245) * np.float32(0.1))
    assert end(_q(0.1, f32), _q(10, f32), 0) is None  # a float zero point has no 8-bit range
    assert end(_q(0.1, f32), _q(10, np.uint8), 2) is None
    # uint8 x at zero point 128 dequantizes into [-64, 63.5] with scale 0.5
    x, s, z = t(2, dtype=TP.UINT8), _q(0.5, f32), _q(128, np.uint8)
    assert within(x, s, z, _q(-64.0, f32), _q(63.5, f32))
    assert not within(x, s, z, _q(-64.0, f32), _q(63.25, f32))
    assert not within(x, s, z, _q(-63.5, f32), _q(64.0, f32))
    assert within(t(2, dtype=TP.INT8), s, _q(0, np.int8), _q(-64.0, f32), _q(63.5, f32))
    assert not within(x, s, z, _q(np.nan, f32), _q(64.0, f32))
    assert not within(t(2), s, z, _q(-64.0, f32), _q(63.5, f32))  # x not 8-bit
    assert not within(x, _q(-0.5, f32), z, _q(-64.0, f32), _q(64.0, f32))


def test_scale_ratio_and_requantization_range():
    ratio = covers("scale-ratio").fn
    s = _q(0.01, np.float32)
    assert ratio(s, _q(0.02, np.float32)) and ratio(s, _q(0.01 * 2.0**14, np.float32))
    assert not ratio(s, _q(0.01 * 2.0**15, np.float32)) and not ratio(s, _q(1e-15, np.float32))
    f = covers("requantizes-in-range").fn
    w = c(np.full((4, 3, 3, 3), 0.635, np.float32))  # s_w = (0.635 + 0.635) / 127, K = 27
    top = 27 * 255 * 127 + 2**24
    assert f(_q(1.0, np.float32), w, _q(0.01 * top / 2.0**30 * 1.0001, np.float32))
    assert not f(_q(1.0, np.float32), w, _q(0.01 * top / 2.0**31, np.float32))
    assert not f(_q(1.0, np.float32), c(np.ones((4, 3), np.float32)), _q(1.0, np.float32))


def test_conv_accumulates_in_int32_and_bias_fits_int24():
    f = covers("conv-accumulates-in-int32").fn
    k = (2**31 - 1 - 2**24) // (255 * 127)
    assert f(t(64, 64, 3, 3)) and f(t(8, k, 1, 1)) and not f(t(8, k + 1, 1, 1))
    assert not f(t(8, 3)) and not f(t(8, "c", 3, 3)) and not f(t(8, 0, 3, 3))
    fits = covers("bias-fits-int24").fn
    w = np.full((2, 1, 1, 1), 12.7, np.float32)  # s_w = 0.1 (K = 1: the pair is w and 0)
    sx = _q(0.5, np.float32)  # a unit of the bias: 0.05
    assert fits(c(np.array([0.05 * 2**24, -1.0], np.float32)), sx, c(w))
    assert not fits(c(np.array([0.05 * 2**24 * 1.01, 0.0], np.float32)), sx, c(w))
    assert not fits(c(np.zeros(3, np.float32)), sx, c(w))  # not one per output channel
    assert not fits(c(np.zeros(2, np.float32)), _q(0.0, np.float32), c(w))  # no unit


def test_fake_quantize_bound_holds_and_is_tight_inside_the_range():
    f = covers("fake-quantize").fn
    rng = np.random.default_rng(5)
    x = rng.normal(0, 3, 2000).astype(np.float32)
    s, zp = np.float32(0.02), np.uint8(100)  # covers [-2.0, 3.1]
    q = np.clip(np.rint(x / s) + zp, 0, 255)
    err = np.abs(x - (q - float(zp)) * s)
    b = f(x, np.array(s), np.array(zp))
    assert np.all(err <= b)
    inside = (x > -2.0) & (x < 3.1)
    assert (err[inside] / b[inside]).max() > 0.95  # half a step, reached
    assert np.all(b[~inside] >= np.abs(x[~inside]) - 3.1)


# the static rules' two kinds of weight steps: (suffix of the guards' and bounds' names, the
# per-channel Conv steps, the per-column MatMul steps)
STEP_KINDS = {
    "pairs": ("", registry.conv_pair_steps, lambda w: registry.pair_steps(w, per_column=True)),
    "full-range": ("-full-range", registry.conv_full_range_steps, registry.full_range_steps),
}


def test_conv_full_range_steps_and_their_guards():
    # one step per output channel, max|w_c| / 127: each channel's largest weight on +-127
    f = covers("conv-full-range-steps").fn
    w = np.zeros((3, 2, 1, 2), np.float32)
    w[0] = [[[1.0, 2.0]], [[3.0, -1.0]]]  # max 3; same-sign pairs up to 2 + 3 = 5 in K order
    w[1] = [[[-4.0, 0.5]], [[0.5, 0.5]]]
    l127 = np.float32(127)
    want = [float(np.float32(3) / l127), float(np.float32(4) / l127), 1.0]  # zeros: step 1
    assert f(c(w)) == tuple(want) and registry.conv_full_range_steps(w).tolist() == want
    assert registry.conv_pair_steps(w)[0] > want[0]  # the pair steps are coarser here
    assert f(t(3, 2, 1, 2)) is None and f(c(np.ones((3, 2), np.float32))) is None
    assert f(c(np.full((1, 1, 1, 1), np.inf, np.float32))) is None
    rng = np.random.default_rng(7)
    for _ in range(50):
        w = rng.normal(0, 1, (int(rng.integers(1, 9)), 3, 3, 3)) * rng.choice([1e-3, 1, 1e3])
        steps = registry.conv_full_range_steps(w)[:, None, None, None]
        q = np.rint(w.astype(np.float32) / steps)
        assert np.all(np.abs(q).reshape(len(q), -1).max(axis=1) == 127)
    # the guards over these steps: a finer step counts a bias in more units, and a smaller
    # rescale of the sums
    fits, fits_full = covers("bias-fits-int24").fn, covers("bias-fits-int24-full-range").fn
    w = np.full((2, 2, 1, 1), 6.35, np.float32)  # pairs: s_w = 12.7 / 127 = 0.1; full: 0.05
    sx = _q(0.5, np.float32)  # a unit of the bias: 0.05 with pairs, 0.025 full-range
    b = c(np.array([0.05 * 2**24, 0.0], np.float32))
    assert fits(b, sx, c(w)) and not fits_full(b, sx, c(w))
    assert fits_full(c(np.array([0.025 * 2**24, 0.0], np.float32)), sx, c(w))
    assert not fits_full(c(np.zeros(3, np.float32)), sx, c(w))  # not one per output channel
    req, req_full = covers("requantizes-in-range").fn, covers("requantizes-in-range-full-range").fn
    top = 2 * 255 * 127 + 2**24
    sy = _q(0.075 * top / 2.0**30, np.float32)  # between the two rescales' limits
    assert req_full(_q(1.0, np.float32), c(w), sy) and not req(_q(1.0, np.float32), c(w), sy)
    assert not req_full(_q(1.0, np.float32), c(np.ones((4, 3), np.float32)), sy)


@pytest.mark.parametrize("kind", STEP_KINDS)
def test_conv_static_bound_holds_on_a_quantized_convolution(kind):
    suffix, conv_steps, _ = STEP_KINDS[kind]
    f = covers("conv-static-8bit" + suffix).fn
    rng = np.random.default_rng(6)
    xq = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    w = rng.normal(0, 0.2, (4, 3, 3, 3)).astype(np.float32)
    sx, zx, sy = np.float32(0.05), np.uint8(128), np.float32(0.1)  # zp_y 120
    x = (xq.astype(np.float32) - 128) * sx
    sw = conv_steps(w)
    wq = np.clip(np.rint(w / sw[:, None, None, None]), -127, 127)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    g = helper.make_graph(
        [conv],
        "g",
        [helper.make_tensor_value_info("x", TP.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    ref = ReferenceEvaluator(helper.make_model(g))
    exact = ref.run(
        None,
        {"x": x},
    )[0]
    quantized = ref.run(None, {"x": x, "w": (wq * sw[:, None, None, None]).astype(np.float32)})[0]
    lhs = np.clip(np.rint(exact / sy) + 120, 0, 255)
    rhs = np.clip(np.rint(quantized / sy) + 120, 0, 255)
    b = f(xq, np.array(sx), np.array(zx), w, np.array(sy))
    assert np.abs(lhs - rhs).max() >= 1  # the weights' rounding shows
    assert b.shape == (4, 1, 1) and np.all(np.abs(lhs - rhs) <= b)
    assert covers("one-level").fn(np.zeros((1, 4)), np.zeros((3, 1))).tolist() == [[1.0] * 4] * 3


def test_bias_floored_steps_raise_only_the_channels_whose_bias_does_not_fit():
    # channel 0: s_w = 0.1, a bias of 1.0 is 20 units of s_x s_w; channel 1: weights of 1e-6 (a
    # dead BatchNormalization channel folded in), s_w = 1e-6 / 127, its bias of 0.5 ~1.3e8 units
    w = np.array([12.7, 1e-6], np.float32).reshape(2, 1, 1, 1)
    sx, b = _q(0.5, np.float32), c(np.array([1.0, 0.5], np.float32))
    for kind, how in (
        ("", registry.conv_pair_steps),
        ("-full-range", registry.conv_full_range_steps),
    ):
        kind_steps = "conv" + kind + "-bias-floored-steps"
        steps = np.array(covers(kind_steps).fn(c(w), b, sx), np.float32)
        plain = how(w)
        assert steps[0] == plain[0] and steps[1] > 10 * plain[1]
        units = np.float64(0.5) * steps.astype(np.float64)
        assert 2**23 * (1 - 2**-20) <= 0.5 / units[1] <= 2**23  # raised to count 2^23
        assert not covers("bias-fits-int24" + kind).fn(b, sx, c(w))
        assert covers("bias-fits-int24" + kind + "-bias-floored").fn(b, sx, c(w))
        # a bias that fits everywhere leaves the steps as they were (the file is unchanged)
        small = c(np.array([1.0, 1e-9], np.float32))
        assert covers(kind_steps).fn(c(w), small, sx) == tuple(plain.astype(float).tolist())
        for bad in (np.array([1.0, np.inf], np.float32), np.ones(3, np.float32)):
            assert covers(kind_steps).fn(c(w), c(bad), sx) is None
            assert not covers("bias-fits-int24" + kind + "-bias-floored").fn(c(bad), sx, c(w))
        assert covers(kind_steps).fn(c(w), b, _q(0.0, np.float32)) is None  # no unit
        assert covers(kind_steps).fn(t(2, 1, 1, 1), b, sx) is None  # not a constant
        # the rescale guard reads the raised steps: a bias of 1e6 raises channel 1 to 0.238
        big = c(np.array([1.0, 1e6], np.float32))
        top = 1 * 255 * 127 + 2**24
        sy = _q(0.5 * 0.15 * top / 2.0**30, np.float32)  # between the steps 0.1 and 0.238
        req = covers("requantizes-in-range" + kind + "-bias-floored").fn
        assert covers("requantizes-in-range" + kind).fn(sx, c(w), sy) and not req(sx, c(w), big, sy)
        assert req(sx, c(w), b, sy)


@pytest.mark.parametrize("bias", [0.0, 0.5])
def test_bias_floored_steps_keep_the_units_a_normal_float32(bias):
    """Weights of 1e-38 make s_x * s_w subnormal in the rule's float32 Mul (0 / 0 or b / 0 for
    the bias, cast to INT_MIN, where the float64 guards passed): such a channel's step is
    raised until the unit is normal, and the plain steps' guard refuses it."""
    w = np.array([12.7, 7.3e-40], np.float32).reshape(2, 1, 1, 1)  # (subnormal itself)
    sx, b = _q(0.02, np.float32), c(np.array([1.0, bias], np.float32))
    steps = np.array(covers("conv-bias-floored-steps").fn(c(w), b, sx), np.float32)
    units = np.float32(0.02) * steps
    assert units[1] >= np.finfo(np.float32).tiny and steps[0] == registry.conv_pair_steps(w)[0]
    assert covers("bias-fits-int24-bias-floored").fn(b, sx, c(w))
    assert not covers("bias-fits-int24").fn(b, sx, c(w))


@pytest.mark.parametrize("kind", STEP_KINDS)
def test_bias_floored_conv_bound_holds_with_a_dead_channel(kind):
    suffix, conv_steps, _ = STEP_KINDS[kind]
    f = covers("conv-static-8bit" + suffix + "-bias-floored").fn
    rng = np.random.default_rng(8)
    xq = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    w = rng.normal(0, 0.2, (4, 3, 3, 3)).astype(np.float32)
    w[2] *= np.float32(1e-6)  # dead: its bias, 0.5, is ~1e9 of its pair steps' units
    bias = np.array([0.1, -0.2, 0.5, 0.3], np.float32)
    sx, zx, sy = np.float32(0.05), np.uint8(128), np.float32(0.1)  # zp_y 120
    x = (xq.astype(np.float32) - 128) * sx
    sw = registry.bias_floored_steps(conv_steps(w), bias, float(sx))
    assert sw[2] > 100 * conv_steps(w)[2] and np.array_equal(
        sw[[0, 1, 3]], conv_steps(w)[[0, 1, 3]]
    )
    wq = np.clip(np.rint(w / sw[:, None, None, None]), -127, 127)
    bq = np.rint(bias.astype(np.float64) / (float(sx) * sw.astype(np.float64)))
    assert np.abs(bq).max() <= 2**24
    conv = helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])
    g = helper.make_graph(
        [conv],
        "g",
        [helper.make_tensor_value_info(n, TP.FLOAT, None) for n in ("x", "w", "b")],
        [helper.make_tensor_value_info("y", TP.FLOAT, None)],
    )
    ref = ReferenceEvaluator(helper.make_model(g))
    exact = ref.run(None, {"x": x, "w": w, "b": bias})[0]
    wdq = (wq * sw[:, None, None, None]).astype(np.float32)
    quantized = ref.run(None, {"x": x, "w": wdq, "b": (bq * sx * sw).astype(np.float32)})[0]
    lhs = np.clip(np.rint(exact / sy) + 120, 0, 255)
    rhs = np.clip(np.rint(quantized / sy) + 120, 0, 255)
    bound = f(xq, np.array(sx), np.array(zx), w, c(bias).value, np.array(sy))
    assert np.abs(lhs - rhs).max() >= 1 and np.all(np.abs(lhs - rhs) <= bound)
    plain = covers("conv-static-8bit" + suffix).fn(xq, np.array(sx), np.array(zx), w, np.array(sy))
    assert bound[2] > plain[2] and np.array_equal(bound[[0, 1, 3]], plain[[0, 1, 3]])


U8, S8 = TP.UINT8, TP.INT8


def test_integer_kernel_guards_follow_onnxruntimes_exact_dtype_pairs():
    mm, conv = covers("integer-matmul-exact").fn, covers("integer-conv-exact").fn
    assert mm(t(2, 8, dtype=U8), t(8, 3, dtype=U8)) and mm(t(4, 2, 8, dtype=S8), t(8, 3, dtype=S8))
    assert not mm(t(2, 8, dtype=U8), t(8, 3, dtype=S8))  # an int8 activation b: int16 pairs
    assert not mm(t(2, 8, dtype=S8), t(8, 3, dtype=U8))  # no onnxruntime kernel
    small, big = np.full((8, 3), -64, np.int8), np.full((8, 3), 65, np.int8)
    assert mm(t(2, 8, dtype=U8), c(small)) and not mm(t(2, 8, dtype=U8), c(big))
    assert not mm(t(8, dtype=U8), t(8, 3, dtype=U8))  # rank 1
    assert not mm(t(2, "k", dtype=U8), t("k", 3, dtype=U8))  # K unknown
    assert mm(t(2, 33025, dtype=U8), t(33025, 1, dtype=U8))  # 33025 * 255^2 < 2^31
    assert not mm(t(2, 33026, dtype=U8), t(33026, 1, dtype=U8))
    assert not mm(t(2, 8, dtype=F32), t(8, 3, dtype=F32))
    assert conv(t(1, 3, 8, 8, dtype=U8), t(4, 3, 3, 3, dtype=U8))
    assert conv(t(1, 3, 8, 8, dtype=U8), c(np.ones((4, 3, 3, 3), np.int8)))
    assert not conv(t(1, 3, 8, 8, dtype=U8), t(4, 3, 3, 3, dtype=S8))
    assert not conv(t(1, 3, 8, 8, dtype=U8), t(4, 3, "k", 3, dtype=U8))


def test_integer_rescales_stay_in_range():
    mm, conv = covers("integer-matmul-requantizes").fn, covers("integer-conv-requantizes").fn
    one, tiny = _q(1.0, np.float32), _q(2.0**-20, np.float32)
    assert mm(t(64, 3, dtype=U8), one, one, one)  # 64 * 255^2 < 2^30
    assert not mm(t(64, 3, dtype=U8), one, one, tiny)
    assert not mm(t(64, 3, dtype=U8), _q(0.0, np.float32), one, one)  # not a scale
    assert conv(t(4, 3, 3, 3, dtype=U8), one, c(np.ones(4, np.float32)), _q(1.0, np.float32))
    assert not conv(t(4, 3, 3, 3, dtype=U8), one, c(np.full(4, 64.0, np.float32)), one)
    assert not conv(t(4, 3, 3, 3, dtype=U8), one, c(np.ones(3, np.float32)), one)  # not C_out


def test_channel_and_bias_scales():
    ch, bias = covers("channel-scales").fn, covers("bias-scales").fn
    w = t(4, 3, 3, 3, dtype=U8)
    zp = _q(7, np.uint8)
    assert ch(w, _q(0.5, np.float32), zp, 1)  # one scale: any axis
    assert ch(w, c(np.full(4, 0.5, np.float32)), c(np.full(4, 7, np.uint8)), 0)
    assert not ch(w, c(np.full(4, 0.5, np.float32)), zp, 1)  # per channel along axis 1
    assert not ch(w, c(np.full(4, 0.5, np.float32)), c(np.arange(4, dtype=np.uint8)), 0)
    assert not ch(w, c(np.array([0.5, 0.0, 0.5, 0.5], np.float32)), zp, 0)
    b = c(np.array([3, -5, 2**24, 0], np.int32))
    sx, sw = _q(0.5, np.float32), c(np.array([0.25, 0.5, 1.0, 2.0], np.float32))
    sb = c(np.array([0.125, 0.25, 0.5, 1.0], np.float32))
    assert bias(b, sb, 0, sx, sw, w)
    assert bias(b, _q(0.125, np.float32), 0, sx, _q(0.25, np.float32), w)
    assert not bias(b, c(np.full(4, 0.125, np.float32)), 0, sx, sw, w)  # not sx * sw[c]
    assert not bias(c(np.array([3, -5, 2**24 + 1, 0], np.int32)), sb, 0, sx, sw, w)
    assert not bias(b, sb, 0, sx, sw, t(3, 3, 3, 3, dtype=U8))  # not one per channel


def test_pool_sums_in_range():
    f = covers("pool-sums-in-range").fn
    x, one = t(1, 8, 7, 7, dtype=U8), _q(1.0, np.float32)
    assert f(x, one, one) and f(x, _q(49 * 128.0, np.float32), one)
    assert not f(x, _q(49 * 256.0, np.float32), one)  # onnxruntime: out of range
    assert not f(x, _q(2.0**-24, np.float32), _q(2.0**20, np.float32))  # below 2^-31
    assert not f(t(1, 8, "h", 7, dtype=U8), one, one)


def _matmul_qdq(rng, k=16):
    a = rng.integers(0, 256, (3, k)).astype(np.uint8)
    b = rng.integers(0, 256, (k, 5)).astype(np.uint8)
    sa, za, sb, zb = np.float32(0.037), np.uint8(121), np.float32(0.011), np.uint8(130)
    da = ((a.astype(np.float32) - np.float32(za)) * sa).astype(np.float32)
    db = ((b.astype(np.float32) - np.float32(zb)) * sb).astype(np.float32)
    exact = (a.astype(np.int64) - 121) @ (b.astype(np.int64) - 130)
    return a, sa, za, b, sb, zb, da @ db, exact


def test_dequantized_and_qlinear_matmul_bounds_hold():
    deq, ql = covers("dequantized-matmul").fn, covers("qlinear-matmul").fn
    rng = np.random.default_rng(11)
    a, sa, za, b, sb, zb, flt, exact = _matmul_qdq(rng)
    integer = (exact.astype(np.float32) * np.float32(sa * sb)).astype(np.float32)
    bound = deq(a, np.array(sa), np.array(za), b, np.array(sb), np.array(zb))
    assert bound.shape == (3, 5) and np.all(np.abs(flt - integer) <= bound)
    assert bound.max() < 1e-3 * np.abs(flt).max()  # rounding only
    sy = np.float32(0.05)
    lhs = np.clip(np.rint(flt / sy) + 128, 0, 255)
    rhs = np.clip(np.rint(exact * (float(sa) * float(sb) / float(sy))) + 128, 0, 255)
    levels = ql(a, np.array(sa), np.array(za), b, np.array(sb), np.array(zb), np.array(sy))
    assert np.all(np.abs(lhs - rhs) <= levels) and np.all(levels >= 1) and levels.max() < 1.01


def test_dequantized_and_qlinear_conv_bounds_hold():
    deq, ql = covers("dequantized-conv").fn, covers("qlinear-conv").fn
    qb = covers("qlinear-conv-with-bias").fn
    rng = np.random.default_rng(12)
    x = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    w = rng.integers(0, 256, (4, 3, 3, 3)).astype(np.uint8)
    sx, zx, sw, zw = np.float32(0.02), np.uint8(100), np.float32(0.01), np.uint8(128)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    g = helper.make_graph(
        [conv],
        "g",
        [helper.make_tensor_value_info(n, TP.DOUBLE, None) for n in ("x", "w")],
        [helper.make_tensor_value_info("y", TP.DOUBLE, None)],
    )
    ref = ReferenceEvaluator(helper.make_model(g))
    dx = (x.astype(np.float64) - 100) * float(sx)
    dw = (w.astype(np.float64) - 128) * float(sw)
    exact = ref.run(None, {"x": dx, "w": dw})[0]
    as32 = ref.run(None, {"x": dx.astype(np.float32), "w": dw.astype(np.float32)})[0]
    b = deq(x, np.array(sx), np.array(zx), w, np.array(sw), np.array(zw))
    assert b.shape == (4, 1, 1) and np.all(np.abs(exact - as32.astype(np.float32)) <= b)
    sy = np.float32(0.1)
    levels = ql(x, np.array(sx), np.array(zx), w, np.array(sw), np.array(zw), np.array(sy))
    assert levels.shape == (4, 1, 1) and np.all(levels >= 1) and levels.max() < 1.01
    bias = np.array([1000, -2000, 0, 5], np.int32)
    sb = np.full(4, np.float32(sx) * np.float32(sw), np.float32)
    with_bias = qb(x, np.array(sx), np.array(zx), w, np.array(sw), np.array(zw), bias, sb, sy)
    assert with_bias.shape == (4, 1, 1) and np.all(with_bias >= levels)
    off = qb(x, np.array(sx), np.array(zx), w, np.array(sw), np.array(zw), bias, sb * 1.5, sy)
    assert off[0, 0, 0] > 1.0 + 1000 * float(sb[0]) * 0.5 / float(sy) * 0.99  # the scale gap


def test_qlinear_global_average_pool_bound_is_a_level_and_rounding():
    f = covers("qlinear-global-average-pool").fn
    x = np.random.default_rng(13).integers(0, 256, (2, 3, 7, 7)).astype(np.uint8)
    b = f(x, np.array(np.float32(0.05)), np.array(np.uint8(10)), np.array(np.float32(0.03)))
    assert b.shape == (2, 3, 1, 1) and np.all(b >= 1) and b.max() < 1.01  # 1.0018: rounding
    empty = f(x[:, :0], np.array(np.float32(0.05)), np.array(np.uint8(0)), np.array(0.03))
    assert empty.shape == (2, 0, 1, 1)


@pytest.mark.parametrize("kind", STEP_KINDS)
def test_static_matmul_guard_and_bound_hold_on_a_quantized_projection(kind):
    suffix, _, column_steps = STEP_KINDS[kind]
    ok = covers("static-matmul-requantizes" + suffix).fn
    f = covers("matmul-static-8bit" + suffix).fn
    rng = np.random.default_rng(14)
    w = rng.normal(0, 0.05, (64, 8)).astype(np.float32)
    sx, zx, sy = np.float32(0.02), np.uint8(120), np.float32(0.05)  # zp_y 128
    assert ok(_q(sx, np.float32), c(w), _q(sy, np.float32))
    assert not ok(_q(4.0, np.float32), c(w), _q(2.0**-24, np.float32))  # rescale too large
    assert not ok(_q(sx, np.float32), t(64, 8), _q(sy, np.float32))  # not a constant
    xq = rng.integers(0, 256, (4, 64)).astype(np.uint8)
    x = (xq.astype(np.float64) - 120) * float(sx)
    sw = column_steps(w)
    wq = np.clip(np.rint(w / sw), -127, 127) * sw
    lhs = np.clip(np.rint(x.astype(np.float32) @ w / sy) + 128, 0, 255)
    rhs = np.clip(np.rint(x @ wq.astype(np.float64) / float(sy)) + 128, 0, 255)
    b = f(xq, np.array(sx), np.array(zx), w, np.array(sy))
    assert np.abs(lhs - rhs).max() >= 1  # the weights' rounding shows
    assert b.shape == (4, 8) and np.all(np.abs(lhs - rhs) <= b)


@pytest.mark.parametrize("kind", STEP_KINDS)
def test_static_gemm_bound_holds_on_a_quantized_linear_layer(kind):
    suffix, _, column_steps = STEP_KINDS[kind]
    f = covers("gemm-static-8bit" + suffix).fn
    ft = covers("gemm-static-8bit-transposed" + suffix).fn
    rng = np.random.default_rng(15)
    w = rng.normal(0, 0.05, (64, 8)).astype(np.float32)
    bias = rng.normal(0, 0.5, 8).astype(np.float32)
    sx, zx = np.float32(0.02), np.uint8(120)
    xq = rng.integers(0, 256, (4, 64)).astype(np.uint8)
    sw = column_steps(w)
    wq = np.clip(np.rint(w / sw), -127, 127).astype(np.int32)
    # the last input is adversarial: each x_k at full size with the sign of column 0's
    # rounding error, so that the errors add up there
    xq[-1] = 120 + np.where(w[:, 0] > wq[:, 0] * sw[0], 135, -120)
    x = ((xq.astype(np.float32) - 120) * sx).astype(np.float32)
    lhs = x @ w + bias
    ints = (xq.astype(np.int32) - 120) @ wq
    rhs = ints.astype(np.float32) * (sx * sw) + bias
    b = f(xq, np.array(sx), np.array(zx), w, bias)
    assert b.shape == (4, 8) and np.all(np.abs(lhs - rhs) <= b)
    assert np.abs(lhs - rhs)[-1, 0] > 0.3 * b[-1, 0]  # a bound of the error's size, not loose
    np.testing.assert_array_equal(ft(xq, np.array(sx), np.array(zx), w.T, bias), b)


def _moved(orig: np.ndarray, steps: np.ndarray, rng) -> np.ndarray:
    """`orig` [K, N] at its nearest levels of the per-column `steps`, moved 0-2 levels (within
    +-127), as GPTQ moves a weight: float32."""
    q = np.clip(np.rint(orig / steps) + rng.integers(-2, 3, orig.shape), -127, 127)
    return (q * steps).astype(np.float32)


@pytest.mark.parametrize("kind", STEP_KINDS)
def test_static_rounded_bounds_add_the_weights_move(kind):
    # the static rules of a product by w standing in for the product by orig (a rounding of it,
    # patterns/quant/rounding_static.rules): each bound is the plain bound of w plus the move
    # |x| |w - orig| and the float32 rounding of the sum over orig, and holds
    suffix, conv_steps, column_steps = STEP_KINDS[kind]
    rng = np.random.default_rng(16)
    sx, zx, sy = np.float32(0.02), np.uint8(120), np.float32(0.05)
    xq = rng.integers(0, 256, (4, 64)).astype(np.uint8)
    x = (xq.astype(np.float64) - 120) * float(sx)
    orig = rng.normal(0, 0.05, (64, 8)).astype(np.float32)
    w = _moved(orig, column_steps(orig), rng)
    bias = rng.normal(0, 0.5, 8).astype(np.float32)
    args = (xq, np.array(sx), np.array(zx))
    f = covers("matmul-static-8bit" + suffix + "-rounded").fn
    plain = covers("matmul-static-8bit" + suffix).fn
    b = f(*args, w, np.array(sy), orig)
    sw = column_steps(w)
    lhs = np.clip(np.rint(x.astype(np.float32) @ orig / sy) + 128, 0, 255)
    rhs = np.clip(np.rint(x @ (np.clip(np.rint(w / sw), -127, 127) * sw) / float(sy)) + 128, 0, 255)
    assert np.abs(lhs - rhs).max() >= 1 and np.all(np.abs(lhs - rhs) <= b)
    ax, o = np.abs(x), np.abs(orig.astype(np.float64))
    moved = ax @ np.abs(w.astype(np.float64) - orig) + ((64 + 8) * 2.0**-23 + 2.0**-20) * (ax @ o)
    np.testing.assert_allclose(b - plain(*args, w, np.array(sy)), moved / float(sy), rtol=1e-9)
    moved += 2.0**-22 * (ax @ o)  # a Gemm adds its bias after the sum over orig
    for name, wt in (("gemm-static-8bit", w), ("gemm-static-8bit-transposed", w.T)):
        g = covers(name + suffix + "-rounded").fn
        ot = orig if wt is w else orig.T
        bg = g(*args, wt, bias, ot)
        np.testing.assert_allclose(bg - covers(name + suffix).fn(*args, wt, bias), moved, rtol=1e-9)
        ints = (xq.astype(np.int32) - 120) @ np.clip(np.rint(w / sw), -127, 127).astype(np.int32)
        err = np.abs((x.astype(np.float32) @ orig + bias) - (ints * (sx * sw) + bias))
        assert np.all(err <= bg)
    # a Conv: per output channel, max|x| sum |w_c - orig_c| and 2^-20 K max|x| sum |orig_c|
    fc = covers("conv-static-8bit" + suffix + "-rounded").fn
    xc = rng.integers(0, 256, (1, 3, 6, 6)).astype(np.uint8)
    oc = rng.normal(0, 0.2, (4, 3, 3, 3)).astype(np.float32)
    steps = conv_steps(oc)[:, None, None, None]
    wc = np.clip(np.rint(oc / steps) + rng.integers(-2, 3, oc.shape), -127, 127) * steps
    wc = wc.astype(np.float32)
    conv_args = (xc, np.array(sx), np.array(np.uint8(128)))
    bc = fc(*conv_args, wc, np.array(sy), oc)
    x_max = 128 * float(sx)
    extra = x_max * np.abs(wc - oc.astype(np.float64)).reshape(4, -1).sum(axis=1)
    extra += 2.0**-20 * 27 * x_max * np.abs(oc.astype(np.float64)).reshape(4, -1).sum(axis=1)
    plain_c = covers("conv-static-8bit" + suffix).fn(*conv_args, wc, np.array(sy))
    np.testing.assert_allclose((bc - plain_c).ravel(), extra / float(sy), rtol=1e-9)


@pytest.mark.parametrize("kind", STEP_KINDS)
def test_static_matmul_to_float_bounds_are_the_gemm_bounds_without_a_bias(kind):
    # a MatMul whose output stays float (patterns/quant/static_matmul.rules): its bound is the
    # Gemm's with a bias of zeros, per output element, over a 3-D activation too, and holds;
    # the rounded form adds the weight's move as the Gemm's does
    suffix, _, column_steps = STEP_KINDS[kind]
    rng = np.random.default_rng(17)
    sx, zx = np.float32(0.02), np.uint8(120)
    xq = rng.integers(0, 256, (2, 3, 64)).astype(np.uint8)
    orig = rng.normal(0, 0.05, (64, 8)).astype(np.float32)
    w = _moved(orig, column_steps(orig), rng)
    args = (xq, np.array(sx), np.array(zx))
    zeros = np.zeros(8, np.float32)
    b = covers("matmul-static-8bit-to-float" + suffix).fn(*args, w)
    assert b.shape == (2, 3, 8)
    np.testing.assert_array_equal(b, covers("gemm-static-8bit" + suffix).fn(*args, w, zeros))
    br = covers("matmul-static-8bit-to-float" + suffix + "-rounded").fn(*args, w, orig)
    gr = covers("gemm-static-8bit" + suffix + "-rounded").fn(*args, w, zeros, orig)
    np.testing.assert_array_equal(br, gr)
    sw = column_steps(w)
    x = (xq.astype(np.float32) - np.float32(120)) * sx
    ints = (xq.astype(np.int32) - 120) @ np.clip(np.rint(w / sw), -127, 127).astype(np.int32)
    err = np.abs(x @ orig - ints.astype(np.float32) * (sx * sw))
    assert err.max() > 0 and np.all(err <= br) and np.all(np.abs(x @ w - ints * (sx * sw)) <= b)


def test_conv2d_of_1d_builders_write_a_1d_convs_attributes_over_one_by_l():
    kernel = covers("conv2d-kernel-of-1d").fn
    ints = covers("conv2d-ints-of-1d").fn
    pads = covers("conv2d-pads-of-1d").fn
    w = ClassInfo(TensorType(1, (32, 8, 5)))
    assert kernel((5,), w) == (1, 5) and kernel(None, w) == (1, 5)  # absent: the weight's
    assert kernel((3, 3), w) is None and kernel(None, ClassInfo(TensorType(1, (32, 8)))) is None
    assert ints((2,)) == (1, 2) and ints(None) == (1, 1) and ints((2, 2)) is None
    assert pads((1, 2)) == (0, 1, 0, 2) and pads(None) == (0, 0, 0, 0) and pads((1,)) is None


def test_static_gemm_bound_covers_float32_underflow():
    # verify's counterexample: a weight entry of 2^-126 gets a subnormal step (2^-126 / 127);
    # the float side's product rounds to -2^-149, the rescale s_x s_w rounds to 0 (right side 0)
    f = covers("gemm-static-8bit").fn
    xq, sx, zx = np.zeros((2, 3), np.uint8), np.float32(2.0**-23), np.uint8(1)
    w = np.zeros((3, 4), np.float32)
    w[2, 3] = np.float32(2.0**-126)
    c = np.zeros((2, 4), np.float32)
    x = (xq.astype(np.float32) - np.float32(1)) * sx
    lhs = x @ w + c
    sw = registry.pair_steps(w, per_column=True).astype(np.float32)
    ints = (xq.astype(np.int32) - 1) @ np.clip(np.rint(w / sw), -127, 127).astype(np.int32)
    rhs = ints.astype(np.float32) * (sx * sw) + c
    assert lhs[0, 3] == -(2.0**-149) and rhs[0, 3] == 0  # the underflow this is about
    b = f(xq, np.array(sx), np.array(zx), w, c)
    assert np.all(np.abs(lhs - rhs) <= b) and b[:, 3].max() < 2.0**-140  # no more than that


def test_exact_when_finite_is_a_zero_bound():
    f = covers("exact-when-finite").fn
    assert f(np.ones((2, 3))).tolist() == [[0.0] * 3] * 2
    assert "exact-when-finite" in registry.EXACT_BOUNDS


def test_nonempty():
    f = covers("nonempty").fn
    assert (
        f(t(3, 4))
        and f(t())
        and not f(t(1, 0))
        and not f(t(2, "n"))
        and not f(ClassInfo(TensorType(F32, None)))
    )


def test_smoothing_factors():
    f = covers("smoothing-factors").fn
    lo, hi = registry.SMOOTHING_RANGE
    assert f(c(np.array([lo, 1.0, hi], np.float32)))
    assert not f(c(np.array([1.0, 0.0], np.float32)))  # a zero: x / s is not finite
    assert not f(c(np.array([1.0, -2.0], np.float32)))  # negative: not SmoothQuant's
    assert not f(c(np.array([2 * hi], np.float32)))
    assert not f(c(np.array([1.0], np.float64)))
    assert not f(c(np.ones((2, 2), np.float32)))  # one factor per channel: 1-D
    assert not f(c(np.array([], np.float32)))
    assert not f(t(4))  # not a constant


def test_every_registered_function_has_a_test():
    names = set(registry.GUARDS) | set(registry.BUILDERS) | set(registry.BOUNDS)
    missing = sorted(names - TESTED)
    assert not missing, f"registry functions without a unit test: {missing}"


NEGATED = """<ir_version: 10, opset_import: ["" : 18, "com.microsoft" : 1]>
g (float[2,2] x) => (float[2,2] y) <float c1 = {1e30}, float c2 = {1e-30}> {
    t = com.microsoft.Inverse(x)
    a = Mul(t, c1)
    b = Mul(a, c2)
    y = Clip(b)
}"""


def test_a_negated_guard_that_cannot_decide_does_not_hold():
    """`(not (is-float @x))` on a value whose dtype no rule infers (a contrib op's output):
    clip-unbounded and mul-mul-constants-integer fired on float data, removing a Clip that
    maps infinities to the largest finite floats and merging 1e30 * 1e-30 (the black-box rule
    author's finding). Undecided fails the guard either way."""
    model = onnx.parser.parse_model(NEGATED)
    out, report = rewrite.optimize_model(model)
    assert "clip-unbounded" not in report.fired
    assert "mul-mul-constants-integer" not in report.fired
    assert [n.op_type for n in out.graph.node].count("Clip") == 1
    assert registry.is_float(ClassInfo(TensorType())) is None
    assert registry.is_float(ClassInfo(TensorType(TP.INT32, (2,)))) is False
    assert sorted(GUARD for GUARD, f in registry.GUARDS.items() if f.negatable) == [
        "all-equal",
        "has-dtype",
        "identity-perm",
        "is-constant",
        "is-float",
        "rank",
        "zero-point-at-min",
    ]


def test_a_zero_point_not_known_at_its_lowest_lets_relu_become_a_max():
    """zero-point-at-min is False, not None, for a zero point that is not a constant: its one
    negation, in quantize-of-relu-as-max (exact for any zero point), means "not known to be at
    the lowest"; None dropped that rule on a computed zero point (the review)."""
    computed = ClassInfo(TensorType(TP.UINT8, ()))
    assert registry.zero_point_at_min(computed) is False
    low = ClassInfo(TensorType(TP.UINT8, ()), np.array(0, np.uint8))
    high = ClassInfo(TensorType(TP.INT8, ()), np.array(3, np.int8))
    assert registry.zero_point_at_min(low) is True and registry.zero_point_at_min(high) is False
