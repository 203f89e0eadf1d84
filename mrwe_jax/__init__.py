"""Multi-resolution word embeddings with ConvRR / FCRR retrieval (``docs/mrwe.md``)::

    mrwe_jax.train(mrwe_jax.configs.convrr_cpu.get_config(), "workdirs/convrr")
    vectors = mrwe_jax.load("workdirs/convrr").encode(["Who founded the NFL?"],
                                                      side="question", normalize=True)
"""

from __future__ import annotations


def train(config, workdir, **kwargs):
    """See ``mrwe_jax.trainer.train``."""
    from mrwe_jax.trainer import train as _train

    return _train(config, workdir, **kwargs)


def load(workdir, **kwargs):
    """See ``mrwe_jax.inference.load``: a ``Retriever`` (``encode(texts, side=...)``)."""
    from mrwe_jax.inference import load as _load

    return _load(workdir, **kwargs)



def config_fields():
    """The run config's field names (``embedding_core.serving.workdirs`` tells workdirs apart)."""
    from mrwe_jax.configs.default import FIELDS

    return list(FIELDS)


__all__ = ["train", "load"]
