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
