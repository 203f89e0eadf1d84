"""CPU-sized FCRR preset (``docs/mrwe.md``) for ``mrwe-jax demo``.

The authors' logged run: 2 residual blocks, sf 0.05, margin 1.0, weight decay 1e-3, kept;
learning rate 1e-4 instead of 1e-3 (chosen on a validation split of the *training* articles,
as for ``convrr_cpu.py``), 300 steps.
"""

from mrwe_jax.configs import default


def get_config():
    c = default.get_config()
    c.tower = "fcrr"
    c.num_blocks = 2
    c.fcrr_hidden = 1024
    c.learning_rate = 1e-4
    c.num_train_steps = 300
    c.log_every = 25
    c.checkpoint_every = 300
    # all_recall@k over every paragraph (config.eval_pool) at steps 100, 200, 300 (curves
    # in plots/training.png).
    c.eval_every = 100
    return c
