"""DualCSE presets (``get_config()`` in each module) and the check every preset must pass.

``default.py`` is the paper's DualCSE-Cross on ``embedding_core.configs.base()``; ``bi.py``,
``simcse.py`` and ``cross_cpu.py`` change a few of its fields. :func:`validate_config`
lives here, light and free of the model, so that training and loading share it.
"""

from __future__ import annotations

import ml_collections

ARCHITECTURES = ("cross", "bi", "simcse")
POOLINGS = ("cls", "cls_mlp", "mean")
TRAIN_DATA = ("inli", "snli")
RTE_SCORE_RULES = ("max", "explicit", "implicit", "pair")
"""How RTE scores a (premise p, hypothesis h) pair (``docs/dualcse.md``, "RTE protocol"):
``max(cos(r_p, r_h), cos(u_p, r_h))``, ``cos(r_p, r_h)``, ``cos(u_p, r_h)`` against one
threshold, or ``pair``: entailed if ``cos(r_p, r_h) > t_r`` or ``cos(u_p, r_h) > t_u``."""
DATA_FILES = ("train_file", "val_file", "test_file")
"""The user's data files (``docs/data.md``); ``train_file`` replaces ``train_data``."""


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Rejects impossible DualCSE settings before anything is loaded or compiled.

    Raises:
      ValueError: naming the field and what it must be.
    """
    if config.architecture not in ARCHITECTURES:
        raise ValueError(f"config.architecture={config.architecture!r}: use cross, bi or simcse")
    if config.pooling not in POOLINGS:
        raise ValueError(f"config.pooling={config.pooling!r}: use cls, cls_mlp or mean")
    rule = config.get("eval_rte_score_rule", "max")
    if rule not in RTE_SCORE_RULES:
        raise ValueError(f"config.eval_rte_score_rule={rule!r}: use one of "
                         f"{', '.join(RTE_SCORE_RULES)}")
    if config.train_data not in TRAIN_DATA:
        raise ValueError(f"config.train_data={config.train_data!r}: use inli or snli")
    for name in DATA_FILES:
        if not isinstance(config.get(name, ""), str):
            raise ValueError(f"config.{name} must be a path (a string), got "
                             f"{config[name]!r}")
    # train_file replaces train_data, so a preset's train_data=snli does not bind it.
    own_file = str(config.get("train_file", "") or "").strip()
    if own_file and str(config.get("train_shards", "") or "").strip():
        raise ValueError("config.train_file and config.train_shards both set: the shards "
                         "hold the training rows (preprocess already read the train file); "
                         "set one of the two")
    if config.train_data == "snli" and not own_file and config.architecture != "simcse":
        raise ValueError("SNLI triplets have no implied entailment: train_data=snli needs "
                         "architecture=simcse")
    for name in ("batch_size", "max_length", "pad_multiple"):
        if int(config[name]) <= 0:
            raise ValueError(f"config.{name} must be positive, got {config[name]}")
    if config.temperature <= 0:
        raise ValueError(f"config.temperature must be positive, got {config.temperature}")
