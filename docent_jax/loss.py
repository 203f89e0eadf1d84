"""DocEnt's objectives, one function per equation (``docs/docent.md``); masks are drawn in the
loss from the step key (the same on a resume and any mesh)."""

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
from embedding_core.losses.contrastive import (
    ContrastiveLoss,
    GradAccumulation,
    gather_keys,
    map_rows,
    per_example,
)
from embedding_core.losses.losses import cosine_similarity_matrix, info_nce
from embedding_core.losses.table_update import TABLE_STATS, FusedTableUpdate, softmax_table_stats
from embedding_core.losses.vocab_softmax import (
    vocab_parallel_logsumexp,
    vocab_parallel_softmax_cross_entropy,
)
from embedding_core.training.task import LossFn


def in_batch_entity_loss(
    sentences: jax.Array, entities: jax.Array, entity_ids: jax.Array, scale: jax.Array | float,
    row_chunk: int = 0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """In-batch softmax with same-entity masking (``info_nce``, temperature ``1 / a``)::

        l_i = -a cos(f_i, g(e_i)) + log sum_{j : j == i or e_j != e_i} exp(a cos(f_i, g(e_j)))

    ``sentences``, ``entities`` ``[b, dim]``, ``entity_ids`` ``[b]`` int32; ``row_chunk``: rows per
    data device at a time. Returns ``(mean, {"scale", "distinct_entities"})``, float32."""
    b = sentences.shape[0]
    entities, entity_ids_keys = gather_keys((entities, entity_ids), b, row_chunk)

    def per_row(rows):
        queries, index = rows
        return info_nce(queries, entities, index, temperature=1.0 / scale,
                        key_ids=entity_ids_keys)

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
    """Softmax over the whole table, vocabulary-parallel over ``"model"``::

        l_i = -a cos(f_i, g(e_i)) + log sum_{e < num_entities} exp(a cos(f_i, g(e)))

    ``sentences`` ``[b, dim]``, ``table`` ``[rows, dim]``, ``entity_ids`` ``[b]`` int32;
    ``fused_table``: no table gradient, its statistics under ``metrics[TABLE_STATS]``."""
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
    """Dual's loss split at ``f(s)``; sentence i's dropout key ``fold_in(step key, i)``."""
    block_size = int(config.vocab_block_size)
    row_chunk = int(config.loss_chunk_size)
    fused_table = bool(config.fused_table_update)

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
    """``-log P(e | s)`` with ``softmax``'s denominator: Dual's and Hybrid's dual term."""
    if softmax == "full_vocab":
        return full_vocab_entity_loss(sentences, table, entity_ids, scale, mesh, num_entities,
                                      block_size, fused_table)
    return in_batch_entity_loss(sentences, table[entity_ids], entity_ids, scale, row_chunk)


# ----------------------------------------------------------------------------- Full, Hybrid


def _cross_entropy_sums(logits: jax.Array, labels: jax.Array,
                        weights: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    logits = logits.astype(jnp.float32)
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return jnp.sum(ce * weights), jnp.sum(correct * weights), jnp.sum(weights)


def _mean(total: jax.Array, count: jax.Array) -> jax.Array:
    return total / jnp.maximum(count, 1.0)


def _warmup_off(batch: Mapping[str, jax.Array]) -> jax.Array:
    """The weight of the non-word-piece terms: 0.0 in the head warm-up, else 1.0."""
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
    """Cross-entropy over ``[word pieces; entities]``, ``z_v = t . E_v + b_v``, ``log Z =
    logaddexp(log Z_words, log Z_entities)`` (entities vocabulary-parallel): ``t`` ``[n, hidden]``,
    ``labels`` ``[n]`` union ids -> ``(ce, correct)`` ``[n]`` float32."""
    t = t.astype(jnp.float32)
    vocab = word_table.shape[0]
    words = jnp.einsum("nh,vh->nv", t, word_table.astype(jnp.float32),
                       precision=jax.lax.Precision.HIGHEST) + word_bias
    word_lse = jax.nn.logsumexp(words, axis=-1)
    word_target = jnp.take_along_axis(words, jnp.clip(labels, 0, vocab - 1)[:, None], axis=1)[:, 0]
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
    """DocEnt-Full's ``L_MLM + lambda * L_E`` (sec. 3) over the union vocabulary;
    ``single_cross_entropy``: ``(sum_words + lambda * sum_entities) / (n_words + n_entities)`` (the
    released TF1 code); lambda 0 in the head warm-up. Returns ``(loss, {mlm_loss, entity_loss,
    mlm_accuracy, entity_accuracy, masked_words, masked_entities})``, float32."""
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
    """DocEnt-Hybrid's ``L_dual + mlm_weight * L_MLM`` (``L_dual`` 0 in the warm-up;
    ``clean_dual``: ``f(s)`` unmasked) -> ``(loss, metrics)`` float32."""
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
    """The :class:`MaskingConfig` of a config's masking fields."""
    return MaskingConfig.from_tokenizer(
        tokenizer, word_mask_rate=float(config.word_mask_rate),
        entity_mask_rate=float(config.entity_mask_rate),
        max_predictions=int(config.max_predictions))


def make_loss_fn(model: DocEntDual | DocEntFull | DocEntHybrid,
                 config: ml_collections.ConfigDict, mesh: Mesh,
                 masking: MaskingConfig | None = None) -> LossFn:
    """``config.variant``'s ``loss_fn(params, batch, rng)``; ValueError: Full, Hybrid without
    ``masking``."""
    variant = config.variant
    if variant == "dual":
        return make_dual_loss_fn(model, config, mesh)
    if masking is None:
        raise ValueError(f"variant {variant!r} needs a MaskingConfig")
    if variant == "full":
        options = dict(entity_loss_weight=float(config.entity_loss_weight),
                       single_cross_entropy=bool(config.single_cross_entropy),
                       dropout=bool(config.dropout),
                       vocab_block_size=int(config.vocab_block_size))

        def loss_fn(params, batch, rng):
            return full_loss(model, params, batch, rng, masking, mesh, **options)
    else:
        options = dict(softmax=config.softmax, mlm_weight=float(config.mlm_loss_weight),
                       clean_dual=config.hybrid_dual_input == "clean",
                       dropout=bool(config.dropout),
                       vocab_block_size=int(config.vocab_block_size))

        def loss_fn(params, batch, rng):
            return hybrid_loss(model, params, batch, rng, masking, mesh, **options)

    return loss_fn


def grad_accumulation(config: ml_collections.ConfigDict) -> GradAccumulation | None:
    """Full's micro-batches weighted by masked tokens: exact means (``docs/docent.md``)."""
    if config.variant != "full":
        return None
    counts = ("masked_words", "masked_entities")  # logged as the step's totals
    if bool(config.single_cross_entropy):
        return GradAccumulation(lambda m: m["masked_words"] + m["masked_entities"], counts)
    return GradAccumulation(lambda m: m["masked_words"], counts)


def fused_table_update(config: ml_collections.ConfigDict,
                       num_entities: int) -> FusedTableUpdate | None:
    """Dual's blockwise table update when ``config.fused_table_update`` (cosine logits)."""
    if not config.fused_table_update:
        return None
    return FusedTableUpdate(("entity_embeddings",), num_entities, int(config.vocab_block_size),
                            cosine=True, grad_clip_norm=float(config.grad_clip_norm) or None)
