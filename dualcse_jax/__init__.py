"""DualCSE: two sentence embeddings, explicit (r) and implicit (u), in one space
(``docs/dualcse.md``)::

    import dualcse_jax
    from dualcse_jax.configs import cross_cpu
    dualcse_jax.train(cross_cpu.get_config(), "workdirs/run1")
    model = dualcse_jax.load("workdirs/run1")
    r = model.encode(["A sentence."], kind="explicit")  # float32 [1, dim]; kind="implicit": u
"""

from __future__ import annotations


def train(config, workdir, **kwargs):
    """See :func:`dualcse_jax.trainer.train`."""
    from dualcse_jax.trainer import train as _train

    return _train(config, workdir, **kwargs)


def load(workdir, **kwargs):
    """See :func:`dualcse_jax.inference.load`."""
    from dualcse_jax.inference import load as _load

    return _load(workdir, **kwargs)



def config_fields():
    """The run config's field names (``embedding_core.serving.workdirs`` tells workdirs apart)."""
    from dualcse_jax.configs.default import FIELDS

    return list(FIELDS)


__all__ = ["train", "load"]
