"""CachedMultipleNegativesRankingLoss at BERT-base scale for TPU pod slices: a global batch of
512 anchors with their positives and hard negatives (every chip's rows are every anchor's
in-batch negatives), GradCache 8 rows a chip at a time, bfloat16, 128 tokens. The TPU compiler
puts one step at 1.86 GiB of a v5e chip's 14.9 GiB from 64 chips (``benchmarks/tpu_plan.py``,
``docs/sentence.md``). Batch, rate and steps are our choice, not tuned; on CPU,
``--config.model=`` a small BERT runs the same preset."""

from sentence_jax.configs import default

MODEL = "google-bert/bert-base-uncased"  # a hub id: each worker downloads it once
CHUNK = 8  # GradCache rows per device: divides 512 / 16 = 32 and 512 / 64 = 8


def get_config():
    c = default.get_config()
    c.model = MODEL
    c.loss = "CachedMultipleNegativesRankingLoss"
    c.mini_batch_size = CHUNK
    c.contrastive_chunk_size = CHUNK  # what train() sets from mini_batch_size
    c.dtype = "bfloat16"
    c.remat = "dots"
    c.max_seq_length = 128
    c.pad_multiple = 64
    c.group_padding = False  # one width for all columns: fewer shapes to compile on a pod
    c.batch_size = 512
    c.learning_rate = 5e-5
    c.warmup_steps = 10
    c.log_every = 10
    c.checkpoint_every = 200
    return c
