"""A tokenised corpus in shard files: its manifest, order contract and per-host reader (no
TensorFlow at import), for ``sharded_corpus`` and ``pipeline.make_batches`` (docs/data.md):

* Rows: ``a = default_rng(assignment_seed).permutation(n)`` cut into S contiguous runs.
* Order: with ``m = B // S``, step s of ``steps_per_epoch = min_k n_k // m`` takes shard
  k's positions ``[b*m, (b+1)*m)`` of ``default_rng([seed, e, k]).permutation(n_k)``.
* Hosts: host p of P owns shards ``[p*S/P, (p+1)*S/P)`` = rows ``[p*B/P, (p+1)*B/P)``.
* Padding: group g pads to ``min(round_up(max longest[f in g], pad_multiple), max_length)``."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from data_pipelines.errors import DataError
from embedding_core.storage import storage

MANIFEST = "manifest.json"
FORMAT = "embedding_jax/sharded-corpus"
VERSION = 1


def round_up(x: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``x``."""
    return -(-int(x) // int(multiple)) * int(multiple)


def group_lengths(longest: Sequence[int], groups: Sequence[Sequence[int]], pad_multiple: int,
                  max_length: int) -> list[int]:
    """The padded length (>= 1) of each length group (module docstring, "Padding")."""
    return [min(round_up(max(max(int(longest[f]) for f in g), 1), pad_multiple), max_length)
            for g in groups]


def host_shards(num_shards: int, process_index: int, process_count: int) -> range:
    """Host ``process_index``'s shards; ValueError: a bad index, shards not divisible by hosts."""
    if process_count < 1 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index={process_index} must lie in [0, {process_count})")
    if num_shards % process_count:
        raise ValueError(f"the corpus has {num_shards} shards, not divisible by the "
                         f"{process_count} processes; preprocess again with --num_shards a "
                         f"multiple of {process_count}")
    per = num_shards // process_count
    return range(process_index * per, (process_index + 1) * per)


@dataclasses.dataclass(frozen=True)
class ShardOrder:
    """A sharded corpus's global batches; ValueError: B not a multiple of S, a shard under B/S
    rows."""

    shard_rows: tuple[int, ...]
    global_batch_size: int
    seed: int

    def __post_init__(self) -> None:
        s, b = len(self.shard_rows), int(self.global_batch_size)
        if s < 1:
            raise ValueError("a sharded corpus needs at least one shard")
        if b < 1 or b % s:
            raise ValueError(f"global_batch_size={b} must be a positive multiple of the "
                             f"corpus's {s} shards (each step takes B/S rows of every shard)")
        if min(self.shard_rows) < b // s:
            raise ValueError(f"global_batch_size={b} needs {b // s} rows from each of the {s} "
                             f"shards, but the smallest has {min(self.shard_rows)}; lower the "
                             "batch size or preprocess into fewer shards")

    @property
    def per_shard(self) -> int:
        """m = B / S, rows of every shard in one global batch."""
        return int(self.global_batch_size) // len(self.shard_rows)

    @property
    def steps_per_epoch(self) -> int:
        """``min_k n_k // m``: full global batches in one epoch."""
        return min(self.shard_rows) // self.per_shard

    def positions(self, step: int, shard: int, cache: dict | None = None) -> np.ndarray:
        """[m] int64 records of ``shard`` in ``step``'s batch (``cache``: the epoch's
        permutations)."""
        epoch, b = divmod(int(step), self.steps_per_epoch)
        key = (epoch, shard)
        perm = None if cache is None else cache.get(key)
        if perm is None:
            perm = np.random.default_rng([int(self.seed), epoch, int(shard)]).permutation(
                int(self.shard_rows[shard]))
            if cache is not None:
                for old in [k for k in cache if k[1] == shard]:
                    del cache[old]
                cache[key] = perm
        m = self.per_shard
        return perm[b * m:(b + 1) * m]


def shard_members(num_rows: int, shard_rows: Sequence[int], assignment_seed: int
                  ) -> list[np.ndarray]:
    """Source rows of each shard in record order; ValueError: sizes not adding up."""
    if sum(int(n) for n in shard_rows) != int(num_rows) or min(shard_rows) < 0:
        raise ValueError(f"shard sizes {list(shard_rows)} do not add up to {num_rows} rows")
    assignment = np.random.default_rng(int(assignment_seed)).permutation(int(num_rows))
    bounds = np.cumsum([0, *[int(n) for n in shard_rows]])
    return [assignment[bounds[k]:bounds[k + 1]] for k in range(len(shard_rows))]


def file_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclasses.dataclass(frozen=True)
class Manifest:
    """``manifest.json`` of a corpus folder (``folder`` not stored; ``shards``: ``(file, rows)``;
    ``files``: role -> file; ``source``: the producing config fields)."""

    folder: str
    fields: tuple[str, ...]
    max_length: int
    pad_id: int
    tokenizer_sha256: str
    tokenizer: str
    num_rows: int
    longest: tuple[int, ...]
    assignment_seed: int
    shards: tuple[tuple[str, int], ...]
    files: Mapping[str, str]
    source: Mapping[str, Any]

    @property
    def path(self) -> str:
        return _join(self.folder, MANIFEST)

    @property
    def num_shards(self) -> int:
        return len(self.shards)

    @property
    def num_examples(self) -> int:
        """n, as ``TokenTable.num_examples``."""
        return self.num_rows

    @property
    def shard_rows(self) -> tuple[int, ...]:
        return tuple(n for _, n in self.shards)

    def shard_path(self, k: int) -> str:
        return _join(self.folder, self.shards[k][0])

    def file_path(self, role: str) -> str:
        """The extra file of ``role``; ValueError: none."""
        if role not in self.files:
            raise ValueError(f"{self.path}: field 'files': no {role!r} file (has "
                             f"{sorted(self.files)}); preprocess again with this version")
        return _join(self.folder, self.files[role])

    def members(self) -> list[np.ndarray]:
        """Source rows of each shard (:func:`shard_members`)."""
        return shard_members(self.num_rows, self.shard_rows, self.assignment_seed)

    def order(self, global_batch_size: int, seed: int) -> ShardOrder:
        """The :class:`ShardOrder` of a batch size and seed; ValueError (the folder named)."""
        try:
            return ShardOrder(self.shard_rows, int(global_batch_size), int(seed))
        except ValueError as err:
            raise ValueError(f"{self.folder}: {err}") from None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": VERSION, "fields": list(self.fields),
            "max_length": self.max_length, "pad_id": self.pad_id,
            "tokenizer_sha256": self.tokenizer_sha256, "tokenizer": self.tokenizer,
            "num_rows": self.num_rows, "longest": list(self.longest),
            "assignment_seed": self.assignment_seed,
            "shards": [{"file": f, "rows": n} for f, n in self.shards],
            "files": dict(self.files), "source": dict(self.source),
        }

    def check(self, *, fields: Sequence[str], max_length: int, tokenizer_sha256: str,
              what: str) -> None:
        """ValueError (``<manifest>: field '<name>': ...``) for other fields, width or tokenizer."""
        want = {"fields": list(fields), "max_length": int(max_length),
                "tokenizer_sha256": tokenizer_sha256}
        have = {"fields": list(self.fields), "max_length": self.max_length,
                "tokenizer_sha256": self.tokenizer_sha256}
        for name, value in want.items():
            if have[name] != value:
                raise ValueError(
                    f"{self.path}: field '{name}': the corpus has {have[name]!r}, the config "
                    f"needs {value!r}; {what} was preprocessed for other settings (run "
                    "preprocess again with this config)")


def _join(folder: str, name: str) -> str:
    return f"{folder.rstrip('/')}/{name}"


def _bad(path: str, field: str, reason: str) -> ValueError:
    return DataError(path, None, field, reason)


def manifest_from_json(folder: str, obj: Mapping[str, Any]) -> Manifest:
    """A checked :class:`Manifest`; DataError: format, version, a bad field or count."""
    path = _join(folder, MANIFEST)
    if obj.get("format") != FORMAT:
        raise _bad(path, "format", f"{obj.get('format')!r} is not {FORMAT!r}; is {folder} a "
                   "folder written by `preprocess`?")
    if obj.get("version") != VERSION:
        raise _bad(path, "version", f"{obj.get('version')!r}: this version reads {VERSION}; "
                   "preprocess again")
    kinds = {"fields": list, "max_length": int, "pad_id": int, "tokenizer_sha256": str,
             "tokenizer": str, "num_rows": int, "longest": list, "assignment_seed": int,
             "shards": list, "files": dict, "source": dict}
    for name, kind in kinds.items():
        value = obj.get(name)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _bad(path, name, f"missing or not a {kind.__name__} (got {value!r})")
    fields = tuple(obj["fields"])
    if not fields or not all(isinstance(f, str) and f for f in fields):
        raise _bad(path, "fields", f"{obj['fields']!r} is not a list of names")
    longest = obj["longest"]
    if len(longest) != len(fields) or not all(
            isinstance(x, int) and 0 <= x <= obj["max_length"] for x in longest):
        raise _bad(path, "longest", f"{longest!r}: one length in [0, max_length] per field")
    shards = []
    for i, entry in enumerate(obj["shards"]):
        if not (isinstance(entry, dict) and isinstance(entry.get("file"), str)
                and isinstance(entry.get("rows"), int) and entry["rows"] >= 0
                and "/" not in entry["file"]):
            raise _bad(path, "shards", f"entry {i} is not {{'file': NAME, 'rows': COUNT}}: "
                       f"{entry!r}")
        shards.append((entry["file"], entry["rows"]))
    if not shards or sum(n for _, n in shards) != obj["num_rows"]:
        raise _bad(path, "shards", f"{len(shards)} shards of {[n for _, n in shards]} rows do "
                   f"not add up to num_rows={obj['num_rows']}")
    return Manifest(**{**{k: obj[k] for k in kinds}, "folder": folder, "fields": fields,
                       "longest": tuple(longest), "shards": tuple(shards)})


def read_manifest(folder: str | os.PathLike) -> Manifest:
    """A corpus folder's manifest; FileNotFoundError (no folder or manifest), DataError."""
    root = storage.as_path(folder)
    path = root / MANIFEST
    if not path.is_file():
        hint = ("it holds files but no manifest: an unfinished preprocess? delete it and "
                "preprocess again") if root.is_dir() else "no such folder"
        raise FileNotFoundError(f"{os.fspath(root)} is not a sharded corpus ({hint}); write "
                                "one with `dualcse-jax preprocess` or `docent-jax preprocess`")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _bad(os.fspath(path), "manifest", f"not valid JSON ({err})") from None
    if not isinstance(obj, dict):
        raise _bad(os.fspath(path), "manifest", "not a JSON object")
    return manifest_from_json(os.fspath(root), obj)


_READ_OPTIONS = "readahead_buffer_size:0,max_parallelism:0"  # ArrayRecord's random-access setting


class _ShardReader:
    """Random access to one shard file; missing or damaged: a one-line :class:`DataError`."""

    def __init__(self, path: str, expected_rows: int) -> None:
        from array_record.python.array_record_module import ArrayRecordReader

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


class StreamBatcher:
    """This host's slice of step s, read from its shards (thread-safe)."""

    def __init__(self, manifest: Manifest, order: ShardOrder,
                 owned: range, groups: Sequence[Sequence[int]], lengths: Sequence[int]
                 ) -> None:
        from data_pipelines.tfds_builders import tokenized_corpus_features

        self.manifest, self.order, self.owned = manifest, order, owned
        self.groups, self.lengths = [list(g) for g in groups], list(lengths)
        self.features = tokenized_corpus_features()
        self.readers = {k: _ShardReader(manifest.shard_path(k), manifest.shard_rows[k])
                        for k in owned}
        self._cache: dict = {}
        self._lock = threading.Lock()

    def records(self, step: int) -> list[dict[str, np.ndarray]]:
        """The decoded records of this host's rows of ``step``, in batch order."""
        with self._lock:
            return [self.features.deserialize_example_np(raw) for k in self.owned
                    for raw in self.readers[k].read(self.order.positions(step, k, self._cache))]

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
