"""DocEnt-Hybrid at BERT-base scale for TPU pod slices: ``hybrid_paper.py`` with the BERT-base
hub id and per-layer rematerialisation (Hybrid's two passes cannot be chunked; ``dual_tpu.py`` says
what to pass)."""

from docent_jax.configs import dual_tpu, hybrid_paper


def get_config():
    c = hybrid_paper.get_config()
    c.model = dual_tpu.MODEL
    c.remat = "dots"
    return c
