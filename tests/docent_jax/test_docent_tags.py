"""DocEnt tag prediction: the notebook's metrics, the human cross-validation, tag heads."""

from __future__ import annotations

import collections

import numpy as np
import pytest
from sklearn.metrics import label_ranking_average_precision_score, roc_auc_score

from docent_jax import tag_eval
from docent_jax.corpora import movielens

# ----------------------------------------------------------------------------- hand-worked

# Movie A: positives (count > 1) t0, t2; ranking t0 t1 t3 t2.
# Movie B: positive t1; ranking t2 t1 t0 t3.
# Movie C: no positive (counts <= 1): only in AUC.
SCORES = np.array([[0.9, 0.8, 0.1, 0.5],
                   [0.2, 0.3, 0.9, 0.1],
                   [0.4, 0.6, 0.7, 0.0]])
COUNTS = np.array([[3, 0, 2, 1],
                   [0, 5, 0, 0],
                   [1, 0, 0, 1]])


def test_hand_worked_fixture():
    m = tag_eval.tag_metrics(SCORES, COUNTS, threshold=1, ks=(1, 2, 3))
    assert m["movies_with_positive"] == 2 and m["positives"] == 3
    # P@1: A hit, B miss. P@2: only A has >= 2 positives: t0 hit, t1 miss.
    assert m["precision@1"] == pytest.approx(0.5)
    assert m["precision@2"] == pytest.approx(0.5)
    assert m["num_movies@2"] == 1 and np.isnan(m["precision@3"]) and m["num_movies@3"] == 0
    # NDCG@1: A 3/3, B 0/5.
    assert m["ndcg@1"] == pytest.approx(0.5)
    # NDCG@2, raw gains: A 3 / (3 + 2/log2 3); B (5/log2 3) / 5.
    a2 = 3 / (3 + 2 / np.log2(3))
    b2 = 1 / np.log2(3)
    assert m["ndcg@2"] == pytest.approx((a2 + b2) / 2, rel=1e-12)
    # NDCG@3, raw: A (3 + 1/2) / (3 + 2/log2 3 + 1/2) (gain 1 of t3 counts although t3 is
    # not positive); B's DCG is unchanged at rank 3 (t0 has gain 0).
    a3 = 3.5 / (3.5 + 2 / np.log2(3))
    assert m["ndcg@3"] == pytest.approx((a3 + b2) / 2, rel=1e-12)
    # log gains: A = ln4 / (ln4 + ln3/log2 3) = 2 ln2 / 3 ln2 = 2/3.
    assert m["ndcg_log@2"] == pytest.approx((2 / 3 + b2) / 2, rel=1e-12)
    # MAP = LRAP: A (1/1 + 2/4) / 2, B 1/2.
    assert m["map"] == pytest.approx((0.75 + 0.5) / 2)
    # AUC over all 12 cells (C included): (8.5 + 1.5 + 3) / (3 * 9).
    assert m["auc"] == pytest.approx(13 / 27)


def test_no_positive_gives_nan_not_an_error():
    m = tag_eval.tag_metrics(SCORES, COUNTS, threshold=5, ks=(1,))
    assert m["movies_with_positive"] == 0
    assert all(np.isnan(m[k]) for k in ("map", "auc", "precision@1", "ndcg@1", "ndcg_log@1"))


# ----------------------------------------------------------------------------- notebook parity


def _notebook_metrics(scores, counts, threshold, max_k):
    """The authors' notebook (MoviesHoldoutEval.ipynb, eval_model), transcribed."""
    binary = counts > threshold
    keep = binary.sum(axis=1) > 0
    predictions = np.argsort(-scores, axis=1, kind="stable")
    labels, b, p, n = counts[keep], binary[keep], predictions[keep], binary[keep].sum(axis=1)
    precision, counter = np.zeros((len(n), max_k)), np.zeros((len(n), max_k))
    ranked = np.take_along_axis(b, p, axis=1)
    for k in range(1, max_k + 1):
        for i in range(len(n)):
            if k <= n[i]:
                precision[i, k - 1] = ranked[i, :k].mean()
                counter[i, k - 1] = 1

    def dcg(order, use_log):
        discounts = np.log2(np.arange(2, max_k + 2))
        out = np.zeros((len(labels), max_k))
        for i in range(len(labels)):
            gain = labels[i, order[i]].astype(np.float64)
            gain = np.log(gain + 1) if use_log else gain
            for k in range(1, max_k + 1):
                out[i, k - 1] = np.sum(gain[:k] / discounts[:k])
        return out

    ideal = np.argsort(-labels, axis=1, kind="stable")
    return {
        "precision": precision.sum(0) / counter.sum(0),
        "ndcg": (dcg(p, False) / dcg(ideal, False)).mean(0),
        "ndcg_log": (dcg(p, True) / dcg(ideal, True)).mean(0),
        "map": label_ranking_average_precision_score(b, scores[keep]),
        "auc": roc_auc_score(binary.reshape(-1), scores.reshape(-1)),
    }


def test_equals_notebook_and_sklearn_on_tie_free_scores():
    rng = np.random.default_rng(0)
    counts = rng.poisson(0.6, size=(60, 30)) * (rng.random((60, 30)) < 0.4)
    scores = rng.normal(size=counts.shape) + 0.5 * counts  # continuous: no ties
    max_k = 8
    ours = tag_eval.tag_metrics(scores, counts, threshold=1, ks=range(1, max_k + 1))
    ref = _notebook_metrics(scores, counts, 1, max_k)
    assert ours["map"] == pytest.approx(ref["map"], rel=1e-12)
    assert ours["auc"] == pytest.approx(ref["auc"], rel=1e-12)
    for k in range(1, max_k + 1):
        if ours[f"num_movies@{k}"]:
            assert ours[f"precision@{k}"] == pytest.approx(ref["precision"][k - 1], rel=1e-12)
        assert ours[f"ndcg@{k}"] == pytest.approx(ref["ndcg"][k - 1], rel=1e-9)
        assert ours[f"ndcg_log@{k}"] == pytest.approx(ref["ndcg_log"][k - 1], rel=1e-9)


# ----------------------------------------------------------------------------- human CV, real data


@pytest.fixture(scope="module")
def movielens_small():
    applications = movielens.read_tags()
    vocab = [g.tag for g in movielens.read_genome_tags()]
    movie_ids = sorted({t.movie_id for t in applications})
    return applications, movie_ids, vocab


def _independent_folds(applications, movie_ids, vocab):
    """The seed-31415 user split and per-fold counts, rebuilt without the data layer."""
    users = np.unique([t.user_id for t in applications])
    np.random.seed(31415)
    folds = np.array_split(np.random.permutation(users), 3)
    row = {m: i for i, m in enumerate(movie_ids)}
    col = {t.strip().casefold(): j for j, t in enumerate(vocab)}
    out = []
    for members in folds:
        cells = collections.defaultdict(set)
        for t in applications:
            j = col.get(t.tag.strip().casefold())
            if j is not None:
                cells[(row[t.movie_id], j, t.user_id in set(members))].add(t.user_id)
        held_in = np.zeros((len(movie_ids), len(vocab)), np.int64)
        others = np.zeros_like(held_in)
        for (i, j, inside), who in cells.items():
            (held_in if inside else others)[i, j] = len(who)
        out.append((members, held_in, others))
    return out


def test_human_baseline_on_real_movielens(movielens_small):
    applications, movie_ids, vocab = movielens_small
    folds = movielens.human_cv_folds(applications, movie_ids, vocab)
    reference = _independent_folds(applications, movie_ids, vocab)
    assert [len(f.users) for f in folds] == [20, 19, 19]  # 58 users
    for fold, (members, held_in, others) in zip(folds, reference, strict=True):
        np.testing.assert_array_equal(fold.users, members)
        np.testing.assert_array_equal(fold.held_in, held_in)
        np.testing.assert_array_equal(fold.others, others)

    # Threshold 2 (the paper's): no (movie, genome tag) cell has 3 users inside one fold of
    # ml-latest-small, so nothing is defined. Say so rather than report numbers.
    sparse = tag_eval.human_baseline(folds, threshold=2)
    assert sparse["human"]["mean"]["positives"] == 0
    assert np.isnan(sparse["human"]["mean"]["map"])

    for threshold in (0, 1):
        result = tag_eval.human_baseline(folds, threshold=threshold, ks=(1, 5, 10))
        # sklearn on the independently built matrices of one fold (it is slow); the other
        # folds' matrices were checked equal above.
        checked = result["human"]["folds"][:1] if threshold == 0 else []
        for fold_metrics, (_, held_in, others) in zip(checked, reference[:len(checked)],
                                                      strict=True):
            labels = held_in > threshold
            keep = labels.any(axis=1)
            assert fold_metrics["map"] == pytest.approx(
                label_ranking_average_precision_score(labels[keep], others[keep]), rel=1e-12)
            assert fold_metrics["auc"] == pytest.approx(
                roc_auc_score(labels.reshape(-1), others.reshape(-1)), rel=1e-12)
        mean = result["human"]["mean"]
        assert mean["map"] == pytest.approx(np.mean([f["map"] for f in result["human"]["folds"]]))
        print(f"\nhuman baseline, ml-latest-small x 1128 genome tags, {len(movie_ids)} tagged "
              f"movies, threshold {threshold}: MAP {100 * mean['map']:.1f}, AUC "
              f"{mean['auc']:.3f}, P@1 {mean['precision@1']:.3f}, NDCG@10 "
              f"{mean['ndcg@10']:.3f}, NDCG_log@10 {mean['ndcg_log@10']:.3f}, movies with a "
              f"positive per fold {mean['movies_with_positive']:.1f}")


def test_model_scores_are_evaluated_against_the_same_fold_labels(movielens_small):
    applications, movie_ids, vocab = movielens_small
    # The first 400 tagged movies keep sklearn's AUC/LRAP quick.
    folds = [movielens.HumanCVFold(f.users, f.held_in[:400], f.others[:400])
             for f in movielens.human_cv_folds(applications, movie_ids, vocab)]
    total = folds[0].held_in + folds[0].others
    # An oracle that sees every user scores each fold's positives at least as high as the
    # human predictor, who misses the fold's own votes.
    result = tag_eval.human_baseline(folds, threshold=0, ks=(1,), model_scores={"oracle": total})
    for human, oracle in zip(result["human"]["folds"], result["oracle"]["folds"], strict=True):
        assert oracle["map"] > human["map"]
        assert oracle["auc"] > human["auc"]
    with pytest.raises(ValueError, match="shape"):
        tag_eval.human_baseline(folds, model_scores={"bad": total[:, :3]})


# ----------------------------------------------------------------------------- closed / open vocab


def _synthetic(n_movies=240, n_tags=12, dim=8, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_movies, dim))
    w = rng.normal(size=(dim, n_tags))
    logits = x @ w
    counts = (logits > np.quantile(logits, 0.85, axis=0)).astype(int) * rng.integers(
        1, 4, size=logits.shape)
    return x, counts


def test_closed_vocab_head_learns_held_out_movies():
    x, counts = _synthetic()
    train, test = np.arange(160), np.arange(160, 240)
    fitted = tag_eval.closed_vocab_eval(x, counts, train, test, threshold=0, steps=300,
                                    learning_rate=5e-2)
    shuffled = tag_eval.closed_vocab_eval(np.random.default_rng(1).permutation(x), counts, train,
                                      test, threshold=0, steps=300, learning_rate=5e-2)
    assert fitted["scores"].shape == (80, 12)
    assert fitted["metrics"]["map"] > 0.85
    assert fitted["metrics"]["auc"] > 0.95
    assert shuffled["metrics"]["map"] < fitted["metrics"]["map"] - 0.3
    head = fitted["head"]
    xn = x[test] / np.linalg.norm(x[test], axis=1, keepdims=True)
    np.testing.assert_allclose(fitted["scores"], xn @ head.kernel + head.bias, rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(ValueError, match="overlap"):
        tag_eval.closed_vocab_eval(x, counts, train, train[:5])


def test_open_vocab_scores_are_text_side_cosines():
    rng = np.random.default_rng(0)
    dim, n_tags = 6, 10
    tag_vectors = rng.normal(size=(n_tags, dim))
    texts = [f"tag {j}" for j in range(n_tags)]
    lookup = dict(zip(texts, tag_vectors, strict=True))
    movies = rng.normal(size=(50, dim))
    cos = (movies / np.linalg.norm(movies, axis=1, keepdims=True)) @ (
        tag_vectors / np.linalg.norm(tag_vectors, axis=1, keepdims=True)).T
    counts = (cos > 0.5).astype(int) * 2
    held = [1, 4, 7]
    seen = []

    def encode(batch):
        seen.extend(batch)
        return np.stack([lookup[t] for t in batch])

    out = tag_eval.open_vocab_eval(movies, texts, encode, counts, held, threshold=1, ks=(1,))
    assert seen == ["tag 1", "tag 4", "tag 7"]  # only held-out tags are encoded zero-shot
    np.testing.assert_allclose(out["scores"], cos[:, held], rtol=1e-5, atol=1e-6)
    assert out["metrics"]["map"] == pytest.approx(1.0)  # labels are a function of the cosine
    assert out["metrics"] == tag_eval.tag_metrics(out["scores"], counts[:, held], 1, (1,))


def test_open_vocab_projection_fitted_on_other_tags_transfers():
    rng = np.random.default_rng(3)
    dim, n_tags = 8, 40
    tag_vectors = rng.normal(size=(n_tags, dim))
    z = rng.normal(size=(120, dim))
    cos = (z / np.linalg.norm(z, axis=1, keepdims=True)) @ (
        tag_vectors / np.linalg.norm(tag_vectors, axis=1, keepdims=True)).T
    counts = (cos > 0.55).astype(int) * 2
    rotation, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    movies = z @ rotation  # the entity space is a rotation of the text space
    texts = [str(j) for j in range(n_tags)]

    def encode(batch):
        return tag_vectors[[int(t) for t in batch]]

    held = list(range(30, 40))
    zero_shot = tag_eval.open_vocab_eval(movies, texts, encode, counts, held, ks=(1,))
    fitted = tag_eval.open_vocab_eval(movies, texts, encode, counts, held, ks=(1,), fit_steps=400,
                                  learning_rate=2e-2)
    assert fitted["metrics"]["map"] > zero_shot["metrics"]["map"] + 0.2
    assert fitted["metrics"]["auc"] > 0.9
