"""``export`` (numpy folders) and ``export-hf`` (sentence-transformers folders) of any
``Encoder``'s declared views, once for every model (``docs/export.md``)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from etils import epath

from embedding_core.distributed import multihost
from embedding_core.storage import storage

SIMILARITIES = ("cosine", "dot", "euclidean")  # as embedding_core.serving.export


@dataclasses.dataclass(frozen=True)
class View:
    """One kind of vector, one export folder: ``encoder.encode(texts, **encode_kwargs)``
    (``None``: not from texts) and/or, with ``table``, ``encoder.table(name, normalize)``."""

    name: str
    similarity: str = "cosine"
    encode_kwargs: Mapping[str, Any] | None = dataclasses.field(default_factory=dict)
    table: bool = False
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.similarity not in SIMILARITIES:
            raise ValueError(f"view {self.name}: similarity {self.similarity!r}: use one of "
                             f"{SIMILARITIES}")


@dataclasses.dataclass(frozen=True)
class HFFolder:
    """``hf_export.write_sentence_transformer(**kwargs)`` into ``subdir`` (``""``: output)."""

    subdir: str
    kwargs: Mapping[str, Any]


class SavesFolder:
    """``save(folder)`` for a trained model's ``Encoder`` (mixed in by the packages)."""

    def save(self, folder: str | os.PathLike) -> epath.Path:
        """:func:`export_hf`. Raises FileExistsError, ValueError (no sentence form)."""
        return export_hf(lambda: self, folder)


# (ids, [rows, dim] float32) blocks of a table view, in row order.
TableRows = tuple[int, Iterator[tuple[Sequence[str], np.ndarray]]]


def _text_blocks(encoder, view: View, texts: list[str], normalize: bool, chunk: int):
    """A function of a row range where this process holds the whole model (each writes its
    rows), else every chunk on every process (collectives)."""
    kwargs = {"normalize": normalize, **dict(view.encode_kwargs or {})}

    def rows(start: int, stop: int):
        for a in range(start, stop, chunk):
            part = texts[a:min(a + chunk, stop)]
            yield part, encoder.encode(part, **kwargs)

    return rows if multihost.is_local(getattr(encoder, "params", None)) else \
        rows(0, len(texts))


def export(load: Callable[[], Any], output: str | os.PathLike, *,
           input_path: str | os.PathLike | None = None, normalize: bool | None = None,
           workdir: str | os.PathLike | None = None, chunk: int = 4096,
           text_name: str = "text") -> epath.Path:
    """Every view of ``load()`` under ``output/<view>/``: of ``input_path``'s lines, or the
    table views' rows. Raises FileExistsError; ValueError: no view without ``--input``;
    FileNotFoundError, DataError: a bad input file (before any work)."""
    from embedding_core.serving.export import ExportFolder
    from embedding_core.storage.text_lines import read_text_lines

    folder = ExportFolder(output)  # refuses an --output that is a file, before any work
    texts = read_text_lines(input_path, text_name) if input_path is not None else None
    encoder = load()
    normalize = bool(encoder.default_normalize if normalize is None else normalize)
    views = [v for v in encoder.views if (texts is not None and v.encode_kwargs is not None)
             or (v.table and (texts is None or v.encode_kwargs is None))]
    if not views:
        raise ValueError(f"{encoder.name} encodes texts only: export needs --input=FILE "
                         "(one text per line)")
    common = {"model": encoder.name, "config": encoder.config.to_dict(),
              "step": encoder.step, "normalized": normalize, **encoder.export_meta()}
    if workdir is not None:
        common["workdir"] = storage.display(workdir)
    written = []
    with folder:
        for view in views:
            meta = {**common, "view": view.name, "similarity": view.similarity, **view.meta}
            if texts is not None and view.encode_kwargs is not None:
                meta["input"] = storage.display(input_path)
                num_rows, blocks = len(texts), _text_blocks(encoder, view, texts, normalize, chunk)
            else:
                num_rows, blocks = encoder.table(view.name, normalize)
            folder.view(view.name, blocks, num_rows=num_rows, dim=encoder.view_dim(view.name),
                        meta=meta)
            written.append(f"{num_rows} x {encoder.view_dim(view.name)} {view.name}")
    if multihost.is_primary():
        print(f"wrote {', '.join(written)} to {storage.display(output)}/ (embeddings.npy, "
              "ids.txt, meta.json each)")
    return storage.as_path(output)


def export_hf(load: Callable[[], Any], output: str | os.PathLike, *,
              workdir: str | os.PathLike | None = None) -> epath.Path:
    """``load()``'s ``hf_folders()``, its text-free table views beside them and its
    ``write_hf_files``. Raises FileExistsError; ValueError: no sentence-encoder form."""
    from embedding_core.serving import hf_export
    from embedding_core.serving.export import export_view

    with hf_export.staged_output(output) as stage:
        encoder = load()
        folders = encoder.hf_folders()
        for folder in folders:
            hf_export.write_sentence_transformer(stage / folder.subdir if folder.subdir
                                                 else stage, **folder.kwargs)
        for view in encoder.views:
            if view.table and view.encode_kwargs is None:
                num_rows, blocks = encoder.table(view.name, False)
                # A local staging folder per process: process 0's is the one kept.
                export_view(stage / view.name, blocks, num_rows=num_rows,
                            dim=encoder.view_dim(view.name), split=False,
                            meta={"model": encoder.name, "step": encoder.step,
                                  "view": view.name, "similarity": view.similarity,
                                  "normalized": False, **encoder.export_meta(), **view.meta,
                                  **({"workdir": storage.display(workdir)} if workdir else {})})
        encoder.write_hf_files(stage)
    names = [f.subdir + "/" for f in folders if f.subdir] or (["one folder"] if folders else [])
    names += [v.name + "/" for v in encoder.views if v.table and v.encode_kwargs is None]
    if multihost.is_primary():
        kind = " (sentence-transformers / transformers)" if folders else ""
        print(f"wrote {storage.display(output)}: {' and '.join(names) or 'its files'}{kind}")
    return storage.as_path(output)
