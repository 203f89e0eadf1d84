"""Batch-hard triplet loss against a brute-force loop over every valid triplet."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from embedding_core.losses.triplet import batch_hard_triplet_loss, pairwise_distances


def _dist(a: np.ndarray, b: np.ndarray, distance: str) -> float:
    if distance == "cosine":
        na, nb = np.linalg.norm(a), np.linalg.norm(b)
        return 1.0 - float(a @ b / (na * nb)) if na > 0 and nb > 0 else 1.0
    sq = float(np.sum((a - b) ** 2))
    return sq if distance == "squared" else float(np.sqrt(sq))


def _brute_force(x, labels, margin, soft, distance, valid=None, anchors=None, candidates=None):
    """Loops over every (anchor, positive, negative) triplet; hardest = worst triplet."""
    x = np.asarray(x, np.float64)
    n = len(labels)
    valid = np.ones(n, bool) if valid is None else valid
    anchors = valid if anchors is None else anchors & valid
    candidates = valid if candidates is None else candidates & valid
    losses = []
    for a in range(n):
        if not anchors[a]:
            continue
        worst = None
        for p, q in itertools.product(range(n), range(n)):
            if not (candidates[p] and candidates[q]) or p == a:
                continue
            if labels[p] != labels[a] or labels[q] == labels[a]:
                continue
            gap = _dist(x[a], x[p], distance) - _dist(x[a], x[q], distance)
            value = np.log1p(np.exp(gap)) if soft else max(gap + margin, 0.0)
            worst = value if worst is None else max(worst, value)
        if worst is not None:  # no valid triplet: contributes nothing, not counted
            losses.append(worst)
    return float(np.mean(losses)) if losses else 0.0


@pytest.mark.parametrize("distance", ["euclidean", "squared", "cosine"])
@pytest.mark.parametrize("soft", [False, True])
def test_equals_brute_force(distance, soft):
    rng = np.random.default_rng(0)
    for trial in range(3):
        n = 9
        x = rng.normal(size=(n, 4)).astype(np.float32)
        labels = rng.integers(0, 3, size=n).astype(np.int32)
        labels[0] = 7  # a singleton: no positive
        valid = np.ones(n, bool)
        valid[-1] = trial != 1  # one padding row in one trial
        loss, _ = batch_hard_triplet_loss(
            jnp.asarray(x), jnp.asarray(labels), margin=0.3, soft_margin=soft,
            distance=distance, valid=jnp.asarray(valid),
        )
        want = _brute_force(x, labels, 0.3, soft, distance, valid)
        np.testing.assert_allclose(float(loss), want, rtol=1e-5, atol=1e-6)


def test_anchor_and_candidate_roles_equal_brute_force():
    """Question anchors against paragraph candidates (the retrieval set-up)."""
    rng = np.random.default_rng(1)
    n = 10
    x = rng.normal(size=(n, 3)).astype(np.float32)
    labels = np.array([0, 1, 2, 0, 1, 0, 1, 2, 3, 3], np.int32)
    is_question = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 1], bool)
    loss, stats = batch_hard_triplet_loss(
        jnp.asarray(x), jnp.asarray(labels), margin=0.5,
        anchors=jnp.asarray(is_question), candidates=jnp.asarray(~is_question),
    )
    want = _brute_force(x, labels, 0.5, False, "euclidean", None, is_question, ~is_question)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    # Questions 0..4 have their paragraph in the batch; question 9's paragraph (8) is there too.
    assert float(stats["num_valid_anchors"]) == 6


def test_stats_match_hand_case():
    # Points on a line: labels 0,0,1 at 0, 1, 3.
    x = jnp.array([[0.0], [1.0], [3.0]])
    labels = jnp.array([0, 0, 1], jnp.int32)
    loss, stats = batch_hard_triplet_loss(x, labels, margin=0.5)
    # anchor 0: d_ap 1, d_an 3 -> 0; anchor 1: d_ap 1, d_an 2 -> 0; anchor 2: no positive.
    assert float(loss) == 0.0
    assert float(stats["num_valid_anchors"]) == 2
    np.testing.assert_allclose(float(stats["mean_d_ap"]), 1.0)
    np.testing.assert_allclose(float(stats["mean_d_an"]), 2.5)
    assert float(stats["active_fraction"]) == 0.0
    loss, stats = batch_hard_triplet_loss(x, labels, margin=1.5)
    np.testing.assert_allclose(float(loss), (0.0 + 0.5) / 2)  # anchor 1: 1 - 2 + 1.5
    np.testing.assert_allclose(float(stats["active_fraction"]), 0.5)


def test_anchors_without_positive_contribute_zero():
    x = jnp.array([[0.0, 0.0], [1.0, 0.0], [5.0, 5.0], [0.1, 0.0]])
    labels = jnp.array([0, 0, 1, 2], jnp.int32)  # labels 1 and 2 are singletons
    loss, stats = batch_hard_triplet_loss(x, labels, margin=1.0)
    # anchors 0 and 1 only: anchor 0: d_ap 1, d_an 0.1 -> 1.9; anchor 1: d_ap 1, d_an 0.9 -> 1.1
    np.testing.assert_allclose(float(loss), (1.9 + 1.1) / 2, rtol=1e-6)
    assert float(stats["num_valid_anchors"]) == 2
    # No anchor with both a positive and a negative: loss 0, not NaN.
    loss, stats = batch_hard_triplet_loss(x, jnp.array([0, 1, 2, 3], jnp.int32), margin=1.0)
    assert float(loss) == 0.0 and float(stats["num_valid_anchors"]) == 0


@pytest.mark.parametrize("distance", ["euclidean", "squared", "cosine"])
@pytest.mark.parametrize("soft", [False, True])
def test_collapse_gives_margin_and_finite_gradient(distance, soft):
    x = jnp.ones((6, 4)) * 0.3
    labels = jnp.array([0, 0, 1, 1, 2, 2], jnp.int32)

    def f(x):
        return batch_hard_triplet_loss(x, labels, margin=0.2, soft_margin=soft,
                                       distance=distance)[0]

    loss, grad = jax.value_and_grad(f)(x)
    want = np.log(2.0) if soft else 0.2  # softplus(0) = ln 2
    np.testing.assert_allclose(float(loss), want, atol=1e-6)
    assert np.all(np.isfinite(np.asarray(grad)))


@pytest.mark.parametrize("distance", ["euclidean", "squared", "cosine"])
def test_gradient_finite_when_two_coincide_and_for_zero_rows(distance):
    rng = np.random.default_rng(2)
    x = rng.normal(size=(6, 3)).astype(np.float32)
    x[1] = x[0]  # exact coincidence of a positive pair
    x[4] = x[2]  # and of a negative pair
    x[5] = 0.0  # an all-zero row (cosine's normalisation must not NaN)
    labels = jnp.array([0, 0, 1, 1, 2, 2], jnp.int32)
    grad = jax.grad(lambda x: batch_hard_triplet_loss(x, labels, margin=0.5,
                                                      distance=distance)[0])(jnp.asarray(x))
    assert np.all(np.isfinite(np.asarray(grad)))
    # The gradient is not trivially zero: the loss is active for these random points.
    assert np.abs(np.asarray(grad)).sum() > 0


def test_pairwise_distances_against_numpy():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(5, 7)).astype(np.float32)
    want = np.sqrt(((x[:, None, :] - x[None, :, :]) ** 2).sum(-1))
    np.testing.assert_allclose(np.asarray(pairwise_distances(jnp.asarray(x))), want, atol=1e-5)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="distance"):
        batch_hard_triplet_loss(jnp.ones((2, 2)), jnp.zeros(2, jnp.int32), margin=1.0,
                                distance="manhattan")
    with pytest.raises(ValueError, match="labels"):
        batch_hard_triplet_loss(jnp.ones((2, 2)), jnp.zeros(3, jnp.int32), margin=1.0)


def test_sharded_batch_gives_same_loss_and_gradient():
    """The loss is written on the global batch: 8 devices must agree with one."""
    from jax.sharding import AxisType, NamedSharding, PartitionSpec

    if jax.device_count() < 8:
        pytest.skip("needs the 8 fake CPU devices of conftest")
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.normal(size=(16, 4)), jnp.float32)
    labels = jnp.asarray(rng.integers(0, 4, size=16), jnp.int32)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Auto,))  # as docs/architecture.md
    rows = NamedSharding(mesh, PartitionSpec("data"))

    def f(x, labels):
        return batch_hard_triplet_loss(x, labels, margin=0.5)[0]

    step = jax.jit(jax.value_and_grad(f))
    want_loss, want_grad = step(x, labels)
    loss, grad = step(jax.device_put(x, rows), jax.device_put(labels, rows))
    np.testing.assert_allclose(float(loss), float(want_loss), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), np.asarray(want_grad), rtol=1e-5, atol=1e-7)
