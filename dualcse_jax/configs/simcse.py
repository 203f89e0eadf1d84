"""Supervised SimCSE baseline (Gao et al. 2021) by the same loop, on ``train_data`` or
``train_file``."""

from dualcse_jax.configs import default


def get_config():
    c = default.get_config()
    c.architecture = "simcse"
    c.pooling = "cls_mlp"
    c.train_data = "snli"
    c.batch_size = 64
    c.learning_rate = 5e-5
    return c
