"""Sharded corpora: preprocess into 8 shards, stream per host, same batches as in memory.

The reference for every streamed batch is the in-memory token table of the same config
(``dualcse_jax.data.train_table``), its rows picked by the order of docs/data.md
("Sharded corpora") recomputed here from the definition.
"""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import numpy as np
import pytest

from data_pipelines import pipeline, sharded_corpus, shards

HERE = Path(__file__).parent
NUM_SHARDS, BATCH, SEED, STEPS = 8, 16, 5, 5
ROWS = 168  # 21 a shard: B/S = 2 rows of each shard a step, 10 steps an epoch


def overrides(model_dir) -> dict:
    return {"model": str(model_dir), "architecture": "cross", "max_length": 32,
            "batch_size": BATCH, "seed": SEED, "max_train_examples": ROWS,
            "pad_multiple": 8, "learning_rate": 1e-3, "log_every": 1,
            "checkpoint_every": 100}


def _config(model_dir, **extra):
    from dualcse_jax.configs import default

    config = default.get_config()
    config.update({**overrides(model_dir), **extra})
    return config


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, tiny_bert_dir):
    """(folder, manifest, in-memory table) of DualCSE-cross INLI rows, 8 shards."""
    return build_corpus(tmp_path_factory.mktemp("sharded") / "corpus", tiny_bert_dir)


def build_corpus(folder: Path, tiny_bert_dir: Path):
    """Preprocesses the DualCSE-cross INLI rows into 8 shards under ``folder``: (folder,
    manifest, in-memory table); also the two-process run's corpus (tests/two_processes.py)."""
    from data_pipelines.preprocess import run_preprocess
    from dualcse_jax import data

    config = _config(tiny_bert_dir)
    source = data.corpus_source(config)  # data.train_table(config, tokenizer) inside
    manifest = run_preprocess("dualcse-jax", lambda c: source, config, str(folder),
                              NUM_SHARDS, chunk_rows=50)
    # The in-memory path's table (tokenising INLI train once more would cost seconds).
    table = source.rows(np.arange(ROWS))
    return folder, manifest, table


def _definition_rows(manifest: shards.Manifest, step: int) -> np.ndarray:
    """Source rows of the global batch of ``step``, written out from docs/data.md."""
    assignment = np.random.default_rng(0).permutation(manifest.num_rows)
    m = BATCH // NUM_SHARDS
    spe = min(manifest.shard_rows) // m
    epoch, b = divmod(step, spe)
    rows, start = [], 0
    for k, n in enumerate(manifest.shard_rows):
        members = assignment[start:start + n]
        start += n
        rows.append(members[np.random.default_rng([SEED, epoch, k]).permutation(n)
                            [b * m:(b + 1) * m]])
    return np.concatenate(rows)


def _streamed(config, manifest, start=0, steps=STEPS):
    from dualcse_jax import data

    return list(itertools.islice(data.batch_factory(config, manifest)(start), steps))


def _assert_batches_equal(got, want):
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert sorted(a) == sorted(b)
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_preprocess_writes_shards_and_manifest(corpus, tiny_bert_dir):
    folder, manifest, table = corpus
    from dualcse_jax import tables as dualcse_data

    names = sorted(os.listdir(folder))
    shard_files = [n for n in names if ".array_record-" in n]
    assert len(shard_files) == NUM_SHARDS and "manifest.json" in names
    saved = json.loads((folder / "manifest.json").read_text())
    assert saved["fields"] == list(dualcse_data.FIELDS["cross"])
    assert saved["max_length"] == 32 and saved["num_rows"] == ROWS
    assert [s["rows"] for s in saved["shards"]] == [ROWS // NUM_SHARDS] * NUM_SHARDS
    assert saved["longest"] == table.lengths.max(axis=0).tolist()
    assert saved["tokenizer_sha256"] == shards.file_sha256(
        (tiny_bert_dir / "tokenizer.json").read_bytes())
    # The folder is a TFDS dataset too: its record i of shard k is row members[k][i].
    import tensorflow_datasets as tfds

    source = tfds.builder_from_directory(str(folder)).as_data_source("train")
    members = manifest.members()
    record = source[ROWS // NUM_SHARDS + 3]  # shard 1, record 3
    row = int(members[1][3])
    assert int(record["row"]) == row
    n = table.lengths[row]
    np.testing.assert_array_equal(
        record["input_ids"], np.concatenate([table.input_ids[row, f, :n[f]]
                                             for f in range(len(n))]))


def test_streamed_batches_follow_the_order_and_equal_the_table(corpus, tiny_bert_dir):
    folder, manifest, table = corpus
    from dualcse_jax import tables as dualcse_data

    config = _config(tiny_bert_dir, train_shards=str(folder))
    streamed = _streamed(config, manifest)
    groups = dualcse_data.length_groups("cross")
    for step, batch in enumerate(streamed):
        assert int(batch["step"]) == step
        rows = _definition_rows(manifest, step)
        np.testing.assert_array_equal(
            sharded_corpus.source_rows(manifest, step, global_batch_size=BATCH, seed=SEED),
            rows)
        np.testing.assert_array_equal(batch["text_ids"], table.text_ids[rows])
        for g, fields in enumerate(groups):
            length = batch[f"input_ids_{g}"].shape[-1]
            # One padded length per group for the run: the corpus's longest, rounded to 8.
            assert length == min(-(-table.lengths[:, fields].max() // 8) * 8, 32)
            want = table.input_ids[rows][:, fields, :length]
            np.testing.assert_array_equal(batch[f"input_ids_{g}"], want)
            np.testing.assert_array_equal(batch[f"token_type_ids_{g}"],
                                          table.token_type_ids[rows][:, fields, :length])
            np.testing.assert_array_equal(batch[f"attention_mask_{g}"].sum(-1),
                                          table.lengths[rows][:, fields])
    # The in-memory path given the shards' rows yields the very same batches.
    in_memory = list(pipeline.make_batches(
        table, global_batch_size=BATCH, seed=SEED, num_steps=STEPS, pad_multiple=8,
        length_groups=groups, shards=manifest.members()))
    _assert_batches_equal(streamed, in_memory)


def test_resume_continues_the_uninterrupted_order(corpus, tiny_bert_dir):
    folder, manifest, _ = corpus
    config = _config(tiny_bert_dir, train_shards=str(folder))
    whole = _streamed(config, manifest, 0, 13)  # epoch 0 is steps 0-9
    _assert_batches_equal(_streamed(config, manifest, 8, 5), whole[8:])
    epoch0 = np.concatenate([sharded_corpus.source_rows(manifest, s, global_batch_size=BATCH,
                                                        seed=SEED) for s in range(10)])
    assert len(set(epoch0.tolist())) == 160  # no row twice in an epoch (1 a shard left out)


def test_settings_and_layouts_that_cannot_work_are_refused(corpus, tiny_bert_dir, tmp_path):
    folder, manifest, table = corpus
    from dualcse_jax import data

    config = _config(tiny_bert_dir, train_shards=str(folder), max_length=48)
    with pytest.raises(ValueError, match=r"manifest.json: field 'max_length': the corpus "
                                         r"has 32, the config needs 48"):
        data.train_rows(config, None, tiny_bert_dir)
    config = _config(tiny_bert_dir, train_shards=str(folder), architecture="bi")
    with pytest.raises(ValueError, match="field 'fields'"):
        data.train_rows(config, None, tiny_bert_dir)
    with pytest.raises(ValueError, match="not divisible by the 3 processes"):
        pipeline.make_batches(manifest, global_batch_size=24, seed=0,
                                    process_index=0, process_count=3)
    with pytest.raises(ValueError, match="multiple of the corpus's 8 shards"):
        pipeline.make_batches(manifest, global_batch_size=12, seed=0)
    source = sharded_corpus.CorpusSource(
        fields=table.field_names, max_length=table.max_len, num_rows=table.num_examples,
        rows=sharded_corpus.table_rows(table), tokenizer_json=b"{}", tokenizer="t", pad_id=0)
    with pytest.raises(FileExistsError, match="not an empty folder"):
        sharded_corpus.write_corpus(source, folder, num_shards=2)
    with pytest.raises(ValueError, match="need 1 <= shards <= rows"):
        sharded_corpus.write_corpus(source, tmp_path / "new", num_shards=ROWS + 1)
    assert not (tmp_path / "new").exists()

    def failing(index):
        if index.min() < 10:  # a later chunk of the assignment order
            from data_pipelines.errors import DataError

            raise DataError("train.csv", 12, "premise", "NUL byte")
        return sharded_corpus.table_rows(table)(index)

    broken = sharded_corpus.CorpusSource(**{**vars(source), "rows": failing})
    with pytest.raises(ValueError, match="train.csv:12: field 'premise': NUL byte"):
        sharded_corpus.write_corpus(broken, tmp_path / "bad", num_shards=2, chunk_rows=40)
    assert not (tmp_path / "bad").exists()
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".preprocess-staging")]
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "tokenized_corpus-train.array_record-00000-of-00002").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="no manifest: an unfinished preprocess"):
        shards.read_manifest(tmp_path / "half")


@pytest.mark.slow
def test_two_processes_train_on_their_own_shards(corpus, two_processes):
    """2 processes x 4 CPU devices train 5 steps on the shards (the shared two-process
    run): each opens only its 4 shard files, and their host batches side by side are the
    in-memory global batches."""
    folder, manifest, table = corpus
    root = two_processes.root / "sharded"
    hosts = [dict(np.load(root / f"host_{pid}.npz")) for pid in range(2)]
    shard_names = [name for name, _ in manifest.shards]
    for pid, host in enumerate(hosts):
        assert int(host["process_index"]) == pid and int(host["local_devices"]) == 4
        assert host["open_files"].tolist() == shard_names[4 * pid:4 * pid + 4]
    from dualcse_jax import tables as dualcse_data

    in_memory = list(pipeline.make_batches(
        table, global_batch_size=BATCH, seed=SEED, num_steps=STEPS, pad_multiple=8,
        length_groups=dualcse_data.length_groups("cross"), shards=manifest.members()))
    for step, want in enumerate(in_memory):
        for key, value in want.items():
            if key == "step":
                continue
            got = np.concatenate([host[f"step_{step}_{key}"] for host in hosts])
            np.testing.assert_array_equal(got, value, err_msg=f"step {step} {key}")
    assert (root / "run" / "checkpoints").is_dir()


def test_docent_preprocess_and_train_task_stream_the_shards(tmp_path, tiny_bert_dir,
                                                           monkeypatch):
    """docent-jax's preprocess keeps the entities and queries beside the shards; its
    training task reads them from there (no sentence loaded) and streams the table's rows."""
    from data_pipelines.preprocess import run_preprocess
    from docent_jax import data as docent_data
    from docent_jax import trainer
    from docent_jax.configs import default
    from embedding_core.distributed import parallel

    words = ["river", "castle", "music", "engine", "forest"]
    tiny = docent_data.EntityData(
        [f"Entity_{w}" for w in words], words,
        [(e, f"the {w} number {k} is described here") for k in range(8)
         for e, w in enumerate(words)],
        [(f"which one has a {w}?", (e,)) for e, w in enumerate(words)], "tiny corpus")
    monkeypatch.setattr(docent_data, "load_data", lambda config: tiny)
    config = default.get_config()
    config.update({"model": str(tiny_bert_dir), "max_length": 16, "batch_size": 16,
                   "seed": SEED, "pad_multiple": 8, "eval_every": 0})
    folder = tmp_path / "docent_corpus"
    manifest = run_preprocess("docent-jax", docent_data.corpus_source, config, str(folder),
                              NUM_SHARDS)
    assert manifest.fields == ("sentence",) and manifest.num_rows == 40

    monkeypatch.setattr(docent_data, "load_data", lambda config: pytest.fail("data loaded"))
    config.train_shards = str(folder)
    data, source = docent_data.training_data(config, tiny_bert_dir)
    assert source == manifest and data.sentences == []
    assert data.entity_ids == tiny.entity_ids and data.entity_names == tiny.entity_names
    assert data.queries == tiny.queries
    task = trainer.build_task(config, parallel.make_mesh())
    assert task.steps_per_epoch == 2 and task.num_examples == 40  # 5 rows a shard, 2 a step
    table = docent_data.entity_sentence_table(tiny.sentences, 5, tiny_bert_dir, 16)
    for step, batch in enumerate(itertools.islice(task.make_batches(0), STEPS)):
        rows = _definition_rows(manifest, step)  # 3 epochs: 2 steps each
        np.testing.assert_array_equal(batch["entity_ids"], table.text_ids[rows, 0])
        length = batch["input_ids"].shape[-1]
        np.testing.assert_array_equal(batch["input_ids"], table.input_ids[rows][:, :, :length])
        np.testing.assert_array_equal(batch["attention_mask"].sum(-1), table.lengths[rows])


def test_gs_corpus_host_copies_only_its_shards(corpus, gcs_emulator, tmp_path, monkeypatch):
    """preprocess into gs://, stream host 1 of 2: the same batches as the table in memory,
    and only shards 2 and 3 are fetched into the host's cache."""
    _, _, table = corpus
    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path / "cache"))
    source = sharded_corpus.CorpusSource(
        fields=table.field_names, max_length=table.max_len, num_rows=table.num_examples,
        rows=sharded_corpus.table_rows(table), tokenizer_json=b"{}", tokenizer="t", pad_id=0)
    uri = "gs://test-bucket/sharded/corpus"
    sharded_corpus.write_corpus(source, uri, num_shards=4)
    manifest = shards.read_manifest(uri)
    assert manifest.folder == uri and manifest.shard_rows == (42, 42, 42, 42)
    kw = dict(global_batch_size=BATCH, seed=SEED, num_steps=3, process_index=1,
              process_count=2, pad_multiple=8)
    _assert_batches_equal(list(pipeline.make_batches(manifest, **kw)),
                          list(pipeline.make_batches(table, shards=manifest.members(), **kw)))
    copied = sorted(os.listdir(tmp_path / "cache" / "gcs" / "test-bucket" / "sharded" /
                               "corpus"))
    assert copied == [manifest.shards[2][0], manifest.shards[3][0]]


@pytest.fixture(scope="module")
def tiny_corpus(tmp_path_factory):
    """A 2-shard corpus of 64 random rows (no tokenizer: write_corpus alone)."""
    from data_pipelines.table import TokenTable

    n, f, width = 64, 2, 8
    rng = np.random.default_rng(0)
    table = TokenTable(
        input_ids=rng.integers(1, 100, (n, f, width)).astype(np.int32),
        token_type_ids=np.zeros((n, f, width), np.int32),
        lengths=rng.integers(1, width + 1, (n, f)).astype(np.int32),
        text_ids=np.arange(n * f, dtype=np.int32).reshape(n, f), field_names=("a", "b"))
    source = sharded_corpus.CorpusSource(
        fields=table.field_names, max_length=width, num_rows=n,
        rows=sharded_corpus.table_rows(table), tokenizer_json=b"{}", tokenizer="t", pad_id=0)
    folder = tmp_path_factory.mktemp("tiny") / "corpus"
    sharded_corpus.write_corpus(source, folder, num_shards=2)
    return folder


def _flip(offset):
    def damage(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[offset:offset + 16] = bytes(b ^ 0xFF for b in data[offset:offset + 16])
        path.write_bytes(bytes(data))  # same size, other bytes
    return damage


@pytest.mark.parametrize(("damage", "reason"), [
    (Path.unlink, "shard file missing: the corpus folder was changed after preprocess"),
    # In the first data chunk: found when a batch reads its records.
    (_flip(200), "shard file damaged (Corrupted Riegeli/records file: chunk data hash"),
    # The block header of the record index: found when the file is opened.
    (_flip(65536), "0 records, the manifest says 32: the shard file is damaged"),
], ids=["missing", "chunk", "index"])
def test_missing_or_damaged_shard_is_one_line_naming_it(tiny_corpus, tmp_path, damage,
                                                        reason):
    import shutil

    from data_pipelines.errors import DataError

    folder = tmp_path / "corpus"
    shutil.copytree(tiny_corpus, folder)
    manifest = shards.read_manifest(folder)
    shard = Path(manifest.shard_path(0))
    damage(shard)
    with pytest.raises(DataError) as info:
        list(itertools.islice(pipeline.make_batches(manifest, global_batch_size=4,
                                                          seed=0), 16))
    assert str(info.value).startswith(f"{shard}: {reason}")
    assert "\n" not in str(info.value)
