"""TensorFlow for tf.data and TFDS, imported here only: a missing install is one line.

TensorFlow is not a base dependency, so that an existing ``tensorflow`` (Colab) is used
instead of a second one; the ``cpu``/``tpu``/``cuda12``/``cuda13`` extras add
``tensorflow-cpu`` (README, "Install"). It never sees a GPU: that memory is JAX's.

Raises:
  ModuleNotFoundError: no ``tensorflow`` module, with the install command.
"""

from __future__ import annotations

MISSING = ("TensorFlow is not installed; the data pipeline (tf.data, TFDS) needs it: install "
           "this project with an extra (pip install -e 'PROJECT_FOLDER[cpu]', or [tpu], "
           "[cuda12], [cuda13]), or pip install 'tensorflow>=2.20,<2.24'")

try:
    import tensorflow as tf
except ModuleNotFoundError as error:
    if error.name != "tensorflow":  # installed but broken: TensorFlow's own error says why
        raise
    raise ModuleNotFoundError(MISSING, name="tensorflow") from None

try:
    tf.config.set_visible_devices([], "GPU")
except (RuntimeError, ValueError):
    pass  # devices already initialised by an earlier import; nothing more can be done here

__all__ = ["MISSING", "tf"]
