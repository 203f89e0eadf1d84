"""DualCSE's data settings are checked before training: conflicting fields, bad eval files."""

from __future__ import annotations

import pytest

from data_pipelines.errors import DataError
from dualcse_jax import data, trainer
from dualcse_jax.configs import default, validate_config

HEADER = "premise,explicit_entailment,implied_entailment,contradiction,neutral\n"


def test_train_file_with_train_shards_is_refused_and_shards_are_named():
    config = default.get_config()
    config.train_shards = "gs://bucket/corpus"
    validate_config(config)
    assert data.train_source(config) == "shards of gs://bucket/corpus"
    config.train_file = "pairs.csv"
    with pytest.raises(ValueError, match=r"^config.train_file and config.train_shards both "
                                         r"set: .*; set one of the two$"):
        validate_config(config)


@pytest.mark.parametrize("field", ["val_file", "test_file"])
def test_bad_eval_file_stops_the_run_before_the_model_loads(tmp_path, field):
    path = tmp_path / "rte.csv"
    path.write_text(HEADER + "p,e,i,c,n\np,e,i,c,\n", encoding="utf-8")
    config = default.get_config()
    config[field] = str(path)
    config.model = str(tmp_path / "no-model")  # never reached: the file is read first
    with pytest.raises(DataError) as info:
        trainer.build_task(config)
    assert (info.value.path, info.value.line, info.value.field) == (str(path), 3, "neutral")


@pytest.mark.mesh  # sets its own mesh shape
def test_loss_chunk_size_must_divide_the_per_device_batch_before_the_model_loads(tmp_path):
    config = default.get_config()
    config.batch_size, config.loss_chunk_size = 16, 3  # 2 rows per device on 8
    config.model = str(tmp_path / "no-model")  # never reached
    with pytest.raises(ValueError, match=r"config.loss_chunk_size=3 \(rows per device in each "
                                         r"chunk\) does not divide the per-device batch 2"):
        trainer.train(config, tmp_path / "w")  # the core's check (contrastive.StepSplit)
    assert not (tmp_path / "w").exists()
