"""CPU-sized ConvRR preset for ``mrwe-jax demo`` (2 cores, minutes).

Departures from ``default.py`` (for time only): one convolution block of 128 kernels with a
projection back to d'' instead of d'' kernels in three blocks, and a fixed number of steps.
"""

from mrwe_jax.configs import default


def get_config():
    c = default.get_config()
    c.tower = "convrr"
    c.num_blocks = 1
    c.kernels = 128
    c.num_train_steps = 300
    c.log_every = 25
    c.checkpoint_every = 300
    return c
