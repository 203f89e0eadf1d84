"""A trained DocEnt model: ``load(workdir)`` -> :class:`EntityRanker` (``docs/docent.md``).

The ranker is an ``embedding_core.inference.Encoder`` for every variant:

* ``encode(texts)`` embeds *queries*: DocEnt-Dual and -Hybrid with the sentence encoder
  ``f``; DocEnt-Full with the MLM head's output ``t`` at the masked entity slot of
  ``[CLS] [MASK] [SEP] query [SEP]``;
* ``entity_embeddings()`` / ``iter_entity_blocks()`` return the entity table (Full: its
  entity rows, hidden width);
* ``score(texts)`` ranks every entity for each query: ``a * cos(f(q), g(e))`` (Dual,
  Hybrid) or the entity logits ``t . g(e) + b_e`` of P(e | query) over the entity rows
  only (Full, the paper's zero-shot scoring);
* ``top_k(texts, k)`` and ``relevant_ranks(texts, relevant)`` rank on the devices that
  hold the table (``embedding_core.table_ranking``: per-shard top-k merged over
  ``"model"``; exact ranks from per-shard counts), so a table split over a mesh
  (``load(workdir, mesh=...)``) is never copied whole to the host.

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
from jax.sharding import Mesh

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
from docent_jax.model import (
    DocEntDual,
    DocEntFull,
    DocEntHybrid,
    build_model,
    dual_scores,
    full_scores,
    init_fn,
)
from embedding_core import configs, multihost, parallel, storage, table_ranking, training
from embedding_core.encoders import EncoderConfig
from embedding_core.export import iter_row_blocks
from embedding_core.inference import Encoder, check_texts, encode_in_batches
from embedding_core.pretrained import workdir_model_dir

PROG = "docent-jax"
REQUIRED_FIELDS = ("model", "pooling", "projection_dim", "max_length", "table_multiple")
"""Fields without which a saved run's model cannot be rebuilt."""


def _dual_table_scores(queries, rows, row_args, consts):
    return dual_scores(queries, rows, consts[0])


def _full_table_scores(queries, rows, row_args, consts):
    return full_scores(queries, rows, row_args[0])


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

    # -- ranking on the devices that hold the table ------------------------------------------

    def _table_scoring(self) -> tuple[table_ranking.ScoreFn, tuple, tuple]:
        """``(score_fn, row_args, consts)`` of this variant for ``table_ranking``: the
        functions :meth:`entity_scores_fn` computes, applied shard by shard."""
        if self.variant == "full":
            return _full_table_scores, (self.params["entity_bias"],), ()
        if not hasattr(self, "_scale"):
            self._scale = self.model.apply({"params": self.params}, method=DocEntDual.scale)
        return _dual_table_scores, (), (self._scale,)

    def _query_blocks(self, q: np.ndarray, block: int) -> Iterator[tuple[int, np.ndarray]]:
        # Every call gets `block` rows (zeros pad the last): one compile per table shape.
        for start in range(0, len(q), block):
            part = q[start:start + block]
            yield start, np.pad(part, ((0, block - len(part)), (0, 0)))

    def top_k(self, texts: Sequence[str], k: int = 10, *, batch_size: int | None = None,
              show_progress_bar: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best entities of each query, ranked where the table lies.

        Every device scores its rows of the table (split over ``"model"`` when the ranker
        was loaded onto such a mesh), keeps its best ``k``, and the candidates are merged
        over ``"model"`` (``embedding_core.table_ranking.top_k``): the same entities and
        scores as sorting :meth:`score`'s rows (ties: the lower entity index first).
        Padding rows of the table never appear.

        Args:
          texts: the queries. k: entities per query (``min(k, num_entities)`` returned).
          batch_size: queries per encoder call and per ranking call.

        Returns:
          ``(entities [n, k] int64, scores [n, k] float32)``, best first; entity ``i`` is
          ``entity_ids[i]``.

        Raises:
          ValueError: ``k < 1``, empty texts (see ``encode``).
        """
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        k = min(int(k), self.num_entities)
        q = self.encode(texts, batch_size=batch_size, show_progress_bar=show_progress_bar)
        block = max(1, min(int(batch_size or self.default_batch_size), len(q) or 1))
        score_fn, row_args, consts = self._table_scoring()
        table = self.params["entity_embeddings"]
        rows = np.zeros((len(q), k), np.int64)
        scores = np.zeros((len(q), k), np.float32)
        for start, part in self._query_blocks(q, block):
            s, r = table_ranking.top_k(score_fn, part, table, k, num_rows=self.num_entities,
                                       row_args=row_args, consts=consts)
            stop = min(start + block, len(q))
            rows[start:stop] = np.asarray(r)[:stop - start]
            scores[start:stop] = np.asarray(s)[:stop - start]
        return rows, scores

    def relevant_ranks(self, texts: Sequence[str], relevant: Sequence[Sequence[int]], *,
                       batch_size: int | None = None, show_progress_bar: bool = False
                       ) -> tuple[np.ndarray, np.ndarray]:
        """The exact rank of each query's relevant entities, computed where the table lies.

        Per shard of the table, the rows scoring at least as high as each relevant entity
        are counted; the counts are summed over ``"model"``
        (``embedding_core.table_ranking``). The ranks are those of
        ``embedding_core.metrics.ranks_of_relevant`` on :meth:`score`'s matrix (a relevant
        entity ranks behind every non-relevant one it ties with), without that matrix.

        Args:
          texts: ``n`` queries. relevant: per query, its relevant entity indices (at least
            one; repeats count once).
          batch_size: queries per encoder call and per ranking call.

        Returns:
          ``(query, rank)``: ``[n_pairs]`` int64, sorted by query then rank; ranks in
          ``[1, num_entities]``.

        Raises:
          ValueError: lengths differ, a query without relevant entity or with one out of
            ``[0, num_entities)``; empty texts (see ``encode``).
        """
        if len(relevant) != len(texts):
            raise ValueError(f"{len(relevant)} relevance lists for {len(texts)} queries")
        lists = []
        for i, items in enumerate(relevant):
            items = sorted({int(e) for e in items})
            if not items:
                raise ValueError(f"query {i} has no relevant entity")
            if items[0] < 0 or items[-1] >= self.num_entities:
                bad = items[0] if items[0] < 0 else items[-1]
                raise ValueError(f"query {i}: relevant entity {bad} not in "
                                 f"[0, {self.num_entities})")
            lists.append(items)
        q = self.encode(texts, batch_size=batch_size, show_progress_bar=show_progress_bar)
        # Columns rounded up to a power of two: few compiled shapes across query blocks.
        width = 1 << (max(map(len, lists), default=1) - 1).bit_length()
        rel = np.full((len(q), width), -1, np.int64)
        for i, items in enumerate(lists):
            rel[i, :len(items)] = items
        block = max(1, min(int(batch_size or self.default_batch_size), len(q) or 1))
        score_fn, row_args, consts = self._table_scoring()
        table = self.params["entity_embeddings"]
        scores = np.zeros(rel.shape, np.float32)
        at_least = np.zeros(rel.shape, np.int64)
        for start, part in self._query_blocks(q, block):
            stop = min(start + block, len(q))
            part_rel = np.full((block, width), -1, np.int64)
            part_rel[:stop - start] = rel[start:stop]
            s, c = table_ranking.relevant_counts(
                score_fn, part, table, part_rel, num_rows=self.num_entities,
                row_args=row_args, consts=consts)
            scores[start:stop], at_least[start:stop] = s[:stop - start], c[:stop - start]
        return table_ranking.ranks_from_counts(rel, scores, at_least)

    # -- the table on the host -----------------------------------------------------------------

    def iter_entity_blocks(self, block_rows: int = 8192
                           ) -> Iterator[tuple[int, list[str], np.ndarray]]:
        """Streams the entity table in row blocks (host memory: one block at a time).

        A table split over devices is read shard by shard, each block cut on the device
        holding it (``embedding_core.export.iter_row_blocks``): the whole table is never
        on the host nor gathered on one device.

        Yields:
          ``(start, ids, vectors)``: ``vectors [rows, dim]`` float32 = the rows of entities
          ``start .. start + rows - 1`` (padding rows never appear), ``ids`` their keys.
        """
        if block_rows < 1:
            raise ValueError(f"block_rows must be positive, got {block_rows}")
        for start, block in iter_row_blocks(self.params["entity_embeddings"],
                                            self.num_entities, block_rows):
            yield (start, self.entity_ids[start:start + len(block)],
                   np.asarray(block, dtype=np.float32))

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


def load(workdir: str | os.PathLike, *, step: int | None = None,
         mesh: Mesh | None = None) -> EntityRanker:
    """Loads the latest (or a given) checkpoint of a training workdir.

    Only the checkpoint's params are restored (no optimizer, no Adam moments).

    * ``mesh=None``: onto a mesh of all devices with ``model=1``; each process keeps its
      own whole copy (``embedding_core.multihost.localize``), so that several processes
      can each work on their slice of the queries.
    * a ``("data", "model")`` mesh (``embedding_core.parallel.make_mesh(-1, 8)``): onto
      that mesh with the run's logical-axis rules, the entity table (and Full's entity
      bias) split by rows over ``"model"``, whatever mesh trained it: each device reads
      and holds ``rows / model`` rows. ``top_k``, ``relevant_ranks`` (hence
      ``evaluate``) and the export then work shard by shard; arrays stay global (every
      process takes part in each call).

    Raises:
      FileNotFoundError: no workdir, ``run_config.json``, ``entity_ids.txt`` or
        checkpoint, or (a workdir without its ``encoder/`` copy) the config's model is gone.
      ValueError: the mesh's ``model`` size does not divide the table's rows (its
        ``table_multiple``).
    """
    config = read_config(workdir)
    entity_ids = read_entity_ids(storage.as_path(workdir) / ENTITY_IDS_FILE)
    # The encoder's shape and tokenizer: the workdir's copy, or the base model for older
    # runs; its weights are never read (the checkpoint holds them all).
    model_dir = workdir_model_dir(workdir, config.model)
    model = build_model(config, EncoderConfig.from_hf_config(model_dir), len(entity_ids))
    target = parallel.make_mesh(-1, 1) if mesh is None else mesh
    shards = int(target.shape["model"])
    if model.num_rows % shards:
        raise ValueError(f"mesh model={shards} does not divide the {model.num_rows} rows of "
                         f"{workdir}'s entity table (table_multiple={config.table_multiple}); "
                         f"use a model size that divides {config.table_multiple}")
    restored_step, params = training.restore_params(
        storage.as_path(workdir) / "checkpoints", init_fn(model), target, step=step,
        rules=configs.axis_rules(config), sizes={"heads": model.config.num_heads})
    if mesh is None:
        params = multihost.localize(params)
    return EntityRanker(model, params, load_tokenizer(model_dir), config, entity_ids,
                        step=restored_step)


__all__ = ["EntityRanker", "load", "read_config"]
