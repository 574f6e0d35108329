"""Symbolic dimensions and the values of small integer tensors, as the shape rules compute them.

Every dimension is a sympy integer expression: a number, or a symbol (an input's `dim_param`,
or a fresh symbol per dimension nothing knows), or an expression over symbols (`2*seq`,
`floor(seq/2)`). Symbols are positive integers, so `seq - seq` is 0 and `Equal(seq, -1)` is
false. Two dimensions are the same exactly when their expressions are. A `SymValue` is the
value of a small integer tensor (a shape, an index): its elements are such expressions too.

Dimensions are written into a TermGraph's types as ints or as the expression's text
(`to_dim`), and read back with `parse_dim`, so equal dimensions share one string everywhere.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np
import sympy
from sympy.parsing.sympy_parser import parse_expr

MAX_VALUE_ELEMENTS = 64  # integer tensors up to this size have their values tracked

Expr = sympy.Expr
Shape = tuple  # tuple[Expr, ...]


def any_unknown(elems) -> bool:
    """True when an element of `elems` (dimensions or values: sympy expressions, ints, None)
    is None, unknown. By identity: `None in elems` compares each sympy element with None by
    sympy's `__eq__`, which converts None first (a fifth of the shape analysis's time on
    Swin-T's 2328 nodes)."""
    return any(e is None for e in elems)


@dataclass(frozen=True)
class SymValue:
    """The value of a small tensor (at most MAX_VALUE_ELEMENTS elements): its shape and its
    elements in row-major order, each a sympy expression or None when unknown."""

    shape: tuple[int, ...]
    elems: tuple

    def array(self) -> np.ndarray:
        """The value as a numpy object array of its elements."""
        return obj_array(list(self.elems)).reshape(self.shape)

    @property
    def known(self) -> bool:
        """True when every element is a number (the value can become a constant)."""
        return all(e is not None and e.is_number for e in self.elems)


def value_of_array(arr) -> SymValue | None:
    """The SymValue of a constant: numpy array `arr` of an integer or bool dtype with at most
    MAX_VALUE_ELEMENTS elements; None for any other array."""
    arr = np.asarray(arr)
    if arr.size > MAX_VALUE_ELEMENTS or arr.dtype.kind not in "iub":
        return None
    return SymValue(arr.shape, tuple(sympy.Integer(int(x)) for x in arr.reshape(-1)))


def symbol(name: str) -> sympy.Symbol:
    """The positive-integer symbol of a dimension name."""
    return sympy.Symbol(name, integer=True, positive=True)


def to_dim(e: Expr):
    """A dimension as TensorType stores it: an int, or the expression's text."""
    if e is None:
        return None
    if e.is_Integer:
        return int(e)
    return str(e)


_IDENT = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_EXPR_TEXT = re.compile(r"[A-Za-z_0-9*+\-/() ]+")


@functools.lru_cache(maxsize=4096)
def parse_dim(text: str) -> Expr:
    """The expression a dimension string stands for: `to_dim`'s text read back.

    "batch" is the symbol `batch`; "batch*seq" (how the analysis writes a product) is the
    product of the symbols `batch` and `seq`, so a dimension written by one analysis run
    means the same in the next. A string that is not such an expression (a `dim_param` may
    be any text) is one symbol of that name."""
    if _IDENT.fullmatch(text) or not _EXPR_TEXT.fullmatch(text):
        return symbol(text)
    names = {n: symbol(n) for n in _IDENT.findall(text) if n != "floor"}
    try:
        e = parse_expr(
            text,
            local_dict=names,
            global_dict={"Integer": sympy.Integer, "floor": sympy.floor, "Symbol": sympy.Symbol},
        )
    except (SyntaxError, TypeError, ValueError, AttributeError, sympy.SympifyError):
        return symbol(text)
    return e if isinstance(e, sympy.Expr) and str(e) == text else symbol(text)


def broadcast(shapes: list[Shape]) -> Shape | None:
    """Multidirectional (numpy) broadcasting of symbolic shapes (ONNX docs/Broadcasting.md).

    A dimension of 1 takes the other; equal expressions stay; a symbol against a number > 1 is
    that number (the model is valid, so the symbol must be 1 or equal). Two different symbols
    give None for that dimension (either may be 1). Returns None if a rank is unknown."""
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        rest = []
        for d in dims:
            if d == 1 or any(d == r for r in rest):
                continue
            rest.append(d)
        if not rest:
            out.append(sympy.Integer(1))
        elif len(rest) == 1:
            out.append(rest[0])
        else:
            nums = [d for d in rest if d.is_number]
            out.append(nums[0] if nums else None)
    return tuple(out)


def obj_array(x) -> np.ndarray:
    """A numpy object array holding sympy expressions (a list gives a 1-D array, anything
    else a 0-d array)."""
    if isinstance(x, list):
        out = np.empty(len(x), dtype=object)
        out[:] = x
        return out
    out = np.empty((), dtype=object)
    out[()] = x
    return out


def map_elems(f, arr: np.ndarray) -> np.ndarray:
    """`f` of each element of object array `arr`, in an object array of its shape."""
    flat = [f(e) for e in arr.reshape(-1).tolist()]
    return obj_array(flat).reshape(arr.shape)


@functools.lru_cache(maxsize=4096)
def simplify(e: Expr) -> Expr:
    """`sympy.simplify(e)`, skipped when `e` is already simplest: an atom (a number or a
    symbol), a monomial (`197*batch`, `batch*sequence**2`, `64*a*b/c`) or a monomial without
    division plus an integer (`batch + 1`), which `simplify` returns as they are. Most shape
    arithmetic is of these forms (a Reshape's -1 is the input's size over the other dims: a
    product over a product), and a `simplify` call costs 4-8 ms (the first of a process also
    imports `sympy.physics.units`). Cached: a model's layers repeat their shape arithmetic."""
    return (
        e
        if _monomial(e, divides=True)
        or (
            e.is_Add
            and len(e.args) == 2
            and any(a.is_Integer for a in e.args)
            and all(_monomial(a) for a in e.args)
        )
        else sympy.simplify(e)
    )


def _monomial(e: Expr, divides: bool = False) -> bool:
    """An atom, a positive integer power of a symbol, or a product of those; with `divides`,
    negative powers too (`a*b/c`, sympy's canonical form of such a product)."""
    if e.is_Atom:
        return True
    if e.is_Pow:
        return bool(e.base.is_Symbol and e.exp.is_Integer and (e.exp > 0 or divides))
    return bool(e.is_Mul) and all(a.is_Atom or (a.is_Pow and _monomial(a, divides)) for a in e.args)
