"""Token tables too large for one host, written once into ArrayRecord shards (``docs/data.md``)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from data_pipelines import shards
from data_pipelines.table import TokenTable
from embedding_core.storage import storage

RowSource = Callable[[np.ndarray], TokenTable]
"""``source rows [r] int64 -> TokenTable`` of those rows, in that order."""



@dataclasses.dataclass
class CorpusSource:
    """What ``preprocess`` writes, a chunk at a time (``rows``: any subset, any order; ``files``:
    extras; ``source``: the config fields kept in the manifest)."""

    fields: tuple[str, ...]
    max_length: int
    num_rows: int
    rows: RowSource
    tokenizer_json: bytes
    tokenizer: str
    pad_id: int
    files: Mapping[str, tuple[str, bytes]] = dataclasses.field(default_factory=dict)
    source: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    description: str = "tokenised training rows"


@contextlib.contextmanager
def _deterministic_examples():
    """Deterministic ``tf.train.Example`` bytes: a rebuilt corpus keeps its fingerprint."""
    from tensorflow_datasets.core import example_serializer

    cls = example_serializer.ExampleSerializer
    original = cls.serialize_example

    def serialize(self, example):
        return self.get_tf_example(example).SerializeToString(deterministic=True)

    cls.serialize_example = serialize
    try:
        yield
    finally:
        cls.serialize_example = original


def _check_output(output) -> None:
    if output.exists() and (not output.is_dir() or any(True for _ in output.iterdir())):
        raise FileExistsError(f"{os.fspath(output)} exists and is not an empty folder; "
                              "preprocess writes into a new or empty --output folder")


def write_corpus(source: CorpusSource, output: str | os.PathLike, *, num_shards: int,
                 chunk_rows: int = 4096, assignment_seed: int = 0) -> shards.Manifest:
    """Tokenises ``source`` into ``num_shards`` shards under ``output``, ``chunk_rows`` at a time
    (nothing left on error); ValueError: bad counts or chunk; FileExistsError: ``output`` in use."""
    import tensorflow_datasets as tfds

    from data_pipelines.tfds_builders import TokenizedCorpus
    from embedding_core.storage import files

    n, num_fields = int(source.num_rows), len(source.fields)
    if num_shards < 1 or n < num_shards:
        raise ValueError(f"--num_shards={num_shards}: need 1 <= shards <= rows ({n})")
    if chunk_rows < 1:
        raise ValueError(f"chunk_rows must be positive, got {chunk_rows}")
    out = storage.as_path(output)
    _check_output(out)
    assignment = np.random.default_rng(int(assignment_seed)).permutation(n)
    longest = np.zeros(num_fields, np.int64)

    def examples() -> Iterator[tuple[int, dict[str, Any]]]:
        for start in range(0, n, chunk_rows):
            rows = assignment[start:start + chunk_rows]
            table = source.rows(rows)
            if (table.field_names != tuple(source.fields) or table.max_len !=
                    source.max_length or table.num_examples != len(rows)):
                raise ValueError(
                    f"rows {start}..: got a table of {table.num_examples} rows, fields "
                    f"{table.field_names}, width {table.max_len}; expected {len(rows)}, "
                    f"{tuple(source.fields)}, {source.max_length}")
            np.maximum(longest, table.lengths.max(axis=0), out=longest)
            for j, row in enumerate(rows):
                lengths = table.lengths[j]
                yield start + j, {
                    "row": int(row),
                    "input_ids": np.concatenate(
                        [table.input_ids[j, f, :lengths[f]] for f in range(num_fields)]),
                    "token_type_ids": np.concatenate(
                        [table.token_type_ids[j, f, :lengths[f]] for f in range(num_fields)]),
                    "lengths": lengths,
                    "text_ids": table.text_ids[j],
                }

    local_parent = None if storage.is_remote(out) else os.fspath(out.parent)
    if local_parent is not None:
        os.makedirs(local_parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".preprocess-staging.", dir=local_parent)
    placed: list = []
    try:
        builder = TokenizedCorpus(examples=examples, description=source.description,
                                  data_dir=staging, file_format="array_record")
        tfds.disable_progress_bar()
        with _deterministic_examples():
            builder.download_and_prepare(
                download_config=tfds.download.DownloadConfig(num_shards=num_shards))
        split = builder.info.splits["train"]
        names, lengths = list(split.filenames), [int(x) for x in split.shard_lengths]
        if len(names) != num_shards or sum(lengths) != n:
            raise RuntimeError(f"tensorflow-datasets wrote {len(names)} shards of {lengths} "
                               f"rows, expected {num_shards} of {n} in all")
        built = builder.data_dir
        out.mkdir(parents=True, exist_ok=True)
        for child in sorted(os.listdir(built)):
            src = os.path.join(built, child)
            placed.append(out / child)
            if storage.is_remote(out):
                storage.upload(src, out / child)
            else:
                os.replace(src, os.fspath(out / child))
        for name, data in source.files.values():
            placed.append(out / name)
            files.write_bytes_atomic(out / name, data)
        manifest = shards.Manifest(
            folder=os.fspath(out), fields=tuple(source.fields),
            max_length=int(source.max_length), pad_id=int(source.pad_id),
            tokenizer_sha256=shards.file_sha256(source.tokenizer_json),
            tokenizer=source.tokenizer, num_rows=n,
            longest=tuple(int(x) for x in longest), assignment_seed=int(assignment_seed),
            shards=tuple(zip(names, lengths, strict=True)),
            files={role: name for role, (name, _) in source.files.items()},
            source=dict(source.source))
        files.write_json(out / shards.MANIFEST, manifest.to_json())
        return manifest
    except BaseException:  # no manifest: leave the folder as it was found
        for path in placed:
            try:
                path.unlink()
            except OSError:
                pass
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def table_rows(table: TokenTable) -> RowSource:
    """A :data:`RowSource` over an in-memory table."""

    def rows(index: np.ndarray) -> TokenTable:
        return dataclasses.replace(
            table, input_ids=table.input_ids[index], token_type_ids=table.token_type_ids[index],
            lengths=table.lengths[index], text_ids=table.text_ids[index])

    return rows


def tokenizer_files(model_dir: str | os.PathLike) -> tuple[bytes, int]:
    """``(tokenizer.json bytes, pad id)`` of a model folder; FileNotFoundError."""
    from data_pipelines.tokenization import load_tokenizer, pad_token_id, tokenizer_json_path

    return tokenizer_json_path(model_dir).read_bytes(), pad_token_id(load_tokenizer(model_dir))


def open_corpus(folder: str | os.PathLike, *, fields: Sequence[str], max_length: int,
                model_dir: str | os.PathLike, what: str = "--config.train_shards"
                ) -> shards.Manifest:
    """A corpus's manifest checked against the run (``what`` names it); FileNotFoundError,
    ValueError."""
    manifest = shards.read_manifest(folder)
    tokenizer_json, _ = tokenizer_files(model_dir)
    manifest.check(fields=fields, max_length=max_length,
                   tokenizer_sha256=shards.file_sha256(tokenizer_json), what=what)
    return manifest


def epoch_steps(source: TokenTable | shards.Manifest, global_batch_size: int) -> int:
    """Steps in one epoch of an in-memory table or a sharded corpus."""
    if isinstance(source, shards.Manifest):
        return source.order(global_batch_size, 0).steps_per_epoch
    from data_pipelines.pipeline import steps_per_epoch

    return steps_per_epoch(source.num_examples, global_batch_size)


def source_rows(manifest: shards.Manifest, step: int, *, global_batch_size: int, seed: int
                ) -> np.ndarray:
    """[B] int64 source-table rows of the global batch of ``step`` (from the manifest alone)."""
    order = manifest.order(global_batch_size, seed)
    members = manifest.members()
    return np.concatenate([members[k][order.positions(step, k)]
                           for k in range(manifest.num_shards)])
