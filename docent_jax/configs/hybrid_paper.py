"""DocEnt-Hybrid at the paper's scale (BERT-base, Amazon reviews); see ``dual_paper.py`` for
the data, the model folder to pass and the example command (``--config=...hybrid_paper.py``).

DocEnt-Dual's in-batch objective plus the MLM head on ``[f(s_-J)_t ; g(e)]``; the dual term
encodes the clean sentence in a second pass (``hybrid_dual_input="clean"``).
"""

from docent_jax.configs import dual_paper


def get_config():
    c = dual_paper.get_config()
    c.variant = "hybrid"
    c.word_mask_rate = 0.15
    c.max_predictions = 20
    c.mlm_loss_weight = 1.0
    c.hybrid_dual_input = "clean"
    c.batch_size = 512
    return c
