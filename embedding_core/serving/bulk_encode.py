"""``embedding-jax encode``: text files into one export, block by block over devices and
hosts, resumable (``docs/models.md``, "Bulk encoding"): ``OUTPUT/_blocks/encode.json``
(the settings) and ``OUTPUT/_blocks/<i>.npz`` (rows ``[i * block_rows, ...)``)."""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import numpy as np

from embedding_core.distributed import arguments
from embedding_core.errors import DataError
from embedding_core.storage import storage
from embedding_core.storage.files import write_bytes_atomic

BLOCKS = "_blocks"
SETTINGS_FILE = "encode.json"


def input_files(pattern: str) -> list[str]:
    """The files of a path or glob, sorted. Raises FileNotFoundError, IsADirectoryError,
    ValueError (a recursive ``**`` glob)."""
    path = storage.as_path(pattern)
    if path.is_dir():
        raise IsADirectoryError(f"--input={pattern} is a folder, not a file; give a file or "
                                f"a glob of its files, such as --input='{pattern.rstrip('/')}"
                                "/*.txt'")
    if path.is_file():  # a file whose name holds [ ] * ?
        return [str(path)]
    if "**" in pattern:
        raise ValueError(f"--input={pattern}: a recursive '**' glob is not read; give one "
                         "'*' per folder level (such as DIR/*/*.txt)")
    if any(c in pattern for c in "*?["):
        parent = storage.as_path(pattern.rsplit("/", 1)[0]) if "/" in pattern else \
            storage.as_path(".")
        files = sorted(str(p) for p in parent.glob(pattern.rsplit("/", 1)[-1]) if p.is_file())
    else:
        files = [str(path)] if path.is_file() else []
    if not files:
        raise FileNotFoundError(f"--input={pattern}: no such file")
    return files


def texts(files: Sequence[str], field: str | None) -> Iterator[tuple[str, str]]:
    """``(FILE:LINE, text)`` of every line (JSON Lines with ``field``), strict UTF-8.

    Raises: DataError: invalid UTF-8, a NUL byte, a carriage return inside a plain-text
    line, an empty text, bad JSON or a missing field."""
    for name in files:
        with storage.as_path(name).open("rb") as f:
            for number, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8").rstrip("\r\n")
                except UnicodeDecodeError as err:
                    raise DataError(name, number, None, f"invalid UTF-8 ({err.reason})") from None
                if number == 1:
                    line = line.removeprefix("\ufeff")
                if "\x00" in line:
                    raise DataError(name, number, None, "holds a NUL byte (\\x00) at character "
                                    f"{line.index(chr(0)) + 1}: the file is binary, UTF-16 or "
                                    "damaged (UTF-8 text is read)")
                if "\r" in line and not field:
                    raise DataError(name, number, None, "a carriage return inside the line (one "
                                    "text a line, lines end with \\n or \\r\\n)")
                if field:
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise DataError(name, number, None, f"invalid JSON ({err.msg})") from None
                    if not isinstance(record, dict) or not isinstance(record.get(field), str):
                        raise DataError(name, number, field, "missing or not a string")
                    line = record[field]
                if not line.strip():
                    raise DataError(name, number, field, "empty text")
                yield f"{name}:{number}", line


def count_rows(pattern: str, files: Sequence[str], field: str | None) -> int:
    """The rows of ``files``, each checked. Raises DataError: as :func:`texts`; no row."""
    rows = sum(1 for _ in texts(files, field))
    if not rows:
        if len(files) == 1:
            raise DataError(files[0], None, field, "no text in the file")
        raise DataError(f"--input={pattern}", None, field,
                        f"no text in any of its {len(files)} files")
    return rows


def _blocks(rows: Iterator[tuple[str, str]], block_rows: int
            ) -> Iterator[tuple[int, list[str], list[str]]]:
    ids: list[str] = []
    values: list[str] = []
    index = 0
    for row_id, text in rows:
        ids.append(row_id)
        values.append(text)
        if len(ids) == block_rows:
            yield index, ids, values
            ids, values, index = [], [], index + 1
    if ids:
        yield index, ids, values


def settings(args: argparse.Namespace, files: Sequence[str]) -> dict[str, Any]:
    """What a run encodes; a re-run must match it to reuse blocks. Inputs are keyed by size
    and content hash: a same-size rewrite with its old mtime (``touch -r``, ``cp -p``) differs."""
    stats = [[name, int(storage.as_path(name).stat().length), storage.content_hash(name)]
             for name in files]
    return {"inputs": stats, "field": args.field, "model": args.model,
            "block_rows": args.block_rows, "normalize": args.normalize,
            "max_seq_length": args.max_seq_length, "prompt": args.prompt}


def _save_block(path, ids: list[str], vectors: np.ndarray) -> None:
    buf = io.BytesIO()
    np.savez(buf, vectors=vectors, ids=np.array(ids))
    write_bytes_atomic(path, buf.getvalue())


class Progress:
    """This process's rows done of ``total`` (``done`` kept from before): a tqdm bar on a
    terminal, else a line at each tenth and at least every ``interval`` seconds."""

    def __init__(self, total: int, done: int, *, stream: TextIO | None = None,
                 bar: bool | None = None, prefix: str = "encode", interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.total, self.kept, self.done, self.prefix = total, done, done, prefix
        self.interval, self.clock = interval, clock
        self.start = self.last = clock()
        self.next_step = 1
        self.bar = None
        if self.stream.isatty() if bar is None else bar:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, initial=done, desc=prefix, unit=" sentences",
                            file=self.stream, dynamic_ncols=True)
        else:
            self._line(f"{done:,}/{total:,} rows ({done:,} in blocks kept from before)")

    def _line(self, text: str) -> None:
        print(f"{self.prefix}: {text}", file=self.stream, flush=True)

    def update(self, rows: int) -> None:
        self.done += rows
        if self.bar is not None:
            self.bar.update(rows)
            return
        now = self.clock()
        todo = max(self.total - self.kept, 1)
        step = (self.done - self.kept) * 10 // todo
        if step >= self.next_step or now - self.last >= self.interval:
            self.next_step = step + 1
            self.last = now
            seconds = max(now - self.start, 1e-9)
            rate = (self.done - self.kept) / seconds
            left = f", about {(self.total - self.done) / rate:.0f} s left" \
                if rate > 0 and self.done < self.total else ""
            self._line(f"{self.done:,}/{self.total:,} rows ({100 * self.done / self.total:.0f}%)"
                       f", {rate:.1f} sentences/s, {seconds:.0f} s{left}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def encode_files(args: argparse.Namespace, stream: TextIO | None = None) -> dict[str, Any]:
    """Encodes ``args.input`` into ``args.output``; returns this process's ``{"rows",
    "blocks", "skipped", "encoded", "seconds", "finished_before"}``.

    Raises: FileNotFoundError, DataError, ValueError: bad input, other settings."""
    import jax

    from embedding_core.distributed import multihost
    from embedding_core.serving import export, inference, quantize
    from embedding_core.serving.st_models import load_encoder

    precision = quantize.check_precision(getattr(args, "precision", "float32"),
                                         allow_float=True)
    calibration = getattr(args, "calibration", None)
    if calibration and precision not in quantize.SCALAR:
        raise ValueError(f"--calibration sets int8/uint8 ranges; --precision={precision} has "
                         "none")
    files = input_files(args.input)
    out = storage.as_path(args.output)
    blocks_dir = out / BLOCKS
    wanted = settings(args, files)
    saved_file = blocks_dir / SETTINGS_FILE
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"--output={args.output} is a file; give a folder (new, or "
                                 "one this command encoded into before)")
    finished = (out / export.META_FILENAME).exists()
    claimed = False  # encode.json holds `wanted`
    if saved_file.exists():
        saved = json.loads(saved_file.read_text())
        claimed = saved == wanted
        if not claimed and (finished or any(blocks_dir.glob("*.npz"))):
            changed = sorted(k for k in wanted if saved.get(k) != wanted[k])
            raise ValueError(f"{storage.display(out)} holds blocks of another encode ({changed} "
                             "differ); use a new --output or the same inputs and flags")
    if finished:  # nothing to redo, if it is this encode's export
        meta = json.loads((out / export.META_FILENAME).read_text())
        if meta.get("config") != wanted:
            done = meta.get("config") if isinstance(meta.get("config"), dict) else {}
            changed = sorted(k for k in wanted if done.get(k) != wanted[k])
            raise ValueError(f"{storage.display(out)} holds the export of another encode or "
                             f"run ({changed} differ); use a new --output or the same inputs "
                             "and flags")
        if meta.get("precision", "float32") != precision:
            raise ValueError(f"{storage.display(out)} holds the export of --precision="
                             f"{meta.get('precision', 'float32')}, not {precision}; use a new "
                             "--output")
        stored = str(meta.get("calibration") or "")
        if precision in quantize.SCALAR and (
                (storage.display(calibration) not in stored) if calibration else
                stored != quantize.OWN_RANGES):
            raise ValueError(f"{storage.display(out)} holds codes with ranges {stored}, not "
                             f"{'--calibration=' + calibration if calibration else 'its own'}; "
                             "use a new --output")
        rows = int(meta["num_rows"])
        return {"rows": rows, "blocks": -(-rows // args.block_rows), "skipped": 0,
                "encoded": 0, "seconds": 0.0, "finished_before": True}
    total = count_rows(args.input, files, args.field)
    encoder = load_encoder(args.model)
    if args.max_seq_length:
        encoder.max_seq_length = args.max_seq_length
    encoder.use_local_devices()
    ranges = what = None
    if calibration:  # checked before the encoding, not after it
        ranges, what = quantize.load_calibration(calibration, encoder.dim)
    process, count = jax.process_index(), jax.process_count()
    num_blocks = -(-total // args.block_rows)
    mine = range(process, num_blocks, count)  # every count-th block is this process's
    kept = {i for i in mine if (blocks_dir / f"{i:06d}.npz").exists()}

    def rows_of(blocks) -> int:
        return sum(min(args.block_rows, total - i * args.block_rows) for i in blocks)

    progress = Progress(rows_of(mine), rows_of(kept), stream=stream,
                        bar=None if multihost.is_primary() else False,
                        prefix="encode" if count == 1 else f"encode [process {process}]")
    encoded = 0
    t0 = time.time()
    reported = 0

    def batch_done(rows: int) -> None:
        nonlocal reported
        reported += rows
        progress.update(rows)

    for index, ids, values in _blocks(texts(files, args.field), args.block_rows):
        if index % count != process or index in kept:
            continue
        path = blocks_dir / f"{index:06d}.npz"
        reported = 0
        with inference.on_batch_done(batch_done):
            vectors = encoder.encode(values, batch_size=args.batch_size, prompt=args.prompt,
                                     normalize_embeddings=args.normalize)
        if len(ids) > reported:  # an encoder whose batches are not reported
            progress.update(len(ids) - reported)
        if not claimed:
            write_bytes_atomic(saved_file, json.dumps(wanted, indent=1).encode())
            claimed = True
        _save_block(path, ids, vectors)
        encoded += len(ids)
        print(f"block {index} done ({len(ids)} rows)", file=progress.stream, flush=True)
    progress.close()
    if count > 1:  # every block written before process 0 assembles them
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices("embedding_jax_encode_blocks")
    if multihost.is_primary():
        meta = {"model": args.model, "config": wanted, "step": None,
                "normalized": bool(args.normalize), "similarity": encoder.similarity_fn_name
                if encoder.similarity_fn_name in export.SIMILARITIES else "cosine"}
        if precision == "float32":
            export.export_view(out, _read_blocks(blocks_dir, num_blocks), num_rows=total,
                               dim=encoder.dim, meta=meta, split=False)
        else:  # the float blocks stay in _blocks, as they do for a float export
            quantize.write_quantized(out, lambda: _read_blocks(blocks_dir, num_blocks), total,
                                     encoder.dim, precision, meta, ranges, what)
    return {"rows": total, "blocks": num_blocks, "skipped": len(kept), "encoded": encoded,
            "seconds": time.time() - t0, "finished_before": False}


def _read_blocks(blocks_dir, num_blocks: int) -> Iterator[tuple[list[str], np.ndarray]]:
    for index in range(num_blocks):
        with (blocks_dir / f"{index:06d}.npz").open("rb") as f:
            with np.load(io.BytesIO(f.read())) as z:
                yield [str(i) for i in z["ids"]], np.asarray(z["vectors"], np.float32)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="embedding-jax encode",
        description="Encode text files with any pretrained encoder (hub id, folder, gs://, "
                    "installed package) into the numpy export layout; resumable: re-run "
                    "the same command after a stop and finished blocks are kept.")
    p.add_argument("--model", required=True, help="hub id org/name[@revision], local or "
                   "gs:// folder, or installed package")
    p.add_argument("--input", required=True, help="a file or glob (local or gs://): one text "
                   "per line, or JSON Lines with --field")
    p.add_argument("--output", required=True, help="export folder (local or gs://)")
    p.add_argument("--field", default=None, help="JSON Lines: the field holding the text")
    p.add_argument("--batch_size", type=int, default=256, help="texts per encoder call")
    p.add_argument("--block_rows", type=int, default=100_000,
                   help="rows per resumable block (one file each)")
    p.add_argument("--normalize", action="store_true", help="unit-length rows")
    p.add_argument("--max_seq_length", type=int, default=0,
                   help="tokens per text (0: the model's own)")
    p.add_argument("--prompt", default=None, help="text prepended to every input")
    p.add_argument("--precision", default="float32",
                   help="float32, or codes: int8, uint8, binary, ubinary (docs/quantization.md)")
    p.add_argument("--calibration", default=None,
                   help="int8/uint8 ranges from a .npy of float embeddings or an export "
                        "(default: the encoded rows themselves)")
    arguments.add_coordinator_arguments(p, "")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.batch_size < 1 or args.block_rows < 1:
        print("error: --batch_size and --block_rows must be >= 1", file=sys.stderr)
        return 2
    arguments.initialize_from_arguments(args)
    try:
        done = encode_files(args)
    except (OSError, ValueError) as err:
        print(f"embedding-jax encode: error: {err}", file=sys.stderr)
        return 1
    if done["finished_before"]:
        print(f"{args.output} is already complete: {done['rows']:,} rows encoded before, "
              "nothing to do (delete it, or give a new --output, to encode again)",
              file=sys.stderr)
        return 0
    print(f"encoded {done['encoded']:,} rows ({done['skipped']} block(s) kept from before) "
          f"of {done['rows']:,} in {done['seconds']:.1f} s into {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":  # python -m embedding_core.serving.bulk_encode encode ...
    sys.exit(main(sys.argv[2:] if sys.argv[1:2] == ["encode"] else sys.argv[1:]))
