"""CPU-sized DocEnt-Dual preset for the SQuAD Wikipedia demo (2 cores, a few minutes)."""

from docent_jax.configs import default


def get_config():
    c = default.get_config()
    c.max_length = 48
    c.pad_multiple = 16
    c.batch_size = 32
    c.num_train_steps = 300
    c.warmup_steps = 30
    c.log_every = 25
    c.checkpoint_every = 100
    return c
