"""DualCSE-Bi with the paper's hyper-parameters (batch 32, lr 3e-5)."""

from dualcse_jax.configs import default


def get_config():
    c = default.get_config()
    c.architecture = "bi"
    c.batch_size = 32
    c.learning_rate = 3e-5
    return c
