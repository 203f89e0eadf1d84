"""CPU-sized ConvRR preset for ``mrwe-jax demo`` (2 cores, minutes).

Departures from ``default.py``: one convolution block of 128 kernels with a projection back
to d'' instead of d'' kernels in three blocks, 300 steps (about 3 epochs of the training
paragraphs of SQuAD dev), and learning rate 1e-4 instead of the authors' 1e-3 (chosen on a
validation split of the *training* articles: with 1e-3 ConvRR fell below its input
embedding there, with 1e-4 it gained about 5 points of recall@1).
"""

from mrwe_jax.configs import default


def get_config():
    c = default.get_config()
    c.tower = "convrr"
    c.num_blocks = 1
    c.kernels = 128
    c.learning_rate = 1e-4
    c.num_train_steps = 300
    c.log_every = 25
    c.checkpoint_every = 300
    # all_recall@k over every paragraph (config.eval_pool) at steps 100, 200, 300 (curves
    # in plots/training.png).
    c.eval_every = 100
    return c
