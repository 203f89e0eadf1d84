"""CPU-sized DocEnt-Hybrid preset for the SQuAD Wikipedia demo (2 cores).

DocEnt-Hybrid: DocEnt-Dual's objective (same softmax, pooling, scale as ``dual_cpu.py``)
plus the entity-conditioned MLM head on ``[f(s_-J)_t ; g(e)]``. The dual term sees the
clean sentence (a second encoder pass: about twice Dual's step cost). The head starts with
a 50-step head-only warm-up (MiniLM ships no MLM head; ``docs/docent.md``).
"""

from docent_jax.configs import dual_cpu


def get_config():
    c = dual_cpu.get_config()
    c.variant = "hybrid"
    c.max_predictions = 8
    c.mlm_head_init = "warmup"
    c.mlm_warmup_steps = 50
    return c
