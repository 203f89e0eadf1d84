"""Records with named fields from a user's CSV or JSON Lines file, checked strictly
(``docs/data.md``, "Your own data"); faults raise ``DataError`` (file, line, field)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from typing import Any

from etils import epath

from data_pipelines.csv_reader import LINE_KEY, read_csv_records
from data_pipelines.errors import DataError

FORMATS = ("csv", "jsonl")
_NAMES = {"csv": "CSV", "jsonl": "JSON Lines"}
_EXTENSIONS = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}
_BOM = b"\xef\xbb\xbf"


def detect_format(path: str | os.PathLike[str], head: bytes) -> str:
    """``"csv"`` or ``"jsonl"``: by extension, else by the first non-blank byte (``{``)."""
    suffix = epath.Path(path).suffix.lower()
    if suffix in _EXTENSIONS:
        return _EXTENSIONS[suffix]
    return "jsonl" if head.removeprefix(_BOM).lstrip()[:1] == b"{" else "csv"


def _json_type(value: Any) -> str:
    """The JSON kind of a value with its article: "a string", "an array"."""
    if isinstance(value, bool):
        return "a boolean"
    names = {str: "a string", int: "a number", float: "a number", list: "an array",
             dict: "an object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


class _DuplicateKey(Exception):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _jsonl_objects(data: bytes, where: str):
    """Yields ``(line, object)`` for each non-blank line of a JSON Lines file."""
    for lineno, raw in enumerate(data.removeprefix(_BOM).split(b"\n"), start=1):
        raw = raw.removesuffix(b"\r")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            column = len(raw[: err.start].decode("utf-8")) + 1
            bad = raw[err.start : err.end].hex(" ")
            raise DataError(where, lineno, None, f"invalid UTF-8 (byte(s) {bad} at character "
                            f"{column}): {err.reason}") from None
        if not text.strip():
            continue
        try:
            # strict=False lets a raw tab inside a string through (hand-edited files);
            # a NUL, raw or escaped, is refused below with its field.
            obj = json.loads(text, strict=False, object_pairs_hook=_no_duplicates)
        except _DuplicateKey as err:
            raise DataError(where, lineno, str(err.args[0]),
                            "key appears twice in this object") from None
        except json.JSONDecodeError as err:
            nul = " (the line holds a NUL byte)" if "\x00" in text else ""
            raise DataError(where, lineno, None, f"invalid JSON at character {err.colno}: "
                            f"{err.msg}{nul}; each line must be one JSON object") from None
        if not isinstance(obj, dict):
            raise DataError(where, lineno, None, f"expected one JSON object {{...}} per line "
                            f"(JSON Lines), got {_json_type(obj)}")
        yield lineno, obj


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value: str) -> str | None:
    """Why ``value`` cannot be text (a lone UTF-16 surrogate such as ``\\ud800``), or None."""
    match = _SURROGATE.search(value)
    if match is None:
        return None
    return (f"holds a lone surrogate \\u{ord(match.group()):04x} at character "
            f"{match.start() + 1} (half of a UTF-16 pair, not a character); write the "
            "character itself, or both halves of its \\ud8xx\\udcxx escape")


def _check_text(where: str, line: int, field: str, value: str) -> None:
    if "\x00" in value:
        raise DataError(where, line, field, "holds a NUL character (\\x00 or \\u0000); "
                        "remove it, a tokenizer would drop it silently")
    surrogate = lone_surrogate(value)
    if surrogate:
        raise DataError(where, line, field, surrogate)


def _field_value(where: str, line: int, field: str, value: Any, *, required: bool,
                 is_list: bool) -> str | list[str] | None:
    if value is None or (isinstance(value, str) and not value.strip() and not required):
        if required:
            raise DataError(where, line, field, "is null; a "
                            f"{'list of strings' if is_list else 'string'} is needed")
        return None
    if is_list:
        if not isinstance(value, list):
            raise DataError(where, line, field, f"expected a JSON array of strings, got "
                            f"{_json_type(value)}")
        if not value:
            raise DataError(where, line, field, "empty list")
        for i, item in enumerate(value):
            _string(where, line, f"{field}[{i}]", item, hint=False)
        return list(value)
    return _string(where, line, field, value, hint=True)


def _string(where: str, line: int, field: str, value: Any, *, hint: bool) -> str:
    if not isinstance(value, str):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        tip = f' (write it as a string: "{value}")' if hint and number else ""
        raise DataError(where, line, field, f"expected a string, got {_json_type(value)}{tip}")
    if not value.strip():
        raise DataError(where, line, field, "empty or whitespace-only value")
    _check_text(where, line, field, value)
    return value


def read_records(path: str | os.PathLike[str], required: Sequence[str],
                 optional: Sequence[str] = (), *, list_fields: Sequence[str] = (),
                 file_format: str = "auto", formats: Sequence[str] = FORMATS,
                 min_records: int = 1) -> list[dict[str, Any]]:
    """One dict per record (field -> str, list or None; ``"_line"``); ``required`` / ``optional`` /
    ``list_fields``, ``file_format`` csv | jsonl | auto. FileNotFoundError; ValueError: a bad
    list field or format; DataError: the file, a line, a field or the record count (named)."""
    fields = [*required, *optional]
    if not set(list_fields) <= set(fields):
        raise ValueError(f"list_fields {sorted(set(list_fields) - set(fields))} are not "
                         f"among the fields {fields}")
    for name in (file_format, *formats):
        if name not in (*FORMATS, "auto"):
            raise ValueError(f"unknown format {name!r}; use one of {FORMATS}")
    where = str(path)
    path = epath.Path(path)
    if path.is_dir():  # open() would say "[Errno 21] Is a directory" without the name
        raise DataError(where, None, None, "a folder, not a file; give one "
                        f"{' or '.join(_NAMES[f] for f in formats)} file")
    kind = file_format
    if kind == "auto":
        kind = _EXTENSIONS.get(path.suffix.lower())
        if kind is None:
            with path.open("rb") as f:
                kind = detect_format(path, f.read(4096))
    if kind not in formats:
        raise DataError(where, None, None, f"read as {_NAMES[kind]} (by its name or first "
                        f"character); this file must be "
                        f"{' or '.join(_NAMES[f] for f in formats)}")
    if kind == "csv" and list_fields:
        raise DataError(where, None, None, f"fields {list(list_fields)} hold lists: write "
                        "the file as JSON Lines, one object a line")
    if kind == "csv":
        # The CSV reader checks the header, quoting and the required values.
        rows = read_csv_records(path, list(required), min_records=0)
        objects = ((row[LINE_KEY], row) for row in rows)
    else:
        objects = _jsonl_objects(path.read_bytes(), where)
    records: list[dict[str, Any]] = []
    is_required, lists = set(required), set(list_fields)
    for line, obj in objects:
        record: dict[str, Any] = {}
        for name in fields:
            if name not in obj:
                if name in is_required:
                    raise DataError(where, line, name, f"missing (the record has "
                                    f"{sorted(k for k in obj if k != LINE_KEY)})")
                record[name] = None
                continue
            record[name] = _field_value(where, line, name, obj[name],
                                        required=name in is_required, is_list=name in lists)
        record[LINE_KEY] = line
        records.append(record)
    if len(records) < min_records:
        raise DataError(where, None, None, f"{len(records)} records; at least {min_records} "
                        "needed")
    return records
