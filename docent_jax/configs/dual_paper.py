"""DocEnt-Dual at the paper's scale, BERT-base on Amazon reviews for pod slices (command:
``docs/docent.md``, "Paper-scale presets")."""

from docent_jax.configs import default


def get_config():
    c = default.get_config()
    c.model = "bert-base-uncased"  # a local folder: the hub name only says what to pass
    c.variant = "dual"
    c.pooling = "cls"  # the paper's f_CLS
    c.train_data = "amazon"
    c.max_length = 128  # tokens per sentence
    c.pad_multiple = 128  # one compiled shape on TPU
    c.batch_size = 1024  # global sentences per step (in-batch negatives)
    c.table_multiple = 1024  # 81,057 movies -> 81,920 rows: any model-axis size <= 1024
    c.softmax = "in_batch"
    c.vocab_block_size = 8192  # entity rows per block of the tiled full_vocab / Full softmax
    c.dtype = "bfloat16"
    c.dropout_impl = "hash"
    c.learning_rate = 5e-5
    c.entity_learning_rate = 1e-3
    c.weight_decay = 0.01
    c.warmup_steps = 1000
    c.num_epochs = 2.0  # ~28M sentences: ~27K steps an epoch at 1,024
    c.log_every = 100
    c.checkpoint_every = 2000
    c.eval_batch_size = 512
    return c
