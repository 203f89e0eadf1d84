"""DualCSE-Bi at BERT-base scale for TPU pod slices: ``cross_tpu.py``'s settings with two encoders
and the paper's bi-encoder rate (3e-5); the same memory cases hold it."""

from dualcse_jax.configs import cross_tpu


def get_config():
    c = cross_tpu.get_config()
    c.architecture = "bi"
    c.learning_rate = 3e-5
    return c
