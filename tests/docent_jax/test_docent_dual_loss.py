"""DocEnt-Dual's in-batch loss with same-entity masking, worked by hand."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from docent_jax.loss import full_vocab_entity_loss, in_batch_entity_loss
from embedding_core.distributed import parallel

R2 = math.sqrt(2.0)


def test_repeated_entities_give_the_hand_computed_masked_loss():
    # Entities g0 = (1, 0), g1 = (0, 1), g2 = (-1, 0); batch entity ids [0, 1, 0, 2], so
    # the candidate keys are [g0, g1, g0, g2]; scale a = 2.
    g = {0: (1.0, 0.0), 1: (0.0, 1.0), 2: (-1.0, 0.0)}
    ids = [0, 1, 0, 2]
    keys = jnp.asarray([g[e] for e in ids])
    sentences = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])
    # l_i = -a cos(f_i, g_{e_i}) + log sum_{j allowed} exp(a cos(f_i, key_j)),
    # allowed = {i} and every j whose entity differs from e_i.
    # s0 (entity 0): cos to keys [1, 0, 1, -1]; key 2 (g0 again) masked:
    #   -2 + log(e^2 + e^0 + e^-2) = log(1 + e^-2 + e^-4)            = 0.142931628...
    # s1 (entity 1): cos [0, 1, 0, 0]; nothing masked:
    #   -2 + log(e^0 + e^2 + e^0 + e^0) = log(1 + 3 e^-2)             = 0.340752953...
    # s2 (entity 0, its own key is j=2): cos [r, r, r, -r] with r = 1/sqrt(2); key 0 masked:
    #   -2r + log(e^2r + e^2r + e^-2r) = log(2 + e^(-2 sqrt 2))          = 0.722271784...
    # s3 (entity 2): cos [-1, 0, -1, 1]; nothing masked:
    #   -2 + log(e^-2 + e^0 + e^-2 + e^2) = log(1 + e^-2 + 2 e^-4)      = 0.158683159...
    per = [0.14293162849989968, 0.3407529539131311, 0.7222717849405393, 0.15868315918983708]
    loss, metrics = in_batch_entity_loss(sentences, keys, jnp.asarray(ids, jnp.int32), 2.0)
    np.testing.assert_allclose(float(loss), 0.3411598816358518, rtol=1e-6)
    np.testing.assert_allclose(float(loss), np.mean(per), rtol=1e-6)
    # Without the mask s0 would pay log(2 + e^-2 + e^-4) = 0.767 and s2 log(3 + ...) = 1.118.
    unmasked = (0.767164505306369 + per[1] + 1.118122633568316 + per[3]) / 4  # 0.596
    assert abs(float(loss) - unmasked) > 0.2
    assert float(metrics["distinct_entities"]) == 3.0
    assert float(metrics["scale"]) == 2.0


def test_sentences_of_one_entity_are_not_each_others_negatives():
    # Both sentences belong to entity 0: each one's only candidate is its own positive, so
    # the loss is log(1) = 0 with no gradient (unmasked, they would push each other away).
    ids = jnp.asarray([0, 0], jnp.int32)
    sentences = jnp.asarray([[1.0, 0.0], [0.0, 1.0]])
    keys = jnp.asarray([[1.0, 0.2], [0.3, 1.0]])
    loss, grad = jax.value_and_grad(lambda k: in_batch_entity_loss(sentences, k, ids, 5.0)[0])(
        keys)
    assert float(loss) == 0.0
    np.testing.assert_allclose(grad, 0.0, atol=1e-7)


@pytest.mark.mesh  # sets its own mesh shape
def test_in_batch_equals_full_softmax_when_the_batch_holds_every_entity_once():
    rng = np.random.default_rng(3)
    table = jnp.asarray(rng.standard_normal((8, 5)), jnp.float32)
    ids = jnp.asarray(rng.permutation(8), jnp.int32)
    sentences = jnp.asarray(rng.standard_normal((8, 5)), jnp.float32)
    in_batch, _ = in_batch_entity_loss(sentences, table[ids], ids, 7.0)
    mesh = parallel.make_mesh(2, 4)
    with jax.set_mesh(mesh):
        full, _ = jax.jit(lambda s, t: full_vocab_entity_loss(s, t, ids, 7.0, mesh, 8))(
            sentences, table)
    np.testing.assert_allclose(float(in_batch), float(full), rtol=1e-5)


@pytest.mark.mesh  # sets its own mesh shape
def test_loss_chunks_give_the_unchunked_loss_and_gradients():
    """``loss_chunk_size`` (``row_chunk``) scores a few sentences per data device at a time:
    the same loss and gradients as all at once, repeated entities masked alike."""
    rng = np.random.default_rng(5)
    ids = jnp.asarray(rng.integers(0, 5, 16), jnp.int32)
    sentences = jnp.asarray(rng.standard_normal((16, 4)), jnp.float32)
    keys = jnp.asarray(rng.standard_normal((5, 4)), jnp.float32)[ids]
    mesh = parallel.make_mesh(8, 1)

    def loss(chunk):
        fn = jax.value_and_grad(lambda s, k: in_batch_entity_loss(s, k, ids, 3.0, chunk)[0],
                                argnums=(0, 1))
        with jax.set_mesh(mesh):
            return jax.jit(fn)(sentences, keys)

    (whole, grads), (chunked, chunk_grads) = loss(0), loss(1)
    np.testing.assert_allclose(float(chunked), float(whole), rtol=1e-6)
    for a, b in zip(chunk_grads, grads, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
