"""Supervised SimCSE at BERT-base scale for TPU pod slices: ``cross_tpu.py``'s settings on the
shipped SNLI triplets with SimCSE's head (``simcse.py``)."""

from dualcse_jax.configs import cross_tpu, simcse


def get_config():
    c = cross_tpu.get_config()
    base = simcse.get_config()
    c.architecture, c.pooling, c.train_data = base.architecture, base.pooling, base.train_data
    return c
