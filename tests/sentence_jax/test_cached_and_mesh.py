"""The cached loss (GradCache, mini_batch_size rows per device at a time) equals the uncached
one, and the loss on 8 devices equals 1 device at the same global batch of 16."""

from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np
import pytest

from embedding_core import parallel
from embedding_core.losses.contrastive import chunked_value_and_grad
from embedding_core.training import training
from sentence_jax import trainer
from sentence_jax.configs import default
from tests.sentence_jax.test_training import _triplets


@pytest.fixture(scope="module")
def task(tmp_path_factory, tiny_bert_dir):
    config = default.get_config()
    config.update(model=str(tiny_bert_dir), batch_size=16, max_seq_length=16,
                  matryoshka_dims="32,16,8", train_files=str(
                      _triplets(tmp_path_factory.mktemp("st") / "t.csv", n=32)))
    task = trainer.build_task(config)
    batch = next(iter(task.make_batches(0)))
    batch.pop("step")
    return task, batch


def _loss_and_grads(task, devices, chunk=0):
    task, batch = task
    mesh = parallel.make_mesh(len(devices), 1, devices=devices)
    tx, _ = training.make_optimizer(learning_rate=1e-3, total_steps=10)
    state, shardings = training.create_sharded_state(
        task.init_params, tx, mesh, jax.random.key(0), pretrained=task.pretrained)
    fn = chunked_value_and_grad(task.loss_fn, chunk, mesh) if chunk else \
        jax.value_and_grad(task.loss_fn, has_aux=True)
    # At the optimisation level users run (tests/conftest.py lowers it for compile time):
    # the chunked and whole losses agree to 1 ulp there, 2 at -O0.
    fn = jax.jit(fn, in_shardings=(shardings.params, parallel.batch_sharding(mesh),
                                   parallel.replicated(mesh)),
                 compiler_options={"xla_backend_optimization_level": 2})
    with jax.set_mesh(mesh):
        (loss, _), grads = fn(state.params, parallel.host_to_global(batch, mesh),
                              jax.random.key(1))
    return float(loss), [np.asarray(g) for g in jax.tree.leaves(nn.meta.unbox(grads))]


@pytest.fixture(scope="module")
def one_device(task):
    return _loss_and_grads(task, jax.devices()[:1])


def _close(a, b, loss_tol):
    assert abs(a[0] - b[0]) <= loss_tol, (a[0], b[0])
    diff = np.sqrt(sum(float(np.sum((x - y) ** 2)) for x, y in zip(a[1], b[1], strict=True)))
    norm = np.sqrt(sum(float(np.sum(y * y)) for y in b[1]))
    assert diff / norm < 1e-5, diff / norm


@pytest.mark.parametrize("devices,chunk", [(1, 2), (1, 8), (8, 1)])
def test_cached_equals_uncached(task, one_device, devices, chunk):
    _close(_loss_and_grads(task, jax.devices()[:devices], chunk), one_device, 1e-6)


def test_eight_devices_equal_one(task, one_device):
    _close(_loss_and_grads(task, jax.devices()), one_device, 1e-5)
