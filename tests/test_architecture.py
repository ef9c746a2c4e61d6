"""Import rules of docs/architecture: a backend implements primitives and never imports the
model graph, the layers or the file loaders."""

from __future__ import annotations

import ast
from pathlib import Path

BACKENDS = Path(__file__).resolve().parents[1] / "fastlayers" / "backends"
FORBIDDEN = ("fastlayers.graph", "fastlayers.layers", "fastlayers.io")


def _imported_modules(path: Path):
    """The absolute names of the modules ``path`` imports (relative imports resolved)."""
    package = ".".join(path.relative_to(BACKENDS.parents[1]).with_suffix("").parts)
    if path.name == "__init__.py":
        package += ".__init__"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:-node.level] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            yield module
            yield from (f"{module}.{alias.name}" for alias in node.names)


def test_backends_never_import_graph_layers_or_io():
    files = sorted(BACKENDS.rglob("*.py"))
    assert len(files) > 10
    bad = sorted({f"{f.relative_to(BACKENDS)}: {m}" for f in files for m in _imported_modules(f)
                  if any(m == x or m.startswith(x + ".") for x in FORBIDDEN)})
    assert bad == []
