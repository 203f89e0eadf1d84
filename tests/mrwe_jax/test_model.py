"""ConvRR / FCRR / Siamese: masking, residual, normalisation, against numpy references."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embedding_core.losses.losses import l2_normalize
from embedding_core.serving.inference import masked_mean
from mrwe_jax.model import FCRR, ConvRR, SiameseRetriever, TextBatch

DIM, WORDS, BATCH = 6, 5, 3


def _batch(seed=0, padding_value=0.0):
    rng = np.random.default_rng(seed)
    words = rng.normal(size=(BATCH, WORDS, DIM)).astype(np.float32)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], bool)
    words[~mask] = padding_value
    text = rng.normal(size=(BATCH, DIM)).astype(np.float32)
    return TextBatch(jnp.asarray(text), jnp.asarray(words), jnp.asarray(mask))


@pytest.fixture(scope="module")
def convrr():
    model = ConvRR(num_blocks=2, window_size=3, kernels=4, scale=0.5)
    params = jax.jit(model.init)(jax.random.key(0), _batch())
    return model, params, jax.jit(model.apply)


def _numpy_convrr_one_block(params, batch, scale):
    """Reference: SAME zero-padded 1-D convolution over the real words only, ReLU, mean."""
    p = nn.unbox(params)["params"]
    kernel = np.asarray(p["conv_0"]["kernel"])  # [ws, in, out]
    bias = np.asarray(p["conv_0"]["bias"])
    ws = kernel.shape[0]
    out = []
    for text, words, mask in zip(*map(np.asarray, batch), strict=True):
        x = words[mask]
        n = len(x)
        if n == 0:
            pooled = np.zeros(kernel.shape[2])
        else:
            padded = np.concatenate([np.zeros((ws // 2, DIM)), x, np.zeros((ws // 2, DIM))])
            h = np.stack([
                sum(padded[t + k] @ kernel[k] for k in range(ws)) + bias for t in range(n)
            ])
            pooled = np.maximum(h, 0).mean(0)
        if "projection" in p:
            pooled = pooled @ np.asarray(p["projection"]["kernel"])
        v = text + scale * pooled
        out.append(v / np.linalg.norm(v))
    return np.stack(out)


def test_convrr_matches_numpy_reference():
    model = ConvRR(num_blocks=1, window_size=3, kernels=4, scale=0.7)
    batch = _batch(1)
    params = jax.jit(model.init)(jax.random.key(1), batch)
    out = jax.jit(model.apply)(params, batch)
    np.testing.assert_allclose(out, _numpy_convrr_one_block(params, batch, 0.7), atol=1e-5)


def test_convrr_padding_values_and_amount_change_nothing(convrr):
    model, params, apply = convrr
    base = apply(params, _batch(0, padding_value=0.0))
    noisy = apply(params, _batch(0, padding_value=123.0))
    np.testing.assert_array_equal(base, noisy)
    # More padding (a wider batch) gives the same vectors as well.
    b = _batch(0)
    wide = TextBatch(b.text, jnp.pad(b.words, ((0, 0), (0, 4), (0, 0)), constant_values=9.0),
                     jnp.pad(b.mask, ((0, 0), (0, 4))))
    np.testing.assert_allclose(apply(params, wide), base, atol=1e-6)


def test_convrr_unit_norm_and_empty_text(convrr):
    model, params, apply = convrr
    batch = _batch(0)
    out = np.asarray(apply(params, batch))
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)
    # Row 2 has no word: the output is the normalised text vector.
    np.testing.assert_allclose(out[2], l2_normalize(batch.text)[2], rtol=1e-6)


def test_zero_word_zero_text_has_finite_gradients(convrr):
    model, params, _ = convrr
    batch = _batch(0)
    batch = TextBatch(batch.text.at[2].set(0.0), batch.words, batch.mask)

    def loss(p, words, text):
        return jnp.sum(model.apply(p, TextBatch(text, words, batch.mask)) ** 2)

    value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))(
        params, batch.words, batch.text)
    assert np.isfinite(float(value))
    for leaf in jax.tree.leaves(nn.unbox(grads)):
        assert np.all(np.isfinite(np.asarray(leaf)))


@pytest.mark.parametrize("tower", [ConvRR(num_blocks=2, window_size=3, kernels=4, scale=0.0),
                                   FCRR(num_blocks=2, hidden=8, scale=0.0)])
def test_zero_scale_returns_normalised_input_exactly(tower):
    batch = _batch(2)
    params = jax.jit(tower.init)(jax.random.key(2), batch)
    out = jax.jit(tower.apply)(params, batch)
    # Bitwise: x + 0 * f(x) is x; compiled the same way, the normalisation is the same.
    np.testing.assert_array_equal(out, jax.jit(l2_normalize)(batch.text))
    text = np.asarray(batch.text)
    np.testing.assert_allclose(out, text / np.linalg.norm(text, axis=1, keepdims=True),
                               rtol=1e-6)


def test_fcrr_matches_numpy_reference():
    model = FCRR(num_blocks=2, hidden=8, scale=0.3)
    batch = TextBatch(_batch(3).text)
    params = jax.jit(model.init)(jax.random.key(3), batch)
    out = jax.jit(model.apply)(params, batch)
    p = nn.unbox(params)["params"]
    x = np.asarray(batch.text, np.float64)
    for i in range(2):
        relu, lin = p[f"block_{i}_relu"], p[f"block_{i}_linear"]
        h = np.maximum(x @ np.asarray(relu["kernel"]) + np.asarray(relu["bias"]), 0)
        x = x + 0.3 * (h @ np.asarray(lin["kernel"]) + np.asarray(lin["bias"]))
    np.testing.assert_allclose(out, x / np.linalg.norm(x, axis=1, keepdims=True), atol=1e-5)


def test_logical_axis_names():
    model = ConvRR(num_blocks=2, window_size=3, kernels=4)
    specs = nn.get_partition_spec(jax.eval_shape(model.init, jax.random.key(0), _batch()))
    p = specs["params"]
    assert tuple(p["conv_0"]["kernel"]) == (None, "embed", "mlp")
    assert tuple(p["conv_1"]["kernel"]) == (None, "conv_in", "mlp")
    assert tuple(p["projection"]["kernel"]) == ("mlp", "embed")
    specs = nn.get_partition_spec(jax.eval_shape(FCRR(hidden=8).init, jax.random.key(0),
                                                 _batch()))
    assert tuple(specs["params"]["block_0_relu"]["kernel"]) == ("embed", "mlp")


def test_siamese_shares_one_tower_and_question_only():
    tower = FCRR(num_blocks=1, hidden=8, scale=0.5)
    q, p = TextBatch(_batch(4).text), TextBatch(_batch(5).text)
    both = SiameseRetriever(tower)
    params = jax.jit(both.init)(jax.random.key(4), q, p)
    assert list(nn.unbox(params)["params"]) == ["tower"]  # one parameter set for both sides
    q_out, p_out = jax.jit(both.apply)(params, q, p)
    np.testing.assert_allclose(p_out, jax.jit(tower.apply)(
        {"params": params["params"]["tower"]}, p), atol=1e-6)
    q_only, p_fixed = jax.jit(SiameseRetriever(tower, question_only=True).apply)(params, q, p)
    np.testing.assert_allclose(q_only, q_out, atol=1e-6)
    np.testing.assert_allclose(p_fixed, l2_normalize(p.text), rtol=1e-6)
    assert not np.allclose(p_out, p_fixed)


def test_masked_mean_divides_by_real_count():
    """ConvRR pools with the core's masked mean: divides by the real words, not the width."""
    x = jnp.array([[[2.0], [4.0], [50.0]]])
    np.testing.assert_allclose(masked_mean(x, jnp.array([[1, 1, 0]], bool)), [[3.0]])
