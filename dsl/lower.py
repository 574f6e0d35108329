"""Lower syntax-tree terms to Rule IR terms, against the op table and the host registry.

The left side binds captures into a `Scope`; results and guards are lowered against it.
Every `OpNode` gets all input slots of its op (absent trailing optional inputs are `Absent`)
and all attributes in op-table order:

| attribute not written | left side                  | right side                              |
|-----------------------|----------------------------|-----------------------------------------|
| no `:attrs`           | `Literal(default)` (strict)| `Literal(default)`                      |
| `:attrs @rest`        | `Capture("rest.a")`        | `Capture("rest.a")` if bound, else default |
| required, no default  | `MissingAttributeError`    | `MissingAttributeError`                 |

`Literal(None)` is an attribute whose default is "absent" (`vocab.ops.NONE`). The left side
of an `equal` rule is also a result (the rule runs both ways), so it is lowered in `equal`
mode: no `:c`, no `@bind`, no `_`, no required attribute left unwritten.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import product

from dsl import ast, ir
from dsl.errors import (
    ArityError,
    AttributeTypeError,
    CommutativeError,
    ForbiddenOperatorError,
    MissingAttributeError,
    PlacementError,
    UnknownAttributeError,
    UnknownOperatorError,
    did_you_mean,
)
from dsl.host import Scope, lower_call
from dsl.printer import value_text
from vocab.ops import ORT_DOMAINS, REQUIRED, VARIADIC_SLOTS, OpSpec, OpTable

KIND_WORDS = {
    "int": "an int",
    "float": "a float",
    "string": "a string",
    "ints": "a list of ints",
    "floats": "a list of floats",
    "strings": "a list of strings",
    "tensor": "a tensor",
}


@dataclass(frozen=True)
class Lowering:
    """What lowering needs: the op table and the builder registry (name -> `HostFn`)."""

    ops: OpTable
    builders: dict


# ---- left side -----------------------------------------------------------------------------


def lower_left(t: ast.Term, scope: Scope, lw: Lowering, equal: bool = False) -> list[ir.Term]:
    """The IR variants of a pattern (more than one when `:c` is used: the written order
    first), binding its captures into `scope`. `equal` lowers one side of an `equal` rule."""
    if isinstance(t, ast.CaptureRef):
        if t.many:
            raise _list_outside(t)
        scope.bind(t.name, "term", t.span)
        return [ir.Capture(t.name)]
    if isinstance(t, ast.AbsentTerm):
        return [ir.Absent()]
    if isinstance(t, ast.Wild):
        if equal:
            raise PlacementError(t.span, "'_' cannot appear in an equal rule (each side is built)")
        return [ir.Wildcard()]
    spec = op_spec(t, lw.ops)
    if t.head == "Constant":  # the import reads a Constant node as a constant: a leaf
        raise PlacementError(
            t.span,
            "a pattern never matches Constant: the import makes a Constant node a constant; "
            "capture it and guard its value, e.g. (Mul @x @one) (if (all-equal @one 1))",
        )
    if t.bind is not None:
        if equal:
            raise PlacementError(t.span, f"'{t.head}@{t.bind}' cannot appear in an equal rule")
        scope.bind(t.bind, "term", t.span)
    variants = [
        [_left_list(t, i, a, spec, scope, equal)]
        if _is_list(a)
        else lower_left(a, scope, lw, equal)
        for i, a in enumerate(t.args)
    ]
    if not any(_is_list(a) for a in t.args):  # a run of list captures is padded by dsl.lists
        variants += [[ir.Absent()]] * (spec.arity - len(t.args))
    combos = list(product(*variants))
    if t.commutative:
        _check_commutative(t, spec, equal)
        combos = [c2 for c in combos for c2 in (c, (c[1], c[0], *c[2:]))]
    attrs = _outputs_fit(t, _left_attrs(t, spec, scope, equal))
    nodes = [ir.OpNode(t.head, tuple(c), attrs, t.bind) for c in combos]
    return list(dict.fromkeys(nodes))


def _is_list(a: ast.Term) -> bool:
    return isinstance(a, ast.CaptureRef) and a.many


def _list_outside(t: ast.CaptureRef) -> PlacementError:
    msg = (
        f"@{t.name}... binds a run of inputs; it can only be an input of an op with a"
        " variadic input, like Concat"
    )
    return PlacementError(t.span, msg)


def _check_list_slot(t: ast.App, i: int, a: ast.CaptureRef, spec: OpSpec) -> None:
    """A list capture must stand in the variadic input's slots (the last input)."""
    if not spec.variadic:
        msg = f"@{a.name}... binds a run of inputs, but {t.head} has no variadic input"
        raise PlacementError(a.span, msg)
    first = spec.arity - VARIADIC_SLOTS
    if i < first:
        msg = (
            f"@{a.name}... is input {i + 1} of {t.head}, whose variadic input starts at input"
            f" {first + 1}"
        )
        raise PlacementError(a.span, msg)


def _left_list(t: ast.App, i: int, a: ast.CaptureRef, spec: OpSpec, scope: Scope, equal: bool):
    if equal:
        raise PlacementError(a.span, f"@{a.name}... cannot appear in an equal rule")
    _check_list_slot(t, i, a, spec)
    if scope.has(a.name):
        msg = f"@{a.name}... is bound twice; a list capture binds one run of inputs"
        raise PlacementError(a.span, msg)
    scope.bind(a.name, "list", a.span)
    return ir.ListCapture(a.name)


def _check_commutative(t: ast.App, spec: OpSpec, equal: bool) -> None:
    if any(_is_list(a) for a in t.args):
        raise CommutativeError(t.span, "':c' cannot swap a list capture")
    if equal:
        raise CommutativeError(t.span, "':c' cannot appear in an equal rule (write one order)")
    if len(t.args) < 2:
        n = len(t.args)
        raise CommutativeError(t.span, f"':c' needs two operands to swap; {t.head} has {n}")
    if not spec.commutative:
        raise CommutativeError(t.span, f"':c' on {t.head}, which is not commutative")


def _left_attrs(t: ast.App, spec: OpSpec, scope: Scope, equal: bool):
    written = written_attrs(t, spec)
    if t.rest is not None:
        scope.bind(t.rest.name, "attrs", t.rest.span)
    out = []
    for a in spec.attrs:
        if a.name in written:
            out.append((a.name, _left_value(t, written[a.name], a.kind, scope, equal)))
        elif t.rest is not None:
            name = f"{t.rest.name}.{a.name}"
            scope.bind(name, "attr", t.rest.span, a.kind)
            out.append((a.name, ir.Capture(name)))
        elif a.default is REQUIRED:  # matching any value must be said: `:to _`
            msg = f"{t.head} needs :{a.name} (it has no default); write it, capture it "
            raise MissingAttributeError(t.span, msg + f"or write :{a.name} _ to match any")
        else:
            out.append((a.name, ir.Literal(a.default)))
    return tuple(out)


def _left_value(t: ast.App, at: ast.Attr, kind: str, scope: Scope, equal: bool) -> ir.AttrExpr:
    v = at.value
    if isinstance(v, ast.CaptureRef):
        scope.bind(v.name, "attr", v.span, kind)
        return ir.Capture(v.name)
    if isinstance(v, ast.Wild):
        if equal:
            raise PlacementError(v.span, "'_' cannot appear in an equal rule (each side is built)")
        return ir.Wildcard()
    if isinstance(v, ast.BuilderCall):
        where = "an equal rule" if equal else "a pattern"
        raise PlacementError(v.span, f"builder '{v.fn}' computes a result; it cannot be in {where}")
    return literal(t, at, kind)


# ---- right side ----------------------------------------------------------------------------

PRUNED = ir.Absent()  # a result term left out (`ast.Pruned`); told apart by identity


def lower_right(t: ast.Term, scope: Scope, lw: Lowering) -> ir.Term:
    """The IR of a result term; its captures must be bound in `scope`."""
    if isinstance(t, ast.CaptureRef):
        if t.many:
            raise _list_outside(t)
        if t.name in scope.lets:  # a `with` binding: its term, written in place
            value = scope.lets[t.name]
            if isinstance(value, ir.Call):
                msg = f"@{t.name} is a with binding of a builder's value; it cannot be a term"
                raise PlacementError(t.span, msg)
            return value
        scope.use(t.name, "term", t.span)
        return ir.Capture(t.name)
    if isinstance(t, ast.Pruned):
        return PRUNED
    if isinstance(t, ast.AbsentTerm):
        return ir.Absent()
    if isinstance(t, ast.Wild):
        raise PlacementError(t.span, "'_' cannot appear in a result (there is nothing to build)")
    spec = op_spec(t, lw.ops)
    if t.bind is not None:
        msg = f"'{t.head}@{t.bind}' binds a match; it is only allowed on the left side"
        raise PlacementError(t.span, msg)
    if t.commutative:
        raise CommutativeError(t.span, "':c' is only allowed on the left side")
    args = [
        _right_list(t, i, a, spec, scope) if _is_list(a) else lower_right(a, scope, lw)
        for i, a in enumerate(t.args)
    ]
    if t.optional:  # `(Op? A B)` in a result: B where A is left out (see ast.Pruned)
        if len(args) != 2:
            raise PlacementError(t.span, f"'{t.head}?' in a result takes two inputs")
        if args[0] is PRUNED:
            return args[1]
    if not any(_is_list(a) for a in t.args):  # a spread is padded when the lists are known
        args += [ir.Absent()] * (spec.arity - len(t.args))
    for i, a in enumerate(args):
        if a is PRUNED and i < spec.n_required:
            return PRUNED  # this term needs what the alternative does not bind: left out
        if a is PRUNED:
            args[i] = ir.Absent()
        elif i < spec.n_required and isinstance(a, ir.Absent):
            msg = f"input {i + 1} of {t.head} is required; it cannot be absent"
            raise PlacementError(t.span, msg)
    return ir.OpNode(t.head, tuple(args), _outputs_fit(t, _right_attrs(t, spec, scope, lw)))


def _right_list(t: ast.App, i: int, a: ast.CaptureRef, spec: OpSpec, scope: Scope):
    _check_list_slot(t, i, a, spec)
    scope.use(a.name, "list", a.span)
    return ir.ListCapture(a.name)


def _right_attrs(t: ast.App, spec: OpSpec, scope: Scope, lw: Lowering):
    written = written_attrs(t, spec)
    if t.rest is not None:
        scope.use(t.rest.name, "attrs", t.rest.span)
    out = []
    for a in spec.attrs:
        rest = f"{t.rest.name}.{a.name}" if t.rest is not None else None
        if a.name in written:
            value = _right_value(t, written[a.name], a.kind, scope, lw)
        elif rest is not None and scope.has(rest):
            value = ir.Capture(rest)
        elif a.default is REQUIRED:
            raise _missing(t, a.name)
        else:
            value = ir.Literal(a.default)
        out.append((a.name, value))
    return tuple(out)


def _right_value(t: ast.App, at: ast.Attr, kind: str, scope: Scope, lw: Lowering):
    v = at.value
    if isinstance(v, ast.CaptureRef) and v.name in scope.lets:
        value = scope.lets[v.name]
        if not isinstance(value, ir.Call):
            msg = f"@{v.name} is a with binding of a result term; it cannot be an attribute"
            raise PlacementError(v.span, msg)
        return value
    if isinstance(v, ast.CaptureRef):
        got = scope.use(v.name, "attr", v.span)
        if got.kind != kind:
            msg = (
                f"@{v.name} holds {KIND_WORDS[got.kind]} (bound at {got.span.line}:{got.span.col})"
                f" but :{at.name} of {t.head} takes {KIND_WORDS[kind]}"
            )
            raise AttributeTypeError(v.span, msg)
        return ir.Capture(v.name)
    if isinstance(v, ast.Wild):
        raise PlacementError(v.span, "'_' cannot appear in a result (there is nothing to build)")
    if isinstance(v, ast.BuilderCall):
        return lower_call(v, scope, lw.builders)
    return literal(t, at, kind)


def _missing(t: ast.App, name: str) -> MissingAttributeError:
    msg = f"{t.head} needs :{name} (it has no default); write it or copy it with :attrs"
    return MissingAttributeError(t.span, msg)


# ---- shared --------------------------------------------------------------------------------


def op_spec(t: ast.App, ops: OpTable) -> OpSpec:
    """The op-table entry of `t`'s operator, checking that it may be used and its arity.
    Raises UnknownOperatorError, ForbiddenOperatorError, ArityError."""
    spec = ops.get(t.head)
    if spec is None:
        raise UnknownOperatorError(t.span, _unknown(t.head, ops))
    if spec.effectful or spec.random:
        what = "random" if spec.random else "effectful"
        raise ForbiddenOperatorError(t.span, f"{t.head} is {what}; rules cannot match or build it")
    n = sum(not (isinstance(a, ast.CaptureRef) and a.many) for a in t.args)
    lists = n < len(t.args)  # list captures may stand for the required inputs
    if not (spec.n_required <= n or lists) or n > spec.arity:
        raise ArityError(t.span, f"{t.head} takes {_inputs(spec)}, got {n}")
    return spec


def _outputs_fit(t: ast.App, attrs: tuple) -> tuple:
    """`attrs`, after checking that the output `t` names (`Split#5`) is among the ones its
    `:num_outputs` literal gives (Split-18). Raises ArityError."""
    base, sharp, k = t.head.partition("#")
    n = dict(attrs).get("num_outputs")
    if sharp and isinstance(n, ir.Literal) and isinstance(n.value, int) and int(k) >= n.value:
        msg = f"'{t.head}': :num_outputs {n.value} gives {base} to {base}#{n.value - 1}"
        raise ArityError(t.span, msg)
    return attrs


def _unknown(head: str, ops: OpTable) -> str:
    """Why `head` names no op: a projection out of range, an unknown domain, or a name with
    the closest known one."""
    base, sharp, k = head.partition("#")
    spec = ops.get(base) if sharp else None
    if spec is not None:
        if spec.n_outputs == 1:
            return f"'{head}': {base} has one output (write {base} for it)"
        last = f"{spec.n_outputs - 1}" + (" (a variadic output)" if spec.variadic_outputs else "")
        return f"'{head}': {base}'s outputs are {base}, then {base}#1 to {base}#{last}"
    if "." in base and not sharp:
        domain = base.rsplit(".", 1)[0]
        names = [n for n in ops.names() if "." in n]
        known = {n.rsplit(".", 1)[0] for n in names} | set(ORT_DOMAINS)
        if domain not in known:
            # the registries' domains (the ones rule files declared ops in vary by process)
            shown = sorted(
                {n.rsplit(".", 1)[0] for n in names if not ops.get(n).declared} | set(ORT_DOMAINS)
            )
            return f"unknown domain '{domain}' in '{head}' (domains: {', '.join(shown)})"
    return f"unknown operator '{head}'{did_you_mean(head, ops.names())}"


def _inputs(spec: OpSpec) -> str:
    lo, hi = spec.n_required, spec.arity
    count = str(hi) if lo == hi else f"{lo} to {hi}"
    return f"{count} input" + ("" if hi == 1 and lo == hi else "s")


def written_attrs(t: ast.App, spec: OpSpec) -> dict[str, ast.Attr]:
    """The attributes written in `t` by name. Raises UnknownAttributeError for an attribute the
    op does not have or one written twice."""
    out: dict[str, ast.Attr] = {}
    for at in t.attrs:
        if at.name not in spec.attr_index:
            names = [a.name for a in spec.attrs]
            hint = did_you_mean(at.name, names, ":") or (
                f" (it has {', '.join(':' + n for n in names)})" if names else " (it has none)"
            )
            raise UnknownAttributeError(at.span, f"{t.head} has no attribute :{at.name}{hint}")
        if at.name in out:
            raise UnknownAttributeError(at.span, f":{at.name} is written twice")
        out[at.name] = at
    return out


def literal(t: ast.App, at: ast.Attr, kind: str) -> ir.Literal:
    """A literal attribute value converted to the attribute's kind (an int for a `float`
    attribute becomes a float). Raises AttributeTypeError on a mismatch."""
    v = at.value
    ok = None
    if kind in ("int", "float") and isinstance(v, ast.Number):
        if kind == "float" or isinstance(v.value, int):
            ok = v.value
    elif kind == "string" and isinstance(v, ast.String):
        ok = v.value
    elif kind in ("ints", "floats") and isinstance(v, ast.ListLit):
        items = [n.value for n in v.items]
        if kind == "floats" or all(isinstance(x, int) for x in items):
            ok = tuple(items)
    if ok is None:
        msg = f":{at.name} of {t.head} takes {KIND_WORDS[kind]}, not {value_text(v)}"
        raise AttributeTypeError(v.span, msg)
    values = list(ok) if kind in ("ints", "floats") else [ok] if kind in ("int", "float") else []
    if kind in ("int", "ints") and any(not INT64_MIN <= i <= INT64_MAX for i in values):
        msg = f":{at.name} of {t.head}: {value_text(v)} does not fit an int64 (ONNX's INT)"
        raise AttributeTypeError(v.span, msg)
    if kind in ("float", "floats"):
        if any(abs(x) > FLOAT32_MAX and x not in (math.inf, -math.inf) for x in values):
            msg = f":{at.name} of {t.head}: {value_text(v)} does not fit a float32 (ONNX's FLOAT)"
            raise AttributeTypeError(v.span, msg)
        ok = float(ok) if kind == "float" else tuple(float(x) for x in ok)
    return ir.Literal(ok)


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1  # an ONNX INT(S) attribute's range
FLOAT32_MAX = 3.4028234663852886e38  # an ONNX FLOAT(S) attribute's largest finite value
