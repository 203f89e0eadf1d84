"""``config.remat``: the DualCSE-Cross loss and its gradients are the same with every
rematerialisation policy (dropout on, so the recomputed layers must redraw the same masks),
and the policy reaches the encoder (a ``checkpoint`` in the step's jaxpr)."""

import flax.linen as nn
import jax
import numpy as np
import pytest

from dualcse_jax.configs import default
from dualcse_jax.model import build_model, init_fn
from dualcse_jax.trainer import make_loss_fn
from embedding_core.models.encoders import REMAT_POLICIES, EncoderConfig

TINY = EncoderConfig(model_type="bert", vocab_size=64, hidden_size=32, num_layers=2,
                     num_heads=4, intermediate_size=64, max_position_embeddings=32,
                     type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu",
                     pad_token_id=0, hidden_dropout_rate=0.1, attention_dropout_rate=0.1)


def _batch(rows: int = 4, fields: int = 8, length: int = 12) -> dict:
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 64, size=(rows, fields, length)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[:, :, 9:] = 0  # padded keys: the mask must survive the recomputation too
    batch = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids),
             "text_ids": np.arange(rows * fields, dtype=np.int32).reshape(rows, fields)}
    return jax.tree.map(jax.numpy.asarray, batch)


@pytest.fixture(scope="module")
def results():
    """``{remat: (loss, grads, jaxpr text)}`` of one DualCSE-Cross step's loss."""
    batch = _batch()
    params = None
    out = {}
    for remat in REMAT_POLICIES:
        config = default.get_config()
        config.pooling, config.remat = "cls", remat
        model = build_model(config, TINY)
        if params is None:  # one set of parameters for all three
            params = nn.unbox(init_fn(model)(jax.random.key(0)))
        loss_fn = make_loss_fn(model, config)

        def value(p, loss_fn=loss_fn):
            return loss_fn(p, batch, jax.random.key(7))[0]

        grad_fn = jax.value_and_grad(value)
        loss, grads = jax.jit(grad_fn)(params)
        out[remat] = (float(loss), grads, str(jax.make_jaxpr(grad_fn)(params)))
    return out


@pytest.mark.parametrize("remat", ["dots", "full"])
def test_remat_keeps_loss_and_gradients(results, remat):
    loss, grads, jaxpr = results[remat]
    ref_loss, ref_grads, ref_jaxpr = results["none"]
    assert "checkpoint" in jaxpr or "remat" in jaxpr
    assert "checkpoint" not in ref_jaxpr and "remat" not in ref_jaxpr
    assert loss == pytest.approx(ref_loss, rel=1e-6) and ref_loss > 0
    flat = jax.tree_util.tree_leaves_with_path(grads)
    ref = dict(jax.tree_util.tree_leaves_with_path(ref_grads))
    assert len(flat) == len(ref)
    scale = max(float(np.abs(np.asarray(r)).max()) for r in ref.values())
    for path, g in flat:
        # Recomputed activations may fuse differently: float32 rounding only. Leaves whose
        # true gradient is 0 (the key bias: softmax ignores a per-row shift) hold noise.
        np.testing.assert_allclose(np.asarray(g), np.asarray(ref[path]), rtol=1e-4,
                                   atol=1e-6 * scale, err_msg=jax.tree_util.keystr(path))
    embed = ref[next(p for p in ref if "word_embeddings" in jax.tree_util.keystr(p))]
    assert np.abs(np.asarray(embed)).max() > 0


def test_unknown_remat_is_refused():
    config = default.get_config()
    config.remat = "some"
    with pytest.raises(ValueError, match="config.remat='some'"):
        default.validate(config)
    with pytest.raises(ValueError, match="remat must be one of"):
        TINY.replace(remat="some")
