"""DocEnt presets (``{dual,full,hybrid}_{cpu,paper,tpu}.py``) on ``default.py``, and the checks."""

from __future__ import annotations

import ml_collections

from docent_jax.configs.default import (  # noqa: F401  (the package's names for them)
    DATA_FILES,
    DATA_PATHS,
    FIELDS,
    HYBRID_DUAL_INPUTS,
    MLM_HEAD_INITS,
    POOLINGS,
    SOFTMAXES,
    TRAIN_DATA,
    VARIANTS,
)
from embedding_core import configs


def cross_field_checks(config: ml_collections.ConfigDict) -> None:
    """DocEnt's rules between fields; ValueError naming them."""
    full = config.variant == "full"
    if full and int(config.max_length) < 5:
        raise ValueError(f"config.max_length={config.max_length}: DocEnt-Full needs >= 5 "
                         "([CLS] <entity> [SEP] word [SEP])")
    if full and config.projection_dim:
        raise ValueError("config.projection_dim must be 0 for variant 'full' (its entity rows "
                         "live in the encoder's input vocabulary, at hidden width)")
    if str(config.train_shards or "").strip():
        for name in DATA_FILES:
            if str(config[name] or "").strip():
                raise ValueError(f"config.{name} and config.train_shards both set: the shards "
                                 "hold the entities, sentences and queries preprocess read; "
                                 f"set {name} at preprocess, not at training")
    if str(config.train_file or "").strip() and config.train_data == "amazon":
        raise ValueError("config.train_file replaces train_data, but train_data='amazon' "
                         "names the Amazon reviews (amazon_paths): set one of the two")
    block = config.vocab_block_size
    if config.fused_table_update and (
            config.variant != "dual" or config.softmax != "full_vocab" or not block):
        raise ValueError(
            "config.fused_table_update=True updates the entity table block by block inside "
            "DocEnt-Dual's tiled full softmax: it needs variant='dual', softmax='full_vocab' "
            f"and vocab_block_size > 0, got variant={config.variant!r}, softmax="
            f"{config.softmax!r}, vocab_block_size={block}; set those or "
            "--config.fused_table_update=False")
    if config.mesh_model > 0 and config.table_multiple % config.mesh_model:
        raise ValueError(f"config.table_multiple={config.table_multiple} must be divisible by "
                         f"config.mesh_model={config.mesh_model} (the table is split over it)")


validate_config = configs.validator(FIELDS, cross_field_checks)
"""Every field against its declaration, then :func:`cross_field_checks`."""
