"""The one exception type for bad input data (it names the file, the line and the field),
the storage errors whose message is the whole report, and the one check of the texts given
to ``encode``."""

from __future__ import annotations

import os
from collections.abc import Sequence


class DataError(ValueError):
    """Bad input data, located as precisely as the reader can.

    Attributes:
      path: the file, as given to the reader (str).
      line: 1-based physical line number, as a text editor shows it; None when the fault is
        not on one line (for example a file with no rows).
      field: the column name (or, in a header, a description of the column); None when the
        fault is not in one field (for example a row with the wrong number of fields).
      reason: what is wrong, in words.

    The message is ``"{path}:{line}: field '{field}': {reason}"``; the ``:{line}`` and the
    ``field '...'`` parts are left out when they are None, so editors and terminals can still
    jump to ``path:line``.
    """

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


class StorageError(OSError):
    """A path that does not exist, a ``gs://`` endpoint a run cannot use, or a write that
    failed: the message is one line (the path, the storage error, what to do) and the CLIs
    print only it."""


class MissingPathError(StorageError, FileNotFoundError):
    """A config field names a file or folder that does not exist:
    ``config.FIELD: PATH does not exist``."""


def check_texts(texts: Sequence[str]) -> list[str]:
    """The texts as a list, checked the same way for every model.

    Raises:
      TypeError: a single string instead of a list, or a non-string item.
      ValueError: an empty or whitespace-only text (its index is given).
    """
    if isinstance(texts, (str, bytes)):
        raise TypeError("encode takes a list of texts, not a single string: encode([text])")
    texts = list(texts)
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise TypeError(f"text {i} is a {type(text).__name__}, not a str")
        if not text.strip():
            raise ValueError(f"text {i} is empty or whitespace only: {text!r}")
    return texts
