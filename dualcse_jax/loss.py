"""DualCSE's 5-term loss and supervised SimCSE's on the global batch (``docs/dualcse.md``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dualcse_jax.tables import sentence_slot
from embedding_core import info_nce
from embedding_core.losses.contrastive import gather_keys, map_rows

# Sentence slots on the model's sentence axis (tables.SENTENCES).
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
    """DualCSE loss (Oda et al. 2025, Sec. 3), ``v(a, b) = exp(cos(a, b) / tau)``, j over the
    global batch::

        l_i = -log v(r_i, r+_i1) / sum_j [v(r_i, r+_j1) + v(r_i, r-_j) + v(r_i, u_j)]
              -log v(u_i, r+_i2) / sum_j [v(u_i, r+_j2) + v(u_i, r-_j) + v(u_i, r_j)]
              -log v(r+_i1, u+_i1) / sum_j v(r+_i1, u+_j1)
              -log v(r+_i2, u+_i2) / sum_j v(r+_i2, u+_j2)
              -log v(r-_i, u-_i) / sum_j v(r-_i, u-_j)

    ``use_contradiction`` / ``use_intra``: ablations (``docs/dualcse.md``, "Loss implementation").
    ``r``, ``u``: ``[batch, 4, dim]`` float (premise, explicit, implied, contradiction);
    ``text_ids`` ``[batch, 4]`` int32 (keys equal to the positive leave the denominator);
    ``row_chunk`` > 0: query rows per data device at a time. ValueError: ``text_ids`` not ``[batch,
    4]``, ``row_chunk`` not dividing the rows. Returns ``(loss, terms)``: float32 batch mean and
    each kept term's mean (``term1``...)."""
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
    keys1, keys2, intra = gather_keys((keys1, keys2, intra), n, row_chunk)

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
    """Supervised SimCSE (Gao et al. 2021, eq. 5) over the global batch: ``l_i = -log v(h_i,
    h+_i) / sum_j [v(h_i, h+_j) + v(h_i, h-_j)]``; a hard negative equal to its row's positive and a
    sibling row's positive (equal anchor ids) leave row i's sum. ``e``: ``[batch, 3, dim]`` (anchor,
    positive, hard negative); ``text_ids`` ``[batch, 3]`` int32. Returns ``(loss, {})``, float32."""
    _check_ids(e, text_ids)
    e = e.astype(jnp.float32)
    n = e.shape[0]
    keys = jnp.concatenate([e[:, POSITIVE], e[:, HARD_NEGATIVE]], axis=0)
    ids = jnp.concatenate([text_ids[:, POSITIVE], text_ids[:, HARD_NEGATIVE]], axis=0)
    has_negative = text_ids[:, HARD_NEGATIVE] != text_ids[:, POSITIVE]
    valid = jnp.concatenate([jnp.ones(n, bool), has_negative])
    anchor = text_ids[:, ANCHOR]
    rows = (e[:, ANCHOR], anchor, jnp.arange(n, dtype=jnp.int32))
    keys, ids, valid, anchor = gather_keys((keys, ids, valid, anchor), n, row_chunk)

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
