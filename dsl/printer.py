"""Pretty-print a `dsl.ast.File` back to canonical `.rules` text.

Canonical layout: one blank line between forms; a rule's name (and `:fp`) on its first line,
then the match, the guards and the result each on its own line, indented two spaces per
nesting level; a term that does not fit in 100 columns is broken one operand per line.
Comments are not part of the tree, so they are not printed. `parse(format_file(f))` equals
`f` (spans aside) for every tree `parse` produces.
"""

from __future__ import annotations

from dsl import ast

WIDTH = 100
_STEP = "  "


def format_file(file: ast.File) -> str:
    """Canonical text of `file` (ending in a newline)."""
    return "\n\n".join(format_form(f) for f in file.forms) + "\n"


def format_form(form: ast.Form, indent: str = "") -> str:
    """Canonical text of one top-level or `for`-body form, starting at `indent`."""
    if isinstance(form, ast.Ruleset):
        needs = f" :opset {form.opset}" if form.opset is not None else ""
        needs += "".join(f" :domain {d}" for d in form.domains)
        needs += f" :sums {form.sums}" if form.sums else ""
        return f"{indent}(ruleset {form.name}{needs})"
    inner = indent + _STEP
    if isinstance(form, ast.OpDecl):
        return _format_decl(form, indent)
    if isinstance(form, ast.For):
        body = "\n".join(format_form(f, inner) for f in form.body)
        return f"{indent}(for {form.var} ({' '.join(form.ops)})\n{body})"
    kind = "simplify" if isinstance(form, ast.Simplify) else "equal"
    fp = f" :fp {form.fp}" if form.fp else ""
    lines = [f"{indent}({kind} {form.name}{fp}", format_term(form.lhs, inner)]
    if isinstance(form, ast.Simplify) and form.bindings:
        pairs = [f"(@{b.name} {term_text(b.value)})" for b in form.bindings]
        lines.append(f"{inner}(with {' '.join(pairs)})")
    if isinstance(form, ast.Simplify) and form.guards:
        lines.append(_format_guards(form.guards, inner))
    if isinstance(form, ast.Simplify) and form.bound is not None:
        lines.append(f"{inner}(bound {_guard_text(form.bound)[1:]}")
    lines.append(format_term(form.rhs, inner) + ")")
    return "\n".join(lines)


def _format_decl(form: ast.OpDecl, indent: str) -> str:
    suffix = {(False, False): "", (True, False): "?", (False, True): "..."}
    ins = " ".join(f"@{i.name}{suffix[(i.optional, i.many)]}" for i in form.inputs)
    head = f"{indent}(op {form.name} ({ins})"
    for a in form.attrs:
        default = f" {value_text(a.default)}" if a.default is not None else ""
        head += f" :attr ({a.name} {a.kind}{default})"
    if form.cost is not None:
        head += f" :cost {form.cost}"
    return head + "\n" + format_term(form.body, indent + _STEP) + ")"


def format_term(t: ast.Term, indent: str = "") -> str:
    """A term at `indent`: on one line if it fits, else one operand or attribute per line."""
    if isinstance(t, ast.Roots):
        inner = indent + _STEP
        return f"{indent}(roots\n" + "\n".join(format_term(r, inner) for r in t.terms) + ")"
    flat = indent + term_text(t)
    if isinstance(t, ast.Alt) and len(flat) > WIDTH:
        inner = indent + _STEP
        return f"{indent}(or\n" + "\n".join(format_term(o, inner) for o in t.options) + ")"
    if len(flat) <= WIDTH or not isinstance(t, ast.App) or not (t.args or t.attrs):
        return flat
    inner = indent + _STEP
    parts = [format_term(a, inner) for a in t.args]
    parts += [f"{inner}:{a.name} {value_text(a.value)}" for a in t.attrs]
    if t.rest is not None:
        parts.append(f"{inner}:attrs @{t.rest.name}")
    return f"{indent}({_head(t)}\n" + "\n".join(parts) + ")"


def term_text(t: ast.Term) -> str:
    """A term on one line."""
    if isinstance(t, ast.CaptureRef):
        return f"@{t.name}" + ("..." if t.many else "")
    if isinstance(t, ast.Wild):
        return "_"
    if isinstance(t, ast.AbsentTerm):
        return "absent"
    if isinstance(t, ast.Alt):
        return "(or " + " ".join(term_text(o) for o in t.options) + ")"
    if isinstance(t, ast.Roots):
        return "(roots " + " ".join(term_text(o) for o in t.terms) + ")"
    parts = [_head(t), *(term_text(a) for a in t.args)]
    parts += [f":{a.name} {value_text(a.value)}" for a in t.attrs]
    if t.rest is not None:
        parts.append(f":attrs @{t.rest.name}")
    return "(" + " ".join(parts) + ")"


def value_text(v: ast.AttrValue | ast.GuardArg) -> str:
    """An attribute value or guard argument on one line."""
    if isinstance(v, ast.CaptureRef):
        return f"@{v.name}" + ("..." if v.many else "")
    if isinstance(v, ast.Wild):
        return "_"
    if isinstance(v, ast.Number):
        return number_text(v.value)
    if isinstance(v, ast.String):
        return f'"{v.value}"'
    if isinstance(v, ast.ListLit):
        return "(" + " ".join(number_text(n.value) for n in v.items) + ")"
    return "(" + " ".join([v.fn, *(value_text(a) for a in v.args)]) + ")"


def number_text(x: int | float) -> str:
    """A number so that it parses back to the same value and type (`1.0`, `1e-05`, `-inf`)."""
    return str(x) if isinstance(x, int) else repr(float(x))


def _head(t: ast.App) -> str:
    head = t.head + ("?" if t.optional else "") + (":c" if t.commutative else "")
    return head + (f"@{t.bind}" if t.bind else "")


def _format_guards(guards: tuple[ast.GuardCall, ...], indent: str) -> str:
    texts = [_guard_text(g) for g in guards]
    flat = f"{indent}(if {' '.join(texts)})"
    if len(flat) <= WIDTH:
        return flat
    inner = indent + "    "
    return f"{indent}(if {texts[0]}\n" + "\n".join(inner + t for t in texts[1:]) + ")"


def _guard_text(g: ast.GuardCall) -> str:
    call = "(" + " ".join([g.fn, *(value_text(a) for a in g.args)]) + ")"
    return f"(not {call})" if g.negate else call
