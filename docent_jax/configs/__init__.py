"""DocEnt presets (``default.py``, ``dual_cpu.py``) and the config check that training and
loading share (:func:`validate_config`)."""

from __future__ import annotations

import ml_collections

SOFTMAXES = ("in_batch", "full_vocab")
"""``config.softmax``: the entities of the global batch, or the whole table."""
POOLINGS = ("cls", "mean")
TRAIN_DATA = ("squad", "amazon")


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
    if config.pooling not in POOLINGS:
        raise ValueError(f"config.pooling={config.pooling!r}: use one of {POOLINGS}")
    if config.train_data not in TRAIN_DATA:
        raise ValueError(f"config.train_data={config.train_data!r}: use one of {TRAIN_DATA}")
    for name in ("batch_size", "max_length", "pad_multiple", "table_multiple"):
        if int(config[name]) <= 0:
            raise ValueError(f"config.{name} must be positive, got {config[name]}")
    if config.projection_dim < 0:
        raise ValueError(f"config.projection_dim must be >= 0, got {config.projection_dim}")
    if config.scale_init <= 0:
        raise ValueError(f"config.scale_init must be positive, got {config.scale_init}")
    if config.entity_learning_rate < 0:
        raise ValueError("config.entity_learning_rate must be >= 0 (0 = learning_rate), got "
                         f"{config.entity_learning_rate}")
    if config.mesh_model > 0 and config.table_multiple % config.mesh_model:
        raise ValueError(f"config.table_multiple={config.table_multiple} must be divisible by "
                         f"config.mesh_model={config.mesh_model} (the table is split over it)")
