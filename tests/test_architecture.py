"""Import rules (ARCHITECTURE.md): a backend implements primitives and never imports the model
graph, the layers or the file loaders."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "fastlayers"
FORBIDDEN = ("fastlayers.graph", "fastlayers.layers", "fastlayers.io")


def _imported_modules(path: Path):
    """The absolute names of the modules ``path`` imports (relative imports resolved)."""
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = parts[:-1]   # the package holding the module (for __init__.py: its own)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def test_backends_never_import_graph_layers_or_io():
    files = sorted((PACKAGE / "backends").rglob("*.py"))
    assert len(files) > 10
    imports = {f"{f.relative_to(PACKAGE)}: {m}" for f in files for m in _imported_modules(f)}
    assert any(i.endswith(": fastlayers.errors.InputError") for i in imports)  # resolved names
    bad = sorted(i for i in imports
                 if any(i.split(": ")[1] == x or i.split(": ")[1].startswith(x + ".")
                        for x in FORBIDDEN))
    assert bad == []
