"""A trained DocEnt model, any variant: ``load(workdir)`` -> :class:`EntityRanker`."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.sharding import Mesh

from data_pipelines.tokenization import load_tokenizer, require_text_tokens, tokenize
from docent_jax.configs import FIELDS, validate_config
from docent_jax.corpus import ENTITY_IDS_FILE, read_entity_ids
from docent_jax.data import FullLayout, full_inputs_from_tokens, sentence_length
from docent_jax.masking import ENTITY_POSITION
from docent_jax.model import (
    NAMES,
    DocEntDual,
    DocEntFull,
    DocEntHybrid,
    build_model,
    dual_scores,
    full_scores,
    init_fn,
)
from embedding_core import (
    EncoderConfig,
    HFFolder,
    SavesFolder,
    View,
    configs,
    multihost,
    parallel,
    workdir_model_dir,
)
from embedding_core.losses import table_ranking
from embedding_core.serving import hf_export
from embedding_core.serving.inference import Encoder, check_texts, encode_in_batches, l2_normalize
from embedding_core.storage import storage
from embedding_core.training import training

PROG = "docent-jax"
REQUIRED_FIELDS = ("model", "pooling", "projection_dim", "max_length", "table_multiple")
FULL_SCORE = "dot + entity_bias (not exported; docent_jax.load(workdir).score includes it)"


def _dual_table_scores(queries, rows, row_args, consts):
    return dual_scores(queries, rows, consts[0])


def _full_table_scores(queries, rows, row_args, consts):
    return full_scores(queries, rows, row_args[0])


class EntityRanker(SavesFolder, Encoder):
    """A trained DocEnt model (row i = ``entity_ids[i]``; ``step`` None in memory)."""

    default_normalize = False
    block_rows = 8192

    def __init__(self, model: DocEntDual | DocEntFull | DocEntHybrid, params, tokenizer,
                 config: ml_collections.ConfigDict, entity_ids: Sequence[str], *,
                 step: int | None = None, batch_size: int | None = None,
                 pad_multiple: int = 1):
        if len(entity_ids) != model.num_entities:
            raise ValueError(f"{len(entity_ids)} entity ids for a model of "
                             f"{model.num_entities} entities")
        self.model, self.params, self.tokenizer, self.config = model, params, tokenizer, config
        self.entity_ids, self.step, self.pad_multiple = list(entity_ids), step, pad_multiple
        self.default_batch_size = int(batch_size or config.get("eval_batch_size", 64))
        # Ranking on the table's devices: queries per call, table rows per scoring step.
        self.query_block = int(config.get("rank_query_block", 0)) or self.default_batch_size
        self.row_block = int(config.get("rank_row_block", 0))
        self.variant = "full" if isinstance(model, DocEntFull) else (
            "hybrid" if isinstance(model, DocEntHybrid) else "dual")
        self._layout = FullLayout.from_tokenizer(tokenizer) if self.variant == "full" else None
        self.name, self.workdir = NAMES[self.variant], None
        similarity = "dot" if self.variant == "full" else "cosine"
        self.views = (View("entities", similarity, encode_kwargs=None, table=True),
                      View("queries", similarity))
        self._query = jax.jit(self.query_fn)
        self._scores = jax.jit(self.entity_scores_fn)

    # -- pure functions (jittable, differentiable; for fine-tuning) -----------------------

    def query_fn(self, params, input_ids, attention_mask, token_type_ids) -> jax.Array:
        """:meth:`query_inputs` arrays ``[n, L]`` int32 -> ``[n, dim]`` float32 query vectors."""
        if self.variant == "full":
            positions = jnp.full((input_ids.shape[0], 1), ENTITY_POSITION, jnp.int32)
            return self.model.apply({"params": params}, input_ids, attention_mask,
                                    token_type_ids, positions, method=DocEntFull.predict)[:, 0]
        return self.model.apply({"params": params}, input_ids, attention_mask,
                                token_type_ids, method=DocEntDual.encode_sentences)

    def entity_scores_fn(self, params, queries: jax.Array) -> jax.Array:
        """Logits of P(e | q): ``[n, dim]`` -> ``[n, num_rows]`` float32 (padding columns)."""
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
        """The same ranker with other params."""
        out = EntityRanker(self.model, params, self.tokenizer, self.config, self.entity_ids,
                           step=self.step, batch_size=self.default_batch_size,
                           pad_multiple=self.pad_multiple)
        out.workdir = self.workdir
        return out

    def query_inputs(self, texts: Sequence[str]) -> dict[str, np.ndarray]:
        """``[n, L]`` int32 inputs ``[CLS] text [SEP]`` (Full: ``[CLS] [MASK] [SEP] text
        [SEP]``); ValueError: an empty, non-string or unknown-token text."""
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

    def _encode(self, texts: list[str], *, batch_size: int, show_progress_bar: bool) -> np.ndarray:
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
        """``[n, num_entities]`` float32 scores (higher = more relevant)."""
        q = self.encode(texts, batch_size=batch_size, show_progress_bar=show_progress_bar)
        if not len(q):
            return np.zeros((0, self.num_entities), np.float32)
        block = max(1, int(batch_size or self.default_batch_size))
        parts = [np.asarray(self._scores(self.params, jnp.asarray(q[i:i + block])))
                 [:, :self.num_entities] for i in range(0, len(q), block)]
        return np.concatenate(parts, axis=0).astype(np.float32)

    # -- ranking on the devices that hold the table ------------------------------------------

    def _table_scoring(self) -> tuple[table_ranking.ScoreFn, tuple, tuple]:
        """``(score_fn, row_args, consts)``: :meth:`entity_scores_fn` shard by shard."""
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
        """``(entities [n, k] int64, scores [n, k] float32)``, :meth:`score`'s best (ties: lower
        index); ValueError: ``k < 1``, empty texts."""
        if isinstance(k, bool) or int(k) != k or k < 1:
            raise ValueError(f"k must be a positive integer, got {k!r}")
        k = min(int(k), self.num_entities)
        q = self.encode(texts, batch_size=batch_size, show_progress_bar=show_progress_bar)
        block = max(1, min(int(batch_size or self.query_block), len(q) or 1))
        score_fn, row_args, consts = self._table_scoring()
        table = self.params["entity_embeddings"]
        rows = np.zeros((len(q), k), np.int64)
        scores = np.zeros((len(q), k), np.float32)
        for start, part in self._query_blocks(q, block):
            s, r = table_ranking.top_k(score_fn, part, table, k, num_rows=self.num_entities,
                                       row_args=row_args, consts=consts,
                                       row_block=self.row_block)
            stop = min(start + block, len(q))
            rows[start:stop] = np.asarray(r)[:stop - start]
            scores[start:stop] = np.asarray(s)[:stop - start]
        return rows, scores

    def relevant_ranks(self, texts: Sequence[str], relevant: Sequence[Sequence[int]], *,
                       batch_size: int | None = None, show_progress_bar: bool = False
                       ) -> tuple[np.ndarray, np.ndarray]:
        """``metrics.ranks_of_relevant`` of :meth:`score` shard by shard, ``[n_pairs]`` int64;
        ValueError: lengths differ, a bad relevant list, empty texts."""
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
        block = max(1, min(int(batch_size or self.query_block), len(q) or 1))
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
                row_args=row_args, consts=consts, row_block=self.row_block)
            scores[start:stop], at_least[start:stop] = s[:stop - start], c[:stop - start]
        return table_ranking.ranks_from_counts(rel, scores, at_least)

    # -- the table on the host -----------------------------------------------------------------

    def iter_entity_blocks(self, block_rows: int = 8192
                           ) -> Iterator[tuple[int, list[str], np.ndarray]]:
        """``(start, ids, vectors [rows, dim] float32)`` table blocks, cut on their devices."""
        if block_rows < 1:
            raise ValueError(f"block_rows must be positive, got {block_rows}")
        for start, block in parallel.iter_row_blocks(self.params["entity_embeddings"],
                                            self.num_entities, block_rows):
            yield (start, self.entity_ids[start:start + len(block)],
                   np.asarray(block, dtype=np.float32))

    def entity_embeddings(self) -> np.ndarray:
        """``[num_entities, dim]`` float32 entity vectors (raw)."""
        blocks = [b for _, _, b in self.iter_entity_blocks()]
        return np.concatenate(blocks, axis=0)

    # -- serving (embedding_core.serving.serving) -------------------------------------------

    def export_meta(self) -> dict:
        meta = {"encoder": self.config.model, "config": self.config.to_dict()}
        return {**meta, "score": FULL_SCORE} if self.variant == "full" else meta

    def table(self, view: str, normalize: bool):
        """The ``entities`` view: ``(num_entities, (ids, rows) blocks)`` of ``block_rows``."""
        return self.num_entities, ((ids, l2_normalize(v) if normalize else v)
                                   for _, ids, v in self.iter_entity_blocks(self.block_rows))

    def hf_folders(self) -> list[HFFolder]:
        """Dual, Hybrid: ``f`` as a sentence-transformers folder; ValueError for Full."""
        if self.variant == "full":
            raise ValueError(
                f"{self.workdir or self.name} is a DocEnt-Full run: its query vector is the "
                "MLM head's output at the [MASK] of '[CLS] [MASK] [SEP] query [SEP]' over the "
                "word pieces and one token per entity, not a pooled sentence encoder, so "
                "export-hf (Dual and Hybrid only) cannot write it; `docent-jax export "
                "--input=QUERIES.txt` exports its entity and query vectors")
        config, params = self.config, self.params
        projection = params.get("projection") if int(config.projection_dim) else None
        head = hf_export.SentenceHead(
            pooling=config.pooling,
            dense_kernel=None if projection is None else projection["kernel"],
            dense_bias=None if projection is None else projection["bias"])
        scale = float(self.model.apply({"params": params}, method=DocEntDual.scale))
        info = {"model": self.name, "view": "queries", "step": self.step,
                "workdir": storage.display(self.workdir) if self.workdir else None,
                "encoder": config.model, "pooling": config.pooling,
                "projection_dim": int(config.projection_dim), "scale": scale,
                "normalized": False, "similarity": "cosine",
                "entities": "entities/ (embeddings.npy, ids.txt, meta.json)"}
        readme = hf_export.readme(
            f"{self.name} query encoder f", "Input: a query or sentence. The entity vectors "
            "g(e) are in entities/embeddings.npy (row i = line i of entities/ids.txt); "
            f"score(e, q) = {scale:.4g} * cos(f(q), g(e)).\n", step=self.step)
        return [HFFolder("", dict(
            encoder_params=params["transformer"], encoder_config=self.model.config,
            tokenizer=self.tokenizer, max_length=sentence_length(config), head=head,
            info=info, readme=readme))]


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
    """A workdir's saved config, checked; FileNotFoundError, ValueError (the file named)."""
    return configs.read_config(workdir, FIELDS, prog=PROG, required=REQUIRED_FIELDS,
                               validate=validate_config)


def _check_fits(workdir, model, config, device_bytes: int | None) -> None:
    if device_bytes is None:
        stats = jax.local_devices()[0].memory_stats() or {}
        device_bytes = stats.get("bytes_limit")
    # The table, and Full's bias beside it, float32.
    table = model.num_rows * (model.dim + isinstance(model, DocEntFull)) * 4
    if device_bytes is not None and table > int(device_bytes):
        raise ValueError(
            f"{storage.display(workdir)}: the entity table ({model.num_rows} x {model.dim} "
            f"float32, {table / 2**30:.3g} GiB) is larger than one device "
            f"({int(device_bytes) / 2**30:.3g} GiB) and mesh=None puts it whole on each; "
            "split it: load(workdir, mesh=embedding_core.distributed.parallel.make_mesh(-1, M)) "
            "with M "
            f"dividing table_multiple={config.table_multiple} (docent-jax: "
            "--config.mesh_model=M)")


def load(workdir: str | os.PathLike, *, step: int | None = None,
         mesh: Mesh | None = None, device_bytes: int | None = None) -> EntityRanker:
    """The latest (or ``step``'s) params: ``mesh=None`` a whole copy per process (refused over
    ``device_bytes``), else the table split over ``"model"``; FileNotFoundError, ValueError."""
    config = read_config(workdir)
    entity_ids = read_entity_ids(storage.as_path(workdir) / ENTITY_IDS_FILE)
    # The encoder's shape and tokenizer: the workdir's copy, or the base model for older
    # runs; its weights are never read (the checkpoint holds them all).
    model_dir = workdir_model_dir(workdir, config.model)
    model = build_model(config, EncoderConfig.from_hf_config(model_dir), len(entity_ids))
    if mesh is None:
        _check_fits(workdir, model, config, device_bytes)
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
    ranker = EntityRanker(model, params, load_tokenizer(model_dir), config, entity_ids,
                          step=restored_step)
    ranker.workdir = workdir
    return ranker


__all__ = ["EntityRanker", "load", "read_config"]
