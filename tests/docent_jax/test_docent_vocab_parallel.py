"""The vocabulary-parallel full softmax equals the dense one, in value and gradients.

Reference: ``optax.softmax_cross_entropy_with_integer_labels`` on the dense ``[b, V]`` logits
``scale * cos(q, table)``, on one device. The sharded form runs on the 8 fake CPU devices
with the table split 4 and 8 ways; the max-shift, sum and target lookup each cross shards.
"""

import json
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from embedding_core.distributed import parallel
from embedding_core.losses import losses, vocab_softmax

REPO = Path(__file__).resolve().parents[2]
B, V, D = 16, 64, 8


@pytest.fixture(scope="module")
def inputs():
    rng = np.random.default_rng(0)
    queries = jnp.asarray(rng.standard_normal((B, D)), jnp.float32)
    table = jnp.asarray(rng.standard_normal((V, D)), jnp.float32)
    # Targets in every shard of an 8-way split, including the first and last rows.
    targets = jnp.asarray(np.concatenate([[0, V - 1], rng.integers(0, V, B - 2)]), jnp.int32)
    return queries, table, targets


def _dense(queries, table, targets, scale, num_classes=V, cosine=True):
    if cosine:
        logits = scale * losses.cosine_similarity_matrix(queries, table[:num_classes])
    else:
        logits = scale * jnp.einsum("bd,vd->bv", queries, table[:num_classes],
                                    precision=jax.lax.Precision.HIGHEST)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))


@pytest.mark.parametrize("data,model,cosine,num_classes", [
    (2, 4, True, V), (1, 8, True, V),
    (2, 4, False, V),  # plain dot product
    (2, 4, True, 50),  # padded table: rows 50..63 are not classes
])
def test_loss_and_gradients_equal_dense(inputs, data, model, cosine, num_classes):
    queries, table, targets = inputs
    targets = targets % num_classes
    mesh = parallel.make_mesh(data, model)

    def sharded(q, w, s):
        return jnp.mean(vocab_softmax.vocab_parallel_softmax_cross_entropy(
            q, w, targets, mesh, s, cosine=cosine, num_classes=num_classes))

    scale = jnp.float32(5.0 if cosine else 0.7)
    with jax.set_mesh(mesh):
        loss, grads = jax.jit(jax.value_and_grad(sharded, argnums=(0, 1, 2)))(
            queries, table, scale)
    ref_loss, ref_grads = jax.value_and_grad(
        lambda q, w, s: _dense(q, w, targets, s, num_classes, cosine), argnums=(0, 1, 2))(
        queries, table, scale)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5)
    for name, g, ref in zip(("queries", "table", "scale"), grads, ref_grads, strict=True):
        scale_of = float(np.abs(ref).max())
        np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-6 * scale_of, err_msg=name)
    if num_classes < V:
        # Padding rows take no part: exactly zero gradient.
        assert float(np.abs(grads[1][num_classes:]).max()) == 0.0


def test_per_example_losses_and_sharding(inputs):
    queries, table, targets = inputs
    mesh = parallel.make_mesh(2, 4)
    with jax.set_mesh(mesh):
        per = jax.jit(lambda q, w: vocab_softmax.vocab_parallel_softmax_cross_entropy(
            q, w, targets, mesh, 3.0))(queries, table)
    logits = 3.0 * losses.cosine_similarity_matrix(queries, table)
    np.testing.assert_allclose(
        per, optax.softmax_cross_entropy_with_integer_labels(logits, targets), rtol=1e-5)
    assert per.shape == (B,)


def test_rejects_shapes_it_cannot_split(inputs):
    queries, table, targets = inputs
    mesh = parallel.make_mesh(2, 4)
    with pytest.raises(ValueError, match="not divisible by mesh axis 'model'"):
        vocab_softmax.vocab_parallel_softmax_cross_entropy(queries, table[:62], targets, mesh, 1.0)
    with pytest.raises(ValueError, match="not divisible by mesh axis 'data'"):
        vocab_softmax.vocab_parallel_softmax_cross_entropy(queries[:15], table, targets[:15],
                                                           mesh, 1.0)
    with pytest.raises(ValueError, match="num_classes"):
        vocab_softmax.vocab_parallel_softmax_cross_entropy(queries, table, targets, mesh, 1.0,
                                                    num_classes=V + 1)


@pytest.mark.slow
def test_one_adam_step_memory_per_device_is_a_shard_of_the_logits(tmp_path):
    """benchmarks/docent_vocab_memory.py, small: loss + grads + Adam on the table.

    The per-device temporaries of the vocab-parallel step stay below one data x model share
    of the [batch, num_entities] logits times a small constant, while the dense one-device
    step needs more than the whole logits matrix; all forms give the same loss.
    """
    out = tmp_path / "mem.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "docent_vocab_memory.py"),
         "--num_entities=32768", "--dim=16", "--batch=64", "--mesh_data=2", "--mesh_model=4",
         f"--json={out}"],
        capture_output=True, text=True, timeout=1800, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    forms = {r["form"]: r for r in result["results"]}
    logits = result["full_logits_bytes"]
    vp = forms["vocab_parallel"]["memory_per_device"]["temp_size_in_bytes"]
    dense = forms["dense_one_device"]["memory_per_device"]["temp_size_in_bytes"]
    assert dense >= logits  # the measurement does see a materialised logits matrix
    assert vp < 4 * logits / 8  # at most a few local [b/2, V/4] blocks per device
    assert vp < dense / 4
    losses_ = [r["loss"] for r in result["results"]]
    np.testing.assert_allclose(losses_, losses_[0], rtol=1e-5)
    assert all(r["table_moved"] for r in result["results"])
