"""The layers import downward (docs/architecture.md), counting imports inside functions.

`lint-imports` (pyproject.toml's [tool.importlinter]) checks the layer contracts on grimp's
import graph; this test walks the sources itself, so that the rules hold without import-linter
installed and include what its contracts do not say: no import cycle between any two modules
(a package's `__init__` counted as the module it is, and run by every import of a module under
it), imports of the project's modules inside functions only in the command-line entry points,
and every module listed in docs/architecture.md.
"""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# lowest first: each layer imports only from the layers before it
LAYERS = ("patterns", "vocab", "dsl", "engine", "frontends", "verify", "rewrite")
# may import the project's modules inside functions, to keep a start-up light: `import rewrite`
# (no onnx, no torch), `rewrite --help`, and pytest's start (the plugin loads in every session)
ENTRY_POINTS = {
    "rewrite",
    "rewrite.cli",
    "rewrite.launch",
    "verify",
    "verify.cli",
    "verify.cli_common",
    "verify.lint_cli",
    "verify.pytest_plugin",
}
# sibling subpackages that must not import each other
INDEPENDENT = ("frontends.onnx", "frontends.fx")


def modules(root: Path, packages=LAYERS) -> dict[str, Path]:
    """Dotted module name -> source file, for every .py file under `packages`."""
    found = {}
    for pkg in packages:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = f
    return found


def imports(root: Path, packages=LAYERS) -> list[tuple[str, str, int, bool]]:
    """(importer, imported module, line, inside a function) for every import of a project
    module, with the packages an import runs on the way (`a.b.c` runs `a` and `a.b`)."""
    mods = modules(root, packages)
    out = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for node, in_function in _import_nodes(tree, False):
            for name in _targets(node, mod, path.name == "__init__.py", mods):
                target = _resolve(name, mods)
                if target is None or target == mod:
                    continue
                out.append((mod, target, node.lineno, in_function))
                parts = target.split(".")
                for i in range(1, len(parts)):
                    parent = ".".join(parts[:i])
                    if parent in mods and parent != mod and not mod.startswith(parent + "."):
                        out.append((mod, parent, node.lineno, in_function))
    return out


def _import_nodes(node, in_function):
    """(import statement, whether it is inside a function) for every import under `node`."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function
        inner = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _import_nodes(child, in_function or inner)


def _resolve(name: str, mods) -> str | None:
    """The longest prefix of dotted `name` that is a project module (None if none is)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in mods:
            return ".".join(parts[:i])
    return None


def _targets(node, mod: str, is_pkg: bool, mods) -> list[str]:
    """The dotted names import statement `node` of module `mod` imports."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importer's package
        pkg = mod.split(".") if is_pkg else mod.split(".")[:-1]
        pkg = pkg[: len(pkg) - node.level + 1]
        base = ".".join(pkg + ([node.module] if node.module else []))
    # `from p import x`: x may be a submodule; else the import is of p itself
    subs = [f"{base}.{a.name}" for a in node.names]
    return [s for s in subs if _resolve(s, mods) == s] or [base]


def cycles(edges) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = {}
    for a, b, *_ in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index, low, stack, on, found = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return found


def upward(edges) -> list[str]:
    """Imports of a higher layer, or between the independent subpackages."""
    bad = []
    rank = {name: i for i, name in enumerate(LAYERS)}
    for a, b, line, _ in edges:
        if rank[b.split(".")[0]] > rank[a.split(".")[0]]:
            bad.append(f"{a}:{line} imports {b} (a higher layer)")
        side = [
            next((x for x in INDEPENDENT if m == x or m.startswith(x + ".")), None) for m in (a, b)
        ]
        if None not in side and side[0] != side[1]:
            bad.append(f"{a}:{line} imports {b} (independent of it)")
    return bad


def _subpackage(mod: str) -> str | None:
    return next((x for x in INDEPENDENT if mod == x or mod.startswith(x + ".")), None)


EDGES = imports(ROOT)


def test_no_import_cycles():
    found = cycles(EDGES)
    assert not found, f"import cycles (imports inside functions counted): {found}"


def test_layers_import_downward():
    bad = upward(EDGES)
    assert not bad, "\n".join(bad)


def test_imports_inside_functions_only_in_entry_points():
    bad = [f"{a}:{line} imports {b}" for a, b, line, local in EDGES if local]
    bad = [b for b in bad if b.split(":")[0] not in ENTRY_POINTS]
    assert not bad, "import these at module level:\n" + "\n".join(bad)


def test_every_module_is_in_the_architecture_doc():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    listed = set(re.findall(r"`((?:{})/[\w/]*\.py)`".format("|".join(LAYERS)), doc))
    files = {str(p.relative_to(ROOT)) for p in modules(ROOT).values()}
    assert files - listed == set(), "not in docs/architecture.md"
    assert listed - files == set(), "in docs/architecture.md, but no such module"


def test_the_checks_see_through_functions(tmp_path):
    """The walk finds a cycle closed by an import inside a function, a relative import, an
    upward import inside a function, and the package an import of a submodule runs."""
    for path, text in {
        "vocab/__init__.py": "",
        "vocab/a.py": "from vocab import b\n",
        "vocab/b.py": "def f():\n    from .a import x\n",
        "engine/__init__.py": "from engine.c import y\n",
        "engine/c.py": "def g():\n    import rewrite.d\n",
        "rewrite/__init__.py": "",
        "rewrite/d.py": "from vocab import a\n",
    }.items():
        (tmp_path / path).parent.mkdir(exist_ok=True)
        (tmp_path / path).write_text(text)
    edges = imports(tmp_path, ("vocab", "engine", "rewrite"))
    assert ("vocab.b", "vocab.a", 2, True) in edges
    assert ("engine.c", "rewrite", 2, True) in edges
    assert cycles(edges) == [["vocab.a", "vocab.b"]]
    assert upward(edges) == [
        "engine.c:2 imports rewrite.d (a higher layer)",
        "engine.c:2 imports rewrite (a higher layer)",
    ]
    edges.append(("engine.c", "engine", 1, False))  # engine/__init__ imports engine.c
    assert ["engine", "engine.c"] in cycles(edges)
