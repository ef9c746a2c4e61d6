"""The package's imports go one way, downward, and form no cycle (docs/architecture.md).

Every ``import`` in every module is read with ``ast``, at module level and inside functions alike,
relative or absolute; ``from X import name`` counts as an import of the submodule ``X.name`` where
that is one, and ``importlib.import_module("fastlayers...")`` with a constant name counts too.
The one exception is ``DEFERRED_UPWARD``: an import inside a function body of a model class's
module that reaches the readers and writers above it (``Model.save`` -> ``io/native.py``); it
runs after every module has loaded, so it is left out of the cycle check too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "fastlayers"

#: The import order, lowest first: a module imports only from its own level or a lower one. A level
#: names modules and packages (a package covers its submodules); ``fastlayers`` is the package's
#: ``__init__`` alone.
LEVELS = [
    # imported from anywhere: exceptions, window and padding arithmetic, array helpers, the
    # version, settings, the readers' limits
    (
        "ground",
        (
            "fastlayers.errors",
            "fastlayers.geometry",
            "fastlayers.arrays",
            "fastlayers.version",
            "fastlayers.settings",
            "fastlayers.limits",
        ),
    ),
    ("native", ("fastlayers.native",)),
    ("backends", ("fastlayers.backends",)),
    # what layers and modules use without being layers: graph records, stream state, warm-up runs
    ("layer support", ("fastlayers.layers.symbolic", "fastlayers.layers.streaming", "fastlayers.model.warmup")),
    ("layers", ("fastlayers.layers",)),
    # services over layers that the model classes call (model/: plan rewrites, summaries,
    # model.to); model/graph.py itself is a model class, and model/plans.py (layer graphs
    # written as ONNX graphs) sits beside it and onnx/
    ("model services", ("fastlayers.model",)),
    ("models", ("fastlayers.model.graph", "fastlayers.model.plans", "fastlayers.nn", "fastlayers.onnx")),
    ("io", ("fastlayers.io",)),
    (
        "top",
        (
            "fastlayers",
            "fastlayers.cli",
            "fastlayers.dask",
            "fastlayers.pickling",
            "fastlayers.benchmark",
            "fastlayers.pytest_plugin",
        ),
    ),
]

#: Importer level -> the modules it may import upward inside a function body (deferred): the model
#: classes' ``save``, ``load_weights``, ``get_config``, ``to_json`` and ``__reduce__`` call the
#: readers, writers and pickling that sit above them.
DEFERRED_UPWARD = {"models": ("fastlayers.io", "fastlayers.pickling")}


def _name(path: Path) -> str:
    parts = ("fastlayers",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    """Module name -> source: the Python modules, and the compiled extension (its .pyx)."""
    modules = {}
    for path in sorted([*ROOT.rglob("*.py"), *ROOT.rglob("*.pyx")]):
        parts = ("fastlayers",) + path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _level(module: str) -> int:
    best, best_len = None, -1
    for k, (_, names) in enumerate(LEVELS):
        for name in names:
            covers = module == name or (name != "fastlayers" and module.startswith(name + "."))
            if covers and len(name) > best_len:
                best, best_len = k, len(name)
    if best is None:
        raise AssertionError(f"{module} is in no level of LEVELS: add it where it belongs")
    return best


def _targets(module: str, node: ast.AST, modules: dict) -> list[str]:
    """The fastlayers modules ``node`` imports, as module names."""
    is_package = modules[module].name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(parts + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    else:  # importlib.import_module("fastlayers.x")
        names = [node.args[0].value]
    out = []
    for name in names:
        if name != "fastlayers" and not name.startswith("fastlayers."):
            continue
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        out.append(name)
    return out


def _is_import_module(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call) or not node.args:
        return False
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    return name == "import_module" and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)


#: Where an import statement may start (at any indentation) or ``import_module`` is called: only
#: these statements are parsed, which keeps the test well under a second; a file where one of
#: them does not parse on its own is parsed whole.
_IMPORT_START = re.compile(r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import\b|import[ \t]+\w)|import_module\(", re.M)


def _import_nodes(text: str, path: Path):
    """The import statements and ``import_module`` calls of a source file, as ast nodes with
    their line numbers in the file."""
    nodes = []
    for match in _IMPORT_START.finditer(text):
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.end())
        snippet = text[start : end if end >= 0 else len(text)].strip()
        if snippet.endswith(("(", ",", "\\")):  # a parenthesised or continued name list
            close = text.find(")", match.end())
            snippet = text[start : close + 1].strip()
        try:
            tree = ast.parse(snippet.rstrip("\\").rstrip())
        except SyntaxError:
            tree = None
        if tree is None or not tree.body:
            return [
                node
                for node in ast.walk(ast.parse(text, str(path)))
                if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_import_module(node)
            ]
        line = text.count("\n", 0, start) + 1
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) or _is_import_module(node):
                node.lineno = line
                nodes.append(node)
    return nodes


def _function_import_lines(path: Path) -> set[int]:
    """The lines of the import statements inside a function body of ``path``."""
    lines = set()
    for fn in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines.update(node.lineno for node in ast.walk(fn) if isinstance(node, (ast.Import, ast.ImportFrom)))
    return lines


def _deferred_allowed(module: str, target: str) -> bool:
    allowed = DEFERRED_UPWARD.get(LEVELS[_level(module)][0], ())
    return any(target == name or target.startswith(name + ".") for name in allowed)


def _graph() -> tuple[dict, dict]:
    """Module -> {imported module: first line} for the imports that run at load time, and the
    modules; the deferred upward imports ``DEFERRED_UPWARD`` allows are left out."""
    modules = _modules()
    edges = {}
    for module, path in modules.items():
        out = edges.setdefault(module, {})
        if path.suffix == ".pyx":
            continue
        in_functions = None
        for node in _import_nodes(path.read_text(), path):
            for target in _targets(module, node, modules):
                if target == module:
                    continue
                if _level(target) > _level(module) and _deferred_allowed(module, target):
                    if in_functions is None:
                        in_functions = _function_import_lines(path)
                    if node.lineno in in_functions:
                        continue
                out.setdefault(target, node.lineno)
    return edges, modules


def _cycles(edges: dict) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


@pytest.fixture(scope="module")
def graph():
    return _graph()


def test_no_import_cycles(graph):
    edges, _ = graph
    cycles = _cycles(edges)
    assert not cycles, "import cycles:\n" + "\n".join(
        " ".join(c) + "\n    " + "; ".join(f"{m} -> {t}" for m in c for t in edges[m] if t in c) for c in cycles
    )


def test_imports_go_downward(graph):
    edges, _ = graph
    upward = [
        f"{m} (line {line}, {LEVELS[_level(m)][0]}) imports {t} ({LEVELS[_level(t)][0]})"
        for m in sorted(edges)
        for t, line in sorted(edges[m].items())
        if _level(t) > _level(m)
    ]
    assert not upward, "imports from a higher level:\n" + "\n".join(upward)


def test_no_module_imports_its_own_package(graph):
    edges, modules = graph
    back = [
        f"{m} (line {line}) imports its package {t}'s __init__"
        for m in sorted(edges)
        for t, line in sorted(edges[m].items())
        if modules[t].name == "__init__.py" and m.startswith(t + ".")
    ]
    assert not back, "\n".join(back)


def test_every_module_has_a_level(graph):
    _, modules = graph
    for module in modules:
        _level(module)


def test_no_module_defines_a_top_level_name_twice():
    """A second ``def`` or ``class`` of a name replaces the first one silently; which one the
    module's code calls then depends on file order. ``@overload`` signatures, which only the
    type checker reads, come before the one definition and are not counted."""
    twice = []
    for path in sorted(ROOT.rglob("*.py")):
        seen: set[str] = set()
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                (d.id if isinstance(d, ast.Name) else getattr(d, "attr", None)) == "overload"
                for d in node.decorator_list
            ):
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                if node.name in seen:
                    twice.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name}")
                seen.add(node.name)
    assert not twice, twice


def test_deferred_imports_name_what_exists():
    """An import inside a function body fails only when it runs: each deferred ``from X import
    name`` of a model class's module must name something X has."""
    import importlib

    modules = _modules()
    missing = []
    for module, path in modules.items():
        if path.suffix != ".py" or LEVELS[_level(module)][0] not in DEFERRED_UPWARD:
            continue
        lines = _function_import_lines(path)
        for node in _import_nodes(path.read_text(), path):
            if not isinstance(node, ast.ImportFrom) or node.lineno not in lines:
                continue
            for target in _targets(module, node, modules):
                if not _deferred_allowed(module, target):
                    continue
                imported = importlib.import_module(target)
                missing += [
                    f"{module} (line {node.lineno}): {target}.{a.name}"
                    for a in node.names
                    if not hasattr(imported, a.name)
                ]
    assert not missing, missing


def test_onnx_reaches_kernels_through_the_ops_interface(graph):
    """``onnx/`` never imports ``native/``: its kernels (layout moves, the integer products) are
    the active backend's (``get_ops()``), so that the numpy reference runs every graph too."""
    edges, _ = graph
    direct = [
        f"{m} (line {line}) imports {t}"
        for m in sorted(edges)
        if m.startswith("fastlayers.onnx")
        for t, line in sorted(edges[m].items())
        if t.startswith("fastlayers.native")
    ]
    assert not direct, "\n".join(direct)
