"""A DualCSE step gives the same loss and gradients on every mesh, and across processes.

Dropout is off for the mesh comparison (its random bits depend on the sharding).
The gradient check catches the pmap-era fault of a per-device loss without averaging
(gradients N_dev times too large) as well as a missing all-gather of negatives.
"""

from pathlib import Path

import jax
import numpy as np
import pytest

from data_pipelines import inli, pipeline
from data_pipelines.tokenization import load_tokenizer
from dualcse_jax import tables as dualcse_data
from dualcse_jax.configs import default
from dualcse_jax.model import build_model, init_fn, pretrained_paths
from dualcse_jax.trainer import make_loss_fn
from embedding_core.distributed import parallel
from embedding_core.models.pretrained import load_pretrained
from embedding_core.training import training

HERE = Path(__file__).parent


def _config(model_dir, architecture="cross"):
    c = default.get_config()
    c.model = str(model_dir)
    c.architecture = architecture
    c.dropout = False
    c.max_length = 32
    c.batch_size = 8
    return c


@pytest.fixture(scope="module")
def setting(minilm_dir):
    # Real MiniLM weights: a random tiny model's gradients cancel so heavily that float32
    # reordering noise dominates them, which says nothing about the sharding.
    config = _config(minilm_dir)
    pre = load_pretrained(config.model)
    tok = load_tokenizer(pre.model_dir)
    rows = inli.read_inli(inli.inli_split_path("val"))[:8]
    table = dualcse_data.inli_table(rows, tok, config.max_length, encoder="cross")
    batch = next(pipeline.make_batches(table, global_batch_size=8, seed=0, pad_multiple=16))
    batch.pop("step", None)
    model = build_model(config, pre.config)
    return config, pre, model, table, batch


def _loss_and_grads(setting, devices, data, model_axis):
    config, pre, model, table, batch = setting
    mesh = parallel.make_mesh(data, model_axis, devices=devices)
    tx, _ = training.make_optimizer(learning_rate=1e-3, total_steps=10)
    state, shardings = training.create_sharded_state(
        init_fn(model), tx, mesh, jax.random.key(0),
        pretrained={p: pre.params for p in pretrained_paths(config.architecture)})
    loss_fn = make_loss_fn(model, config)
    grad_fn = jax.jit(jax.value_and_grad(loss_fn, has_aux=True),
                      in_shardings=(shardings.params, parallel.batch_sharding(mesh),
                                    parallel.replicated(mesh)))
    with jax.set_mesh(mesh):
        (loss, _), grads = grad_fn(state.params, parallel.host_to_global(batch, mesh),
                                   jax.random.key(1))
    return float(loss), jax.tree.map(np.asarray, grads)


@pytest.fixture(scope="module")
def single_device(setting):
    return _loss_and_grads(setting, jax.devices()[:1], 1, 1)


@pytest.mark.parametrize("data,model_axis", [(8, 1), (4, 2)])
def test_loss_and_gradients_equal_across_meshes(setting, single_device, data, model_axis):
    loss1, grads1 = single_device
    loss, grads = _loss_and_grads(setting, jax.devices(), data, model_axis)
    np.testing.assert_allclose(loss, loss1, rtol=1e-5)
    flat1 = jax.tree_util.tree_leaves_with_path(grads1)
    flat = dict(jax.tree_util.tree_leaves_with_path(grads))
    assert len(flat1) == len(flat)
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(grads1))
    for path, g1 in flat1:
        # Elementwise rtol 1e-5, with an absolute floor of 1e-5 of the largest gradient:
        # entries that are mathematically zero (e.g. key biases, softmax-invariant) hold
        # only float32 reduction noise, whose order depends on the device split.
        np.testing.assert_allclose(flat[path], g1, rtol=1e-5, atol=1e-5 * scale,
                                   err_msg=jax.tree_util.keystr(path))
    diff = np.sqrt(sum(float(np.sum((flat[p] - g) ** 2)) for p, g in flat1))
    norm1 = np.sqrt(sum(float(np.sum(g * g)) for _, g in flat1))
    assert diff / norm1 < 1e-5
    # A per-device loss without gradient averaging would be off by the device count.
    norm = np.sqrt(sum(float(np.sum(g * g)) for g in jax.tree.leaves(grads)))
    np.testing.assert_allclose(norm, norm1, rtol=1e-5)


@pytest.mark.slow
def test_two_processes_match_single_process(tiny_bert_dir, dualcse_tiny_run, two_processes):
    """2 processes x 4 CPU devices (jax.distributed, gloo; the shared two-process run) ==
    1 process x 8 devices (the session's shared run of the same config,
    tests/shared_runs.py)."""
    # The same run in one (8-device) process.
    single = dualcse_tiny_run.params
    multi = dict(np.load(two_processes.root / "dualcse_train" / "params.npz"))
    assert sorted(single) == sorted(multi)
    for key, value in single.items():
        if "['key']['bias']" in key:
            # Softmax is invariant to the key bias, so its true gradient is 0 and it gets
            # only float32 reduction noise, which Adam scales up to ~1e-5-sized steps:
            # it must stay near 0 in both runs, but its noise need not agree.
            assert np.abs(value).max() < 1e-4 and np.abs(multi[key]).max() < 1e-4, key
            continue
        np.testing.assert_allclose(multi[key], value, rtol=1e-5, atol=1e-5, err_msg=key)
    # Training did move the weights (so equality is not equality of initialisations).
    from embedding_core.models.pretrained import load_pretrained as lp

    word = lp(str(tiny_bert_dir)).params["embeddings"]["word_embeddings"]["embedding"]
    key = [k for k in single if "word_embeddings" in k][0]
    moved = float(np.abs(single[key] - word).max())
    assert moved > 1e-4
