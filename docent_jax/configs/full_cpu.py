"""DocEnt-Full on the shipped SQuAD corpus, CPU-sized (about 6 minutes); the settings tried:
``docs/docent.md``, "CPU presets"."""

from docent_jax.configs import dual_cpu


def get_config():
    c = dual_cpu.get_config()
    c.variant = "full"
    c.softmax = "in_batch"  # unused by Full (its entity softmax is over the union vocabulary)
    c.learning_rate = 2e-4
    c.entity_mask_rate = 0.5
    c.max_predictions = 8
    c.mlm_head_init = "warmup"
    c.mlm_warmup_steps = 50
    return c
