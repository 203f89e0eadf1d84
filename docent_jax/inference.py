"""Entity vectors and query encoding of a trained DocEnt-Dual: ``load(workdir)``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import jax
import ml_collections
import numpy as np

from data_pipelines.tokenization import load_tokenizer, tokenize
from docent_jax.data import read_entity_ids
from docent_jax.model import DocEntDual, build_model, init_fn
from embedding_core import parallel, training
from embedding_core.pretrained import load_pretrained

CONFIG_FILE = "config.json"
ENTITY_IDS_FILE = "entity_ids.txt"

# (input_ids, attention_mask, token_type_ids) [n, L] int32 -> [n, dim] float vectors.
EncodeFn = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def encode_texts(encode: EncodeFn, tokenizer, texts: Sequence[str], max_length: int, *,
                 batch_size: int = 64, pad_multiple: int = 8,
                 progress: bool | str = False) -> np.ndarray:
    """Encodes texts in length-sorted, fixed-size batches (few compiled shapes).

    Args:
      encode: the jitted forward pass, see :data:`EncodeFn`.
      tokenizer: a ``tokenizers.Tokenizer``.
      texts: strings; empty or whitespace-only ones raise (index given).
      max_length: tokens per text including special tokens (longer texts are cut).
      batch_size: rows per call (the last batch is padded to it).
      pad_multiple: each batch's length is rounded up to a multiple of this.
      progress: a tqdm description (or True) to show a bar.

    Returns:
      ``[len(texts), dim]`` float32, row i = texts[i].

    Raises:
      TypeError: a single string instead of a list. ValueError: an empty text.
    """
    if isinstance(texts, str):
        raise TypeError("pass a list of texts, not a single string")
    for i, t in enumerate(texts):
        if not isinstance(t, str) or not t.strip():
            raise ValueError(f"text {i} is empty or not a string: {t!r}")
    tok = tokenize(tokenizer, texts, max_length)
    order = np.argsort(-tok.lengths, kind="stable")
    out: np.ndarray | None = None
    starts = range(0, len(texts), batch_size)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc=progress if isinstance(progress, str) else "encode",
                      unit="batch", leave=False)
    for start in starts:
        rows = order[start:start + batch_size]
        length = int(tok.lengths[rows].max())
        length = min(-(-length // pad_multiple) * pad_multiple, tok.input_ids.shape[1])
        ids = tok.input_ids[rows, :length]
        types = tok.token_type_ids[rows, :length]
        mask = (np.arange(length)[None, :] < tok.lengths[rows, None]).astype(np.int32)
        pad = batch_size - len(rows)
        if pad:
            ids, mask, types = (np.pad(x, ((0, pad), (0, 0))) for x in (ids, mask, types))
        vec = np.asarray(encode(ids, mask, types), dtype=np.float32)[: len(rows)]
        if out is None:
            out = np.zeros((len(texts), vec.shape[-1]), np.float32)
        out[rows] = vec
    return out if out is not None else np.zeros((0, 0), np.float32)


class EntityRanker:
    """A trained DocEnt-Dual: entity vectors ``g(e)`` and the query encoder ``f``.

    Attributes:
      entity_ids: ``[num_entities]`` keys; row i of :meth:`entity_embeddings` is entity i.
      step: the checkpoint step (None when built from in-memory params).
    """

    def __init__(self, model: DocEntDual, params, tokenizer,
                 config: ml_collections.ConfigDict, entity_ids: Sequence[str], *,
                 step: int | None = None, batch_size: int | None = None,
                 pad_multiple: int = 16):
        if len(entity_ids) != model.num_entities:
            raise ValueError(f"{len(entity_ids)} entity ids for a model of "
                             f"{model.num_entities} entities")
        self.model = model
        self.params = params
        self.tokenizer = tokenizer
        self.config = config
        self.entity_ids = list(entity_ids)
        self.step = step
        self.batch_size = int(batch_size or config.get("eval_batch_size", 64))
        self.pad_multiple = pad_multiple
        self._encode = jax.jit(lambda p, ids, mask, types: model.apply(
            {"params": p}, ids, mask, types, method=DocEntDual.encode_sentences))

    @property
    def num_entities(self) -> int:
        return self.model.num_entities

    @property
    def dim(self) -> int:
        return self.model.dim

    def iter_entity_blocks(self, block_rows: int = 8192
                           ) -> Iterator[tuple[int, list[str], np.ndarray]]:
        """Streams the entity table in row blocks (host memory: one block at a time).

        Yields:
          ``(start, ids, vectors)``: ``vectors [rows, dim]`` float32 = ``g`` of entities
          ``start .. start + rows - 1`` (padding rows never appear), ``ids`` their keys.
        """
        if block_rows < 1:
            raise ValueError(f"block_rows must be positive, got {block_rows}")
        table = self.params["entity_embeddings"]
        for start in range(0, self.num_entities, block_rows):
            stop = min(start + block_rows, self.num_entities)
            block = np.asarray(jax.device_get(table[start:stop]), dtype=np.float32)
            yield start, self.entity_ids[start:stop], block

    def entity_embeddings(self) -> np.ndarray:
        """``[num_entities, dim]`` float32 entity vectors ``g(e)`` (raw; score with cosine)."""
        blocks = [b for _, _, b in self.iter_entity_blocks()]
        return np.concatenate(blocks, axis=0)

    def encode_queries(self, texts: Sequence[str], *, progress: bool | str = False
                       ) -> np.ndarray:
        """``[n, dim]`` float32 ``f(q)`` of each query (raw; score with cosine)."""
        if not len(texts):
            return np.zeros((0, self.dim), np.float32)
        encode = lambda ids, mask, types: self._encode(self.params, ids, mask, types)
        return encode_texts(encode, self.tokenizer, texts, self.config.max_length,
                            batch_size=self.batch_size, pad_multiple=self.pad_multiple,
                            progress=progress)


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
    """The ``config.json`` of a training workdir.

    Raises:
      FileNotFoundError: the workdir or its config.json is missing (message says what).
    """
    workdir = Path(workdir)
    if not workdir.is_dir():
        raise FileNotFoundError(f"workdir {workdir} does not exist; train first with "
                                f"`docent-jax train --workdir={workdir}`")
    path = workdir / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: {workdir} is not a docent-jax training "
                                "workdir (train into it first)")
    return ml_collections.ConfigDict(json.loads(path.read_text()))


def load(workdir: str | os.PathLike, *, step: int | None = None) -> EntityRanker:
    """Loads the latest (or a given) checkpoint of a training workdir.

    Raises:
      FileNotFoundError: no workdir, ``config.json``, ``entity_ids.txt`` or checkpoint, or
        the model folder named in the config is gone.
    """
    config = read_config(workdir)
    entity_ids = read_entity_ids(Path(workdir) / ENTITY_IDS_FILE)
    pre = load_pretrained(config.model)
    model = build_model(config, pre.config, len(entity_ids))
    # Any optimizer of the same structure restores the params (moments are not used).
    from docent_jax.trainer import make_optimizer

    tx, _ = make_optimizer(config, 10)
    mesh = parallel.make_mesh(-1, 1)
    restored_step, params = training.restore_params(
        Path(workdir) / "checkpoints", init_fn(model), tx, mesh, step=step)
    return EntityRanker(model, params, load_tokenizer(pre.model_dir), config, entity_ids,
                        step=restored_step)


def cosine_scores(queries: np.ndarray, entities: np.ndarray) -> np.ndarray:
    """``[n_q, n_e]`` float32 cosine similarities (zero vectors score 0)."""
    q = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    e = entities / np.maximum(np.linalg.norm(entities, axis=1, keepdims=True), 1e-12)
    return (q @ e.T).astype(np.float32)


__all__ = ["EntityRanker", "cosine_scores", "encode_texts", "load", "read_config"]
