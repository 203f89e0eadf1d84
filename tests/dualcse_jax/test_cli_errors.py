"""User mistakes give one clear message (file / field named), no traceback, no output."""

from __future__ import annotations

import json

import pytest

from data_pipelines.errors import DataError
from dualcse_jax import workflows
from dualcse_jax.configs import default
from dualcse_jax.inference import read_config


@pytest.fixture
def _cli(cli):
    """``dualcse-jax ARGS`` in this process and, in the slow tier, as a child process."""
    return lambda *args: cli("dualcse_jax.main", *args)


@pytest.mark.parametrize("args,expect", [
    (["train", "--config.architecture=foo"],
     "config.architecture='foo': use one of ('cross', 'bi', 'simcse')"),
    (["train", "--config.nope=1"], "error: config has no field 'nope'\n"),
    (["train", "--config.temperatur=1"],
     "config has no field 'temperatur' (did you mean 'temperature'?)"),
    (["train", "--config=/no/such/config.py"], "--config=/no/such/config.py: no such file"),
])
def test_train_settings(tmp_path, args, expect, _cli):
    workdir = tmp_path / "w"
    proc = _cli(*args, f"--workdir={workdir}")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert expect in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not workdir.exists()


def test_workdir_that_is_a_file(tmp_path, _cli):
    taken = tmp_path / "taken"
    taken.write_text("keep me")
    proc = _cli("train", f"--workdir={taken}")
    assert proc.returncode == 1
    assert f"--workdir {taken} exists and is not a folder" in proc.stderr
    assert taken.read_text() == "keep me"


def test_export_input_folder_and_output_file(tmp_path, _cli):
    out_file = tmp_path / "taken"
    out_file.write_text("keep me")
    proc = _cli("export", f"--workdir={tmp_path}", f"--input={tmp_path}",
                f"--output={tmp_path / 'out'}")
    assert proc.returncode == 1 and f"--input {tmp_path} is not a file" in proc.stderr
    (tmp_path / "in.txt").write_text("A sentence.\n")
    proc = _cli("export", f"--workdir={tmp_path}", f"--input={tmp_path / 'in.txt'}",
                f"--output={out_file}")
    assert proc.returncode == 1 and f"--output {out_file} exists and is not a folder" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert out_file.read_text() == "keep me" and not (tmp_path / "out").exists()


@pytest.mark.parametrize("content,expect", [
    ('{"model": "x", ', "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    (json.dumps({"model": "x", "pooling": "mean", "max_length": 8, "dtype": "float32"}),
     "missing config fields ['architecture']"),
    (json.dumps(dict(default.get_config().to_dict(), pooling="foo")),
     "config.pooling='foo'"),
])
@pytest.mark.parametrize("name", ["run_config.json", "config.json"])  # config.json: old runs
def test_damaged_config_json_names_the_file(tmp_path, content, expect, name):
    (tmp_path / name).write_text(content)
    with pytest.raises(ValueError, match=f"/{name}: ") as info:
        read_config(tmp_path)
    assert expect in str(info.value)


def test_eis_data_is_checked_before_the_rte_pass(tmp_path):
    # The workdir does not exist either: the --eis_data check must come first, before any
    # model is loaded or sentence encoded.
    with pytest.raises(FileNotFoundError, match="--eis_data .*nosuch.csv does not exist"):
        workflows.evaluate_workdir(tmp_path / "nowhere", eis_data=str(tmp_path / "nosuch.csv"))
    header_only = tmp_path / "few.csv"
    header_only.write_text("pos_implicit,pos_explicit,neg_implicit,neg_explicit\n")
    with pytest.raises(DataError, match="few.csv: 0 records after the header"):
        workflows.evaluate_workdir(tmp_path / "nowhere", eis_data=str(header_only))


def test_train_set_smaller_than_a_batch_writes_nothing(tmp_path, tiny_bert_dir):
    from dualcse_jax.trainer import train

    config = default.get_config()
    config.update(model=str(tiny_bert_dir), max_length=32, batch_size=8, max_train_examples=4)
    with pytest.raises(ValueError, match="4 examples, fewer than one batch"):
        train(config, tmp_path / "w")
    assert not (tmp_path / "w").exists()


def test_usage_and_help(_cli):
    proc = _cli()
    assert proc.returncode == 1
    assert "{train|evaluate|export|export-hf|demo|preprocess|config} --workdir=DIR" in \
        proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 2  # a usage line, not the whole help
    proc = _cli("--help")
    assert proc.returncode == 0
    assert "--workdir: Training directory" in proc.stdout and "--num_train_steps" in proc.stdout
    assert "--num_shards: preprocess: shard files to write" in proc.stdout
    assert "75 preempted by SIGTERM (checkpoint saved" in proc.stdout
    assert "run the same command to resume); 130 Ctrl-C" in " ".join(proc.stdout.split())
    assert "config    lists every field of --config" in proc.stdout
    assert "export-hf writes the trained encoder as Hugging Face" in proc.stdout


def test_config_command_lists_fields_with_values_and_comments(_cli):
    proc = _cli("config", "--config=dualcse_jax/configs/cross_cpu.py", "--config.batch_size=32")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# dualcse_jax/configs/cross_cpu.py: override any field")
    rows = {line.split(" = ")[0]: line for line in lines[1:]}
    assert sorted(rows) == sorted(default.get_config().keys())
    # The command line's value, the preset's value, each with its declared help.
    assert rows["batch_size"].startswith("batch_size = 32 ")
    assert rows["batch_size"].endswith("# global batch, premises (64 cross / 32 bi in the paper)")
    assert rows["pooling"].split() == ["pooling", "=", "'mean'", "#", "cls", "|", "cls_mlp", "|",
                                       "mean;", "the", "same", "head", "at", "training", "and",
                                       "evaluation"]
    assert "contradiction[, neutral]; simcse: anchor" in rows["train_file"]


def test_unknown_field_in_a_python_config_is_refused_and_nothing_written(tmp_path):
    import dualcse_jax
    from embedding_core.fields import unknown_field_message

    config = default.get_config()
    config.batch_sz = 3
    with pytest.raises(ValueError) as info:
        dualcse_jax.train(config, tmp_path / "w")
    assert str(info.value) == unknown_field_message("batch_sz", default.FIELDS)
    assert "did you mean 'batch_size'?" in str(info.value)
    assert not (tmp_path / "w").exists()


def test_a_run_saved_before_loss_chunk_size_loads_with_its_default(tmp_path):
    saved = default.get_config().to_dict()
    del saved["loss_chunk_size"]
    saved["contrastive_chunk_size"] = 4  # GradCache chunks only: the loss is not chunked
    saved["a_field_since_dropped"] = 1  # the saved run is the truth: kept, not refused
    (tmp_path / "run_config.json").write_text(json.dumps(saved))
    config = read_config(tmp_path)
    assert config.loss_chunk_size == 0 and config.contrastive_chunk_size == 4
    assert config.a_field_since_dropped == 1
    assert default.FIELDS.resumable("loss_chunk_size")
