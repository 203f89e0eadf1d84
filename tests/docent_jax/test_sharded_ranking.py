"""DocEnt on meshes of any model size: a run resumes from mesh_model=4 on mesh_model=8, a
checkpoint loads with its table split over model=4 or 8, and ranking, metrics and export
on the split table equal those of the whole table (tiny BERT, 8 CPU devices)."""

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from docent_jax import data as docent_data
from docent_jax import evaluate, load, trainer, workflows
from docent_jax.configs import default
from docent_jax.inference import EntityRanker
from docent_jax.model import DocEntFull
from embedding_core.distributed import parallel
from embedding_core.models.encoders import EncoderConfig
from embedding_core.serving import export as export_lib
from embedding_core.serving import export_reader

WORDS = ["river", "castle", "music", "engine", "forest"]
ENTITIES = [f"Entity_{w}" for w in WORDS]
QUERIES = [(f"which one has a {w}?", (e,)) for e, w in enumerate(WORDS)] + [
    ("a castle by the river", (0, 1)), ("music of the forest engine", (2, 3, 4))]
TEXTS = [q for q, _ in QUERIES]
RELEVANT = [r for _, r in QUERIES]
ROWS = 16  # table_multiple: 5 entities + 11 padding rows, 2 rows a device on model=8


def _tiny_data() -> docent_data.EntityData:
    sentences = [(e, f"the {w} number {k} is described here") for k in range(8)
                 for e, w in enumerate(WORDS)]
    return docent_data.EntityData(ENTITIES, WORDS, sentences, QUERIES[:5], "tiny corpus")


def _config(tiny_bert_dir, data, model):
    config = default.get_config()
    config.update(dict(model=str(tiny_bert_dir), max_length=16, batch_size=8,
                       num_train_steps=2, log_every=1, checkpoint_every=100, warmup_steps=0,
                       softmax="full_vocab", mesh_data=data, mesh_model=model, dropout=False,
                       learning_rate=1e-3, entity_learning_rate=1e-2, pooling="mean",
                       table_multiple=ROWS))
    return config


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_bert_dir):
    """Step 1 on mesh 2x4, step 2 resumed on 1x8; the same two steps on 2x4 in one go."""
    root = tmp_path_factory.mktemp("mesh_resume")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(docent_data, "load_data", lambda config: _tiny_data())
        trainer.train(_config(tiny_bert_dir, 2, 4), root / "resumed", stop_after=1)
        resumed = trainer.train(_config(tiny_bert_dir, 1, 8), root / "resumed")
        straight = trainer.train(_config(tiny_bert_dir, 2, 4), root / "straight")
    return root / "resumed", resumed, straight


def test_a_run_resumes_from_model_4_on_model_8(runs):
    workdir, resumed, straight = runs
    assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                  if p.name.isdigit()) == [1, 2]
    table = resumed.params["entity_embeddings"]
    assert table.sharding.spec == P("model", None) and table.sharding.mesh.shape["model"] == 8
    assert int(resumed.step) == 2
    # Step 2 ran from the restored params and Adam moments: the same result as the
    # uninterrupted run on 2x4 (up to the reduction order of the other mesh).
    flat_r = jax.tree_util.tree_flatten_with_path(jax.device_get(resumed.params))[0]
    flat_s = dict(jax.tree_util.tree_flatten_with_path(jax.device_get(straight.params))[0])
    for path, value in flat_r:
        np.testing.assert_allclose(value, flat_s[path], rtol=1e-4, atol=1e-5,
                                   err_msg=jax.tree_util.keystr(path))
    assert not np.allclose(flat_s[flat_r[0][0]], 0.0)


@pytest.fixture(scope="module")
def rankers(runs):
    """The checkpoint loaded whole (model=1, the host path) and split over model=4 and 8,
    with each padding row set to a query's own vector, so that a padding row would rank
    first for some query if it were ranked at all."""
    workdir = runs[0]
    whole = load(workdir)
    vectors = whole.encode(TEXTS)
    table = np.asarray(jax.device_get(whole.params["entity_embeddings"])).copy()
    table[5:] = vectors[np.arange(ROWS - 5) % len(TEXTS)]
    out = {1: (whole, whole.with_params({**whole.params, "entity_embeddings": table}))}
    for model in (4, 8):
        split = load(workdir, mesh=parallel.make_mesh(-1, model))
        sharding = split.params["entity_embeddings"].sharding
        padded = split.with_params({**split.params,
                                    "entity_embeddings": jax.device_put(table, sharding)})
        out[model] = (split, padded)
    for _, padded in out.values():  # the encoder is checked once per mesh below
        padded.encode = lambda texts, **kw: vectors[[TEXTS.index(t) for t in texts]]
    return out, vectors


def test_load_splits_the_table_and_encodes_the_same(rankers):
    out, vectors = rankers
    for model in (4, 8):
        split, _ = out[model]
        table = split.params["entity_embeddings"]
        assert table.sharding.spec == P("model", None)
        assert {s.data.shape for s in table.addressable_shards} == {(ROWS // model, 32)}
        np.testing.assert_array_equal(split.entity_embeddings(), out[1][0].entity_embeddings())
    # The encoder on model=8: its 4 heads kept whole, its MLP split (one compile suffices).
    np.testing.assert_allclose(out[8][0].encode(TEXTS), vectors, rtol=1e-5, atol=1e-6)


def test_sharded_top_k_and_metrics_equal_the_host_path(rankers):
    out, _ = rankers
    host = out[1][1]
    scores = host.score(TEXTS)  # [n, 5]: padding columns cut off on the host
    want = evaluate.evaluate_scores(lambda a, b: scores[a:b], RELEVANT)
    order = np.argsort(-scores, axis=1, kind="stable")
    for model, (_, padded) in out.items():
        rows, top = padded.top_k(TEXTS, k=3, batch_size=4)
        np.testing.assert_array_equal(rows, order[:, :3], err_msg=f"model={model}")
        np.testing.assert_allclose(top, np.take_along_axis(scores, order[:, :3], 1),
                                   rtol=1e-5)
        assert padded.top_k(TEXTS, k=50)[0].shape == (len(TEXTS), 5)  # padding never ranks
        got = evaluate.evaluate_ranker(padded, QUERIES, block_size=3)
        assert got == pytest.approx(want, rel=1e-12), model
    assert 0 < want["MAP"] < 1  # a ranking with errors: the comparison can fail


def test_export_streams_the_split_table_shard_by_shard(runs, tmp_path, monkeypatch):
    workdir = runs[0]
    sizes = []
    original = export_lib.EmbeddingWriter.write

    def spy(self, start, blocks, ids):
        sizes.append((start, len(ids)))
        return original(self, start, blocks, ids)

    monkeypatch.setattr(export_lib.EmbeddingWriter, "write", spy)
    whole = export_reader.load_export(workflows.export_workdir(workdir, tmp_path / "one"))
    sizes.clear()
    split = export_reader.load_export(workflows.export_workdir(workdir, tmp_path / "eight",
                                                            mesh_model=8))
    assert sizes == [(0, 2), (2, 2), (4, 1)]  # 2 rows a device; padding rows never read
    np.testing.assert_array_equal(split["entities"][0], whole["entities"][0])
    assert split["entities"][1] == whole["entities"][1] == ENTITIES
    with pytest.raises(ValueError, match="mesh model=3 does not divide the 16 rows"):
        load(workdir, mesh=parallel.make_mesh(-1, 3, devices=jax.devices()[:6]))


def test_full_ranks_with_its_entity_bias_on_a_split_table(tiny_bert_dir):
    """DocEnt-Full scores t . g(e) + b_e: the bias is split with the rows."""
    from data_pipelines.tokenization import load_tokenizer

    config = default.get_config()
    config.update(dict(variant="full", model=str(tiny_bert_dir), table_multiple=ROWS))
    model = DocEntFull(EncoderConfig.from_hf_config(tiny_bert_dir), num_entities=5,
                       num_rows=ROWS)
    rng = np.random.default_rng(0)
    params = {"entity_embeddings": rng.normal(size=(ROWS, 32)).astype(np.float32),
              "entity_bias": rng.normal(size=ROWS).astype(np.float32)}
    params["entity_bias"][5:] = 1e3  # padding rows would win everything
    params["word_bias"] = np.zeros(model.config.vocab_size, np.float32)  # read by setup
    vectors = rng.normal(size=(len(TEXTS), 32)).astype(np.float32)
    host = EntityRanker(model, params, load_tokenizer(tiny_bert_dir), config, ENTITIES)
    host.encode = lambda texts, **kw: vectors[[TEXTS.index(t) for t in texts]]
    scores = host.score(TEXTS)
    want = evaluate.evaluate_scores(lambda a, b: scores[a:b], RELEVANT)
    for model_size in (4, 8):
        mesh = parallel.make_mesh(-1, model_size)
        split = host.with_params({
            "entity_embeddings": jax.device_put(params["entity_embeddings"],
                                                NamedSharding(mesh, P("model", None))),
            "entity_bias": jax.device_put(params["entity_bias"],
                                          NamedSharding(mesh, P("model"))),
            "word_bias": params["word_bias"]})
        split.encode = host.encode
        rows, _ = split.top_k(TEXTS, k=5)
        np.testing.assert_array_equal(rows, np.argsort(-scores, axis=1, kind="stable"))
        got = evaluate.evaluate_ranker(split, QUERIES)
        assert got == pytest.approx(want, rel=1e-12)
