"""DocEnt-Dual's objective: maximise log P(e | s) over (entity, sentence) pairs.

``P(e | s) = exp(a cos(g(e), f(s))) / sum_{e'} exp(a cos(g(e'), f(s)))`` (Zemlyanskiy et al.
2021, sec. 3.1, after RELIC). Two choices of the denominator's entities (``config.loss``):

* ``"in_batch"``: the entities of the global batch (the DocEnt paper's footnote 3: "only a
  subset of entities ... the so called in-batch negatives"). Several sentences of one
  entity can share a batch; the copies of a sentence's own entity are removed from its
  denominator, so they are neither negatives nor counted twice (PITFALLS: accidental hits).
* ``"full"``: every entity of the table, computed vocabulary-parallel over the ``"model"``
  mesh axis (``embedding_core.losses.vocab_parallel_softmax_cross_entropy``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from embedding_core.losses import info_nce, vocab_parallel_softmax_cross_entropy

LOSSES = ("in_batch", "full")


def in_batch_entity_loss(
    sentences: jax.Array, entities: jax.Array, entity_ids: jax.Array, scale: jax.Array | float
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

    Returns:
      ``(loss, metrics)``: the batch mean (float32 scalar) and ``{"scale", "distinct_entities"}``
      (the number of distinct entities in the batch, i.e. candidates per sentence).
    """
    b = sentences.shape[0]
    per = info_nce(sentences, entities, jnp.arange(b, dtype=jnp.int32),
                   temperature=1.0 / scale, key_ids=entity_ids)
    first = jnp.argmax(entity_ids[None, :] == entity_ids[:, None], axis=1) == jnp.arange(b)
    return jnp.mean(per), {"scale": jnp.asarray(scale, jnp.float32),
                           "distinct_entities": jnp.sum(first).astype(jnp.float32)}


def full_softmax_entity_loss(
    sentences: jax.Array,
    table: jax.Array,
    entity_ids: jax.Array,
    scale: jax.Array | float,
    mesh: Mesh,
    num_entities: int,
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

    Returns:
      ``(loss, metrics)``: the batch mean (float32 scalar) and ``{"scale"}``.
    """
    per = vocab_parallel_softmax_cross_entropy(sentences, table, entity_ids, mesh, scale,
                                               num_classes=num_entities)
    return jnp.mean(per), {"scale": jnp.asarray(scale, jnp.float32)}
