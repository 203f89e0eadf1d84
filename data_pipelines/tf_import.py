"""TensorFlow for tf.data and TFDS, imported here only, GPUs hidden and start-up notices muted
(``docs/install.md``, "TensorFlow and the extras"). ModuleNotFoundError: none installed, with the
install command; two distributions: one warning line."""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence

MISSING = ("TensorFlow is not installed; the data pipeline (tf.data, TFDS) needs it: install "
           "this project with an extra (pip install -e 'PROJECT_FOLDER[cpu]', or [tpu], "
           "[cuda12], [cuda13]), or pip install 'tensorflow>=2.20,<2.24'")

# Each installs the same ``tensorflow`` package folder.
DISTRIBUTIONS = ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly",
                 "tf-nightly-cpu")

# TF 2.21 prints these through absl before its logging starts: TF_CPP_MIN_LOG_LEVEL does
# not reach them, and each of its two libraries prints its own copy.
_NOTICES = re.compile(r"All log messages before absl::InitializeLog\(\) is called"
                      r"|port\.cc:\d+\] oneDNN custom operations are on"
                      r"|cpu_feature_guard\.cc:\d+\] This TensorFlow binary is optimized"
                      r"|^To enable the following instructions: .* rebuild TensorFlow")


def installed(path: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """``(name, version)`` of each TensorFlow distribution on ``path`` (default ``sys.path``)."""
    where = {} if path is None else {"path": list(path)}
    found = []
    for name in DISTRIBUTIONS:
        for dist in importlib.metadata.distributions(name=name, **where):
            found.append((name, dist.version))
            break
    return found


def duplicate_warning(found: Sequence[tuple[str, str]]) -> str | None:
    """One line naming two TensorFlows and the commands that keep one, or None."""
    if len(found) < 2:
        return None
    keep_name, keep_version = next(((n, v) for n, v in found if n == "tensorflow"), found[0])
    drop = " ".join(n for n, _ in found if n != keep_name)
    listed = " and ".join(f"{n} {v}" for n, v in found)
    # The uninstall deletes the package folder they share, hence the reinstall after it.
    return (f"warning: two TensorFlows are installed, {listed}, over the same tensorflow/ "
            f"folder; keep one: pip uninstall -y {drop} && pip install --force-reinstall "
            f"--no-deps {keep_name}=={keep_version}")


@contextlib.contextmanager
def _without_notices() -> Iterator[None]:
    """fd 2 to a file while TensorFlow loads, then back to stderr without its notices."""
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL") == "0":
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no file descriptor 2 to borrow
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode("utf-8", "replace")
            kept = [line for line in text.splitlines(keepends=True)
                    if not _NOTICES.search(line)]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()


_duplicate = duplicate_warning(installed())
if _duplicate:
    print(_duplicate, file=sys.stderr)

try:
    with _without_notices():
        import tensorflow as tf
except ModuleNotFoundError as error:
    if error.name != "tensorflow":  # installed but broken: TensorFlow's own error says why
        raise
    raise ModuleNotFoundError(MISSING, name="tensorflow") from None

try:
    tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):
    pass  # devices already initialised by an earlier import; nothing more can be done here

__all__ = ["DISTRIBUTIONS", "MISSING", "duplicate_warning", "installed", "tf"]
