"""``PROG config``: every field of a ``--config`` file with its value and its comment.

The presets document their fields with trailing comments (``c.pooling = "cls"  # cls |
cls_mlp | mean``), in the preset itself, in its package's ``configs/default.py`` and in
``embedding_core.configs.base()``. This module reads those comments from the source, so the
listing never drifts from the files (``docs/architecture.md``, "Configs").
"""

from __future__ import annotations

import ast
import importlib.util
import io
import os
import tokenize
from collections.abc import Iterator

import ml_collections

# Only modules of config presets are followed from a config file's imports: their
# assignments are the fields; other modules' attribute assignments are not.
_CONFIG_PACKAGES = ("configs", "config")


def _module_file(name: str) -> str | None:
    """The source file of module ``name`` when it is a config module, else None."""
    if not any(part in _CONFIG_PACKAGES for part in name.split(".")):
        return None
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return None
    return spec.origin


def _imported_files(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            # `from pkg import mod` names a module or an attribute of pkg: try both.
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            path = _module_file(name)
            if path is not None:
                yield path


def _continuation(line: str) -> str | None:
    """The text of a comment-only line that continues the comment above it (``#`` then
    two or more spaces, aligned under that comment), else None."""
    stripped = line.strip()
    if stripped.startswith("#  "):
        return stripped[1:].strip()
    return None


def field_comments(source: str) -> list[tuple[str, str]]:
    """``(field, comment)`` of each ``NAME.FIELD = value  # comment`` in ``source``, in
    source order (comment ``""`` when there is none).

    A comment continues on the following comment-only lines that start with ``#`` and two
    or more spaces (the presets align them under the first line).

    Raises:
      SyntaxError: ``source`` is not Python.
    """
    tree = ast.parse(source)
    comments: dict[int, str] = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string[1:].strip()
    lines = source.splitlines()
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)):
            continue
        end = node.end_lineno or node.lineno
        parts = [comments[end]] if end in comments else []
        row = end  # 1-based line of the statement's end; lines[row] is the next line
        while parts and row < len(lines) and (more := _continuation(lines[row])) is not None:
            parts.append(more)
            row += 1
        found.append((node.lineno, target.attr, " ".join(parts)))
    return [(name, text) for _, name, text in sorted(found)]


def _config_files(path: str) -> list[str]:
    """``path`` and the config modules it imports, transitively, nearest first."""
    order: list[str] = []
    pending = [os.path.abspath(path)]
    while pending:
        current = pending.pop(0)
        if current in order:
            continue
        order.append(current)
        with open(current, encoding="utf-8") as f:
            pending.extend(os.path.abspath(p) for p in _imported_files(ast.parse(f.read())))
    return order


def describe(config: ml_collections.ConfigDict, config_file: str | os.PathLike) -> str:
    """One line per field of ``config``: ``field = value  # comment``.

    Args:
      config: the config as the command line made it (``--config.FIELD`` overrides
        applied: the values shown are the ones a run would use).
      config_file: the preset it came from; its comments, then those of the config
        modules it imports (``configs/default.py``, ``embedding_core/configs.py``),
        explain the fields.

    Returns:
      A header naming the file, then the fields in the order the files define them
      (shared fields first), each with the nearest file's comment.

    Raises:
      OSError: ``config_file`` cannot be read. SyntaxError: it is not Python.
    """
    files = _config_files(os.fspath(config_file))
    per_file = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            per_file.append(field_comments(f.read()))
    comment: dict[str, str] = {}
    for entries in per_file:  # nearest file first: its comment wins
        for name, text in entries:
            if text and name not in comment:
                comment[name] = text
    order: list[str] = []
    for entries in reversed(per_file):  # base() first, then the model's, then the preset's
        order += [name for name, _ in entries if name in config and name not in order]
    order += sorted(name for name in config.keys() if name not in order)
    rows = [(f"{name} = {config[name]!r}", comment.get(name, "")) for name in order]
    # Comments start in one column; a long value (logical_axis_rules) just pushes its own.
    width = max((len(left) for left, _ in rows if len(left) <= 40), default=0)
    lines = [f"# {os.fspath(config_file)}: override any field with --config.FIELD=VALUE"]
    lines += [f"{left:<{width}}  # {text}" if text else left for left, text in rows]
    return "\n".join(lines)
