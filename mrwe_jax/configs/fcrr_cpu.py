"""CPU-sized FCRR preset (arXiv 1810.10176; authors' logged run: 2 residual blocks, sf 0.05,
margin 1.0, lr 1e-3, weight decay 1e-3) for ``mrwe-jax demo``."""

from mrwe_jax.configs import default


def get_config():
    c = default.get_config()
    c.tower = "fcrr"
    c.num_blocks = 2
    c.fcrr_hidden = 1024
    c.num_train_steps = 300
    c.log_every = 25
    c.checkpoint_every = 300
    return c
