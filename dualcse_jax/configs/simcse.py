"""Supervised SimCSE baseline (Gao et al. 2021) trained by the same loop.

``--config.train_data=snli`` trains on the shipped SNLI triplets, ``inli`` on INLI
(premise, each entailment as a positive, the contradiction as hard negative);
``--config.train_file=FILE`` on your own ``anchor, positive[, hard_negative]`` CSV or JSON
Lines file (docs/data.md).
"""

from dualcse_jax.configs import default


def get_config():
    c = default.get_config()
    c.architecture = "simcse"
    c.pooling = "cls_mlp"
    c.train_data = "snli"
    c.batch_size = 64
    c.learning_rate = 5e-5
    return c
