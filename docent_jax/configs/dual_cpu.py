"""DocEnt-Dual on the shipped SQuAD corpus, CPU-sized (2 cores, a few minutes): full-vocabulary
softmax, mean pooling (measured: ``docs/docent.md``, "CPU presets")."""

from docent_jax.configs import default


def get_config():
    c = default.get_config()
    c.softmax = "full_vocab"
    c.pooling = "mean"
    c.dropout_impl = "hash"  # cheaper CPU step: no random-bit generation (benchmarks/)
    c.max_length = 48
    c.pad_multiple = 16
    c.batch_size = 32
    c.num_train_steps = 300
    c.warmup_steps = 30
    c.log_every = 25
    c.checkpoint_every = 100
    # heldout_MAP, ... on 500 evenly spaced held-out queries (`evaluate` ranks all 2,105).
    c.eval_every = 50
    c.eval_examples = 500
    return c
