"""DocEnt-Full at the paper's scale (``dual_paper.py``'s data): 81,057 entity rows over
``model``."""

from docent_jax.configs import dual_paper


def get_config():
    c = dual_paper.get_config()
    c.variant = "full"
    c.word_mask_rate = 0.15
    c.entity_mask_rate = 0.15  # the paper's footnote 5: a hyperparameter
    c.max_predictions = 20  # BERT's max_predictions_per_seq for 128 tokens
    c.entity_loss_weight = 1.0
    c.batch_size = 512
    c.mlm_head_init = "random"  # the loader reads the encoder only: the MLM head is fresh
    return c
