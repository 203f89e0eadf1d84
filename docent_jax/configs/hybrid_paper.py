"""DocEnt-Hybrid at the paper's scale (see ``dual_paper.py``): Dual's in-batch objective plus the
MLM head, the dual term on the clean sentence (``hybrid_dual_input="clean"``)."""

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
