"""Train -> evaluate -> export of DocEnt-Dual on a tiny BERT, streaming export, CLI errors."""

import json
import subprocess
import sys
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest

from docent_jax import data as docent_data
from docent_jax import trainer, workflows
from docent_jax.configs import default
from docent_jax.inference import EntityRanker, load
from docent_jax.model import DocEntDual
from embedding_core import export as export_lib
from embedding_core.encoders import EncoderConfig

REPO = Path(__file__).resolve().parents[2]

WORDS = ["river", "castle", "music", "engine", "forest"]
ENTITIES = [f"Entity_{w}" for w in WORDS]


def _tiny_data() -> docent_data.EntityData:
    sentences = [(e, f"the {w} number {k} is described here") for k in range(8)
                 for e, w in enumerate(WORDS)]
    queries = [(f"which one has a {w}?", (e,)) for e, w in enumerate(WORDS)]
    return docent_data.EntityData(ENTITIES, WORDS, sentences, queries, "tiny test corpus")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_bert_dir):
    """Two steps of the full (vocab-parallel) softmax on a data=4 x model=2 mesh."""
    mp = pytest.MonkeyPatch()
    mp.setattr(trainer, "load_data", lambda config: _tiny_data())
    config = default.get_config()
    config.update(dict(model=str(tiny_bert_dir), max_length=16, batch_size=8,
                       num_train_steps=2, log_every=1, checkpoint_every=100, warmup_steps=0,
                       loss="full", mesh_data=4, mesh_model=2, dropout=False,
                       learning_rate=1e-3, entity_learning_rate=1e-2))
    workdir = tmp_path_factory.mktemp("docent") / "run"
    state = trainer.train(config, workdir)
    yield workdir, jax.device_get(state.params)
    mp.undo()


def test_checkpoint_restores_the_trained_table_and_ids(trained):
    workdir, params = trained
    ranker = load(workdir)
    assert ranker.step == 2 and ranker.entity_ids == ENTITIES
    table = ranker.entity_embeddings()
    assert table.shape == (5, 32) and table.dtype == np.float32
    np.testing.assert_array_equal(table, params["entity_embeddings"][:5])
    queries = ranker.encode_queries(["which one has a river?", "castle"])
    assert queries.shape == (2, 32) and np.isfinite(queries).all()


def test_export_streams_blocks_with_ids_on_their_rows(trained, tmp_path, monkeypatch):
    workdir, params = trained
    sizes = []
    original = export_lib.EmbeddingWriter.write

    def spy(self, start, blocks, ids):
        sizes.append((start, len(ids)))
        return original(self, start, blocks, ids)

    monkeypatch.setattr(export_lib.EmbeddingWriter, "write", spy)
    out = workflows.export_workdir(workdir, tmp_path / "exp", block_rows=2)
    assert sizes == [(0, 2), (2, 2), (4, 1)]
    arrays, ids, meta = export_lib.load_arrays(out)
    assert sorted(p.name for p in out.iterdir()) == ["entities.npy", "entity_ids.txt",
                                                     "meta.json"]
    assert ids == ENTITIES and meta["checkpoint_step"] == 2
    np.testing.assert_array_equal(arrays["entities"], params["entity_embeddings"][:5])


def test_evaluate_writes_the_ranking_table(trained, monkeypatch, capsys):
    workdir, _ = trained
    monkeypatch.setattr(trainer, "load_data", lambda config: _tiny_data())
    rows = workflows.evaluate_workdir(workdir, baselines=True, progress=False)
    assert list(rows) == ["DocEnt-Dual (step 2)", "BoS-MiniLM", "BoS-GloVe", "TF-IDF"]
    # TF-IDF finds each query's word in exactly one entity's sentences.
    assert rows["TF-IDF"]["MAP"] == 1.0
    saved = json.loads((workdir / "eval" / "ranking.json").read_text())
    assert saved["rows"]["TF-IDF"]["recall@1"] == 1.0
    assert "recall@10" in capsys.readouterr().out


def test_large_table_export_holds_one_block_at_a_time(tmp_path, monkeypatch):
    n, dim = 50_000, 16
    cfg = EncoderConfig("bert", 100, 8, 1, 2, 16, 16, 2, 1e-12, "gelu", 0, 0.0, 0.0)
    model = DocEntDual(cfg, num_entities=n, num_rows=n + 48, projection_dim=dim)
    table = np.random.default_rng(0).standard_normal((n + 48, dim)).astype(np.float32)
    ids = [f"e{i}" for i in range(n)]
    config = ml_collections.ConfigDict({"model": "none", "max_length": 8})
    ranker = EntityRanker(model, {"entity_embeddings": jax.device_put(table)}, None, config,
                          ids)
    largest = []
    original = export_lib.EmbeddingWriter.write
    monkeypatch.setattr(export_lib.EmbeddingWriter, "write", lambda self, start, blocks, ids_:
                        (largest.append(len(ids_)), original(self, start, blocks, ids_))[1])
    workflows.export_ranker(ranker, tmp_path / "big", block_rows=4096)
    assert max(largest) == 4096 and sum(largest) == n
    arrays, read_ids, _ = export_lib.load_arrays(tmp_path / "big", mmap_mode="r")
    assert read_ids == ids
    np.testing.assert_array_equal(arrays["entities"], table[:n])  # padding rows dropped


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "docent_jax.main", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def test_cli_reports_a_missing_workdir_and_model_path_without_traceback(tmp_path):
    missing = tmp_path / "nowhere"
    proc = _cli("evaluate", f"--workdir={missing}")
    assert proc.returncode == 1
    assert f"workdir {missing} does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _cli("train", f"--workdir={tmp_path / 'w'}", f"--config.model={tmp_path / 'm'}")
    assert proc.returncode == 1
    assert f"No model folder at '{tmp_path / 'm'}'" in proc.stderr
    assert "Traceback" not in proc.stderr
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a docent-jax training workdir"):
        workflows.export_workdir(tmp_path / "empty")
