"""Dropout from an integer hash of each element's index: the same mask however the array
is sharded, and cheaper than threefry bits on CPU (``config.dropout_impl="hash"``)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp


def _fmix32(x: jax.Array) -> jax.Array:
    """MurmurHash3's 32-bit finaliser: a cheap bijective mix of uint32 values."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


class HashDropout(nn.Module):
    """Inverted dropout keeping element ``i`` (row-major, global shape) when
    ``fmix32(i * golden + seed) >= rate * 2**32``, ``seed`` a uint32 per call."""

    rate: float
    rng_collection: str = "dropout"

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        if deterministic or self.rate == 0.0:
            return x
        seed = jax.random.bits(self.make_rng(self.rng_collection), (), jnp.uint32)
        index = jnp.zeros(x.shape, jnp.uint32)
        stride = 1
        for axis in reversed(range(x.ndim)):
            index = index + jax.lax.broadcasted_iota(jnp.uint32, x.shape, axis) * jnp.uint32(
                stride % 2**32
            )
            stride *= x.shape[axis]
        bits = _fmix32(index * jnp.uint32(0x9E3779B9) + seed)
        threshold = jnp.uint32(min(int(round(self.rate * 2**32)), 2**32 - 1))
        keep = bits >= threshold
        return jnp.where(keep, x / jnp.asarray(1.0 - self.rate, x.dtype), jnp.zeros_like(x))
