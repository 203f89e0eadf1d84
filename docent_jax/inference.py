"""A trained DocEnt-Dual: ``load(workdir)`` -> :class:`EntityRanker` (``docs/docent.md``).

The ranker is an ``embedding_core.inference.Encoder``: ``encode(texts)`` embeds *queries*
(or any sentence) with the sentence encoder ``f``; ``entity_embeddings()`` returns the
entity table ``g``. Both are raw (not normalised) float32 vectors; score with cosine.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import jax
import ml_collections
import numpy as np

from data_pipelines.tokenization import load_tokenizer, require_text_tokens, tokenize
from docent_jax.configs import default, validate_config
from docent_jax.data import ENTITY_IDS_FILE, read_entity_ids
from docent_jax.model import DocEntDual, build_model, init_fn
from embedding_core import configs, parallel, training
from embedding_core.inference import Encoder, encode_in_batches, token_batch_builder
from embedding_core.pretrained import load_pretrained

PROG = "docent-jax"
REQUIRED_FIELDS = ("model", "pooling", "projection_dim", "max_length", "table_multiple")
"""Fields without which a saved run's model cannot be rebuilt."""


class EntityRanker(Encoder):
    """A trained DocEnt-Dual: entity vectors ``g(e)`` and the query encoder ``f``.

    Attributes:
      entity_ids: ``[num_entities]`` keys; row i of :meth:`entity_embeddings` is entity i.
      step: the checkpoint step (None when built from in-memory params).
      config: the run's config.
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
        self.default_batch_size = int(batch_size or config.get("eval_batch_size", 64))
        self.pad_multiple = pad_multiple
        self._forward = jax.jit(lambda p, ids, mask, types: model.apply(
            {"params": p}, ids, mask, types, method=DocEntDual.encode_sentences))

    @property
    def num_entities(self) -> int:
        return self.model.num_entities

    @property
    def dim(self) -> int:
        return self.model.dim

    def _encode(self, texts: list[str], *, batch_size: int,
                show_progress_bar: bool) -> np.ndarray:
        """``f(q)`` of checked, non-empty texts: ``[n, dim]`` float32 (raw)."""
        tok = tokenize(self.tokenizer, texts, int(self.config.max_length))
        require_text_tokens(self.tokenizer, tok, texts, None)
        return encode_in_batches(
            tok.lengths, token_batch_builder(tok, batch_size),
            lambda inputs: self._forward(self.params, *inputs), batch_size=batch_size,
            pad_multiple=self.pad_multiple, max_width=tok.input_ids.shape[1],
            show_progress_bar=show_progress_bar, desc="encode queries")

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


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
    """The ``config.json`` of a training workdir, on today's defaults, checked.

    Raises:
      FileNotFoundError: the workdir or its config.json is missing (message says what).
      ValueError: a malformed or impossible config (the file is named).
    """
    return configs.read_config(workdir, default.get_config, prog=PROG,
                               required=REQUIRED_FIELDS, validate=validate_config)


def load(workdir: str | os.PathLike, *, step: int | None = None) -> EntityRanker:
    """Loads the latest (or a given) checkpoint of a training workdir.

    Only the checkpoint's params are restored (no optimizer, no Adam moments), onto a mesh
    of all local devices.

    Raises:
      FileNotFoundError: no workdir, ``config.json``, ``entity_ids.txt`` or checkpoint, or
        the model folder named in the config is gone.
    """
    config = read_config(workdir)
    entity_ids = read_entity_ids(Path(workdir) / ENTITY_IDS_FILE)
    pre = load_pretrained(config.model)
    model = build_model(config, pre.config, len(entity_ids))
    restored_step, params = training.restore_params(
        Path(workdir) / "checkpoints", init_fn(model), parallel.make_mesh(-1, 1), step=step,
        rules=configs.axis_rules(config))
    return EntityRanker(model, params, load_tokenizer(pre.model_dir), config, entity_ids,
                        step=restored_step)


__all__ = ["EntityRanker", "load", "read_config"]
