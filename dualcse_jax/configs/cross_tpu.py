"""DualCSE-Cross at BERT-base scale for TPU pod slices: global batch 512, bfloat16 compute, 128
tokens. The TPU compiler puts one step at 8.0 GiB of a v4 chip's 32 GiB from 16 chips and 3.0 GiB of
a v5e chip's 16 GB from 64 (``benchmarks/tpu_plan.py``; v5p, v6e and the largest batch in
``docs/performance.md``). Batch, rate and epochs are our choice, not tuned. The README's "Pods and
Colab" gives the commands; on CPU, ``--config.model=`` a small BERT runs the same preset."""

from dualcse_jax.configs import default

MODEL = "google-bert/bert-base-uncased"  # a hub id: each worker downloads it once
BATCH = 512
CHUNK = 8  # GradCache rows per device: divides 512 / 16 = 32 and 512 / 64 = 8
REMAT = "dots"


def get_config():
    c = default.get_config()
    c.model = MODEL
    c.dtype = "bfloat16"
    c.max_length = 128
    c.pad_multiple = 64  # at most 2 x 2 compiled shapes (premises, hypotheses)
    c.batch_size = BATCH
    c.contrastive_chunk_size = CHUNK
    c.loss_chunk_size = CHUNK
    c.remat = REMAT
    c.learning_rate = 5e-5  # the paper's (at batch 64)
    c.warmup_steps = 10
    c.num_epochs = 5.0  # INLI's 8,000 premises: 16 steps an epoch at 512
    c.log_every = 10
    c.checkpoint_every = 50
    c.eval_every = 20
    c.eval_batch_size = 512
    return c
