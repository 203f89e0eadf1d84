"""DocEnt-Dual at BERT-base scale for TPU pod slices: ``dual_paper.py`` (Amazon reviews, global
batch 1,024 sentences of 128 tokens, bfloat16) with the BERT-base hub id (each worker downloads it)
and the memory settings of ``dualcse_jax/configs/cross_tpu.py``: the TPU compiler puts one step at
7.2 GiB of a v4 chip's 32 GiB from 16 chips and 3.3 GiB of a v5e chip's 16 GB from 64
(``benchmarks/tpu_plan.py``, ``docs/performance.md``). Pass your review files as in
``dual_paper.py``; on CPU, ``--config.model=`` a small BERT and ``--config.train_file=`` run the
same preset."""

from docent_jax.configs import dual_paper

MODEL = "google-bert/bert-base-uncased"


def get_config():
    c = dual_paper.get_config()
    c.model = MODEL
    c.remat = "dots"
    c.contrastive_chunk_size = 16  # GradCache rows per device: divides 1024 / 64
    return c
