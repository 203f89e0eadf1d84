"""Supervised SimCSE baseline (Gao et al. 2021) trained by the same loop: ``train_data`` snli
(shipped triplets) or inli, or ``train_file`` rows ``anchor, positive[, hard_negative]``
(docs/data.md)."""

from dualcse_jax.configs import default


def get_config():
    c = default.get_config()
    c.architecture = "simcse"
    c.pooling = "cls_mlp"
    c.train_data = "snli"
    c.batch_size = 64
    c.learning_rate = 5e-5
    return c
