"""DocEnt: entity representations learned from the documents about each entity
(``docs/docent.md``). Nothing parses flags at import; TensorFlow never takes an accelerator::

    import docent_jax
    from docent_jax.configs import dual_cpu
    docent_jax.train(dual_cpu.get_config(), "workdirs/docent")
    ranker = docent_jax.load("workdirs/docent")     # an embedding_core.serving.inference.Encoder
    g = ranker.entity_embeddings()                  # [num_entities, dim] float32
    q = ranker.encode(["Who won Super Bowl 50?"])   # [1, dim] float32, f(q)
"""

from __future__ import annotations


def train(config, workdir, **kwargs):
    """See ``docent_jax.trainer.train``."""
    from docent_jax.trainer import train as _train

    return _train(config, workdir, **kwargs)


def load(workdir, **kwargs):
    """See ``docent_jax.inference.load``: an ``EntityRanker``."""
    from docent_jax.inference import load as _load

    return _load(workdir, **kwargs)


def config_fields():
    """The run config's field names (``embedding_core.serving.workdirs`` tells workdirs apart)."""
    from docent_jax.configs.default import FIELDS

    return list(FIELDS)


__all__ = ["train", "load"]
