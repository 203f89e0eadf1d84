"""ConvRR on a BERT-base multi-resolution embedding for TPU pod slices: BERT-base's last four
layers (hub id) as the contextual source, 64 paragraphs x 4 questions per step."""

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
