"""DocEnt-Full at BERT-base scale for TPU pod slices: ``full_paper.py`` with the BERT-base hub id
and per-layer rematerialisation (``dual_tpu.py`` says what to pass)."""

from docent_jax.configs import dual_tpu, full_paper


def get_config():
    c = full_paper.get_config()
    c.model = dual_tpu.MODEL
    c.remat = "dots"
    return c
