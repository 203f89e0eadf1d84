"""CPU-sized FCRR preset for ``mrwe-jax demo``: the authors' logged FCRR at lr 1e-4."""

from mrwe_jax.configs import convrr_cpu, default


def get_config():
    c = convrr_cpu.get_config()  # its schedule: lr 1e-4, 300 steps, evaluation every 100
    c.tower, c.num_blocks, c.fcrr_hidden = "fcrr", 2, 1024
    c.kernels = default.get_config().kernels
    return c
