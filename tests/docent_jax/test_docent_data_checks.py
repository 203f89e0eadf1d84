"""DocEnt refuses data files that train_shards would silently replace."""

from __future__ import annotations

import pytest

from docent_jax.configs import default, validate_config


@pytest.mark.parametrize("field", ["train_file", "eval_queries_file"])
def test_data_file_with_train_shards_is_refused(field):
    config = default.get_config()
    config.train_shards = "corpus"
    validate_config(config)
    config[field] = "documents.jsonl"
    with pytest.raises(ValueError, match=rf"^config.{field} and config.train_shards both set"):
        validate_config(config)


def test_an_unknown_field_in_a_python_config_is_refused_before_anything_is_written(tmp_path):
    from docent_jax import train

    config = default.get_config()
    config.unlock()
    config.batch_sz = 3
    with pytest.raises(ValueError, match=r"^config has no field 'batch_sz' \(did you mean "
                                         r"'batch_size'\?\)$"):
        train(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_old_run_config_loads_on_todays_defaults(tmp_path):
    """A saved config without today's fields (``loss_chunk_size``) gets their defaults; one
    with a field this version no longer declares still loads."""
    import json

    from docent_jax.inference import read_config

    saved = json.loads(json.dumps(default.get_config().to_dict()))
    del saved["loss_chunk_size"]
    saved["retired_field"] = 1
    (tmp_path / "run_config.json").write_text(json.dumps(saved))
    config = read_config(tmp_path)
    assert config.loss_chunk_size == 0 and config.retired_field == 1
    config.loss_chunk_size = -1
    with pytest.raises(ValueError, match="config.loss_chunk_size must be >= 0"):
        validate_config(config)
