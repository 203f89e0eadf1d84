"""``DataError`` (bad input data: file, line, field), the one-line storage errors, and the
one check of the texts given to ``encode``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence


class DataError(ValueError):
    """``"{path}:{line}: field '{field}': {reason}"`` (1-based physical line; parts that are
    None left out), so editors jump to ``path:line``."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        line: int | None,
        field: str | None,
        reason: str,
    ) -> None:
        self.path = str(path)
        self.line = line
        self.field = field
        self.reason = reason
        where = self.path if line is None else f"{self.path}:{line}"
        what = reason if field is None else f"field '{field}': {reason}"
        super().__init__(f"{where}: {what}")

    def __reduce__(self):
        # Keep the attributes when the error crosses a process boundary (multiprocessing).
        return (type(self), (self.path, self.line, self.field, self.reason))


def json_object(path: str | os.PathLike[str], line: int, text: str, *,
                invalid: str = "invalid JSON: {msg}",
                not_object: str = "a JSON {type}, not an object") -> dict:
    """``text`` as a JSON object. Raises DataError: ``invalid`` (with the parser's ``msg``,
    ``colno``) or ``not_object`` (with the value's ``type``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise DataError(path, line, None, invalid.format(msg=err.msg, colno=err.colno)) from None
    if not isinstance(value, dict):
        raise DataError(path, line, None, not_object.format(type=type(value).__name__))
    return value


class StorageError(OSError):
    """A missing path, an unusable ``gs://`` endpoint or a failed write: one line, which the
    CLIs print alone."""


class MissingPathError(StorageError, FileNotFoundError):
    """``config.FIELD: PATH does not exist``."""


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list. Raises TypeError: a single string, a non-string item;
    ValueError: an empty or whitespace-only text (its index given)."""
    if isinstance(texts, (str, bytes)):
        raise TypeError("encode takes a list of texts, not a single string: encode([text])")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"text {i} is a {type(text).__name__}, not a str")
        if not text.strip():
            raise ValueError(f"text {i} is empty or whitespace only: {text!r}")
    return texts
