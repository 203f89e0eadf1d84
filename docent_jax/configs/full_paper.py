"""DocEnt-Full at the paper's scale (BERT-base, Amazon reviews); see ``dual_paper.py`` for
the data, the model folder to pass and the example command (``--config=...full_paper.py``).

The input is ``[CLS] <entity> [SEP] sentence [SEP]`` (128 tokens in all), BERT's masking of
word pieces (15%, at most 20 predictions a sequence, 80/10/10) and of the entity token;
``L_MLM + lambda * L_E`` with lambda = 1. The entity rows (81,057, hidden width) and their
softmax are split over the ``model`` mesh axis, as DocEnt-Dual's table.
"""

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
