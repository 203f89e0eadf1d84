"""Logical-axis rules in the config, fitted to the mesh; ranking and reading a row-sharded
table on device (embedding_core.distributed.parallel, configs, table_ranking,
parallel.iter_row_blocks)."""

import logging

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from embedding_core import configs
from embedding_core.distributed import parallel
from embedding_core.distributed.parallel import iter_row_blocks
from embedding_core.evaluation import metrics
from embedding_core.losses import table_ranking


def _mesh(data, model):
    return parallel.make_mesh(data, model, devices=jax.devices()[:data * model])


class _Tables(nn.Module):
    """BERT-like shapes: a 30,522-row word table, a padded entity table, 384 head columns
    and a 1,536-wide MLP (MiniLM)."""

    @nn.compact
    def __call__(self):
        def param(name, axes, shape):
            return self.param(name, nn.with_logical_partitioning(nn.initializers.zeros, axes),
                              shape)

        param("words", ("vocab", "embed"), (30522, 8))
        param("entities", ("entities", "embed"), (128, 8))
        param("entity_bias", ("entities",), (128,))
        param("query", ("embed", "heads"), (384, 384))
        param("mlp", ("embed", "mlp"), (384, 1536))


ABSTRACT = jax.eval_shape(lambda: _Tables().init(jax.random.key(0))["params"])


def _specs(mesh, rules, sizes=None):
    return {k: s.spec for k, s in parallel.logical_shardings(ABSTRACT, mesh, rules,
                                                             sizes).items()}


def test_default_rules_split_entities_and_keep_word_pieces_whole():
    for model in (4, 8):
        specs = _specs(_mesh(8 // model, model), parallel.LOGICAL_AXIS_RULES, {"heads": 12})
        assert specs["words"] == P(None, None)  # 30,522 rows: replicated, no warning needed
        assert specs["entities"] == P("model", None) and specs["entity_bias"] == P("model")
        assert specs["mlp"] == P(None, "model")  # 1536 = 8 * 192
        # 12 heads split 4 ways (3 each), not 8 ways: the 384 columns alone would allow it.
        assert specs["query"] == (P(None, "model") if model == 4 else P(None, None))


def test_an_axis_the_mesh_does_not_divide_is_replicated_with_one_warning(caplog,
                                                                          monkeypatch):
    monkeypatch.setattr(parallel, "_REPORTED", set())
    rules = configs.axis_rules(configs.base().copy_and_resolve_references())
    rules = tuple(("vocab", "model") if name == "vocab" else (name, axis)
                  for name, axis in rules)
    mesh = _mesh(2, 4)
    with caplog.at_level(logging.WARNING):
        fitted = parallel.fit_rules(rules, mesh, ABSTRACT)
        again = parallel.fit_rules(rules, mesh, ABSTRACT)
    assert dict(fitted)["vocab"] is None and dict(fitted)["entities"] == "model"
    assert again == fitted
    warned = [r.getMessage() for r in caplog.records if "'vocab'" in r.getMessage()]
    assert len(warned) == 1 and "30522" in warned[0] and "'model' = 4" in warned[0]
    # model=2 divides 30,522: the word table is split when the rules ask for it.
    assert _specs(_mesh(4, 2), rules)["words"] == P("model", None)


def test_config_rules_override_defaults_by_name():
    config = configs.base()
    config.logical_axis_rules = (("heads", ""), ("vocab", "model"), ("extra", "data"))
    rules = dict(configs.axis_rules(config))
    assert rules["heads"] is None and rules["vocab"] == "model" and rules["extra"] == "data"
    assert rules["entities"] == "model" and rules["batch"] == "data"  # defaults kept
    configs.validate_base(config)


@pytest.mark.parametrize("rules,message", [
    ((("vocab", "tensor"),), "mesh axis must be one of"),
    ((("vocab", "model"), ("vocab", "")), "names 'vocab' twice"),
    ((("vocab",),), "is not \\(name, mesh axis\\)"),
    ((("", "model"),), "non-empty string"),
])
def test_bad_rules_are_refused_before_compile(rules, message):
    config = configs.base()
    config.logical_axis_rules = rules
    with pytest.raises(ValueError, match="config.logical_axis_rules.*" + message):
        configs.validate_base(config)


def test_a_rule_naming_no_axis_of_the_model_is_refused():
    config = configs.base()
    config.logical_axis_rules = (("entitys", "model"),)
    with pytest.raises(ValueError, match=r"names \['entitys'\] that nothing.*'entities'"):
        configs.check_rule_names(config, parallel.logical_dims(ABSTRACT))
    config.logical_axis_rules = (("words_extra", "data"), ("heads", ""))
    configs.check_rule_names(config, {"words_extra"})  # the model's own axis: accepted


@pytest.mark.parametrize("field,value,message", [
    ("contrastive_chunk_size", -1, "contrastive_chunk_size must be >= 0.*got -1"),
    ("grad_accum_steps", 0, "grad_accum_steps must be >= 1.*got 0"),
])
def test_bad_chunk_or_accumulation_names_only_its_field(field, value, message):
    config = configs.base()
    config[field] = value
    with pytest.raises(ValueError, match=message) as err:
        configs.validate_base(config)
    other = {"contrastive_chunk_size", "grad_accum_steps"} - {field}
    assert other.pop() not in str(err.value)


# ----------------------------------------------------------------------------- ranking


def _score(q, w, row_args, consts):
    return consts[0] * jnp.einsum("nd,rd->nr", q, w,
                                  precision=jax.lax.Precision.HIGHEST) + row_args[0]


@pytest.fixture(scope="module")
def table_case():
    rng = np.random.default_rng(0)
    rows, num_rows, n, d = 32, 27, 13, 4
    table = rng.normal(size=(rows, d)).astype(np.float32)
    bias = rng.normal(size=rows).astype(np.float32)
    table[5], bias[5] = table[3], bias[3]  # an exact tie between rows 3 and 5
    queries = rng.normal(size=(n, d)).astype(np.float32)
    # Padding rows (27..31) would win every query if they were ranked.
    bias[num_rows:] = 100.0
    relevant = np.full((n, 3), -1)
    relevant[:, 0] = 3
    relevant[:, 1] = rng.integers(6, num_rows, n)
    relevant[::2, 2] = 5  # tied with row 3: not counted against each other
    dense = np.asarray(_score(queries, table, (bias,), (2.0,)))[:, :num_rows]
    return table, bias, queries, relevant, num_rows, dense


@pytest.mark.parametrize("data,model", [(2, 4), (1, 8)])
def test_sharded_top_k_and_ranks_equal_the_dense_matrix(table_case, data, model):
    table, bias, queries, relevant, num_rows, dense = table_case
    mesh = _mesh(data, model)
    t = jax.device_put(table, NamedSharding(mesh, P("model", None)))
    b = jax.device_put(bias, NamedSharding(mesh, P("model")))
    scores, rows = table_ranking.top_k(_score, queries, t, 6, num_rows=num_rows, row_args=(b,),
                                       consts=(2.0,))
    want = np.argsort(-dense, axis=1, kind="stable")[:, :6]  # ties: lower row first
    np.testing.assert_array_equal(np.asarray(rows), want)
    # Equal up to rounding (the sharded form may fuse the scale and bias differently).
    np.testing.assert_allclose(np.asarray(scores), np.take_along_axis(dense, want, 1),
                               rtol=1e-6)
    s, at_least = table_ranking.relevant_counts(_score, queries, t, relevant,
                                                num_rows=num_rows, row_args=(b,), consts=(2.0,))
    query, rank = table_ranking.ranks_from_counts(relevant, s, at_least)
    rel = np.zeros(dense.shape, bool)
    for i, items in enumerate(relevant):
        rel[i, items[items >= 0]] = True
    want_query, want_rank = metrics.ranks_of_relevant(dense, rel)
    np.testing.assert_array_equal(query, want_query)
    np.testing.assert_array_equal(rank, want_rank)


@pytest.mark.parametrize("row_block", [0, 1])
def test_ranks_hand_worked_across_two_shards(row_block):
    """Scores [1, 1, 0, 2] (rows 0-1 on one device, 2-3 on the other): relevant {0} ranks
    behind both rows scoring >= 1 (rank 3); relevant {0, 1} take ranks 2 and 3; whole
    shards or one row scored at a time (``row_block``) alike."""
    mesh = _mesh(4, 2)  # one query, padded to the 4 data shards
    table = jax.device_put(np.array([[1.0], [1.0], [0.0], [2.0]], np.float32),
                           NamedSharding(mesh, P("model", None)))
    query = np.ones((1, 1), np.float32)

    def dot(q, w, row_args, consts):
        return q @ w.T

    for relevant, want in (([[0, -1]], [3]), ([[1, 0]], [2, 3])):
        s, c = table_ranking.relevant_counts(dot, query, table, np.array(relevant),
                                             row_block=row_block)
        assert list(table_ranking.ranks_from_counts(np.array(relevant), s, c)[1]) == want
    scores, rows = table_ranking.top_k(dot, query, table, 1, row_block=row_block)
    assert rows.tolist() == [[3]] and scores.tolist() == [[2.0]]
    scores, rows = table_ranking.top_k(dot, query, table, 3)
    assert rows.tolist() == [[3, 0, 1]] and scores.tolist() == [[2.0, 1.0, 1.0]]


def test_relevant_counts_refuses_bad_input(table_case):
    table, bias, queries, relevant, num_rows, _ = table_case
    bad = relevant.copy()
    bad[0, 1] = num_rows  # a padding row
    with pytest.raises(ValueError, match=r"relevant rows must lie in \[0, 27\)"):
        table_ranking.relevant_counts(_score, queries, table, bad, num_rows=num_rows,
                                      row_args=(bias,), consts=(2.0,))
    with pytest.raises(ValueError, match="k must be an int in"):
        table_ranking.top_k(_score, queries, table, num_rows + 1, num_rows=num_rows,
                            row_args=(bias,), consts=(2.0,))


def test_row_blocks_stream_shard_by_shard():
    table = np.arange(64 * 3, dtype=np.float32).reshape(64, 3)
    mesh = _mesh(2, 4)
    sharded = jax.device_put(table, NamedSharding(mesh, P("model", None)))
    blocks = list(iter_row_blocks(sharded, 50, block_rows=5))
    # 16 rows a shard: blocks of 5 end at shard boundaries; padding rows 50.. never read.
    assert [(s, len(b)) for s, b in blocks][:5] == [(0, 5), (5, 5), (10, 5), (15, 1), (16, 5)]
    assert blocks[-1][0] + len(blocks[-1][1]) == 50
    np.testing.assert_array_equal(np.concatenate([b for _, b in blocks]), table[:50])
    assert [s for s, _ in iter_row_blocks(table, 7, block_rows=3)] == [0, 3, 6]
    with pytest.raises(ValueError, match="block_rows"):
        next(iter_row_blocks(sharded, 50, block_rows=0))
