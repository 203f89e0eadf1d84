"""Token tables too large for one host: written once into shards, streamed per host.

:func:`write_corpus` tokenises a source chunk by chunk and writes its rows through the
tensorflow-datasets builder ``tfds_builders.TokenizedCorpus`` as ArrayRecord shards (only
the real tokens are stored), then moves them into the output folder (local or ``gs://``)
and writes ``manifest.json`` last. The folder is also a TFDS dataset:
``tfds.builder_from_directory(folder)`` reads it.

:func:`make_batches` streams a host's share of every global batch from that folder: host p
opens only its own shards (``shards.host_shards``), reads the records of each step by index
(ArrayRecord is random access) and pads them; the order and padding are the contract of
:mod:`data_pipelines.shards`, a pure function of (seed, step), so a resumed run continues
exactly and any number of hosts yields the same global batches. Per host, memory holds
the batches in flight, one permutation per owned shard (8 bytes a row) and ArrayRecord's
record index; never the token table.

``gs://`` shards are copied to the local cache once per host (only its own shards), since
ArrayRecord reads local files.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from data_pipelines import shards
from data_pipelines.errors import DataError
from data_pipelines.table import TokenTable

RowSource = Callable[[np.ndarray], TokenTable]
"""``source rows [r] int64 -> TokenTable`` of those rows, in that order."""

_READ_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"  # ArrayRecord's random-access setting


@dataclasses.dataclass
class CorpusSource:
    """What ``preprocess`` writes: a token table that is built a chunk at a time.

    Attributes:
      fields: F field names (the table's F axis).
      max_length: the width every chunk is tokenised to.
      num_rows: n, the source's rows.
      rows: builds the rows it is given (any subset, any order); row i must be the same
        whatever chunk it comes in (text identities included).
      tokenizer_json: the bytes of the tokenizer.json used (its sha256 is recorded).
      tokenizer: where that tokenizer came from, for messages.
      pad_id: the tokenizer's pad id.
      files: ``{role: (file name, bytes)}`` extra files of the package (e.g. entity ids).
      source: the config fields that shaped the rows, kept in the manifest.
      description: one line for the TFDS dataset info.
    """

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


def _check_output(output) -> None:
    if output.exists() and (not output.is_dir() or any(True for _ in output.iterdir())):
        raise FileExistsError(f"{os.fspath(output)} exists and is not an empty folder; "
                              "preprocess writes into a new or empty --output folder")


def write_corpus(source: CorpusSource, output: str | os.PathLike, *, num_shards: int,
                 chunk_rows: int = 4096, assignment_seed: int = 0) -> shards.Manifest:
    """Tokenises ``source`` once into ``num_shards`` ArrayRecord shards under ``output``.

    Rows are assigned to shards by ``default_rng(assignment_seed).permutation(n)`` (see
    :mod:`data_pipelines.shards`); ``source.rows`` is called on chunks of at most
    ``chunk_rows`` rows of that order, so the whole token table is never held. The TFDS
    builder stages the files in a local temporary folder; they are then moved (or uploaded,
    for ``gs://``) into ``output``, extra files next, ``manifest.json`` last. On any error
    nothing is left in ``output`` (files already placed are removed) and the staging
    folder is deleted.

    Args:
      source: the rows (see :class:`CorpusSource`).
      output: a new or empty folder, local or ``gs://``.
      num_shards: S >= 1; choose a multiple of the number of training hosts (each host
        reads S/P whole shards).
      chunk_rows: rows tokenised at a time.
      assignment_seed: seed of the row-to-shard assignment.

    Returns:
      The :class:`~data_pipelines.shards.Manifest` written.

    Raises:
      ValueError: ``num_shards`` < 1 or more shards than rows, ``chunk_rows`` < 1, or a
        chunk that does not match ``source`` (fields, width, row count).
      FileExistsError: ``output`` is a file or a folder that is not empty.
    """
    import tensorflow_datasets as tfds

    from data_pipelines.tfds_builders import TokenizedCorpus
    from embedding_core import files, storage

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
    except BaseException:
        # No manifest was written, so the folder is no corpus; leave it as it was found.
        for path in placed:
            try:
                path.unlink()
            except OSError:
                pass
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def table_rows(table: TokenTable) -> RowSource:
    """A :data:`RowSource` over an in-memory table (rows gathered by index)."""

    def rows(index: np.ndarray) -> TokenTable:
        return dataclasses.replace(
            table, input_ids=table.input_ids[index], token_type_ids=table.token_type_ids[index],
            lengths=table.lengths[index], text_ids=table.text_ids[index])

    return rows


def tokenizer_files(model_dir: str | os.PathLike) -> tuple[bytes, int]:
    """``(tokenizer.json bytes, pad id)`` of a model folder, for a :class:`CorpusSource`
    and for :func:`open_corpus`'s check.

    Raises:
      FileNotFoundError: no tokenizer.json there.
    """
    from data_pipelines.tokenization import load_tokenizer, pad_token_id, tokenizer_json_path

    return (tokenizer_json_path(model_dir).read_bytes(),
            pad_token_id(load_tokenizer(model_dir)))


def open_corpus(folder: str | os.PathLike, *, fields: Sequence[str], max_length: int,
                model_dir: str | os.PathLike, what: str = "--config.train_shards"
                ) -> shards.Manifest:
    """The manifest of a corpus a run trains on, checked against the run's settings.

    Args:
      folder: the corpus folder (local or ``gs://``).
      fields, max_length: what the run's model reads.
      model_dir: the run's model folder; its tokenizer.json must be the corpus's.
      what: how the user named the folder, for messages.

    Raises:
      FileNotFoundError: no corpus there.
      ValueError: a malformed manifest, or one written for other fields, width or tokenizer
        (the manifest file and the field are named).
    """
    manifest = shards.read_manifest(folder)
    tokenizer_json, _ = tokenizer_files(model_dir)
    manifest.check(fields=fields, max_length=max_length,
                   tokenizer_sha256=shards.file_sha256(tokenizer_json), what=what)
    return manifest


def epoch_steps(source: TokenTable | shards.Manifest, global_batch_size: int) -> int:
    """Steps in one epoch of an in-memory table (``pipeline.steps_per_epoch``) or of a
    sharded corpus (``shards.ShardOrder.steps_per_epoch``).

    Raises:
      ValueError: no full batch can be formed (see either).
    """
    if isinstance(source, shards.Manifest):
        return source.order(global_batch_size, 0).steps_per_epoch
    from data_pipelines.pipeline import steps_per_epoch

    return steps_per_epoch(source.num_examples, global_batch_size)


def batches_of(source: TokenTable | shards.Manifest, **kwargs: Any
               ) -> Iterator[dict[str, np.ndarray]]:
    """``pipeline.make_batches`` for an in-memory table, :func:`make_batches` (streamed
    from the shard files) for a corpus manifest; the same arguments and batch layout."""
    if isinstance(source, shards.Manifest):
        return make_batches(source, **kwargs)
    from data_pipelines.pipeline import make_batches as table_batches

    return table_batches(source, **kwargs)


# ----------------------------------------------------------------------------- reading


class _ShardReader:
    """Random access to the records of one shard file (a local copy for ``gs://``).

    Faults name the shard file in one line (:class:`~data_pipelines.errors.DataError`):
    a missing file, or one that ArrayRecord/Riegeli cannot read (bytes changed since
    preprocess wrote it), which only a new preprocess repairs.
    """

    def __init__(self, path: str, expected_rows: int) -> None:
        from array_record.python.array_record_module import ArrayRecordReader

        from embedding_core import storage

        self.path = path
        if not storage.as_path(path).exists():
            raise DataError(path, None, None, "shard file missing: the corpus folder was "
                            "changed after preprocess; re-run preprocess")
        local = storage.local_copy(path)
        try:
            self._reader = ArrayRecordReader(os.fspath(local), _READ_OPTIONS)
            found = self._reader.num_records()
        except Exception as err:  # noqa: BLE001 - Riegeli raises RuntimeError/ValueError/...
            raise self._damaged(err) from None
        if found != expected_rows:
            raise DataError(path, None, None, f"{found} records, the manifest says "
                            f"{expected_rows}: the shard file is damaged or was replaced "
                            "after preprocess; re-run preprocess")

    def _damaged(self, err: BaseException) -> DataError:
        detail = " ".join(str(err).split())
        return DataError(self.path, None, None, f"shard file damaged ({detail}); re-run "
                         "preprocess to write the corpus again")

    def read(self, positions: np.ndarray) -> list[bytes]:
        try:
            return self._reader.read([int(i) for i in positions])
        except Exception as err:  # noqa: BLE001 - Riegeli's hash mismatch is a RuntimeError
            raise self._damaged(err) from None


class _StreamBatcher:
    """Numpy side of the streaming pipeline: this host's slice of step s (thread-safe)."""

    def __init__(self, manifest: shards.Manifest, order: shards.ShardOrder,
                 owned: range, groups: Sequence[Sequence[int]], lengths: Sequence[int]
                 ) -> None:
        from data_pipelines.tfds_builders import tokenized_corpus_features

        self.manifest, self.order, self.owned = manifest, order, owned
        self.groups = [list(g) for g in groups]
        self.lengths = list(lengths)
        self.features = tokenized_corpus_features()
        self.readers = {k: _ShardReader(manifest.shard_path(k), manifest.shard_rows[k])
                        for k in owned}
        self._cache: dict = {}
        self._lock = threading.Lock()

    def records(self, step: int) -> list[dict[str, np.ndarray]]:
        """The decoded records of this host's rows of ``step``, in batch order."""
        out = []
        with self._lock:
            for k in self.owned:
                positions = self.order.positions(step, k, self._cache)
                for raw in self.readers[k].read(positions):
                    out.append(self.features.deserialize_example_np(raw))
        return out

    def __call__(self, step: np.int64) -> tuple[np.ndarray, ...]:
        records = self.records(int(step))
        m = self.manifest
        num_fields, b = len(m.fields), len(records)
        row_lengths = np.stack([r["lengths"] for r in records]).astype(np.int32)
        offsets = np.concatenate([np.zeros((b, 1), np.int64), np.cumsum(row_lengths, 1)], 1)
        out = []
        for fields, length in zip(self.groups, self.lengths, strict=True):
            ids = np.full((b, len(fields), length), m.pad_id, np.int32)
            types = np.zeros((b, len(fields), length), np.int32)
            for i, record in enumerate(records):
                for j, f in enumerate(fields):
                    lo, n = offsets[i, f], row_lengths[i, f]
                    ids[i, j, :n] = record["input_ids"][lo:lo + n]
                    types[i, j, :n] = record["token_type_ids"][lo:lo + n]
            lens = row_lengths[:, fields]
            mask = (np.arange(length, dtype=np.int32) < lens[:, :, None]).astype(np.int32)
            out += [ids, mask, types]
        text_ids = np.stack([r["text_ids"] for r in records]).astype(np.int32)
        if text_ids.shape != (b, num_fields):
            raise ValueError(f"{m.folder}: a record has {text_ids.shape[1]} text ids for "
                             f"{num_fields} fields")
        return (*out, text_ids)


def source_rows(manifest: shards.Manifest, step: int, *, global_batch_size: int, seed: int
                ) -> np.ndarray:
    """[B] int64 source-table rows of the global batch of ``step`` (the contract of
    :mod:`data_pipelines.shards`, from the manifest alone; reads no shard)."""
    order = manifest.order(global_batch_size, seed)
    members = manifest.members()
    return np.concatenate([members[k][order.positions(step, k)]
                           for k in range(manifest.num_shards)])


def make_batches(
    manifest: shards.Manifest,
    *,
    global_batch_size: int,
    seed: int,
    start_step: int = 0,
    num_steps: int | None = None,
    process_index: int = 0,
    process_count: int = 1,
    pad_multiple: int = 16,
    fixed_length: int | None = None,
    prefetch: int = 2,
    length_groups: Sequence[Sequence[int]] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Streams this host's slice of each global batch of a sharded corpus, from
    ``start_step`` on; the arguments and the yielded dicts are those of
    ``data_pipelines.pipeline.make_batches``, with the sharded order and padding.

    Args:
      manifest: the corpus (``shards.read_manifest(folder)``).
      global_batch_size: B, a multiple of the number of shards S.
      seed, start_step, num_steps, prefetch, length_groups: as for the in-memory path.
      process_index, process_count: host p of P; ``S % P == 0``, host p opens only shards
        ``[p*S/P, (p+1)*S/P)`` (their files stay open while the iterator lives).
      pad_multiple: each length group is padded to its longest sequence over the corpus
        (``manifest.longest``) rounded up to this multiple, capped at ``max_length``: one
        shape per group for the whole run.
      fixed_length: if given, every group is padded to exactly this length instead.

    Yields:
      ``input_ids``, ``attention_mask``, ``token_type_ids`` [B/P, F, L] int32 (or per group
      ``*_g`` [B/P, F_g, L_g] with ``length_groups``), ``text_ids`` [B/P, F] int32 and
      ``step`` (int64 scalar).

    Raises:
      ValueError: B not a multiple of S or of P, S not a multiple of P, a shard with fewer
        than B/S rows, process_index out of range, negative start_step or num_steps,
        pad_multiple < 1, fixed_length outside [longest, max_length], length_groups not a
        partition of the fields.
      DataError: a shard file missing, or damaged (unreadable, or a record count that
        differs from the manifest), named in one line; a damaged record deep in a shard is
        found when a batch reads it.
    """
    # Imported here: the pipeline module loads TensorFlow (and hides the accelerators from it).
    from data_pipelines.pipeline import field_groups, step_batches

    owned = shards.host_shards(manifest.num_shards, process_index, process_count)
    if global_batch_size % process_count:
        raise ValueError(f"global_batch_size={global_batch_size} is not divisible by "
                         f"process_count={process_count}")
    order = manifest.order(global_batch_size, seed)
    if start_step < 0 or (num_steps is not None and num_steps < 0):
        raise ValueError(f"start_step={start_step} and num_steps={num_steps} must be >= 0")
    if pad_multiple < 1:
        raise ValueError(f"pad_multiple must be positive, got {pad_multiple}")
    num_fields = len(manifest.fields)
    groups = field_groups(num_fields, length_groups)
    if fixed_length is not None:
        longest = max(manifest.longest)
        if not longest <= fixed_length <= manifest.max_length:
            raise ValueError(f"fixed_length={fixed_length} must lie in [{longest}, "
                             f"{manifest.max_length}]: the corpus's longest sequence and the "
                             "stored width")
        lengths = [int(fixed_length)] * len(groups)
    else:
        lengths = shards.group_lengths(manifest.longest, groups, pad_multiple,
                                       manifest.max_length)
    batcher = _StreamBatcher(manifest, order, owned, groups, lengths)
    return step_batches(batcher, groups=groups, lengths=lengths,
                        local_batch=global_batch_size // process_count, num_fields=num_fields,
                        grouped=length_groups is not None, start_step=start_step,
                        num_steps=num_steps, prefetch=prefetch)
