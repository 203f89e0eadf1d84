"""The DualCSE 5-term contrastive loss and the supervised SimCSE loss (``docs/dualcse.md``).

Both are written on the global batch (all devices' premises are negatives of each other)
and are built from ``embedding_core.losses.info_nce``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from data_pipelines.dualcse_data import sentence_slot
from embedding_core.contrastive import map_rows
from embedding_core.losses import info_nce

# Sentence slots of an INLI example on the model's sentence axis (dualcse_data.SENTENCES).
PREMISE, EXPLICIT, IMPLIED, CONTRADICTION = (
    sentence_slot("cross", s) for s in ("premise", "explicit_hyp", "implied_hyp",
                                        "contradiction"))
ANCHOR, POSITIVE, HARD_NEGATIVE = (
    sentence_slot("simcse", s) for s in ("anchor", "positive", "hard_negative"))


def _check_ids(vectors: jax.Array, text_ids: jax.Array) -> None:
    # Ids of the wrong layout (e.g. one per indicator field instead of one per sentence)
    # would silently mask true negatives; refuse them at trace time.
    if tuple(text_ids.shape) != tuple(vectors.shape[:2]):
        raise ValueError(f"text_ids has shape {tuple(text_ids.shape)}; expected one id per "
                         f"sentence, {tuple(vectors.shape[:2])}")


def _ids(text_ids: jax.Array, kind: int) -> jax.Array:
    # A vector's identity is (text, which of r/u): equal identities are equal vectors, so a
    # copy of the positive is masked out of the denominator instead of pushed away.
    return text_ids * 2 + kind


def dualcse_loss(
    r: jax.Array,
    u: jax.Array,
    text_ids: jax.Array,
    *,
    temperature: float = 0.05,
    use_contradiction: bool = True,
    use_intra: bool = True,
    row_chunk: int = 0,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """DualCSE loss (Oda et al. 2025, the loss equation of Sec. 3; ``docs/dualcse.md``).

    With ``v(a, b) = exp(cos(a, b) / tau)`` and sums over the global batch j::

        l_i = -log v(r_i, r+_i1) / sum_j [v(r_i, r+_j1) + v(r_i, r-_j) + v(r_i, u_j)]
              -log v(u_i, r+_i2) / sum_j [v(u_i, r+_j2) + v(u_i, r-_j) + v(u_i, r_j)]
              -log v(r+_i1, u+_i1) / sum_j v(r+_i1, u+_j1)
              -log v(r+_i2, u+_i2) / sum_j v(r+_i2, u+_j2)
              -log v(r-_i, u-_i) / sum_j v(r-_i, u-_j)

    Ablation switches (our reading of the paper's ablations):

    * ``use_contradiction=False`` removes the contradiction negatives ``r-_j`` from terms
      1-2 and drops term 5 (contradictions are then unused);
    * ``use_intra=False`` removes the intra-sentence relations: the premise's other vector
      (``u_j`` in term 1, ``r_j`` in term 2) and terms 3-5.

    Args:
      r, u: ``[batch, 4, dim]`` float explicit / implicit vectors of (premise, explicit
        entailment, implied entailment, contradiction).
      text_ids: ``[batch, 4]`` int32 sentence identities (one per sentence, not per
        indicator field: see ``model.sentence_text_ids``); keys whose identity equals the
        positive's are removed from the denominator (duplicates are not negatives).
      temperature: tau; the paper uses 0.05.
      row_chunk: > 0: the query rows are scored in chunks of this many rows per data
        device (``embedding_core.contrastive.map_rows``; ``config.contrastive_chunk_size``),
        so a device holds ``[row_chunk, keys]`` scores instead of ``[its rows, keys]``.

    Raises:
      ValueError: ``text_ids`` is not ``[batch, 4]``; ``row_chunk`` does not divide the
        rows per device.

    Returns:
      ``(loss, terms)``: the batch mean of ``l_i`` (float32 scalar) and the mean of each
      term (``term1`` ... ``term5``; dropped terms are absent).
    """
    _check_ids(r, text_ids)
    r = r.astype(jnp.float32)
    u = u.astype(jnp.float32)
    n = r.shape[0]
    rid, uid = _ids(text_ids, 0), _ids(text_ids, 1)

    def keys(blocks):
        return (jnp.concatenate([b[0] for b in blocks], axis=0),
                jnp.concatenate([b[1] for b in blocks], axis=0))

    keys1 = [(r[:, EXPLICIT], rid[:, EXPLICIT])]
    keys2 = [(r[:, IMPLIED], rid[:, IMPLIED])]
    if use_contradiction:
        keys1.append((r[:, CONTRADICTION], rid[:, CONTRADICTION]))
        keys2.append((r[:, CONTRADICTION], rid[:, CONTRADICTION]))
    if use_intra:
        keys1.append((u[:, PREMISE], uid[:, PREMISE]))
        keys2.append((r[:, PREMISE], rid[:, PREMISE]))
    slots = [EXPLICIT, IMPLIED] + ([CONTRADICTION] if use_contradiction else [])
    # Every term's keys hold the positives first, in row order: row i's positive is key i.
    keys1, keys2 = keys(keys1), keys(keys2)
    intra = {slot: (u[:, slot], uid[:, slot]) for slot in slots} if use_intra else {}

    def terms_of(rows):  # per-row terms of a chunk of query rows against every key
        r_rows, u_rows, index = rows

        def term(query, key_block):
            return info_nce(query, key_block[0], index, temperature=temperature,
                            key_ids=key_block[1])

        out = {"term1": term(r_rows[:, PREMISE], keys1),
               "term2": term(u_rows[:, PREMISE], keys2)}
        for k, slot in enumerate(intra, start=3):
            out[f"term{k}"] = term(r_rows[:, slot], intra[slot])
        return out

    terms = map_rows(terms_of, (r, u, jnp.arange(n, dtype=jnp.int32)), row_chunk)
    total = sum(terms.values())
    return jnp.mean(total), {k: jnp.mean(v) for k, v in terms.items()}


def simcse_loss(
    e: jax.Array, text_ids: jax.Array, *, temperature: float = 0.05, row_chunk: int = 0
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Supervised SimCSE (Gao et al. 2021, eq. 5): anchors against positives + hard negatives.

    ``l_i = -log v(h_i, h+_i) / sum_j [v(h_i, h+_j) + v(h_i, h-_j)]``, one direction, over
    the global batch. A hard negative with the same text identity as its own row's positive
    is no negative: it is left out of every row's sum (how a row without a hard negative is
    stored, ``dualcse_jax.data``), so such rows add in-batch negatives only.

    Rows whose anchors share a text identity (SimCSE(INLI) writes two rows per premise,
    its explicit and its implied entailment as positives) are siblings: a sibling's
    positive is a positive of this anchor too, so it is left out of this row's sum rather
    than pushed away (``docs/dualcse.md``, "Baselines"). The siblings' shared hard
    negative stays a negative.

    Args:
      e: ``[batch, 3, dim]`` float vectors of (anchor, positive, hard negative).
      text_ids: ``[batch, 3]`` int32 text identities (duplicates of the positive masked;
        equal anchor ids mark sibling rows).
      row_chunk: > 0: anchors scored in chunks of this many rows per data device
        (:func:`dualcse_loss`).

    Returns:
      ``(loss, {})``: float32 batch mean.
    """
    _check_ids(e, text_ids)
    e = e.astype(jnp.float32)
    n = e.shape[0]
    keys = jnp.concatenate([e[:, POSITIVE], e[:, HARD_NEGATIVE]], axis=0)
    ids = jnp.concatenate([text_ids[:, POSITIVE], text_ids[:, HARD_NEGATIVE]], axis=0)
    has_negative = text_ids[:, HARD_NEGATIVE] != text_ids[:, POSITIVE]
    valid = jnp.concatenate([jnp.ones(n, bool), has_negative])
    anchor = text_ids[:, ANCHOR]
    rows = (e[:, ANCHOR], anchor, jnp.arange(n, dtype=jnp.int32))

    def losses_of(chunk):  # a chunk of anchors against every key: [c, 2n] at a time
        query, anchor_rows, index = chunk
        sibling = (anchor_rows[:, None] == anchor[None, :]) & (
            index[:, None] != jnp.arange(n)[None, :])  # [c, n]
        valid_rows = valid[None, :] & ~jnp.concatenate(
            [sibling, jnp.zeros(sibling.shape, bool)], axis=1)

        def row(q, positive, row_valid):  # info_nce's key_valid is per key: one row each
            return info_nce(q[None], keys, positive[None], temperature=temperature,
                            key_ids=ids, key_valid=row_valid)[0]

        return jax.vmap(row)(query, index, valid_rows)

    per = map_rows(losses_of, rows, row_chunk)
    return jnp.mean(per), {}
