"""ConvRR on a BERT-base multi-resolution embedding for TPU pod slices: the authors' settings
(``default.py``) with BERT-base's last four layers as the contextual source (the hub id: each worker
downloads it) and 64 paragraphs x 4 questions per step. The contextual encoder only extracts
features (float32, forward only), so ``remat`` and ``dtype`` do not apply; the tower is small. On
CPU, ``--config.contextual_model=`` a small BERT runs the same preset."""

from mrwe_jax.configs import default

MODEL = "google-bert/bert-base-uncased"


def get_config():
    c = default.get_config()
    c.tower = "convrr"
    c.contextual_model = MODEL
    c.contextual_batch_size = 128  # windows per encoder call (one device, forward only)
    c.paragraphs_per_batch = 64
    c.questions_per_paragraph = 4
    c.log_every = 50
    return c
