"""DocEnt-Hybrid on the shipped SQuAD corpus, CPU-sized: ``dual_cpu.py`` plus the
entity-conditioned MLM head on ``[f(s_-J)_t ; g(e)]`` (about twice Dual's step: the dual term
encodes the clean sentence again), with a 50-step head-only warm-up."""

from docent_jax.configs import dual_cpu


def get_config():
    c = dual_cpu.get_config()
    c.variant = "hybrid"
    c.max_predictions = 8
    c.mlm_head_init = "warmup"
    c.mlm_warmup_steps = 50
    return c
