"""DocEnt's objectives, one function per equation (``docs/docent.md``).

**DocEnt-Dual**: maximise log P(e | s) over (entity, sentence) pairs, with
``P(e | s) = exp(a cos(g(e), f(s))) / sum_{e'} exp(a cos(g(e'), f(s)))`` (Zemlyanskiy et al.
2021, sec. 3.1, after RELIC). Two choices of the denominator's entities
(``config.softmax``):

* ``"in_batch"``: the entities of the global batch (the DocEnt paper's footnote 3: "only a
  subset of entities ... the so called in-batch negatives"). Several sentences of one
  entity can share a batch; the copies of a sentence's own entity are removed from its
  denominator, so they are neither negatives nor counted twice (accidental hits).
* ``"full_vocab"``: every entity of the table, computed vocabulary-parallel over the
  ``"model"`` mesh axis (``embedding_core.losses.vocab_parallel_softmax_cross_entropy``).
  Not to be confused with DocEnt-Full, the MLM model below.

**DocEnt-Full** (``L_MLM + lambda * L_E`` over the union vocabulary, entity part
vocabulary-parallel) and **DocEnt-Hybrid** (Dual's term + entity-conditioned MLM):
:func:`full_loss`, :func:`hybrid_loss`; :func:`make_loss_fn` picks by ``config.variant``.
Masking is done in JAX inside the loss from the step's rng (``make_train_step`` passes
``fold_in(rng, step)``; ``docent_jax.masking``): the masks of a step depend
only on (seed, step, batch), so a resumed run draws exactly the masks the uninterrupted run
would have, and ``jax.random`` draws the global array, so they do not change with the mesh.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from jax.sharding import Mesh

from docent_jax.masking import (
    ENTITY_POSITION,
    MaskingConfig,
    mask_entity_tokens,
    mask_word_pieces,
    maskable_word_pieces,
)
from docent_jax.model import DocEntDual, DocEntFull, DocEntHybrid, word_table
from embedding_core.contrastive import ContrastiveLoss, map_rows, per_example
from embedding_core.losses import (
    cosine_similarity_matrix,
    info_nce,
    vocab_parallel_logsumexp,
    vocab_parallel_softmax_cross_entropy,
)
from embedding_core.table_update import TABLE_STATS, softmax_table_stats
from embedding_core.task import LossFn


def in_batch_entity_loss(
    sentences: jax.Array, entities: jax.Array, entity_ids: jax.Array, scale: jax.Array | float,
    row_chunk: int = 0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """In-batch softmax with same-entity masking.

    Sentence i's candidates are ``g(e_j)`` for every sentence j of the batch; its positive
    is ``g(e_i)``; every other j with ``e_j == e_i`` is masked out of the denominator::

        l_i = -a cos(f_i, g(e_i)) + log sum_{j : j == i or e_j != e_i} exp(a cos(f_i, g(e_j)))

    This is ``info_nce`` with temperature ``1 / a`` and ``key_ids = entity ids``.

    Args:
      sentences: ``[b, dim]`` float sentence vectors ``f(s)``.
      entities: ``[b, dim]`` float ``g(e_i)`` of each sentence's entity.
      entity_ids: ``[b]`` int32 entity of each sentence.
      scale: the scale a (> 0), float or float32 scalar array.
      row_chunk: > 0: sentences scored in chunks of this many rows per data device
        (``embedding_core.contrastive.map_rows``; ``config.contrastive_chunk_size``), so
        a device holds ``[row_chunk, b]`` scores instead of ``[its rows, b]``.

    Returns:
      ``(loss, metrics)``: the batch mean (float32 scalar) and ``{"scale", "distinct_entities"}``
      (the number of distinct entities in the batch, i.e. candidates per sentence).
    """
    b = sentences.shape[0]

    def per_row(rows):
        queries, index = rows
        return info_nce(queries, entities, index, temperature=1.0 / scale,
                        key_ids=entity_ids)

    per = map_rows(per_row, (sentences, jnp.arange(b, dtype=jnp.int32)), row_chunk)
    ordered = jnp.sort(entity_ids)  # O(b log b): no [b, b] comparison
    distinct = 1 + jnp.sum(ordered[1:] != ordered[:-1])
    return jnp.mean(per), {"scale": jnp.asarray(scale, jnp.float32),
                           "distinct_entities": distinct.astype(jnp.float32)}


def full_vocab_entity_loss(
    sentences: jax.Array,
    table: jax.Array,
    entity_ids: jax.Array,
    scale: jax.Array | float,
    mesh: Mesh,
    num_entities: int,
    block_size: int = 0,
    fused_table: bool = False,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Softmax over the whole entity table, vocabulary-parallel over the ``"model"`` axis.

    ``l_i = -a cos(f_i, g(e_i)) + log sum_{e < num_entities} exp(a cos(f_i, g(e)))``; table
    rows at or beyond ``num_entities`` are padding and take no part.

    Args:
      sentences: ``[b, dim]`` float; ``b`` divisible by the mesh's data size.
      table: ``[rows, dim]`` float, rows divisible by the mesh's model size.
      entity_ids: ``[b]`` int32 targets in ``[0, num_entities)``.
      scale: the scale a.
      mesh: the training mesh.
      num_entities: real rows of the table.
      block_size: rows per block of the tiled scan inside each table shard
        (``config.vocab_block_size``; 0 = untiled).
      fused_table: the train step updates the table block by block
        (``config.fused_table_update``): no gradient flows to ``table`` here, and the
        per-query statistics its gradient is made of go to the step under
        ``metrics[embedding_core.table_update.TABLE_STATS]`` (weight ``1 / b`` each: the
        loss is the batch mean).

    Returns:
      ``(loss, metrics)``: the batch mean (float32 scalar) and ``{"scale"}`` (and the
      table statistics with ``fused_table``).
    """
    metrics = {"scale": jnp.asarray(scale, jnp.float32)}
    if not fused_table:
        per = vocab_parallel_softmax_cross_entropy(sentences, table, entity_ids, mesh, scale,
                                                   num_classes=num_entities,
                                                   block_size=block_size)
        return jnp.mean(per), metrics
    stats = vocab_parallel_logsumexp(sentences, table, entity_ids, mesh, scale,
                                     num_classes=num_entities, block_size=block_size,
                                     table_gradient=False)
    b = sentences.shape[0]
    metrics[TABLE_STATS] = softmax_table_stats(sentences, entity_ids,
                                               jnp.full((b,), 1.0 / b, jnp.float32),
                                               stats.logsumexp, scale)
    return jnp.mean(stats.logsumexp - stats.target_logit), metrics


def make_dual_loss_fn(model: DocEntDual, config: ml_collections.ConfigDict,
                      mesh: Mesh) -> ContrastiveLoss:
    """DocEnt-Dual's ``loss_fn(params, batch, rng) -> (loss, metrics)`` on the global batch,
    split at the sentence vectors ``f(s)`` (``embedding_core.contrastive.ContrastiveLoss``:
    ``config.contrastive_chunk_size`` chunks the encoder; the table and the scale enter
    the loss directly).

    The batch holds ``input_ids``, ``attention_mask``, ``token_type_ids`` ``[b, 1, L]`` and
    ``entity_ids`` ``[b]`` int32 (``docent_jax.data.make_batches``); ``config.softmax``
    picks :func:`in_batch_entity_loss` or :func:`full_vocab_entity_loss`
    (``config.vocab_block_size`` tiles the latter; ``config.fused_table_update`` leaves
    its table's update to the train step). With dropout, sentence i is encoded
    with the key ``fold_in(step key, i)`` (``contrastive.per_example``).
    """
    block_size = int(config.get("vocab_block_size", 0))
    row_chunk = int(config.get("contrastive_chunk_size", 0))
    fused_table = bool(config.get("fused_table_update", False))

    def embed(params, batch, rows, rng):
        def apply(inputs, key):
            b, f, seq = inputs[0].shape
            flat = [x.reshape(b * f, seq) for x in inputs]
            return model.apply({"params": params}, *flat, deterministic=key is None,
                               rngs={} if key is None else {"dropout": key},
                               method=DocEntDual.encode_sentences)

        inputs = tuple(batch[k] for k in ("input_ids", "attention_mask", "token_type_ids"))
        sentences = per_example(apply, bool(config.dropout))(inputs, rows, rng)
        return sentences.reshape(-1, sentences.shape[-1])

    def loss(params, sentences, batch, rng):
        table, scale = model.apply({"params": params},
                                   method=lambda m: (m.entity_table(), m.scale()))
        return entity_softmax_loss(config.softmax, sentences, table, batch["entity_ids"],
                                   scale, mesh, model.num_entities, block_size, row_chunk,
                                   fused_table)

    return ContrastiveLoss(embed, loss)


def entity_softmax_loss(softmax: str, sentences: jax.Array, table: jax.Array,
                        entity_ids: jax.Array, scale: jax.Array | float, mesh: Mesh,
                        num_entities: int, block_size: int = 0, row_chunk: int = 0,
                        fused_table: bool = False) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DocEnt-Dual's objective ``-log P(e | s)`` with the denominator ``softmax`` names
    (``"in_batch"``: :func:`in_batch_entity_loss`; ``"full_vocab"``:
    :func:`full_vocab_entity_loss`). Dual and Hybrid's dual term both call this: one
    equation, one function.

    Args:
      sentences: ``[b, dim]`` float ``f(s)``; table: ``[rows, dim]`` float ``g``;
      entity_ids: ``[b]`` int32; scale: the scale a; mesh: the training mesh;
      num_entities: real rows of the table; block_size: the full softmax's tiling
      (:func:`full_vocab_entity_loss`); row_chunk: the in-batch softmax's query chunks
      (:func:`in_batch_entity_loss`); fused_table: the full softmax leaves the table's
      update to the step (:func:`full_vocab_entity_loss`).
    """
    if softmax == "full_vocab":
        return full_vocab_entity_loss(sentences, table, entity_ids, scale, mesh, num_entities,
                                      block_size, fused_table)
    return in_batch_entity_loss(sentences, table[entity_ids], entity_ids, scale, row_chunk)


# ----------------------------------------------------------------------------- Full, Hybrid


def _cross_entropy_sums(logits: jax.Array, labels: jax.Array,
                        weights: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sums of weighted cross-entropy and of correct top-1 predictions, and the weight sum."""
    logits = logits.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(ce * weights), jnp.sum(correct * weights), jnp.sum(weights)


def _mean(total: jax.Array, count: jax.Array) -> jax.Array:
    return total / jnp.maximum(count, 1.0)


def _warmup_off(batch: Mapping[str, jax.Array]) -> jax.Array:
    """0.0 while the batch is in the MLM head warm-up (``config.mlm_warmup_steps``), else 1.0:
    the weight of the non-word-piece terms (a word-piece-only warm-up)."""
    if "mlm_warmup" not in batch:
        return jnp.asarray(1.0, jnp.float32)
    return 1.0 - jnp.max(jnp.asarray(batch["mlm_warmup"], jnp.float32))


def union_cross_entropy(
    t: jax.Array,
    labels: jax.Array,
    word_table: jax.Array,
    word_bias: jax.Array,
    entity_table: jax.Array,
    entity_bias: jax.Array,
    mesh: Mesh,
    num_entities: int,
    block_size: int = 0,
) -> tuple[jax.Array, jax.Array]:
    """Cross-entropy of a softmax over the union vocabulary ``[word pieces; entities]``.

    Logits ``z_v = t . E_v + b_v`` with ``E = [word_table; entity_table[:num_entities]]``:
    the word part is dense (GSPMD shards it by the ``"vocab"`` rule), the entity part goes
    through ``embedding_core.losses.vocab_parallel_logsumexp`` over the ``"model"`` axis
    (the same path as DocEnt-Dual's full-vocabulary softmax), so the ``[n, num_entities]``
    logits never sit whole on one device; ``log Z = logaddexp(log Z_words, log Z_entities)``.

    Args:
      t: ``[n, hidden]`` float head outputs; ``n`` divisible by the mesh's data size.
      labels: ``[n]`` int32 union ids (word piece ``< vocab``, entity e ``= vocab + e``).
      word_table: ``[vocab, hidden]``; word_bias: ``[vocab]``.
      entity_table: ``[rows, hidden]``; entity_bias: ``[rows]``; rows divisible by the
        mesh's model size, rows ``>= num_entities`` are padding.
      block_size: rows per block of the entity part's tiled scan (0 = untiled).

    Returns:
      ``(ce, correct)``: ``[n]`` float32 cross-entropy and ``[n]`` float32 1.0 where the
      label's logit is the largest (ties count as correct).
    """
    t = t.astype(jnp.float32)
    vocab = word_table.shape[0]
    words = jnp.einsum("nh,vh->nv", t, word_table.astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST) + word_bias
    word_lse = jax.nn.logsumexp(words, axis=-1)
    word_target = jnp.take_along_axis(words, jnp.clip(labels, 0, vocab - 1)[:, None],
                                      axis=1)[:, 0]
    ent = vocab_parallel_logsumexp(t, entity_table, labels - vocab, mesh, 1.0,
                                   bias=entity_bias, cosine=False, num_classes=num_entities,
                                   block_size=block_size)
    is_entity = labels >= vocab
    target = jnp.where(is_entity, ent.target_logit, word_target)
    best = jnp.maximum(jax.lax.stop_gradient(jnp.max(words, axis=-1)), ent.max_logit)
    ce = jnp.logaddexp(word_lse, ent.logsumexp) - target
    return ce, (jax.lax.stop_gradient(target) >= best).astype(jnp.float32)


def full_loss(
    model: DocEntFull,
    params: Any,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    masking: MaskingConfig,
    mesh: Mesh,
    *,
    entity_loss_weight: float = 1.0,
    single_cross_entropy: bool = False,
    dropout: bool = False,
    vocab_block_size: int = 0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DocEnt-Full loss ``L_MLM + lambda * L_E`` (paper sec. 3, "DocEnt-Full").

    ``L_MLM`` is the mean cross-entropy of the masked word pieces and ``L_E`` that of the
    masked entity tokens, both with softmax over the union vocabulary (word pieces and
    entities, :func:`union_cross_entropy`), in float32. ``single_cross_entropy=True``
    instead averages all masked tokens together, ``(sum_words + lambda * sum_entities) /
    (n_words + n_entities)``: what the released TF1 code did in effect (one MLM loss over
    the union); the two agree up to the weighting of the terms. During the MLM head
    warm-up (``batch["mlm_warmup"]``) lambda is 0.

    Args:
      batch: ``input_ids``, ``attention_mask``, ``token_type_ids``: ``[batch, seq_len]`` int32
        in the ``docent_jax.data.full_inputs_from_tokens`` layout.
      rng: the step key; split into masking and dropout keys.
      masking: rates and ids; ``entity_loss_weight`` is lambda.
      mesh: the training mesh (the entity rows are split over its ``"model"`` axis).
      dropout: apply the encoder's dropout.
      vocab_block_size: tiling of the entity softmax (:func:`union_cross_entropy`).

    Returns:
      ``(loss, metrics)``: float32 scalar and ``mlm_loss``, ``entity_loss``, ``mlm_accuracy``,
      ``entity_accuracy``, ``masked_words``, ``masked_entities`` (counts in the batch).
    """
    mask_rng, entity_rng, dropout_rng = jax.random.split(rng, 3)
    ids, mask, types = (jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask",
                                                         "token_type_ids"))
    words = mask_word_pieces(mask_rng, ids, maskable_word_pieces(ids, mask, masking), masking)
    corrupted, entity_labels, entity_weights = mask_entity_tokens(entity_rng, words.input_ids,
                                                                  masking)
    b, slots = words.positions.shape
    positions = jnp.concatenate(
        [words.positions, jnp.full((b, 1), ENTITY_POSITION, jnp.int32)], axis=1)
    t = model.apply({"params": params}, corrupted, mask, types, positions,
                    deterministic=not dropout, rngs={"dropout": dropout_rng},
                    method=DocEntFull.predict)
    labels = jnp.concatenate([words.labels, entity_labels[:, None]], axis=1)
    ce, correct = union_cross_entropy(
        t.reshape(b * (slots + 1), -1), labels.reshape(-1), word_table(params),
        params["word_bias"], params["entity_embeddings"], params["entity_bias"], mesh,
        model.num_entities, vocab_block_size)
    ce, correct = ce.reshape(b, slots + 1), correct.reshape(b, slots + 1)
    w_loss, w_count = jnp.sum(ce[:, :-1] * words.weights), jnp.sum(words.weights)
    e_loss, e_count = jnp.sum(ce[:, -1] * entity_weights), jnp.sum(entity_weights)
    weight = entity_loss_weight * _warmup_off(batch)
    mlm, entity = _mean(w_loss, w_count), _mean(e_loss, e_count)
    if single_cross_entropy:
        loss = (w_loss + weight * e_loss) / jnp.maximum(w_count + e_count, 1.0)
    else:
        loss = mlm + weight * entity
    metrics = {"mlm_loss": mlm, "entity_loss": entity,
               "mlm_accuracy": _mean(jnp.sum(correct[:, :-1] * words.weights), w_count),
               "entity_accuracy": _mean(jnp.sum(correct[:, -1] * entity_weights), e_count),
               "masked_words": w_count, "masked_entities": e_count}
    return loss, metrics


def hybrid_loss(
    model: DocEntHybrid,
    params: Any,
    batch: Mapping[str, jax.Array],
    rng: jax.Array,
    masking: MaskingConfig,
    mesh: Mesh,
    *,
    softmax: str = "in_batch",
    mlm_weight: float = 1.0,
    clean_dual: bool = True,
    dropout: bool = False,
    vocab_block_size: int = 0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DocEnt-Hybrid loss: DocEnt-Dual's objective + entity-conditioned MLM.

    ``L_dual`` is Dual's ``-log P(e | s)`` with Dual's learned scale a and the same
    function (:func:`entity_softmax_loss`: in-batch, where another sentence of the same
    entity is not a negative, or the whole table). ``L_MLM`` is the mean cross-entropy of
    the masked word pieces predicted from ``[f(s_-J)_t ; g(e)]``. Loss ``L_dual +
    mlm_weight * L_MLM`` (``L_dual`` weighted 0 during the MLM head warm-up).

    ``clean_dual=True`` (default): the dual term's ``f(s)`` comes from a second encoder pass
    on the unmasked sentence, as at inference; ``False`` reuses the masked pass (one pass,
    cheaper). The paper does not say which; see ``docs/docent.md``.

    Args:
      batch: ``input_ids``, ``attention_mask``, ``token_type_ids`` ``[batch, seq_len]`` int32
        (the sentence alone) and ``entity_ids`` ``[batch]`` int32.
      rng: the step key; split into masking and dropout keys.
      mesh: the training mesh (for ``softmax="full_vocab"``).
      vocab_block_size: tiling of the ``full_vocab`` softmax (:func:`full_vocab_entity_loss`).

    Returns:
      ``(loss, metrics)``: ``dual_loss``, ``dual_accuracy`` (the sentence's own entity scores
      highest among the batch's other entities), ``mlm_loss``, ``mlm_accuracy``,
      ``masked_words``, ``scale``.
    """
    mask_rng, dropout_rng = jax.random.split(rng)
    ids, mask, types = (jnp.asarray(batch[k]) for k in ("input_ids", "attention_mask",
                                                         "token_type_ids"))
    entity_ids = jnp.asarray(batch["entity_ids"], jnp.int32)
    words = mask_word_pieces(mask_rng, ids, maskable_word_pieces(ids, mask, masking), masking)
    sentence, logits, table, scale = model.apply(
        {"params": params}, words.input_ids, mask, types, entity_ids, words.positions,
        clean_ids=ids if clean_dual else None, deterministic=not dropout,
        rngs={"dropout": dropout_rng})
    dual, dual_metrics = entity_softmax_loss(softmax, sentence, table, entity_ids, scale, mesh,
                                             model.num_entities, vocab_block_size)
    cos = cosine_similarity_matrix(sentence, table[entity_ids])
    index = jnp.arange(sentence.shape[0], dtype=jnp.int32)
    others = entity_ids[None, :] != entity_ids[:, None]
    best_other = jnp.max(jnp.where(others, cos, -jnp.inf), axis=1)
    dual_accuracy = jnp.mean((cos[index, index] > best_other).astype(jnp.float32))
    w_loss, w_correct, w_count = _cross_entropy_sums(logits, words.labels, words.weights)
    mlm = _mean(w_loss, w_count)
    metrics = {"dual_loss": dual, "dual_accuracy": dual_accuracy, "mlm_loss": mlm,
               "mlm_accuracy": _mean(w_correct, w_count), "masked_words": w_count,
               "scale": dual_metrics["scale"]}
    return _warmup_off(batch) * dual + mlm_weight * mlm, metrics


def masking_config(config: ml_collections.ConfigDict, tokenizer) -> MaskingConfig:
    """The :class:`~docent_jax.data.MaskingConfig` of a config's masking fields."""
    return MaskingConfig.from_tokenizer(
        tokenizer, word_mask_rate=float(config.word_mask_rate),
        entity_mask_rate=float(config.entity_mask_rate),
        max_predictions=int(config.max_predictions))


def make_loss_fn(model: DocEntDual | DocEntFull | DocEntHybrid,
                 config: ml_collections.ConfigDict, mesh: Mesh,
                 masking: MaskingConfig | None = None) -> LossFn:
    """The ``loss_fn(params, batch, rng) -> (loss, metrics)`` of ``config.variant`` on the
    global batch (``masking`` is required for Full and Hybrid)."""
    variant = config.get("variant", "dual")
    if variant == "dual":
        return make_dual_loss_fn(model, config, mesh)
    if masking is None:
        raise ValueError(f"variant {variant!r} needs a MaskingConfig")
    if variant == "full":
        options = dict(entity_loss_weight=float(config.entity_loss_weight),
                       single_cross_entropy=bool(config.single_cross_entropy),
                       dropout=bool(config.dropout),
                       vocab_block_size=int(config.get("vocab_block_size", 0)))

        def loss_fn(params, batch, rng):
            return full_loss(model, params, batch, rng, masking, mesh, **options)
    else:
        options = dict(softmax=config.softmax, mlm_weight=float(config.mlm_loss_weight),
                       clean_dual=config.hybrid_dual_input == "clean",
                       dropout=bool(config.dropout),
                       vocab_block_size=int(config.get("vocab_block_size", 0)))

        def loss_fn(params, batch, rng):
            return hybrid_loss(model, params, batch, rng, masking, mesh, **options)

    return loss_fn
