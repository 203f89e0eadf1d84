"""The core imports of a file that bypass its public surface (``embedding_core/__init__.py``):
a submodule imported, or a name not on ``embedding_core.__all__``."""

from __future__ import annotations

import ast
from pathlib import Path


def outside_surface(path: Path) -> list[str]:
    """``"FILE: what"`` for each core import of ``path`` not through the surface."""
    import embedding_core

    bad = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            bad += [f"{path.name}: import {a.name}" for a in node.names
                    if a.name.startswith("embedding_core.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "embedding_core"):
            if node.module != "embedding_core":
                bad.append(f"{path.name}: from {node.module}")
            else:
                bad += [f"{path.name}: {a.name} is not on the surface" for a in node.names
                        if a.name not in embedding_core.__all__]
    return bad
