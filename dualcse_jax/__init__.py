"""DualCSE: two sentence embeddings, explicit (r) and implicit (u), in one space.

Python API (nothing parses flags at import; TensorFlow never takes an accelerator)::

    import dualcse_jax
    from dualcse_jax.configs import cross_cpu
    dualcse_jax.train(cross_cpu.get_config(), "workdirs/run1")
    r, u = dualcse_jax.load("workdirs/run1").encode(["A sentence."])
"""

from __future__ import annotations


def train(config, workdir, **kwargs):
    """See ``dualcse_jax.trainer.train``."""
    from dualcse_jax.trainer import train as _train

    return _train(config, workdir, **kwargs)


def load(workdir, **kwargs):
    """See ``dualcse_jax.inference.load``: an object with ``encode(list_of_str) -> (r, u)``."""
    from dualcse_jax.inference import load as _load

    return _load(workdir, **kwargs)


__all__ = ["train", "load"]
