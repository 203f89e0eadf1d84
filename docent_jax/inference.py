"""A trained DocEnt model: ``load(workdir)`` -> :class:`EntityRanker` (``docs/docent.md``).

The ranker is an ``embedding_core.inference.Encoder`` for every variant:

* ``encode(texts)`` embeds *queries*: DocEnt-Dual and -Hybrid with the sentence encoder
  ``f``; DocEnt-Full with the MLM head's output ``t`` at the masked entity slot of
  ``[CLS] [MASK] [SEP] query [SEP]``;
* ``entity_embeddings()`` / ``iter_entity_blocks()`` return the entity table (Full: its
  entity rows, hidden width);
* ``score(texts)`` ranks every entity for each query: ``a * cos(f(q), g(e))`` (Dual,
  Hybrid) or the entity logits ``t . g(e) + b_e`` of P(e | query) over the entity rows
  only (Full, the paper's zero-shot scoring).

Vectors are raw float32 (not normalised); Dual/Hybrid compare with cosine, Full with the
dot product plus the entity bias.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from data_pipelines.tokenization import load_tokenizer, require_text_tokens, tokenize
from docent_jax.configs import default, validate_config
from docent_jax.data import (
    ENTITY_IDS_FILE,
    FullLayout,
    full_inputs_from_tokens,
    read_entity_ids,
    sentence_length,
)
from docent_jax.masking import ENTITY_POSITION
from docent_jax.model import DocEntDual, DocEntFull, DocEntHybrid, build_model, init_fn
from embedding_core import configs, multihost, parallel, storage, training
from embedding_core.encoders import EncoderConfig
from embedding_core.inference import Encoder, check_texts, encode_in_batches
from embedding_core.pretrained import workdir_model_dir

PROG = "docent-jax"
REQUIRED_FIELDS = ("model", "pooling", "projection_dim", "max_length", "table_multiple")
"""Fields without which a saved run's model cannot be rebuilt."""


class EntityRanker(Encoder):
    """A trained DocEnt model (any variant): entity vectors and the query scorer.

    Attributes:
      variant: ``"dual"``, ``"full"`` or ``"hybrid"``.
      entity_ids: ``[num_entities]`` keys; row i of :meth:`entity_embeddings` is entity i.
      step: the checkpoint step (None when built from in-memory params).
      config, model, params, tokenizer: the run's config, Flax module, params and tokenizer.
    """

    def __init__(self, model: DocEntDual | DocEntFull | DocEntHybrid, params, tokenizer,
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
        self.variant = "full" if isinstance(model, DocEntFull) else (
            "hybrid" if isinstance(model, DocEntHybrid) else "dual")
        self._layout = FullLayout.from_tokenizer(tokenizer) if self.variant == "full" else None
        self._query = jax.jit(self.query_fn)
        self._scores = jax.jit(self.entity_scores_fn)

    # -- pure functions (jittable, differentiable; for fine-tuning) -----------------------

    def query_fn(self, params, input_ids, attention_mask, token_type_ids) -> jax.Array:
        """Query vectors of :meth:`query_inputs` arrays: ``[n, L]`` int32 -> ``[n, dim]``
        float32 (Dual/Hybrid ``f(q)``; Full the head output at the entity slot)."""
        if self.variant == "full":
            positions = jnp.full((input_ids.shape[0], 1), ENTITY_POSITION, jnp.int32)
            return self.model.apply({"params": params}, input_ids, attention_mask,
                                    token_type_ids, positions, method=DocEntFull.predict)[:, 0]
        return self.model.apply({"params": params}, input_ids, attention_mask,
                                token_type_ids, method=DocEntDual.encode_sentences)

    def entity_scores_fn(self, params, queries: jax.Array) -> jax.Array:
        """Logits of P(e | q) for every table row: ``[n, dim]`` -> ``[n, num_rows]`` float32
        (columns at or beyond ``num_entities`` are padding)."""
        method = DocEntFull.entity_scores if self.variant == "full" else \
            DocEntDual.entity_scores
        return self.model.apply({"params": params}, queries, method=method)

    # -- host side ---------------------------------------------------------------------------

    @property
    def num_entities(self) -> int:
        return self.model.num_entities

    @property
    def dim(self) -> int:
        return self.model.dim

    def with_params(self, params) -> EntityRanker:
        """The same ranker (model, tokenizer, ids, config) with other params."""
        return EntityRanker(self.model, params, self.tokenizer, self.config, self.entity_ids,
                            step=self.step, batch_size=self.default_batch_size,
                            pad_multiple=self.pad_multiple)

    def query_inputs(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """The variant's query layout: ``input_ids``, ``attention_mask``, ``token_type_ids``
        ``[n, L]`` int32 (Full: ``[CLS] [MASK] [SEP] text [SEP]``; else ``[CLS] text [SEP]``).

        Raises:
          ValueError: a text that is empty or not a string. DataError-like ValueError: a
            text with no token the vocabulary knows.
        """
        texts = check_texts(texts)
        tok = tokenize(self.tokenizer, texts, sentence_length(self.config))
        require_text_tokens(self.tokenizer, tok, texts, None)
        if self.variant != "full":
            mask = np.arange(tok.input_ids.shape[1])[None, :] < tok.lengths[:, None]
            return {"input_ids": tok.input_ids, "attention_mask": mask.astype(np.int32),
                    "token_type_ids": tok.token_type_ids}
        layout = self._layout
        out = full_inputs_from_tokens(tok.input_ids, tok.lengths, np.zeros(len(texts), np.int32),
                                      word_vocab_size=layout.word_vocab_size,
                                      sep_id=layout.sep_id, pad_id=layout.pad_id)
        out["input_ids"][:, ENTITY_POSITION] = layout.mask_id
        return {k: out[k] for k in ("input_ids", "attention_mask", "token_type_ids")}

    def _encode(self, texts: list[str], *, batch_size: int,
                show_progress_bar: bool) -> np.ndarray:
        """Query vectors of checked, non-empty texts: ``[n, dim]`` float32 (raw)."""
        inputs = self.query_inputs(texts)
        lengths = inputs["attention_mask"].sum(axis=1)
        width = inputs["input_ids"].shape[1]

        def build(rows: np.ndarray, width: int):
            pad = batch_size - len(rows)  # every call has batch_size rows: one compile a width
            return tuple(np.pad(inputs[k][rows, :width], ((0, pad), (0, 0)))
                         for k in ("input_ids", "attention_mask", "token_type_ids"))

        return encode_in_batches(
            lengths, build, lambda x: self._query(self.params, *x), batch_size=batch_size,
            pad_multiple=self.pad_multiple, max_width=width,
            show_progress_bar=show_progress_bar, desc="encode queries")

    def score(self, texts: Sequence[str], *, batch_size: int | None = None,
              show_progress_bar: bool = False) -> np.ndarray:
        """``[n, num_entities]`` float32 scores of every entity for each query (higher =
        more relevant; see the module docstring)."""
        q = self.encode(texts, batch_size=batch_size, show_progress_bar=show_progress_bar)
        if not len(q):
            return np.zeros((0, self.num_entities), np.float32)
        block = max(1, int(batch_size or self.default_batch_size))
        parts = [np.asarray(self._scores(self.params, jnp.asarray(q[i:i + block])))
                 [:, :self.num_entities] for i in range(0, len(q), block)]
        return np.concatenate(parts, axis=0).astype(np.float32)

    def iter_entity_blocks(self, block_rows: int = 8192
                           ) -> Iterator[tuple[int, list[str], np.ndarray]]:
        """Streams the entity table in row blocks (host memory: one block at a time).

        Yields:
          ``(start, ids, vectors)``: ``vectors [rows, dim]`` float32 = the rows of entities
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
        """``[num_entities, dim]`` float32 entity vectors (raw)."""
        blocks = [b for _, _, b in self.iter_entity_blocks()]
        return np.concatenate(blocks, axis=0)


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
    """The ``run_config.json`` of a training workdir, on today's defaults, checked.

    Raises:
      FileNotFoundError: the workdir or its run_config.json is missing (message says what).
      ValueError: a malformed or impossible config (the file is named).
    """
    return configs.read_config(workdir, default.get_config, prog=PROG,
                               required=REQUIRED_FIELDS, validate=validate_config)


def load(workdir: str | os.PathLike, *, step: int | None = None) -> EntityRanker:
    """Loads the latest (or a given) checkpoint of a training workdir.

    Only the checkpoint's params are restored (no optimizer, no Adam moments), onto a mesh
    of all devices; each process keeps its own whole copy
    (``embedding_core.multihost.localize``), so that several processes can each work on
    their slice of the queries.

    Raises:
      FileNotFoundError: no workdir, ``run_config.json``, ``entity_ids.txt`` or
        checkpoint, or (a workdir without its ``encoder/`` copy) the config's model is gone.
    """
    config = read_config(workdir)
    entity_ids = read_entity_ids(storage.as_path(workdir) / ENTITY_IDS_FILE)
    # The encoder's shape and tokenizer: the workdir's copy, or the base model for older
    # runs; its weights are never read (the checkpoint holds them all).
    model_dir = workdir_model_dir(workdir, config.model)
    model = build_model(config, EncoderConfig.from_hf_config(model_dir), len(entity_ids))
    restored_step, params = training.restore_params(
        storage.as_path(workdir) / "checkpoints", init_fn(model), parallel.make_mesh(-1, 1),
        step=step,
        rules=configs.axis_rules(config))
    return EntityRanker(model, multihost.localize(params), load_tokenizer(model_dir),
                        config, entity_ids, step=restored_step)


__all__ = ["EntityRanker", "load", "read_config"]
