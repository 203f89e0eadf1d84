"""DualCSE presets (``get_config()`` each, on ``default.FIELDS``) and the cross-field rules."""

from __future__ import annotations

import ml_collections

ARCHITECTURES = ("cross", "bi", "simcse")
POOLINGS = ("cls", "cls_mlp", "mean")
TRAIN_DATA = ("inli", "snli")
RTE_SCORE_RULES = ("max", "explicit", "implicit", "pair")
"""RTE scores of (p, h): ``max(cos(r_p, r_h), cos(u_p, r_h))``, ``cos(r_p, r_h)``, ``cos(u_p,
r_h)``, or ``pair`` (``docs/dualcse.md``, "RTE protocol")."""
DATA_FILES = ("train_file", "val_file", "test_file")


def validate_config(config: ml_collections.ConfigDict) -> None:
    """DualCSE's cross-field rules; ValueError naming the fields."""
    # train_file replaces train_data, so a preset's train_data=snli does not bind it.
    own_file = str(config.train_file or "").strip()
    if own_file and str(config.train_shards or "").strip():
        raise ValueError("config.train_file and config.train_shards both set: the shards "
                         "hold the training rows (preprocess already read the train file); "
                         "set one of the two")
    if config.train_data == "snli" and not own_file and config.architecture != "simcse":
        raise ValueError("SNLI triplets have no implied entailment: train_data=snli needs "
                         "architecture=simcse")
