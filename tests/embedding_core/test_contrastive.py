"""Chunked (GradCache) contrastive steps equal the unchunked step; gradient accumulation.

Each comparison trains the same tiny model two SGD steps with ``make_train_step``, once
with the plain gradient and once chunked, on the 8 fake devices, and compares the
parameters. With dropout on, the masks must agree too (per-example keys).
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from dualcse_jax import tables as dualcse_data
from embedding_core import configs
from embedding_core.distributed import parallel
from embedding_core.losses import contrastive
from embedding_core.models.encoders import EncoderConfig
from embedding_core.training import training
from embedding_core.training.run import run

TINY = EncoderConfig(model_type="bert", vocab_size=64, hidden_size=16, num_layers=1,
                     num_heads=2, intermediate_size=32, max_position_embeddings=32,
                     type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu",
                     pad_token_id=0, hidden_dropout_rate=0.1, attention_dropout_rate=0.1)
LR = 0.05  # SGD: large enough that a wrong gradient moves parameters far beyond rtol


def _tokens(rng, shape, lengths=None):
    ids = rng.integers(1, TINY.vocab_size, shape).astype(np.int32)
    mask = np.ones(shape, np.int32)
    if lengths is not None:  # ragged rows: padding must not leak between examples
        for index in np.ndindex(shape[:-1]):
            cut = lengths[index]
            ids[index][cut:], mask[index][cut:] = 0, 0
    return ids, mask, np.zeros(shape, np.int32)


# These programs run two steps on 16 rows: compile time is nearly all of their cost, and
# unoptimised machine code without XLA CPU's fusion emitters compiles in about half of it.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def _train(loss_fn, init, batches, mesh, chunk):
    state, shardings = init
    state = jax.tree.map(jnp.copy, state)  # the step donates it
    grad = None if chunk == 0 else contrastive.chunked_value_and_grad(
        loss_fn, chunk, mesh, shardings.params)
    step = training.make_train_step(loss_fn, shardings, mesh, value_and_grad=grad)
    batches = [parallel.host_to_global(b, mesh) for b in batches]
    key = jax.random.key(7)
    with jax.set_mesh(mesh), nn.logical_axis_rules(parallel.LOGICAL_AXIS_RULES):
        compiled = step.jitted.lower(state, batches[0], key).compile(FAST_COMPILE)
    losses = []
    for batch in batches:
        state, metrics = compiled(state, batch, key)
        losses.append(float(metrics["loss"]))
    return jax.tree.map(np.asarray, state.params), losses


def _state(init, mesh):
    """``(state, shardings)`` with random params placed directly (no init program to
    compile): N(0, 0.1), LayerNorm scales around 1."""
    tx = optax.sgd(LR)
    shardings = training.state_shardings(init, tx, mesh)
    rng = np.random.default_rng(0)

    def place(path, leaf, sharding):
        value = rng.normal(0.0, 0.1, leaf.shape) + (jax.tree_util.keystr(path).endswith(
            "['scale']") and leaf.ndim == 1)
        return jax.device_put(value.astype(leaf.dtype), sharding)

    abstract = nn.unbox(jax.eval_shape(init, jax.random.key(0)))
    params = jax.tree_util.tree_map_with_path(place, abstract, shardings.params)
    scalar = jax.device_put(np.zeros((), np.int32), shardings.step)
    state = training.TrainState(step=scalar, apply_fn=None, params=params, tx=tx,
                                opt_state=tx.init(params), first_nonfinite_step=scalar - 1)
    return state, shardings


def _assert_same_training(make_loss, init, batches, mesh, chunk):
    """Two SGD steps from the same state ``init`` = (state, shardings): the plain step of
    ``make_loss(0)`` and the chunked step of ``make_loss(chunk)`` (whose loss also scores
    its query rows in chunks)."""
    start = jax.tree.map(np.asarray, init[0].params)
    plain, plain_losses = _train(make_loss(0), init, batches, mesh, 0)
    chunked, chunked_losses = _train(make_loss(chunk), init, batches, mesh, chunk)
    np.testing.assert_allclose(chunked_losses, plain_losses, rtol=1e-5)
    moved = max(float(np.max(np.abs(a - b))) for a, b in
                zip(jax.tree.leaves(plain), jax.tree.leaves(start), strict=True))
    assert moved > 1e-2  # the two steps changed the parameters far beyond the tolerance
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(chunked),
                            jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6,
                                   err_msg=jax.tree_util.keystr(path))


def _dualcse_batches(architecture, rows, seed=0):
    rng = np.random.default_rng(seed)
    fields = len(dualcse_data.FIELDS[architecture])
    sentences = len(dualcse_data.SENTENCES[architecture])
    out = []
    for _ in range(2):
        lengths = rng.integers(2, 9, (rows, fields))
        batch = dict(zip(("input_ids", "attention_mask", "token_type_ids"),
                         _tokens(rng, (rows, fields, 8), lengths), strict=True))
        sentence = (np.arange(rows)[:, None] * sentences
                    + np.arange(sentences)[None, :]).astype(np.int32)
        if architecture == "cross":  # one id per sentence, repeated on its two fields
            sentence = np.repeat(sentence, 2, axis=1)
        if architecture == "simcse":  # some rows without a hard negative (id = positive's)
            sentence[::3, 2] = sentence[::3, 1]
        batch["text_ids"] = sentence
        out.append(batch)
    return out


def _dualcse(architecture, dropout):
    """``(chunk -> loss_fn, init)`` of a tiny DualCSE model."""
    from dualcse_jax.configs import default
    from dualcse_jax.model import build_model, init_fn
    from dualcse_jax.trainer import make_loss_fn

    c = default.get_config()
    c.architecture, c.dropout, c.dropout_impl = architecture, dropout, "hash"
    c.pooling = "mean" if architecture == "simcse" else "cls"
    model = build_model(c, TINY)

    def make_loss(chunk):  # the encoder (GradCache) and the loss's query rows chunked
        c.contrastive_chunk_size = c.loss_chunk_size = chunk
        return make_loss_fn(model, c)

    return make_loss, init_fn(model)


@pytest.fixture(scope="module")
def dualcse_state():
    # Cross and SimCSE (CLS / mean pooling) have the same parameters, and dropout rates do
    # not change them: one initial state for the three tests. 16 rows over data=4: 4 per
    # device, chunks of 2.
    mesh = parallel.make_mesh(4, 2)
    return mesh, _state(_dualcse("cross", False)[1], mesh)


@pytest.mark.parametrize("dropout", [False, True])
def test_dualcse_cross_chunked_equals_unchunked(dualcse_state, dropout):
    mesh, init = dualcse_state
    make_loss, _ = _dualcse("cross", dropout)
    assert isinstance(make_loss(0), contrastive.ContrastiveLoss)
    _assert_same_training(make_loss, init, _dualcse_batches("cross", 16), mesh, chunk=2)


def test_simcse_chunked_equals_unchunked_with_dropout(dualcse_state):
    # Dropout on: the per-example masks must agree as well; the dropout-off path (no
    # vmap) is the same code as DualCSE-Cross's above.
    mesh, init = dualcse_state
    make_loss, _ = _dualcse("simcse", True)
    _assert_same_training(make_loss, init, _dualcse_batches("simcse", 16, seed=1), mesh,
                          chunk=2)


def test_docent_in_batch_chunked_equals_unchunked_with_dropout():
    from docent_jax.configs import default
    from docent_jax.loss import make_dual_loss_fn
    from docent_jax.model import build_model, init_fn

    c = default.get_config()
    c.dropout, c.dropout_impl, c.table_multiple, c.projection_dim = True, "hash", 8, 8
    model = build_model(c, TINY, num_entities=6)
    mesh = parallel.make_mesh(8, 1)

    def make_loss(chunk):
        c.contrastive_chunk_size = chunk
        return make_dual_loss_fn(model, c, mesh)

    rng = np.random.default_rng(2)
    batches = []
    for _ in range(2):  # 16 sentences of 6 entities: repeats are masked, not negatives
        ids, mask, types = _tokens(rng, (16, 1, 8), rng.integers(2, 9, (16, 1)))
        batches.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": types,
                        "entity_ids": rng.integers(0, 6, 16).astype(np.int32)})
    # The learned scale and the table take their gradient from the loss directly.
    _assert_same_training(make_loss, _state(init_fn(model), mesh), batches, mesh, chunk=1)


def test_chunk_size_not_dividing_the_per_device_batch_is_refused_before_the_task(tmp_path):
    c = configs.base()
    c.batch_size = 16
    c.contrastive_chunk_size = 3
    c.mesh_data = 8

    def make_task(config, mesh):
        raise AssertionError("the task was built before the chunk size was checked")

    with pytest.raises(ValueError, match=r"config\.contrastive_chunk_size=3 .* per-device "
                                         r"batch 2 \(batch_size=16 over mesh data=8, "
                                         r"model=1\); use one of \[1, 2\]"):
        run(make_task, c, tmp_path / "w")
    c.contrastive_chunk_size, c.grad_accum_steps = 0, 4
    with pytest.raises(ValueError, match=r"config\.grad_accum_steps=4 \(micro-batches\) does "
                                         r"not divide the per-device batch 2"):
        run(make_task, c, tmp_path / "w")
    c.grad_accum_steps, c.contrastive_chunk_size = 2, 1
    with pytest.raises(ValueError, match="set one of them"):
        configs.validate_base(c)


def test_losses_that_cannot_be_chunked_or_accumulated_are_refused():
    c = configs.base()
    c.contrastive_chunk_size = 2
    with pytest.raises(ValueError, match=r"contrastive_chunk_size=2: MLM's loss is not split "
                                         r"at its embeddings .* cannot be chunked; set it to "
                                         r"0 \(grad_accum_steps bounds its memory\)"):
        contrastive.StepSplit.from_config(c).check_task(
            "MLM", lambda p, b, r: (0.0, {}), contrastive.GradAccumulation())
    c.contrastive_chunk_size, c.grad_accum_steps = 0, 2
    spec = contrastive.ContrastiveLoss(lambda p, b, rows, r: b, lambda p, e, b, r: (0.0, {}))
    with pytest.raises(ValueError, match="would lose negatives: use contrastive_chunk_size"):
        contrastive.StepSplit.from_config(c).check_task("DualCSE", spec, None)


def _token_loss(params, batch, rng):
    """A per-token mean cross-entropy over weighted tokens (the MLM form)."""
    logits = jnp.einsum("btd,dv->btv", batch["x"], params["w"])
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, batch["labels"])
    w = batch["weights"]
    return jnp.sum(ce * w) / jnp.sum(w), {"tokens": jnp.sum(w)}


def test_token_weighted_accumulation_equals_the_full_batch_gradient():
    rng = np.random.default_rng(4)
    mesh = parallel.make_mesh(8, 1)
    weights = (rng.random((32, 6)) < 0.3).astype(np.float32)
    weights[:8] = 1.0  # the first micro-batch's rows hold far more tokens than the rest
    batch = parallel.host_to_global(
        {"x": rng.standard_normal((32, 6, 4)).astype(np.float32),
         "labels": rng.integers(0, 5, (32, 6)).astype(np.int32), "weights": weights}, mesh)
    params = {"w": jnp.asarray(rng.standard_normal((4, 5)), jnp.float32)}
    key = jax.random.key(0)
    with jax.set_mesh(mesh):
        (loss, _), grads = jax.jit(jax.value_and_grad(_token_loss, has_aux=True))(
            params, batch, key)
        weighted = contrastive.accumulated_value_and_grad(
            _token_loss, 4, mesh, contrastive.GradAccumulation(lambda m: m["tokens"],
                                                               summed=("tokens",)))
        (acc_loss, metrics), acc_grads = jax.jit(weighted)(params, batch, key)
        plain = contrastive.accumulated_value_and_grad(_token_loss, 4, mesh)
        (_, _), mean_grads = jax.jit(plain)(params, batch, key)
    np.testing.assert_allclose(float(acc_loss), float(loss), rtol=1e-6)
    np.testing.assert_allclose(acc_grads["w"], grads["w"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(metrics["tokens"]), float(np.sum(weights)))
    # An unweighted mean of micro-batch means is not the per-token mean here.
    assert float(np.max(np.abs(mean_grads["w"] - grads["w"]))) > 1e-3


def test_micro_batches_keep_each_device_block_of_paragraphs_with_its_questions():
    # MRWE's layout: P paragraphs and P*K questions, group-major, both sharded over data.
    mesh = parallel.make_mesh(8, 1)
    P, K, steps = 32, 3, 2
    labels = np.random.default_rng(5).permutation(1000)[:P].astype(np.int32)
    batch = parallel.host_to_global(
        {"p_label": labels, "q_label": np.repeat(labels, K)}, mesh)
    micro = jax.jit(lambda b: contrastive.split_rows(b, steps, mesh))(batch)
    p, q = np.asarray(micro["p_label"]), np.asarray(micro["q_label"])
    assert p.shape == (steps, P // steps) and q.shape == (steps, P * K // steps)
    for j in range(steps):
        np.testing.assert_array_equal(np.repeat(p[j], K), q[j])
        # Micro-batch j holds the j-th block of every device's local paragraphs.
        want = labels.reshape(8, steps, -1)[:, j].reshape(-1)
        np.testing.assert_array_equal(p[j], want)
    back = jax.jit(lambda m: contrastive.merge_rows(m, mesh))(micro)
    np.testing.assert_array_equal(np.asarray(back["q_label"]), np.repeat(labels, K))
