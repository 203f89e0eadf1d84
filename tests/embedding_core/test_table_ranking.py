"""Ranking a sharded table in row blocks (``table_ranking``'s ``row_block``) gives exactly
the results of scoring each shard at once."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from embedding_core.distributed import parallel
from embedding_core.losses import table_ranking


def _score(q, w, row_args, consts):
    return consts[0] * jnp.einsum("nd,rd->nr", q, w,
                                  precision=jax.lax.Precision.HIGHEST) + row_args[0]


@pytest.fixture(scope="module")
def case():
    """Small integers, so every score is exact: 27 rows padded to 32 on 4 shards of 8,
    many ties (rows within and across blocks and shards score alike), 3 relevant a query."""
    rng = np.random.default_rng(0)
    mesh = parallel.make_mesh(2, 4, devices=jax.devices()[:8])
    table = rng.integers(-2, 3, size=(32, 2)).astype(np.float32)
    bias = rng.integers(0, 2, size=32).astype(np.float32)
    bias[27:] = 100.0  # padding rows would win if they were ranked
    queries = rng.integers(-2, 3, size=(6, 2)).astype(np.float32)
    relevant = np.stack([rng.permutation(27)[:3] for _ in range(6)])
    relevant[1, 2] = -1
    t = jax.device_put(table, NamedSharding(mesh, P("model", None)))
    b = jax.device_put(bias, NamedSharding(mesh, P("model")))
    return t, b, queries, relevant


@pytest.mark.parametrize("row_block", [1, 3, 5, 8, 100])
def test_blocked_ranking_equals_whole_shards(case, row_block):
    t, b, queries, relevant = case
    kw = dict(num_rows=27, row_args=(b,), consts=(2.0,))
    whole = table_ranking.top_k(_score, queries, t, 5, **kw)
    blocked = table_ranking.top_k(_score, queries, t, 5, row_block=row_block, **kw)
    for a, c in zip(whole, blocked, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(c))
    whole = table_ranking.relevant_counts(_score, queries, t, relevant, **kw)
    blocked = table_ranking.relevant_counts(_score, queries, t, relevant, row_block=row_block,
                                            **kw)
    for a, c in zip(whole, blocked, strict=True):
        np.testing.assert_array_equal(a, c)


def test_a_negative_row_block_is_refused():
    mesh = parallel.make_mesh(4, 2, devices=jax.devices()[:8])
    table = jax.device_put(np.zeros((4, 1), np.float32), NamedSharding(mesh, P("model", None)))

    def dot(q, w, row_args, consts):
        return q @ w.T

    with pytest.raises(ValueError, match="row_block must be an int >= 0"):
        table_ranking.top_k(dot, np.ones((1, 1), np.float32), table, 1, row_block=-1)
