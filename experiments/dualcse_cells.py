"""DualCSE experiment cells: the systems, their training configs, and how one trained
model is scored on INLI RTE (per pair, every score rule) and the EIS proxy.

Shared by the 200-step grid (``experiments/dualcse.py``) and the learning curves
(``experiments/dualcse_curves.py``); the protocol is described in ``experiments/dualcse.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from experiments import grid

RULES = ("max", "explicit", "implicit", "pair")
CLASSES = ("explicit", "implied", "neutral", "contradiction")
COLUMNS = (*CLASSES, "average")
SEEDS = (0, 1, 2)
CPU_STEPS = 200
"""Steps per trained run on ``--preset=cpu``: ``cross_cpu.py``'s own 200 (3,200 premises of
INLI train's 8,000). Fewer do not leave MiniLM's starting point: at 50 steps DualCSE-Cross
scored 59.05 (max rule, average) against MiniLM off the shelf at 64.50, at 200 steps 68.0.
A Cross or Bi cell costs about 30 s of start-up, 3 s per step and 105 s of scoring (val and
test encoded once, the EIS proxy reusing test), a SimCSE cell about 30 s, 2.3 s per step and
70 s: the thirteen trained cells take about two and a half hours on 2 quiet cores.
"""

BASELINE = "MiniLM off the shelf (NLI-trained)"
SIMCSE = "SimCSE(INLI)"
CROSS = "DualCSE-Cross"
BI = "DualCSE-Bi"
NO_CONTRA = "Cross w/o contradiction"
NO_INTRA = "Cross w/o intra-sentence"
SYSTEMS = {  # key -> (row name, architecture, config overrides)
    "simcse": (SIMCSE, "simcse", {}),
    "cross": (CROSS, "cross", {}),
    "bi": (BI, "bi", {}),
    "cross-nocontra": (NO_CONTRA, "cross", {"use_contradiction": False}),
    "cross-nointra": (NO_INTRA, "cross", {"use_intra": False}),
}
MAIN = ("simcse", "cross", "bi")
ABLATIONS = ("cross-nocontra", "cross-nointra")
THREE_SEEDS = (*MAIN, "cross-nocontra")  # the first four trained rows (issue 12)

PAPER = {  # seed text's RTE table (docs/dualcse.md), BERT/RoBERTa-base, decision rule unknown
    "SimCSE (SNLI+MNLI)": (79.80, 49.00, 74.30, 67.60, 67.68),
    SIMCSE: (90.60, 69.10, 66.90, 91.00, 79.40),
    CROSS: (90.20, 73.40, 68.40, 88.70, 80.18),
    BI: (91.90, 69.90, 72.10, 87.60, 80.38),
}
COMPARISONS = (  # (system, reference, metric): the paper's signs
    (CROSS, SIMCSE, "average"), (BI, SIMCSE, "average"),
    (CROSS, SIMCSE, "implied"), (BI, SIMCSE, "implied"), (BI, CROSS, "average"),
)


def run_config(key: str, preset: str, seed: int, steps: int | None = None):
    """The training config of grid row ``key`` (a :data:`SYSTEMS` key) with ``seed``.

    Raises:
      KeyError: an unknown key. ValueError: an unknown preset.
    """
    from dualcse_jax.configs import cross_cpu, default

    _, architecture, overrides = SYSTEMS[key]
    if preset == "cpu":
        c = cross_cpu.get_config()
        c.num_train_steps = CPU_STEPS
        c.checkpoint_every = 100  # the runs are short: one checkpoint, at the end
    elif preset == "gpu":
        c = default.get_config()
        c.num_train_steps = 0  # one epoch (num_epochs=1)
        c.pooling = "mean"
        if architecture == "bi":
            c.batch_size, c.learning_rate = 32, 3e-5
        c.checkpoint_every = 1000
    else:
        raise ValueError(f"preset {preset!r}: use cpu or gpu")
    premises = int(c.batch_size)
    c.architecture = architecture
    c.train_data = "inli"
    if architecture == "simcse":
        c.batch_size = 2 * premises  # two rows per premise: the same premises per step
    c.update(overrides)
    if steps:
        c.num_train_steps = steps
    c.seed = seed
    c.eval_every = 0  # scored once at the end, on every rule
    c.keep_checkpoints = 1
    default.validate(c)
    return c


def scores_of(embedder, val, test, *, raw: bool = False) -> tuple[grid.Scores, dict]:
    """Per-pair test correctness for every rule (``"<rule>/<class>"``, ``"<rule>/average"``
    = the macro items), the EIS proxy per pair (``"eis_proxy"``), and the thresholds.
    ``raw``: also the cosines themselves, ``"sims/<val|test>/<class>"`` ``[n_pairs, 2]``
    (columns ``evaluate.SIMILARITIES``: cos(r_p, r_h), cos(u_p, r_h)), to be scored later
    without a threshold."""
    from dualcse_jax import evaluate

    val_sims = evaluate.rte_similarities(embedder, val)
    test_vectors = evaluate.encode_rte(embedder, test)  # reused by the EIS proxy
    test_sims = evaluate.similarities_of(test_vectors, test)
    scores: grid.Scores = {}
    thresholds = {}
    for rule in RULES:
        correct, thresholds[rule] = evaluate.rte_correct(val_sims, test_sims, rule)
        for c in CLASSES:
            scores[f"{rule}/{c}"] = correct[c].astype(np.float64)
        scores[f"{rule}/average"] = grid.macro_average_items([correct[c] for c in CLASSES])
    scores["eis_proxy"] = evaluate.inli_eis_proxy_correct(
        embedder, test, test_vectors).astype(np.float64)
    if raw:
        for split, sims in (("val", val_sims), ("test", test_sims)):
            for c in CLASSES:
                scores[f"sims/{split}/{c}"] = np.asarray(sims[c], np.float64)
    return scores, thresholds


def rte_sets():
    from data_pipelines import inli

    return (inli.read_inli(inli.inli_split_path("val")),
            inli.read_inli(inli.inli_split_path("test")))


def save_thresholds(workdir: Path, thresholds: dict) -> None:
    from embedding_core.storage import storage
    from embedding_core.storage.files import write_json

    write_json(storage.as_path(workdir) / "eval" / "rte_thresholds.json",
               {rule: list(t) for rule, t in thresholds.items()})


def train_and_score(key: str, preset: str, seed: int, steps: int | None):
    def run(workdir: Path) -> grid.Scores:
        from dualcse_jax.inference import load
        from dualcse_jax.trainer import train

        t0, c0 = time.time(), time.process_time()
        train(run_config(key, preset, seed, steps), workdir)
        t1, c1 = time.time(), time.process_time()
        val, test = rte_sets()
        scores, thresholds = scores_of(load(workdir), val, test, raw=True)
        save_thresholds(workdir, thresholds)
        # CPU seconds (all threads) next to wall seconds: on a shared machine the wall time
        # says little about what the cell costs on quiet cores.
        print(f"{key}-seed{seed}: train {t1 - t0:.0f} s wall / {c1 - c0:.0f} s CPU, score "
              f"{time.time() - t1:.0f} s wall / {time.process_time() - c1:.0f} s CPU",
              flush=True)
        return scores
    return run


def baseline(preset: str, *, raw: bool = False):
    def run(workdir: Path) -> grid.Scores:
        from dualcse_jax.baselines import baseline as off_the_shelf

        config = run_config("cross", preset, 0)
        val, test = rte_sets()
        scores, thresholds = scores_of(
            off_the_shelf(config.model, pooling="mean", max_length=int(config.max_length)),
            val, test, raw=raw)
        save_thresholds(workdir, thresholds)
        return scores
    return run
