"""DocEnt-Hybrid on the shipped SQuAD corpus, CPU-sized: ``dual_cpu.py`` plus the MLM head."""

from docent_jax.configs import dual_cpu


def get_config():
    c = dual_cpu.get_config()
    c.variant = "hybrid"
    c.max_predictions = 8
    c.mlm_head_init = "warmup"
    c.mlm_warmup_steps = 50
    return c
