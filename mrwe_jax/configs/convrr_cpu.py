"""CPU-sized ConvRR preset for ``mrwe-jax demo`` (2 cores, minutes; ``docs/mrwe.md``, presets)."""

from mrwe_jax.configs import default


def get_config():
    c = default.get_config()
    c.tower = "convrr"
    c.num_blocks = 1
    c.kernels = 128
    c.learning_rate = 1e-4
    c.num_train_steps = 300
    c.log_every = 25
    c.checkpoint_every = 300
    # all_recall@k over every paragraph (config.eval_pool) at steps 100, 200, 300 (curves
    # in plots/training.png).
    c.eval_every = 100
    return c
