"""L2 normalisation, cosine matrix and InfoNCE in float32 over the global batch
(``docs/pitfalls.md``, "Contrastive training across devices")."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, axis: int = -1, eps: float = 1e-12) -> jax.Array:
    """``x / ||x||`` along ``axis``; ``||x|| <= eps`` maps to 0 with gradient 0 (double
    where: ``rsqrt`` never sees 0)."""
    sq = jnp.sum(x * x, axis=axis, keepdims=True)
    big = sq > eps * eps
    inv = jnp.where(big, jax.lax.rsqrt(jnp.where(big, sq, 1.0)), 0.0)
    return x * inv.astype(x.dtype)


def cosine_similarity_matrix(a: jax.Array, b: jax.Array) -> jax.Array:
    """``[n, dim]`` x ``[m, dim]`` -> ``[n, m]`` float32 ``cos(a_i, b_j)``."""
    a = l2_normalize(a.astype(jnp.float32))
    b = l2_normalize(b.astype(jnp.float32))
    return jnp.einsum("nd,md->nm", a, b, precision=jax.lax.Precision.HIGHEST)


def info_nce(queries: jax.Array, keys: jax.Array, positive_index: jax.Array, *, temperature: float,
             key_ids: jax.Array | None = None, key_valid: jax.Array | None = None) -> jax.Array:
    """``[n]`` float32 ``-log(v(q_i, k_{p_i}) / sum_j v(q_i, k_j))``, ``v(a, b) =
    exp(cos(a, b) / temperature)``, of ``[n, dim]`` queries and ``[m, dim]`` keys; copies
    of the positive (equal ``key_ids``) and ``key_valid`` False keys leave the sum."""
    logits = cosine_similarity_matrix(queries, keys) / temperature  # [n, m]
    n, m = logits.shape
    columns = jnp.arange(m)[None, :]
    is_positive = columns == positive_index[:, None]
    if key_ids is not None:
        positive_ids = key_ids[positive_index]  # [n]
        duplicate = (key_ids[None, :] == positive_ids[:, None]) & ~is_positive
        logits = jnp.where(duplicate, -jnp.inf, logits)
    if key_valid is not None:
        logits = jnp.where(key_valid[None, :] | is_positive, logits, -jnp.inf)
    log_norm = jax.nn.logsumexp(logits, axis=-1)
    positive_logit = jnp.take_along_axis(logits, positive_index[:, None], axis=-1)[:, 0]
    return log_norm - positive_logit
