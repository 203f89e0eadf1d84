"""A trained workdir: export == load().encode, load without the base model, and the CLI's
errors on bad input."""

import csv
from pathlib import Path

import jax
import numpy as np
import pytest

from dualcse_jax.configs import default
from tests import shared_runs


def _dualcse(cli, *args, check=True):
    """``dualcse-jax ARGS`` through the ``cli`` fixture (tests/conftest.py)."""
    out = cli("dualcse_jax.main", *args)
    if check and out.returncode != 0:
        raise AssertionError(out.stdout[-3000:] + out.stderr[-3000:])
    return out


def _params(workdir):
    from dualcse_jax.inference import load

    emb = load(workdir)
    return emb, {jax.tree_util.keystr(k): np.asarray(v)
                 for k, v in jax.tree_util.tree_leaves_with_path(emb.params)}


@pytest.fixture(scope="module")
def uninterrupted(dualcse_tiny_run):
    """The session's shared 3-step run (tests/shared_runs.py), read-only. The CLI's train
    (console metric lines, the periodic RTE evaluation, TensorBoard event files) is run by
    tests/data_pipelines/test_own_data_train.py."""
    return dualcse_tiny_run.workdir


STEPS = shared_runs.DUALCSE_TINY["num_train_steps"]

# SIGKILL after the first checkpoint, then resume to the uninterrupted parameters: the
# same CLI path is tested on gs:// (tests/embedding_core/test_gcs_storage.py), and a local
# stop/resume equality by tests/embedding_core/test_run_stops.py (Ctrl-C, then resume).


def test_export_equals_fresh_encode(tmp_path, uninterrupted, cli):
    from data_pipelines import inli
    from embedding_core.serving.export_reader import load_export

    sentences = [ex.premise for ex in inli.read_inli(inli.inli_split_path("test"))[:37]]
    src = tmp_path / "sentences.txt"
    src.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    out = tmp_path / "export"
    _dualcse(cli, "export", f"--workdir={uninterrupted}", f"--input={src}", f"--output={out}")
    assert sorted(p.name for p in out.iterdir()) == ["explicit", "export.json", "implicit"]
    views = load_export(out)
    explicit, ids, meta = views["explicit"]
    implicit, implicit_ids, _ = views["implicit"]
    assert explicit.dtype == np.float32 and explicit.shape == (37, 32)
    assert implicit.dtype == np.float32 and implicit.shape == (37, 32)
    assert ids == sentences and implicit_ids == sentences
    assert (out / "explicit" / "ids.txt").read_text(encoding="utf-8").splitlines() == sentences
    assert meta["step"] == STEPS
    assert meta["normalized"] is False and meta["similarity"] == "cosine"
    assert meta["config"]["architecture"] == "cross"
    emb, _ = _params(uninterrupted)
    r = emb.encode(sentences, kind="explicit")
    u = emb.encode(sentences, kind="implicit")
    np.testing.assert_allclose(explicit, r, atol=1e-5)
    np.testing.assert_allclose(implicit, u, atol=1e-5)
    assert np.abs(r - u).max() > 1e-4  # not the same vector twice (nor swapped unnoticed)
    # Row order is input order, not the length-sorted batching order.
    r_rev = emb.encode(sentences[::-1], kind="explicit")
    np.testing.assert_allclose(r_rev[::-1], r, atol=1e-5)


def test_short_run_loads_encodes_and_exports(tmp_path, uninterrupted):
    """After a 3-step run (``workflows.train``, what ``dualcse-jax train`` calls): one
    unit-norm float32 row per text, and an export whose two views equal ``encode`` of the
    same texts."""
    from dualcse_jax import load, workflows
    from embedding_core.serving.export_reader import load_export

    workdir = uninterrupted
    model = load(workdir)
    assert model.step == STEPS and model.dim == 32
    one = model.encode(["a sentence"], batch_size=2, normalize=True, show_progress_bar=False)
    assert one.dtype == np.float32 and one.shape == (1, model.dim)
    np.testing.assert_allclose(np.linalg.norm(one, axis=1), 1.0, atol=1e-6)
    with pytest.raises(ValueError, match="text 1 is empty or whitespace only"):
        model.encode(["fine", "  "])
    # One string gives one row, as SentenceTransformer.encode does.
    np.testing.assert_array_equal(model.encode("a sentence", normalize=True), one[0])
    with pytest.raises(ValueError, match="kind"):
        model.encode(["fine"], kind="r")

    texts = ["a sentence", "The lawn was littered with toys.", "He kept his promise."]
    src = tmp_path / "in.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    for normalize in (False, True):
        out = tmp_path / f"export_{normalize}"
        workflows.export_workdir(workdir, str(src), str(out), normalize=normalize)
        assert sorted(p.name for p in out.iterdir()) == ["explicit", "export.json", "implicit"]
        views = load_export(out)
        for kind in ("explicit", "implicit"):
            assert sorted(p.name for p in (out / kind).iterdir()) == [
                "embeddings.npy", "ids.txt", "meta.json"]
            vectors, ids, meta = views[kind]
            assert ids == texts and vectors.dtype == np.float32
            assert {"model", "config", "step", "normalized", "similarity"} <= set(meta)
            assert meta["step"] == STEPS and meta["normalized"] is normalize
            want = model.encode(texts, kind=kind, normalize=normalize)
            np.testing.assert_allclose(vectors, want, atol=1e-5)
        assert np.abs(views["explicit"][0] - views["implicit"][0]).max() > 1e-4


@pytest.mark.parametrize("content,expect,through_cli", [
    # embedding_core.serving.serving.export reads --input for every model: a line is a 'text'.
    (b"A fine sentence.\n\nAnother.\n", ":2: field 'text': empty text", True),
    # The same path in this process: the CLI's one-line report is the case above.
    (b"ok\n\xff\xfe bad\n", ":2: field 'text': invalid UTF-8", False),
])
def test_export_bad_input_names_line_and_writes_nothing(tmp_path, uninterrupted, content, expect,
                                                        through_cli, cli):
    from data_pipelines.errors import DataError
    from dualcse_jax import workflows

    src = tmp_path / "in.txt"
    src.write_bytes(content)
    out = tmp_path / "export"
    if through_cli:
        res = _dualcse(cli, "export", f"--workdir={uninterrupted}", f"--input={src}",
                       f"--output={out}", check=False)
        assert res.returncode == 1
        assert expect in res.stderr and str(src) in res.stderr
        assert len(res.stderr.strip().splitlines()) == 1  # the whole report: no debug hint
        assert "Traceback" not in res.stderr
    else:
        with pytest.raises(DataError) as info:
            workflows.export_workdir(uninterrupted, str(src), str(out))
        assert expect in str(info.value) and str(src) in str(info.value)
    assert not out.exists()


@pytest.mark.mesh  # sets its own mesh shape
def test_train_rejects_indivisible_batch_before_compiling(tmp_path, tiny_bert_dir):
    from dualcse_jax.trainer import train

    config = default.get_config()
    config.update(dict(shared_runs.DUALCSE_TINY, model=str(tiny_bert_dir),
                       batch_size=12))  # 8 devices
    with pytest.raises(ValueError, match="batch_size=12 is not divisible by the "
                                         "data-parallel size 8"):
        train(config, tmp_path / "w")
    assert not (tmp_path / "w" / "checkpoints").exists()


def test_missing_model_path_is_a_clear_error(tmp_path, cli):
    res = _dualcse(cli, "train", f"--workdir={tmp_path / 'w'}", "--config.model=/no/such/model",
                   check=False)
    assert res.returncode == 1
    assert "dualcse-jax train: error: No model folder at '/no/such/model'" in res.stderr
    assert "Traceback" not in res.stderr  # the user's mistake, not a crash
    assert not (tmp_path / "w").exists()


def test_bad_training_csv_names_file_line_field(tmp_path, tiny_bert_dir, monkeypatch):
    """A broken INLI copy: the error names the file, the line and the column."""
    data = tmp_path / "data"
    (data / "inli").mkdir(parents=True)
    src = Path(__file__).resolve().parents[2] / "data" / "inli" / "train.csv"
    with open(src, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))[:20]
    rows[5][2] = ""  # the premise of the 5th data row, physical line 6 (no multi-line rows)
    with open(data / "inli" / "train.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)
    monkeypatch.setenv("EMBEDDING_JAX_DATA", str(data))
    from data_pipelines.errors import DataError
    from dualcse_jax.trainer import train

    config = default.get_config()
    config.update(dict(shared_runs.DUALCSE_TINY, model=str(tiny_bert_dir)))
    with pytest.raises(DataError, match=r"train\.csv:6: field 'premise'"):
        train(config, tmp_path / "w")


def test_rte_json_counts_rows_with_one_sentence_under_two_labels(dualcse_tiny_run, tmp_path,
                                                                 monkeypatch, capsys):
    import json

    from data_pipelines import inli
    from dualcse_jax import data, workflows

    uninterrupted = shared_runs.copy_run(dualcse_tiny_run, tmp_path / "run")  # eval/ written

    # Slices holding one conflicting row each: val row 9 and test row 571 (here row 6).
    val = inli.read_inli(inli.inli_split_path("val"))[:12]
    test = inli.read_inli(inli.inli_split_path("test"))[565:575]
    monkeypatch.setattr(data, "val_examples", lambda config: val)
    monkeypatch.setattr(data, "test_examples", lambda config: test)
    result = workflows.evaluate_workdir(uninterrupted, progress=False)
    saved = json.loads((uninterrupted / "eval" / "rte.json").read_text())
    both = [["implied", "contradiction"]]
    assert saved["label_conflicts"] == result["label_conflicts"] == {
        "val": {"rows": 1, "index": [9], "line": [11], "classes": both},
        "test": {"rows": 1, "index": [6], "line": [573], "classes": both}}
    assert {"explicit", "implied", "neutral", "contradiction", "average"} <= set(saved)
    assert "row 6 (line 573: implied = contradiction)" in capsys.readouterr().out


TEXTS = ["A man is playing a guitar.", "The lawn was littered with toys.", "He kept it."]


def test_load_needs_no_base_model(tmp_path, tiny_bert_dir, uninterrupted, monkeypatch):
    """The workdir keeps its encoder's HF config and tokenizer (``encoder/``): ``load``
    gives the same vectors with the base model unfindable. A workdir of the previous
    layout (run config in ``config.json``, no ``encoder/``) loads through the base model."""
    import shutil

    from dualcse_jax import load
    from embedding_core import configs
    from embedding_core.models import pretrained

    def encode(workdir):
        model = load(workdir)
        return [model.encode(TEXTS, kind=kind) for kind in ("explicit", "implicit")]

    copy = uninterrupted / pretrained.ENCODER_DIR
    for name in ("config.json", "tokenizer.json", "vocab.txt"):
        assert (copy / name).read_bytes() == (tiny_bert_dir / name).read_bytes(), name
    assert not (copy / "model.safetensors").exists()  # the checkpoint holds the weights
    installed = encode(uninterrupted)
    old = tmp_path / "old"
    shutil.copytree(uninterrupted, old, ignore=shutil.ignore_patterns(
        pretrained.ENCODER_DIR, "events.out.tfevents*", "eval"))
    (old / configs.CONFIG_FILE).rename(old / configs.LEGACY_CONFIG_FILE)
    for got, want in zip(encode(old), installed, strict=True):
        np.testing.assert_array_equal(got, want)

    def uninstalled(name):
        raise FileNotFoundError(f"No model folder at {str(name)!r} and no installed package")

    monkeypatch.setattr(pretrained, "resolve_model_dir", uninstalled)
    for got, want in zip(encode(uninterrupted), installed, strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(FileNotFoundError, match="encoder holds no encoder files .* and the "
                       "run's model: No model folder at"):
        encode(old)

