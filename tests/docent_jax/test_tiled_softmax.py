"""The tiled vocabulary-parallel softmax equals the dense one, in value and gradients.

Reference: the dense logits ``scale * cos(q, w) + bias`` (or ``scale * q . w + bias``) over
the real rows and their cross-entropy gradients, by hand in float64 numpy (its loss checked
against ``optax.softmax_cross_entropy_with_integer_labels`` on the same logits).
The tiled form runs on 8 fake CPU devices (meshes 2x4 and 1x8) with 45 real classes in 64
rows (the 1x8 split leaves one shard part-padding and two shards all padding: their local
log-sum-exp is -inf) and blocks of 3 rows, which divide neither 8 nor 16 rows per shard.
"""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from docent_jax.configs import default, dual_paper, full_paper, validate_config
from docent_jax.loss import union_cross_entropy
from embedding_core.distributed import parallel
from embedding_core.losses import vocab_softmax

REPO = Path(__file__).resolve().parents[2]
B, ROWS, D, CLASSES, BLOCK = 16, 64, 8, 45, 3


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    queries = rng.standard_normal((B, D)).astype(np.float32)
    table = rng.standard_normal((ROWS, D)).astype(np.float32)
    bias = rng.standard_normal((ROWS,)).astype(np.float32)
    # The first and last real classes, and targets in every shard holding real rows.
    targets = np.concatenate([[0, CLASSES - 1], rng.integers(0, CLASSES, B - 2)]).astype(
        np.int32)
    return queries, table, bias, targets


def _dense_reference(q, w, bias, s, targets, cosine):
    """Mean cross-entropy over the real rows and its gradients, by hand in float64:
    ``G = (softmax(z) - onehot) / n`` and the chain rule through ``z = s u.v + b`` and, for
    the cosine form, through ``u = q / |q|`` (``du -> (du - u (u . du)) / |q|``)."""
    q, w, bias = (np.asarray(x, np.float64) for x in (q, w, bias))
    real = w[:CLASSES]
    norm_q = np.linalg.norm(q, axis=1, keepdims=True) if cosine else 1.0
    norm_w = np.linalg.norm(real, axis=1, keepdims=True) if cosine else 1.0
    u, v = q / norm_q, real / norm_w
    logits = s * u @ v.T + bias[:CLASSES]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(axis=1)) + logits.max(axis=1)
    rows = np.arange(len(q))
    loss = np.mean(log_z - logits[rows, targets])
    g = np.exp(logits - log_z[:, None])
    g[rows, targets] -= 1.0
    g /= len(q)
    du, dv = s * g @ v, s * g.T @ u
    if cosine:
        du = (du - u * np.sum(u * du, axis=1, keepdims=True)) / norm_q
        dv = (dv - v * np.sum(v * dv, axis=1, keepdims=True)) / norm_w
    d_table, d_bias = np.zeros_like(w), np.zeros_like(bias)
    d_table[:CLASSES], d_bias[:CLASSES] = dv, g.sum(axis=0)
    return loss, logits, (du, d_table, d_bias, np.sum(g * (u @ v.T)))


def test_reference_loss_is_optax_on_the_dense_logits(inputs):
    queries, table, bias, targets = inputs
    loss, logits, _ = _dense_reference(queries, table, bias, 5.0, targets, True)
    ref = optax.softmax_cross_entropy_with_integer_labels(jnp.asarray(logits, jnp.float32),
                                                          targets)
    np.testing.assert_allclose(loss, float(jnp.mean(ref)), rtol=1e-6)


SCALES = {True: 5.0, False: 0.7}  # cosine, dot


@pytest.fixture(scope="module")
def tiled_results(inputs):
    """Loss, max logit and gradients of the tiled form on each mesh, for the cosine and the
    dot form together (one compiled program per mesh)."""
    queries, table, bias, targets = inputs
    cache = {}

    def get(data, model):
        if (data, model) not in cache:
            mesh = parallel.make_mesh(data, model)

            def tiled(q, w, b, s, cosine):
                stats = vocab_softmax.vocab_parallel_logsumexp(
                    q, w, jnp.asarray(targets), mesh, s, bias=b, cosine=cosine,
                    num_classes=CLASSES, block_size=BLOCK)
                return jnp.mean(stats.logsumexp - stats.target_logit), stats.max_logit

            def both(q, w, b):
                return {cosine: jax.value_and_grad(tiled, argnums=(0, 1, 2, 3), has_aux=True)(
                    q, w, b, jnp.float32(SCALES[cosine]), cosine) for cosine in SCALES}

            with jax.set_mesh(mesh):
                cache[data, model] = jax.device_get(jax.jit(both)(queries, table, bias))
        return cache[data, model]

    return get


@pytest.mark.mesh  # sets its own mesh shape
@pytest.mark.parametrize("data,model", [(2, 4), (1, 8)])
@pytest.mark.parametrize("cosine", [True, False], ids=["cosine", "dot"])
def test_tiled_equals_dense_loss_and_gradients(inputs, tiled_results, data, model, cosine):
    queries, table, bias, targets = inputs
    (loss, top), grads = tiled_results(data, model)[cosine]
    ref_loss, ref_logits, ref_grads = _dense_reference(queries, table, bias, SCALES[cosine],
                                                       targets, cosine)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    np.testing.assert_allclose(top, ref_logits.max(axis=1), rtol=1e-5)
    for name, g, ref in zip(("queries", "table", "bias", "scale"), grads, ref_grads,
                            strict=True):
        assert np.isfinite(g).all(), name
        np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-7 * float(np.abs(ref).max()),
                                   err_msg=name)
    # Padding rows take no part: exactly zero gradient (and no NaN from the -inf shards).
    assert float(np.abs(grads[1][CLASSES:]).max()) == 0.0
    assert float(np.abs(grads[2][CLASSES:]).max()) == 0.0


@pytest.mark.mesh  # sets its own mesh shape
def test_union_cross_entropy_tiled_equals_dense():
    """DocEnt-Full's softmax over [word pieces; entities] with the entity part tiled."""
    rng = np.random.default_rng(1)
    n, hidden, vocab = 16, 8, 11
    t = rng.standard_normal((n, hidden)).astype(np.float32)
    words = rng.standard_normal((vocab, hidden)).astype(np.float32)
    word_bias = rng.standard_normal((vocab,)).astype(np.float32)
    entities = rng.standard_normal((ROWS, hidden)).astype(np.float32)
    entity_bias = rng.standard_normal((ROWS,)).astype(np.float32)
    # Word-piece and entity labels, including the last word piece and the last real entity.
    labels = np.concatenate([[vocab - 1, vocab + CLASSES - 1, vocab],
                             rng.integers(0, vocab, 6), vocab + rng.integers(0, CLASSES, 7)])
    mesh = parallel.make_mesh(2, 4)

    def tiled(t, words, word_bias, entities, entity_bias):
        ce, correct = union_cross_entropy(t, jnp.asarray(labels, jnp.int32), words, word_bias,
                                          entities, entity_bias, mesh, CLASSES,
                                          block_size=BLOCK)
        return jnp.mean(ce), (ce, correct)

    args = (t, words, word_bias, entities, entity_bias)
    with jax.set_mesh(mesh):
        (loss, (ce, correct)), grads = jax.device_get(jax.jit(
            jax.value_and_grad(tiled, argnums=(0, 1, 2, 3, 4), has_aux=True))(*args))

    # Dense reference in float64: logits over the union, G = (softmax - onehot) / n.
    full = np.concatenate([words, entities[:CLASSES]]).astype(np.float64)
    logits = t.astype(np.float64) @ full.T + np.concatenate([word_bias, entity_bias[:CLASSES]])
    log_z = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    rows = np.arange(n)
    ref_ce = log_z - logits[rows, labels]
    g = np.exp(logits - log_z[:, None])
    g[rows, labels] -= 1.0
    g /= n
    d_full, d_bias = g.T @ t, g.sum(axis=0)
    d_entities, d_entity_bias = np.zeros_like(entities), np.zeros_like(entity_bias)
    d_entities[:CLASSES], d_entity_bias[:CLASSES] = d_full[vocab:], d_bias[vocab:]
    ref_grads = (g @ full, d_full[:vocab], d_bias[:vocab], d_entities, d_entity_bias)

    np.testing.assert_allclose(loss, ref_ce.mean(), rtol=1e-5)
    np.testing.assert_allclose(ce, ref_ce, rtol=1e-5)
    np.testing.assert_array_equal(correct, logits.argmax(axis=1) == labels)
    names = ("t", "word_table", "word_bias", "entity_table", "entity_bias")
    for name, grad, ref in zip(names, grads, ref_grads, strict=True):
        np.testing.assert_allclose(grad, ref, rtol=1e-5,
                                   atol=1e-7 * float(np.abs(ref).max()), err_msg=name)
    assert float(np.abs(grads[3][CLASSES:]).max()) == 0.0


@pytest.mark.mesh  # sets its own mesh shape
def test_tiled_step_holds_one_block_of_logits_per_device():
    """Compile-only: the tiled step's temporaries are the table shard's gradient plus a
    few ``[batch / data, block]`` blocks, well under the ``[batch / data, rows / model]``
    local logits of the untiled form; the arguments are the state split over ``model``."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from memory_cases import docent_full_softmax_case

    entities, dim, batch, data, model, block = 32768, 8, 256, 2, 4, 256
    tiled = docent_full_softmax_case(entities, dim, batch, data, model, block)
    local_batch, shard_rows = batch // data, entities // model
    gradient = shard_rows * dim * 4
    blocks = 8 * (local_batch * block + block * dim) * 4
    assert gradient < tiled["temp_bytes"] <= gradient + blocks
    assert tiled["temp_bytes"] < local_batch * shard_rows * 4 / 2  # untiled: 2+ such blocks
    state = 3 * entities * dim * 4 // model  # table + two Adam moments
    assert state <= tiled["arg_bytes"] <= state + 4096 + batch * (dim + 1) * 4


@pytest.mark.mesh  # sets its own mesh shape
def test_block_size_is_validated_before_compile(inputs):
    queries, table, bias, targets = inputs
    mesh = parallel.make_mesh(2, 4)
    with pytest.raises(ValueError, match="block_size must be >= 0"):
        vocab_softmax.vocab_parallel_logsumexp(jnp.asarray(queries), jnp.asarray(table),
                                        jnp.asarray(targets), mesh, 1.0, block_size=-1)
    config = default.get_config()
    assert config.vocab_block_size == 0
    validate_config(config)
    for bad in (-1, 2.5, True):
        config = default.get_config()
        with config.ignore_type():
            config.vocab_block_size = bad
        with pytest.raises(ValueError, match="config.vocab_block_size"):
            validate_config(config)
    # The paper presets tile (Full and Hybrid inherit Dual's).
    for preset in (dual_paper, full_paper):
        config: ml_collections.ConfigDict = preset.get_config()
        assert config.vocab_block_size > 0
        validate_config(config)
