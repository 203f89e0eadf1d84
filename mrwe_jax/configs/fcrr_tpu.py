"""FCRR on the BERT-base multi-resolution embedding for TPU pod slices: ``convrr_tpu.py`` with
the FCRR tower of the authors' logged run (2 residual blocks, 1,024 wide)."""

from mrwe_jax.configs import convrr_tpu


def get_config():
    c = convrr_tpu.get_config()
    c.tower = "fcrr"
    c.num_blocks = 2
    c.fcrr_hidden = 1024
    return c
