"""Train -> load -> encode -> evaluate -> export of DocEnt-Dual on a tiny BERT, CLI errors."""

import json
import stat
from pathlib import Path

import jax
import ml_collections
import numpy as np
import pytest

from data_pipelines.tokenization import tokenize
from docent_jax import data as docent_data
from docent_jax import load, trainer, workflows
from docent_jax.configs import default
from docent_jax.inference import EntityRanker
from docent_jax.model import DocEntDual
from embedding_core.models.encoders import EncoderConfig
from embedding_core.serving import export as export_lib
from embedding_core.serving import export_reader, serving
from embedding_core.serving.inference import Encoder

REPO = Path(__file__).resolve().parents[2]

WORDS = ["river", "castle", "music", "engine", "forest"]
ENTITIES = [f"Entity_{w}" for w in WORDS]
QUERIES = ["which one has a river?", "castle",
           "a much longer query about the engine of the forest castle and its music"]


def _tiny_data() -> docent_data.EntityData:
    sentences = [(e, f"the {w} number {k} is described here") for k in range(8)
                 for e, w in enumerate(WORDS)]
    queries = [(f"which one has a {w}?", (e,)) for e, w in enumerate(WORDS)]
    return docent_data.EntityData(ENTITIES, WORDS, sentences, queries, "tiny test corpus")


EVALUATIONS = []


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_bert_dir):
    """Two steps of the full-vocabulary softmax on a data=4 x model=2 mesh, with the
    held-out ranking after each step (``eval_every=1``)."""
    from docent_jax import evaluate

    mp = pytest.MonkeyPatch()
    mp.setattr(docent_data, "load_data", lambda config: _tiny_data())
    original = evaluate.evaluate_ranker
    mp.setattr(evaluate, "evaluate_ranker", lambda ranker, queries, **kw: EVALUATIONS.append(
        (ranker.step, len(queries))) or original(ranker, queries, **kw))
    config = default.get_config()
    config.update(dict(model=str(tiny_bert_dir), max_length=16, batch_size=8,
                       num_train_steps=2, log_every=1, checkpoint_every=100, warmup_steps=0,
                       softmax="full_vocab", mesh_data=4, mesh_model=2, dropout=False,
                       learning_rate=1e-3, entity_learning_rate=1e-2, pooling="mean",
                       eval_every=1))
    workdir = tmp_path_factory.mktemp("docent") / "run"
    state = trainer.train(config, workdir)
    mp.undo()
    yield workdir, jax.device_get(state.params)


def test_training_ran_the_heldout_ranking_every_step(trained):
    assert EVALUATIONS == [(1, 5), (2, 5)]


def test_checkpoint_restores_the_trained_table_and_ids(trained):
    workdir, params = trained
    ranker = load(workdir)
    assert isinstance(ranker, Encoder)
    assert ranker.step == 2 and ranker.entity_ids == ENTITIES
    assert (workdir / "entity_ids.txt").read_text() == "".join(f"{e}\n" for e in ENTITIES)
    table = ranker.entity_embeddings()
    assert table.shape == (5, 32) and table.dtype == np.float32
    np.testing.assert_array_equal(table, params["entity_embeddings"][:5])
    saved = json.loads((workdir / "run_config.json").read_text())
    assert saved["softmax"] == "full_vocab" and "loss" not in saved


def test_encode_is_the_trained_sentence_encoder_f(trained):
    """encode(queries) = the model's training-time sentence encoding of the same tokens."""
    workdir, params = trained
    ranker = load(workdir)
    out = ranker.encode(QUERIES, batch_size=2)
    assert out.shape == (3, 32) and out.dtype == np.float32
    # The training forward pass ([batch, 1 field, L] inputs, as the pipeline yields them),
    # one query at a time at its own length, with the trained params.
    for i, query in enumerate(QUERIES):
        tok = tokenize(ranker.tokenizer, [query], ranker.config.max_length)
        n = int(tok.lengths[0])
        ids, types = tok.input_ids[:, None, :n], tok.token_type_ids[:, None, :n]
        f, _, _ = ranker.model.apply({"params": params}, ids, np.ones_like(ids), types)
        np.testing.assert_allclose(out[i], np.asarray(f)[0], rtol=1e-5, atol=1e-5)
    # Batching and order do not change a row; an empty query is refused.
    np.testing.assert_allclose(ranker.encode(QUERIES[::-1], batch_size=3)[::-1], out,
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="text 1 is empty"):
        ranker.encode(["fine", "  "])
    np.testing.assert_array_equal(ranker.encode("castle"), ranker.encode(["castle"])[0])


def test_encode_normalized_is_float32_unit_rows(trained):
    workdir, _ = trained
    out = load(workdir).encode(["a sentence"], batch_size=2, normalize=True,
                               show_progress_bar=False)
    assert out.shape == (1, 32) and out.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)


def test_export_views_equal_entity_embeddings_and_encode(trained, tmp_path, monkeypatch):
    workdir, _ = trained
    queries = tmp_path / "queries.txt"
    queries.write_text("\n".join(QUERIES) + "\n", encoding="utf-8")
    sizes = []
    original = export_lib.EmbeddingWriter.write

    def spy(self, start, blocks, ids):
        sizes.append((start, len(ids)))
        return original(self, start, blocks, ids)

    monkeypatch.setattr(export_lib.EmbeddingWriter, "write", spy)
    out = workflows.export_workdir(workdir, tmp_path / "exp", input_path=queries, block_rows=2)
    assert sizes[:3] == [(0, 2), (2, 2), (4, 1)]  # the table streams in blocks
    views = export_reader.load_export(out)
    assert sorted(views) == ["entities", "queries"]
    ranker = load(workdir)
    entities, ids, meta = views["entities"]
    assert ids == ENTITIES and entities.dtype == np.float32
    np.testing.assert_allclose(entities, ranker.entity_embeddings(), rtol=1e-5, atol=1e-5)
    vectors, ids, qmeta = views["queries"]
    assert ids == QUERIES
    np.testing.assert_allclose(vectors, ranker.encode(QUERIES), rtol=1e-5, atol=1e-5)
    for m in (meta, qmeta):
        assert m["model"] == "DocEnt-Dual" and m["step"] == 2
        assert m["normalized"] is False and m["similarity"] == "cosine"
        assert m["config"]["softmax"] == "full_vocab"
    for path in (out / "entities").iterdir():
        mode = Path(path).stat().st_mode  # export_workdir returns an epath.Path
        assert stat.S_IMODE(mode) & 0o044 == 0o044, path  # readable by others


def test_evaluate_writes_the_ranking_table(trained, monkeypatch, capsys, tiny_bert_dir):
    workdir, _ = trained
    monkeypatch.setattr(docent_data, "load_data", lambda config: _tiny_data())
    rows = workflows.evaluate_workdir(workdir, baselines=True, progress=False)
    # The BoS row is named after the encoder it used (the run's tiny BERT, not MiniLM).
    assert list(rows) == ["DocEnt-Dual (step 2)", f"BoS-{Path(tiny_bert_dir).name}",
                          "BoS-GloVe", "TF-IDF"]
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
    ranker.block_rows = 4096
    serving.export(lambda: ranker, tmp_path / "big")
    assert max(largest) == 4096 and sum(largest) == n
    vectors, read_ids, _ = export_reader.load_view(tmp_path / "big" / "entities",
                                                   mmap_mode="r")
    assert read_ids == ids
    np.testing.assert_array_equal(vectors, table[:n])  # padding rows dropped


@pytest.fixture
def _cli(cli, monkeypatch):
    """``docent-jax ARGS`` from the repository root, in this process and, in the slow
    tier, as a child process."""
    monkeypatch.chdir(REPO)
    return lambda *args: cli("docent_jax.main", *args)


def test_cli_export_with_input_writes_both_views(trained, tmp_path, _cli):
    workdir, _ = trained
    (tmp_path / "q.txt").write_text("castle\nriver\n", encoding="utf-8")
    proc = _cli("export", f"--workdir={workdir}", f"--output={tmp_path / 'o'}",
                f"--input={tmp_path / 'q.txt'}")
    assert proc.returncode == 0, proc.stderr
    views = export_reader.load_export(tmp_path / "o")
    assert views["entities"][0].shape == (5, 32) and views["queries"][1] == ["castle", "river"]
    (tmp_path / "bad.txt").write_text("castle\n\nriver\n", encoding="utf-8")
    proc = _cli("export", f"--workdir={workdir}", f"--output={tmp_path / 'o2'}",
                f"--input={tmp_path / 'bad.txt'}")
    assert proc.returncode == 1 and "bad.txt:2" in proc.stderr and "empty query" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "o2").exists()


def test_cli_reports_a_missing_workdir_and_model_path_without_traceback(tmp_path, _cli):
    missing = tmp_path / "nowhere"
    proc = _cli("evaluate", f"--workdir={missing}")
    assert proc.returncode == 1
    assert f"workdir {missing} does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _cli("train", f"--workdir={tmp_path / 'w'}", f"--config.model={tmp_path / 'm'}")
    assert proc.returncode == 1
    assert f"No model folder at '{tmp_path / 'm'}'" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _cli("train", f"--workdir={tmp_path / 'w'}", "--config.softmax=full")
    assert proc.returncode == 1 and "full_vocab" in proc.stderr
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="a docent-jax training workdir"):
        workflows.export_workdir(tmp_path / "empty")


def test_resumed_run_equals_the_uninterrupted_one(tmp_path, docent_tiny_run):
    """Stopped after step 1 and resumed (data position, dropout keys, entity-lr optimizer
    state restored), the run ends where an uninterrupted one does: the session's shared
    run of the same config (tests/shared_runs.py)."""
    over = docent_tiny_run.overrides
    # What makes the restored state matter: dropout keys, a warm-up schedule, two rates.
    assert over["dropout"] and over["warmup_steps"] == 1 and over["softmax"] == "in_batch"
    assert over["entity_learning_rate"] != over["learning_rate"]
    config = default.get_config()
    config.update(over)
    trainer.train(config, tmp_path / "parts", stop_after=1)
    assert load(tmp_path / "parts").step == 1
    parts = jax.device_get(trainer.train(config, tmp_path / "parts").params)
    parts = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(parts)}
    assert sorted(parts) == sorted(docent_tiny_run.params)
    for key, value in docent_tiny_run.params.items():
        np.testing.assert_allclose(parts[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
    with pytest.raises(ValueError, match="batch_size"):
        config.batch_size = 4
        trainer.train(config, tmp_path / "parts")


@pytest.fixture(scope="module", params=["full", "hybrid"])
def trained_mlm(request, tmp_path_factory, tiny_bert_dir):
    """Two steps of DocEnt-Full / -Hybrid (head warm-up on step 0) on a data=4 x model=2
    mesh; the evaluation during training is off, the CLI evaluates afterwards."""
    mp = pytest.MonkeyPatch()
    mp.setattr(docent_data, "load_data", lambda config: _tiny_data())
    config = default.get_config()
    config.update(dict(model=str(tiny_bert_dir), max_length=16, batch_size=8,
                       num_train_steps=2, log_every=1, checkpoint_every=100, warmup_steps=0,
                       variant=request.param, mesh_data=4, mesh_model=2, dropout=False,
                       learning_rate=1e-3, entity_learning_rate=1e-2, pooling="mean",
                       table_multiple=8, mlm_head_init="warmup", mlm_warmup_steps=1,
                       entity_mask_rate=1.0))
    workdir = tmp_path_factory.mktemp(f"docent_{request.param}") / "run"
    state = trainer.train(config, workdir)
    mp.undo()
    yield request.param, workdir, jax.device_get(state.params)


def test_mlm_variants_load_score_and_export(trained_mlm, tmp_path, monkeypatch):
    variant, workdir, params = trained_mlm
    monkeypatch.setattr(docent_data, "load_data", lambda config: _tiny_data())
    ranker = load(workdir)
    assert ranker.variant == variant and ranker.step == 2 and ranker.entity_ids == ENTITIES
    scores = ranker.score(QUERIES)
    assert scores.shape == (3, 5) and np.isfinite(scores).all()
    assert ranker.score([]).shape == (0, 5)
    q = ranker.encode(QUERIES)
    table = np.asarray(params["entity_embeddings"])[:5]
    if variant == "full":
        # Zero-shot scoring = the entity logits of the masked entity slot, over the entity
        # rows only: t . g(e) + b_e, with t the head output at position 1 of
        # [CLS] [MASK] [SEP] query [SEP].
        inputs = ranker.query_inputs(QUERIES)
        assert (inputs["input_ids"][:, 1] == 103).all() and (inputs["input_ids"][:, 2] == 102).all()
        positions = np.ones((3, 1), np.int32)
        dense = np.asarray(ranker.model.apply({"params": ranker.params}, inputs["input_ids"],
                                              inputs["attention_mask"],
                                              inputs["token_type_ids"], positions))[:, 0]
        vocab = ranker.model.config.vocab_size
        np.testing.assert_allclose(scores, dense[:, vocab:], rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(scores, q @ table.T + np.asarray(params["entity_bias"])[:5],
                                   rtol=1e-4, atol=1e-4)
        assert ranker.dim == ranker.model.config.hidden_size
    else:
        a = float(np.exp(params["log_scale"]))
        cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (
            table / np.linalg.norm(table, axis=1, keepdims=True)).T
        np.testing.assert_allclose(scores, a * cos, rtol=1e-4, atol=1e-4)
    # The export needs no training data (the CLI's export is run by
    # test_cli_export_with_input_writes_both_views).
    monkeypatch.setattr(docent_data, "load_data", lambda config: pytest.fail("data loaded"))
    out = tmp_path / "out"
    workflows.export_workdir(workdir, out)
    views = export_reader.load_export(out)
    emb, ids, meta = views["entities"]
    np.testing.assert_array_equal(emb, table)
    assert ids == ENTITIES and meta["model"] == f"DocEnt-{variant.capitalize()}"


def test_load_needs_no_base_model(trained, monkeypatch):
    """``load`` takes the encoder's config and tokenizer from the workdir's ``encoder/``
    copy: with the base model unfindable, the same query vectors and scores."""
    from embedding_core.models import pretrained

    workdir, _ = trained
    assert (workdir / pretrained.ENCODER_DIR / "tokenizer.json").is_file()
    ranker = load(workdir)
    queries, scores = ranker.encode(QUERIES, batch_size=2), ranker.score(QUERIES)

    def uninstalled(name):
        raise FileNotFoundError(f"No model folder at {str(name)!r} and no installed package")

    monkeypatch.setattr(pretrained, "resolve_model_dir", uninstalled)
    ranker = load(workdir)
    np.testing.assert_array_equal(ranker.encode(QUERIES, batch_size=2), queries)
    np.testing.assert_array_equal(ranker.score(QUERIES), scores)


def test_load_refuses_a_table_larger_than_a_device_and_ranks_in_row_blocks(trained):
    """mesh=None with a table over ``device_bytes``: one line naming the fix; with a mesh
    the table is split and loads. Ranking 3 rows at a time gives the whole shard's ranks."""
    from embedding_core.distributed import parallel

    workdir, params = trained
    table_bytes = params["entity_embeddings"].size * 4  # 128 x 32 float32
    with pytest.raises(ValueError) as err:
        load(workdir, device_bytes=table_bytes - 1)
    message = str(err.value)
    assert "\n" not in message and "is larger than one device" in message
    assert "mesh=embedding_core.distributed.parallel.make_mesh(-1, M)" in message
    whole = load(workdir, device_bytes=table_bytes)
    split = load(workdir, mesh=parallel.make_mesh(-1, 2), device_bytes=table_bytes - 1)
    assert whole.row_block == default.get_config().rank_row_block
    relevant = [[0], [1, 3], [4]]
    want = whole.relevant_ranks(QUERIES, relevant)
    best = whole.top_k(QUERIES, k=4)
    whole.row_block = split.row_block = 3
    for ranker in (whole, split):
        for a, b in zip(ranker.relevant_ranks(QUERIES, relevant), want, strict=True):
            np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(ranker.top_k(QUERIES, k=4)[0], best[0])
