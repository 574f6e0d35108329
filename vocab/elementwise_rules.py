"""Shape rules of the elementwise ops: same shape, broadcasting, and the values they compute.

Types for `engine.infer` (`type_rule`), symbolic shapes (`shape_rule`) and small integer values
(`value_rule`) of the unary, binary and variadic elementwise ops, the comparisons, the logical
ops and Where. Sources: the ONNX operator specification of each op
(https://onnx.ai/onnx/operators/) and docs/Broadcasting.md; integer Div truncates toward zero
and Mod with fmod=0 takes the divisor's sign, as the spec says.
"""

from __future__ import annotations

import numpy as np
import onnx
import sympy

from vocab.ops import FAMILIES
from vocab.shape_registry import Call, is_int_dtype, shape_rule, type_rule, value_rule
from vocab.symbolic import Expr, Shape, any_unknown, broadcast, map_elems, obj_array, simplify
from vocab.types import UNKNOWN, TensorType

# ---- types straight from the input types (engine.infer) -------------------------------------


@type_rule(*FAMILIES["SAME_TYPE"], *FAMILIES["CONTRIB_UNARY_ELEMENTWISE"])
def same_type(attrs: dict, inputs: tuple) -> TensorType:
    """The first input's type: elementwise ops, activations, normalizations (ONNX operator
    spec of each: Y has X's shape and element type)."""
    return inputs[0]


@type_rule(*FAMILIES["BINARY_ARITHMETIC"], *FAMILIES["VARIADIC_ELEMENTWISE"])
def arithmetic_type(attrs: dict, inputs: tuple) -> TensorType:
    """The first input's dtype, the inputs' shapes broadcast (ONNX docs/Broadcasting.md)."""
    ins = [t for t in inputs if t is not None]
    return _broadcast_type(ins[0].dtype, ins)


@type_rule(*FAMILIES["COMPARISON"], *FAMILIES["LOGICAL"])
def comparison_type(attrs: dict, inputs: tuple) -> TensorType:
    """bool, the inputs' shapes broadcast (ONNX operator spec, Equal, Less, And, ...)."""
    ins = [t for t in inputs if t is not None]
    return _broadcast_type(onnx.TensorProto.BOOL, ins)


@type_rule("Where")
def where_type(attrs: dict, inputs: tuple) -> TensorType:
    """The last input's dtype (X and Y share it), the three shapes broadcast (ONNX spec,
    Where)."""
    ins = [t for t in inputs if t is not None]
    return _broadcast_type(ins[-1].dtype, ins)


@type_rule("Cast")
def cast_type(attrs: dict, inputs: tuple) -> TensorType:
    """Attribute `to`'s dtype, the input's shape (ONNX spec, Cast)."""
    return TensorType(attrs["to"], inputs[0].shape)


@type_rule("CastLike")
def cast_like_type(attrs: dict, inputs: tuple) -> TensorType:
    """The second input's dtype, the first input's shape (ONNX spec, CastLike)."""
    return TensorType(inputs[1].dtype, inputs[0].shape)


def _broadcast_type(dtype: int, ins: list[TensorType]) -> TensorType:
    if any(t.shape is None for t in ins):
        return TensorType(dtype, None)
    try:
        return TensorType(dtype, _broadcast_dims([t.shape for t in ins]))
    except ValueError:
        return UNKNOWN


def _broadcast_dims(shapes) -> tuple:
    """Broadcasting of TensorType dims: a dimension two different symbols (or a symbol and a
    number) meet at is None; different numbers other than 1 raise ValueError."""
    rank = max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        known = {d for d in dims if d != 1}
        if not known:
            out.append(1)
        elif len(known) == 1:
            out.append(known.pop())
        elif all(isinstance(d, int) for d in known):
            raise ValueError(f"shapes do not broadcast: {shapes}")
        else:
            out.append(None)
    return tuple(out)


# ---- symbolic shapes and values ---------------------------------------------------------------


@shape_rule(
    *FAMILIES["SAME_SHAPE"], *FAMILIES["CONTRIB_UNARY_ELEMENTWISE"], "SimplifiedLayerNormalization"
)
def same_shape(c: Call) -> Shape | None:
    """The first input's shape (ONNX operator spec of each; SimplifiedLayerNormalization is
    onnxruntime's, registered in the default domain but in no registry the op table reads)."""
    return c.shape(0)


@value_rule("Identity")
def identity_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """The input (ONNX spec, Identity)."""
    return c.array(0)


@value_rule("Cast")
def cast_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """The input, when casting to `to` keeps its elements (`_cast_keeps`)."""
    x = c.array(0)
    return x if x is not None and _cast_keeps(x, c.attrs.get("to")) else None


def _cast_keeps(v: np.ndarray, to) -> bool:
    """True if casting integer elements to `to` keeps them as they are (an integer type wide
    enough for the known numbers, or any type for symbolic dims, which fit in int32)."""
    if to not in (onnx.TensorProto.INT64, onnx.TensorProto.INT32):
        return False
    return all(e is None or not e.is_number or abs(int(e)) < 2**31 for e in v.reshape(-1).tolist())


@value_rule("Neg")
def neg_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """-x (ONNX spec, Neg)."""
    return _unary(c, lambda e: -e)


@value_rule("Abs")
def abs_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """|x| (ONNX spec, Abs)."""
    return _unary(c, sympy.Abs)


@value_rule("Not")
def not_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """1 - x of a known boolean (ONNX spec, Not)."""
    return _unary(c, lambda e: sympy.Integer(1 - int(e)) if e.is_number else None)


def _unary(c: Call, f) -> np.ndarray | None:
    x = c.array(0)
    return None if x is None else map_elems(lambda e: None if e is None else f(e), x)


@shape_rule(*FAMILIES["BROADCASTING"], "PRelu")
def broadcasting(c: Call) -> Shape | None:
    """The present inputs' shapes broadcast (ONNX docs/Broadcasting.md; PRelu's slope
    broadcasts to X, so the result is X's shape); None if a rank is unknown, and None for
    a dimension where two different symbols meet (either may be 1): the analysis gives that
    one dimension a symbol of its own and keeps the others (a Softmax over BERT's scores
    plus a mask whose sequence symbol differs still has its batch, head and query axes)."""
    return broadcast([c.shape(i) for i in range(len(c.inputs)) if c.has(i)])


def _elementwise(c: Call, f) -> np.ndarray | None:
    """`f` of the inputs' elements, broadcast (an element any input does not know is None);
    None when an input's value is unknown or the values do not broadcast."""
    vs = [c.array(i) for i in range(len(c.inputs))]
    if not all(v is not None for v in vs):
        return None
    try:
        cols = np.broadcast_arrays(*vs)
    except ValueError:
        return None
    flat = [col.reshape(-1).tolist() for col in cols]
    out = [None if any_unknown(args) else f(*args) for args in zip(*flat)]
    return obj_array(out).reshape(cols[0].shape)


@value_rule("Add", "Sum")
def add_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """x + y (ONNX spec, Add; Sum of two inputs)."""
    return _elementwise(c, lambda x, y: x + y)


@value_rule("Sub")
def sub_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """x - y (ONNX spec, Sub)."""
    return _elementwise(c, lambda x, y: x - y)


@value_rule("Mul")
def mul_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """x * y (ONNX spec, Mul)."""
    return _elementwise(c, lambda x, y: x * y)


@value_rule("Max")
def max_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """max(x, y) (ONNX spec, Max of two inputs)."""
    return _elementwise(c, sympy.Max)


@value_rule("Min")
def min_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """min(x, y) (ONNX spec, Min of two inputs)."""
    return _elementwise(c, sympy.Min)


@value_rule("Div")
def div_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """Integer division truncating toward zero (ONNX spec, Div; C's `/`): floor(x / y) for
    symbolic x >= 0 and y > 0. Elements of a non-integer Div are unknown."""
    integer = is_int_dtype(c.dtypes[-1])
    return _elementwise(c, lambda x, y: _int_div(x, y) if integer else None)


def _int_div(x: Expr, y: Expr) -> Expr | None:
    if x.is_number and y.is_number:
        return sympy.Integer(
            int(x) // int(y) if (int(x) >= 0) == (int(y) > 0) else -(abs(int(x)) // abs(int(y)))
        )
    if x.is_nonnegative and y.is_positive:
        return sympy.floor(x / y)
    return None


@value_rule("Mod")
def mod_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """Integer remainder with the divisor's sign, fmod=0 only (ONNX spec, Mod; Python's
    `%`). Elements of a non-integer or fmod Mod are unknown."""
    integer = is_int_dtype(c.dtypes[-1]) and not c.attrs.get("fmod")
    return _elementwise(c, lambda x, y: _int_mod(x, y) if integer else None)


def _int_mod(x: Expr, y: Expr) -> Expr | None:
    if x.is_number and y.is_number:
        return sympy.Integer(int(x) % int(y))
    if x.is_nonnegative and y.is_positive:
        return sympy.Mod(x, y)
    return None


def _truth(b: bool | None) -> Expr | None:
    return None if b is None else sympy.Integer(int(b))


@value_rule("Equal")
def equal_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """x == y, 1 or 0, when sympy can decide it (ONNX spec, Equal)."""
    return _elementwise(c, lambda x, y: _truth(simplify(x - y).is_zero))


@value_rule("Less")
def less_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """x < y, 1 or 0, when sympy can decide it (ONNX spec, Less)."""
    return _elementwise(c, lambda x, y: _truth(simplify(x - y).is_negative))


@value_rule("Greater")
def greater_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """x > y, 1 or 0, when sympy can decide it (ONNX spec, Greater)."""
    return _elementwise(c, lambda x, y: _truth(simplify(x - y).is_positive))


@value_rule("LessOrEqual")
def less_or_equal_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """x <= y, 1 or 0, when sympy can decide it (ONNX spec, LessOrEqual)."""
    return _elementwise(c, lambda x, y: _truth(simplify(x - y).is_nonpositive))


@value_rule("GreaterOrEqual")
def greater_or_equal_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """x >= y, 1 or 0, when sympy can decide it (ONNX spec, GreaterOrEqual)."""
    return _elementwise(c, lambda x, y: _truth(simplify(x - y).is_nonnegative))


@value_rule("And")
def and_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """x and y of known booleans, 1 or 0 (ONNX spec, And)."""
    return _elementwise(
        c, lambda x, y: _truth(bool(int(x)) and bool(int(y))) if _numbers(x, y) else None
    )


@value_rule("Or")
def or_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """x or y of known booleans, 1 or 0 (ONNX spec, Or)."""
    return _elementwise(
        c, lambda x, y: _truth(bool(int(x)) or bool(int(y))) if _numbers(x, y) else None
    )


def _numbers(*es: Expr) -> bool:
    return all(e.is_number for e in es)


@value_rule("Where")
def where_value(c: Call, out: Shape | None) -> np.ndarray | None:
    """X where the condition is true, else Y, for a known condition (ONNX spec, Where)."""
    return _elementwise(c, lambda b, x, y: (x if int(b) else y) if b.is_number else None)
