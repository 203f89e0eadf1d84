"""DocEnt presets (``default.py``; ``dual_cpu.py``, ``full_cpu.py``, ``hybrid_cpu.py`` for
the shipped SQuAD corpus on a CPU; ``*_paper.py`` at the paper's scale) and the config check
that training and loading share (:func:`validate_config`)."""

from __future__ import annotations

import math

import ml_collections

VARIANTS = ("dual", "full", "hybrid")
"""``config.variant``: DocEnt-Dual, DocEnt-Full, DocEnt-Hybrid."""
SOFTMAXES = ("in_batch", "full_vocab")
"""``config.softmax``: the entities of the global batch, or the whole table."""
POOLINGS = ("cls", "mean")
HYBRID_DUAL_INPUTS = ("clean", "masked")
MLM_HEAD_INITS = ("random", "warmup")
TRAIN_DATA = ("squad", "amazon")
DATA_FILES = ("train_file", "eval_queries_file")
"""The user's own data files (``docs/data.md``); ``train_file`` replaces ``train_data``."""


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Rejects impossible DocEnt settings before anything is loaded or compiled (the shared
    fields are checked by ``embedding_core.configs.validate_base``).

    Raises:
      ValueError: naming the field and the allowed values.
    """
    if config.softmax not in SOFTMAXES:
        hint = (" (DocEnt-Dual's softmax over the whole table is now 'full_vocab'; "
                "config.loss was renamed config.softmax)") if config.softmax == "full" else ""
        raise ValueError(f"config.softmax={config.softmax!r}: use one of {SOFTMAXES}{hint}")
    if config.variant not in VARIANTS:
        raise ValueError(f"config.variant={config.variant!r}: use one of {VARIANTS}")
    if config.hybrid_dual_input not in HYBRID_DUAL_INPUTS:
        raise ValueError(f"config.hybrid_dual_input={config.hybrid_dual_input!r}: use one of "
                         f"{HYBRID_DUAL_INPUTS}")
    if config.mlm_head_init not in MLM_HEAD_INITS:
        raise ValueError(f"config.mlm_head_init={config.mlm_head_init!r}: use one of "
                         f"{MLM_HEAD_INITS}")
    for name in ("word_mask_rate", "entity_mask_rate"):
        if not 0.0 <= float(config[name]) <= 1.0:
            raise ValueError(f"config.{name} must lie in [0, 1], got {config[name]}")
    for name in ("entity_loss_weight", "mlm_loss_weight", "mlm_head_learning_rate",
                 "entity_learning_rate"):
        if not (math.isfinite(float(config[name])) and float(config[name]) >= 0):
            raise ValueError(f"config.{name} must be a finite number >= 0, got {config[name]}")
    for name in ("scale_init", "entity_init_std"):
        if not (math.isfinite(float(config[name])) and float(config[name]) > 0):
            raise ValueError(f"config.{name} must be a finite number > 0, got {config[name]}")
    if int(config.max_predictions) < 1 or int(config.mlm_warmup_steps) < 0:
        raise ValueError(f"config.max_predictions must be >= 1 and mlm_warmup_steps >= 0, got "
                         f"{config.max_predictions}, {config.mlm_warmup_steps}")
    if int(config.get("eval_examples", 0)) < 0:
        raise ValueError(f"config.eval_examples must be >= 0 (0 = every held-out query), got "
                         f"{config.eval_examples}")
    if config.variant == "full" and int(config.max_length) < 5:
        raise ValueError(f"config.max_length={config.max_length}: DocEnt-Full needs >= 5 "
                         "([CLS] <entity> [SEP] word [SEP])")
    if config.variant == "full" and config.projection_dim:
        raise ValueError("config.projection_dim must be 0 for variant 'full' (its entity rows "
                         "live in the encoder's input vocabulary, at hidden width)")
    if config.pooling not in POOLINGS:
        raise ValueError(f"config.pooling={config.pooling!r}: use one of {POOLINGS}")
    if config.train_data not in TRAIN_DATA:
        raise ValueError(f"config.train_data={config.train_data!r}: use one of {TRAIN_DATA}")
    for name in DATA_FILES:
        if not isinstance(config.get(name, ""), str):
            raise ValueError(f"config.{name} must be a path (a string), got "
                             f"{config[name]!r}")
    if str(config.get("train_shards", "") or "").strip():
        for name in DATA_FILES:
            if str(config.get(name, "") or "").strip():
                raise ValueError(f"config.{name} and config.train_shards both set: the shards "
                                 "hold the entities, sentences and queries preprocess read; "
                                 f"set {name} at preprocess, not at training")
    if str(config.get("train_file", "") or "").strip() and config.train_data == "amazon":
        raise ValueError("config.train_file replaces train_data, but train_data='amazon' "
                         "names the Amazon reviews (amazon_paths): set one of the two")
    for name in ("batch_size", "max_length", "pad_multiple", "table_multiple"):
        if int(config[name]) <= 0:
            raise ValueError(f"config.{name} must be positive, got {config[name]}")
    block = config.get("vocab_block_size", 0)
    if isinstance(block, bool) or not isinstance(block, int) or block < 0:
        raise ValueError(f"config.vocab_block_size must be an integer >= 0 (entity rows per "
                         f"block of the tiled softmax; 0 = untiled), got {block!r}")
    fused = config.get("fused_table_update", False)
    if not isinstance(fused, bool):
        raise ValueError(f"config.fused_table_update must be True or False, got {fused!r}")
    if fused and (config.variant != "dual" or config.softmax != "full_vocab" or not block):
        raise ValueError(
            "config.fused_table_update=True updates the entity table block by block inside "
            "DocEnt-Dual's tiled full softmax: it needs variant='dual', softmax='full_vocab' "
            f"and vocab_block_size > 0, got variant={config.variant!r}, softmax="
            f"{config.softmax!r}, vocab_block_size={block}; set those or "
            "--config.fused_table_update=False")
    if config.projection_dim < 0:
        raise ValueError(f"config.projection_dim must be >= 0, got {config.projection_dim}")
    if config.mesh_model > 0 and config.table_multiple % config.mesh_model:
        raise ValueError(f"config.table_multiple={config.table_multiple} must be divisible by "
                         f"config.mesh_model={config.mesh_model} (the table is split over it)")
    for name in ("tag_heldout_movies", "tag_heldout_tags", "tag_finetune_steps",
                 "tag_batch_size"):
        if int(config.get(name, 1)) < 1:
            raise ValueError(f"config.{name} must be >= 1, got {config[name]}")
    if not 0.0 < float(config.get("tag_max_heldout_share", 0.5)) < 1.0:
        raise ValueError("config.tag_max_heldout_share must lie in (0, 1), got "
                         f"{config.tag_max_heldout_share}")
    for name in ("tag_threshold", "tag_human_threshold", "tag_train_threshold"):
        if int(config.get(name, 0)) < 0:
            raise ValueError(f"config.{name} must be >= 0 (a count of users), got "
                             f"{config[name]}")
    for name in ("tag_learning_rate", "tag_head_learning_rate"):
        if not float(config.get(name, 1.0)) > 0:
            raise ValueError(f"config.{name} must be positive, got {config[name]}")
