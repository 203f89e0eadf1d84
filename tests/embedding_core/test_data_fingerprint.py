"""A resume on changed training data is refused (and accepted on purpose); a target step
below the saved one is an error; the fingerprint itself, by hand."""

from __future__ import annotations

import hashlib
import json
import os

import ml_collections
import pytest

from embedding_core import configs
from embedding_core.fields import Field
from embedding_core.training import data_fingerprint
from embedding_core.training.run import run
from tests.embedding_core.test_run import _config, _make_task

FIELDS = configs.declare(batch_size=Field(8), train_file=Field("", data=True),
                         notes=Field("", "not data"))
VALIDATE = configs.validator(FIELDS)


def _data_config(train_file, **kw) -> ml_collections.ConfigDict:
    config = FIELDS.config()
    config.update(_config().to_dict())
    config.train_file = str(train_file)
    config.update(kw)
    return config


def test_fingerprint_hashes_files_and_folders_and_reuses_known_hashes(tmp_path, monkeypatch):
    monkeypatch.setattr(data_fingerprint, "RACY_S", 0.0)  # files written just now count
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "b.txt").write_bytes(b"bb")
    (tmp_path / "d" / "a.txt").write_bytes(b"a")
    (tmp_path / "d" / ".DS_Store").write_bytes(b"not data")
    (tmp_path / "f.txt").write_bytes(b"hello\n")
    config = ml_collections.ConfigDict({"x": f"{tmp_path}/f.txt, {tmp_path}/d", "y": ""})
    fields = FIELDS.extend(x=Field("", data=True), y=Field("", data=True))
    assert data_fingerprint.data_fields(config, fields) == ["x"]
    got = data_fingerprint.fingerprint(config, ["x"])["x"]
    assert list(got) == [f"{tmp_path}/f.txt", f"{tmp_path}/d/a.txt", f"{tmp_path}/d/b.txt"]
    assert got[f"{tmp_path}/f.txt"]["size"] == 6
    assert got[f"{tmp_path}/f.txt"]["hash"] == "sha256:" + hashlib.sha256(b"hello\n").hexdigest()
    # Size and stamp as recorded: the recorded hash is trusted, the file not read.
    known = {"x": {k: {**v, "hash": "sha256:recorded"} for k, v in got.items()}}
    again = data_fingerprint.fingerprint(config, ["x"], known=known)["x"]
    assert {v["hash"] for v in again.values()} == {"sha256:recorded"}
    # A record of an older version (no stamp) is never trusted: hashed again.
    old = {"x": {k: {"size": v["size"], "mtime": v["mtime"], "hash": "sha256:recorded"}
                 for k, v in got.items()}}
    assert data_fingerprint.fingerprint(config, ["x"], known=old)["x"] == got


def test_a_file_changed_within_the_racy_window_is_hashed_again(tmp_path):
    f = tmp_path / "t.csv"
    f.write_text("a,b\n")  # its ctime is now: another write in this tick would keep it
    config = ml_collections.ConfigDict({"train_file": str(f)})
    first = data_fingerprint.fingerprint(config, ["train_file"])
    assert first["train_file"][str(f)]["stamp"] is None
    known = {"train_file": {str(f): {**first["train_file"][str(f)], "hash": "sha256:old"}}}
    again = data_fingerprint.fingerprint(config, ["train_file"], known=known)
    assert again["train_file"][str(f)]["hash"] == first["train_file"][str(f)]["hash"]


def _touch_r(path, text: str, stat) -> None:
    path.write_text(text)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _cp_p(path, text: str, stat) -> None:
    import shutil

    source = path.with_name("backup.csv")
    _touch_r(source, text, stat)
    shutil.copy2(source, path)  # cp -p: the bytes and the source's mtime, same inode


def _rsync_t(path, text: str, stat) -> None:
    aside = path.with_name(f".{path.name}.tmp")
    _touch_r(aside, text, stat)
    os.replace(aside, path)  # rsync -t: a new file with the old mtime, renamed over


@pytest.mark.parametrize("rewrite", [_touch_r, _cp_p, _rsync_t])
def test_a_same_size_rewrite_with_the_old_mtime_is_refused(tmp_path, monkeypatch, rewrite):
    monkeypatch.setattr(data_fingerprint, "RACY_S", 0.0)  # the stamp alone must tell
    data = tmp_path / "pairs.csv"
    data.write_text("premise,hypothesis\nab,cd\n")
    workdir = tmp_path / "run"
    run(_make_task([]), _data_config(data), workdir, validate=VALIDATE, stop_after=2)
    before = (workdir / data_fingerprint.FILE).read_text()
    stat = os.stat(data)
    rewrite(data, "hypothesis,premise\ncd,ab\n", stat)  # two columns swapped
    assert (os.stat(data).st_size, os.stat(data).st_mtime_ns) == (stat.st_size,
                                                                   stat.st_mtime_ns)
    with pytest.raises(data_fingerprint.DataChangedError) as err:
        run(_make_task([]), _data_config(data), workdir, validate=VALIDATE)
    assert str(err.value).startswith(
        f"config.train_file: {data} changed (same size, other content) since the run in "
        f"{workdir} last started: resuming at step 2 would")
    assert (workdir / data_fingerprint.FILE).read_text() == before
    assert json.loads(before)["train_file"][str(data)]["hash"] == "sha256:" + hashlib.sha256(
        b"premise,hypothesis\nab,cd\n").hexdigest()


def test_changes_name_the_field_and_file_and_ignore_a_touch(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text("abc\n")
    config = ml_collections.ConfigDict({"train_file": str(f)})
    first = data_fingerprint.fingerprint(config, ["train_file"])
    os.utime(f, (1, 1))  # touched: other mtime, same bytes
    touched = data_fingerprint.fingerprint(config, ["train_file"], known=first)
    assert data_fingerprint.changes(first, touched) == []
    f.write_text("abd\n")  # same size, other content
    assert data_fingerprint.changes(first, data_fingerprint.fingerprint(
        config, ["train_file"], known=first)) == [
        f"config.train_file: {f} changed (same size, other content)"]
    f.write_text("abc\nmore\n")
    assert data_fingerprint.changes(first, data_fingerprint.fingerprint(
        config, ["train_file"])) == [f"config.train_file: {f} changed (4 -> 9 bytes)"]


def test_a_missing_data_file_names_the_field(tmp_path):
    config = ml_collections.ConfigDict({"train_file": f"{tmp_path}/nope.jsonl"})
    with pytest.raises(FileNotFoundError, match=r"^config.train_file: .*nope.jsonl does not "
                       "exist$"):
        data_fingerprint.fingerprint(config, ["train_file"])


def test_a_broken_link_a_link_loop_or_a_fifo_under_a_data_folder_names_the_field(tmp_path):
    """Were 'd/dangling does not exist' (no field) and 'd/loop/loop/.../a.txt does not
    exist' after 40 levels."""
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "a.txt").write_text("a\n")
    config = ml_collections.ConfigDict({"train_file": str(folder)})
    (folder / "dangling").symlink_to(tmp_path / "gone.txt")
    with pytest.raises(FileNotFoundError) as err:
        data_fingerprint.fingerprint(config, ["train_file"])
    assert str(err.value) == (f"config.train_file: {folder}/dangling is a broken symbolic "
                              f"link (to {tmp_path}/gone.txt); remove it or restore its target")
    (folder / "dangling").unlink()
    (folder / "loop").symlink_to(folder)
    with pytest.raises(ValueError) as err:
        data_fingerprint.fingerprint(config, ["train_file"])
    assert str(err.value) == (f"config.train_file: {folder}/loop is a link to "
                              f"{os.path.realpath(folder)}, a folder it is in: a loop; remove "
                              "the link")
    (folder / "loop").unlink()
    (folder / "sub").symlink_to(tmp_path, target_is_directory=True)  # a link to a parent
    with pytest.raises(ValueError, match="a folder it is in: a loop"):
        data_fingerprint.fingerprint(config, ["train_file"])
    (folder / "sub").unlink()
    os.mkfifo(folder / "pipe")  # hashing it would wait for a writer forever
    with pytest.raises(ValueError) as err:
        data_fingerprint.fingerprint(config, ["train_file"])
    assert str(err.value) == (f"config.train_file: {folder}/pipe is not a regular file (a FIFO, "
                              "socket or device); a data folder holds data files only")
    (folder / "pipe").unlink()
    assert list(data_fingerprint.fingerprint(config, ["train_file"])["train_file"]) == [
        f"{folder}/a.txt"]


def test_resume_on_edited_data_is_refused_and_the_flag_accepts_it(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text('{"text": "a"}\n')
    workdir = tmp_path / "run"
    run(_make_task([]), _data_config(data), workdir, validate=VALIDATE, stop_after=4)
    saved = json.loads((workdir / data_fingerprint.FILE).read_text())
    assert saved["train_file"][str(data)]["size"] == 14
    with data.open("a") as f:
        f.write('{"text": "b"}\n')
    with pytest.raises(data_fingerprint.DataChangedError) as err:
        run(_make_task([]), _data_config(data), workdir, validate=VALIDATE)
    message = str(err.value)
    assert message.startswith(f"config.train_file: {data} changed (14 -> 28 bytes) since the "
                              f"run in {workdir} last started: resuming at step 4")
    assert "--config.resume_changed_data=true" in message and "\n" not in message
    # A field that is not data may name a file and change freely (not fingerprinted).
    state = run(_make_task([]), _data_config(data, resume_changed_data=True), workdir,
                validate=VALIDATE)
    assert int(state.step) == 12
    # The new data is now the run's own: a plain resume (nothing left to do) passes.
    again = json.loads((workdir / data_fingerprint.FILE).read_text())
    assert again["train_file"][str(data)]["size"] == 28
    run(_make_task([]), _data_config(data), workdir, validate=VALIDATE)


def test_a_target_below_the_saved_step_is_an_error(tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_text("x\n")
    run(_make_task([]), _data_config(data), tmp_path / "run", validate=VALIDATE, stop_after=8)
    with pytest.raises(ValueError, match=r"is trained to step 8, past the 6 steps this "
                       "config asks for"):
        run(_make_task([]), _data_config(data, num_train_steps=6), tmp_path / "run",
            validate=VALIDATE)
    # Equal to the saved step: a finished run, nothing to do, no error.
    state = run(_make_task([]), _data_config(data, num_train_steps=8), tmp_path / "run",
                validate=VALIDATE)
    assert int(state.step) == 8


def test_a_damaged_fingerprint_is_one_line_with_the_way_out(tmp_path):
    path = tmp_path / data_fingerprint.FILE
    for text in ('{"train_file": "x"}', '{"train_file": {"/a.csv": "x"}}', '{"train'):
        path.write_text(text)
        with pytest.raises(ValueError, match="delete it to record the data as it is now, or "
                           "use a new --workdir$"):
            data_fingerprint.read(path)


def test_a_symlinked_data_file_keeps_its_name_and_is_checked_by_content(tmp_path, monkeypatch):
    from embedding_core.storage.storage import absolute_data_paths

    (tmp_path / "v1.csv").write_text("a\n")
    (tmp_path / "v2.csv").write_text("a\n")
    (tmp_path / "current.csv").symlink_to("v1.csv")
    monkeypatch.chdir(tmp_path)
    config = absolute_data_paths(ml_collections.ConfigDict({"train_file": "current.csv"}),
                                 ["train_file"])
    assert config.train_file == str(tmp_path / "current.csv")
    first = data_fingerprint.fingerprint(config, ["train_file"])
    (tmp_path / "current.csv").unlink()
    (tmp_path / "current.csv").symlink_to("v2.csv")  # the same bytes: unchanged
    assert data_fingerprint.changes(first, data_fingerprint.fingerprint(
        config, ["train_file"], known=first)) == []


def test_changed_data_accepted_with_a_target_below_the_saved_step_is_the_error_alone(
        tmp_path, caplog):
    data = tmp_path / "train.jsonl"
    data.write_text("x\n")
    workdir = tmp_path / "run"
    run(_make_task([]), _data_config(data), workdir, validate=VALIDATE, stop_after=8)
    data.write_text("x\ny\n")
    with caplog.at_level("WARNING"), pytest.raises(ValueError, match="is trained to step 8, "
                                                   "past the 6 steps"):
        run(_make_task([]), _data_config(data, num_train_steps=6, resume_changed_data=True),
            workdir, validate=VALIDATE)
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []
    # A target above it: the warning, naming the file, then the run goes on.
    caplog.clear()
    with caplog.at_level("WARNING"):
        state = run(_make_task([]), _data_config(data, num_train_steps=10,
                                                 resume_changed_data=True),
                    workdir, validate=VALIDATE)
    assert int(state.step) == 10
    assert f"config.train_file: {data} changed (2 -> 4 bytes); resuming at step 8 with the " \
        "new data (resume_changed_data)" in [r.getMessage() for r in caplog.records]
