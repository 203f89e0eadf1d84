"""The CLI's work as plain functions (no flags): train, evaluate, export, the demo."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from etils import epath

from embedding_core import multihost
from embedding_core.serving import serving
from embedding_core.storage import storage
from embedding_core.storage.files import write_json, write_lines
from embedding_core.training import metric_log

BASE = "MiniLM off the shelf (mean)"


def train(config, workdir: str | os.PathLike, *, stop_after: int | None = None):
    """Trains (or resumes) into ``workdir`` (:func:`dualcse_jax.trainer.train`)."""
    from dualcse_jax.trainer import train as train_task

    state = train_task(config, workdir, stop_after=stop_after)
    if multihost.is_primary():
        print(f"checkpoints and TensorBoard events in {workdir}")
    return state


def evaluate_workdir(workdir: str | os.PathLike, *, step: int | None = None,
                     baseline: bool = False, eis_data: str | None = None,
                     progress: bool = True, overrides: dict | None = None,
                     rules: Sequence[str] | None = None) -> dict:
    """RTE (+ EIS) of a checkpoint, printed and written to ``workdir/eval/``; ``overrides``:
    ``val_file``, ``test_file``, ``eval_rte_score_rule``; ``rules``: a table each. ValueError
    (before loading): an unknown rule or override."""
    from data_pipelines import impscore
    from dualcse_jax import data, evaluate
    from dualcse_jax.baselines import baseline as make_baseline
    from dualcse_jax.inference import load, read_config

    if eis_data:
        if not storage.as_path(eis_data).is_file():
            raise FileNotFoundError(f"--eis_data {eis_data} does not exist or is not a file")
        _, _, test_rows = impscore.split_impscore(impscore.read_impscore(eis_data))
        eis_pairs = evaluate.impscore_pairs(test_rows)  # >= 1 row: the reader checks
    config = read_config(workdir)  # the run's val_file / test_file, before the model loads
    for key, value in (overrides or {}).items():
        if key not in ("val_file", "test_file", "eval_rte_score_rule"):
            raise ValueError(f"evaluate may change only config.val_file, config.test_file and "
                             f"config.eval_rte_score_rule, not {key!r} (the others describe "
                             f"the trained run)")
        config[key] = value
    rules = list(rules or [config.eval_rte_score_rule])
    for rule in rules:
        evaluate.check_rule(rule)
    val, test = data.val_examples(config), data.test_examples(config)
    embedder = load(workdir, step=step)
    name = f"DualCSE-{embedder.config.architecture} (step {embedder.step})"
    if embedder.config.architecture == "simcse":
        # The file's name, not its path, keeps the table's first column narrow.
        source = (os.path.basename(str(embedder.config.get("train_file", "") or ""))
                  or embedder.config.train_data)
        name = f"SimCSE-{source} (step {embedder.step})"
    by_rule = evaluate.evaluate_rte_rules(embedder, val, test, rules, progress=progress)
    base_rule: dict = {}
    if baseline:
        base = make_baseline(embedder.config.model, max_length=embedder.config.max_length)
        base_rule = evaluate.evaluate_rte_rules(base, val, test, rules, progress=progress)
    rows = {name: by_rule[rules[0]], **({BASE: base_rule[rules[0]]} if baseline else {})}
    test_source = data.test_source(config)
    if embedder.config.architecture == "simcse":
        # One vector (r = u): implicitness is 0 for every sentence; no EIS to report.
        eis = {"eis_accuracy": None, "proxy": False,
               "eis_data": "n/a (one vector: SimCSE's r and u are the same)"}
    elif eis_data:
        eis = {"eis_accuracy": evaluate.evaluate_eis(embedder, eis_pairs),
               "eis_data": eis_data, "proxy": False}
    else:
        pairs = evaluate.inli_eis_proxy_pairs(test)
        eis = {"eis_accuracy": evaluate.evaluate_eis(embedder, pairs), "proxy": True,
               "eis_data": f"{test_source}: premise (implicit) vs its implied entailment "
                           "(explicit), a proxy"}
    out_dir = storage.as_path(workdir) / "eval"
    key = evaluate.token_key(embedder)  # as the tokenizer sees them ("The dog" = "the dog")
    conflicts = {"val": evaluate.label_conflicts(val, key),
                 "test": evaluate.label_conflicts(test, key)}
    extra = {"rules": by_rule} if len(rules) > 1 else {}
    if multihost.is_primary():  # every process holds the same results; one writes them
        write_json(out_dir / "rte.json", dict(rows[name], rule=rules[0], **extra,
                                              label_conflicts=conflicts))
        write_json(out_dir / "eis.json", eis)
        if baseline:
            write_json(out_dir / "rte_baseline.json",
                       dict(rows[BASE], rule=rules[0],
                            **({"rules": base_rule} if len(rules) > 1 else {}),
                            label_conflicts=conflicts))
        for rule in rules:
            table = {name: by_rule[rule], **({BASE: base_rule[rule]} if baseline else {})}
            print(f"\nRTE accuracy (%) on {data.rte_sets_label(config)}; score rule {rule}: "
                  f"{evaluate.RULE_TEXT[rule]}")
            print(evaluate.format_rte_table(table))
        if note := evaluate.format_label_conflicts(conflicts):
            print(note)
        if eis["eis_accuracy"] is None:
            print(f"EIS accuracy: {eis['eis_data']}")
        else:
            label = (f"EIS accuracy ({'INLI' if test_source == 'INLI test' else test_source} "
                     "proxy)" if eis["proxy"] else f"EIS accuracy ({eis_data})")
            print(f"{label}: {100 * eis['eis_accuracy']:.2f}%")
        print(f"wrote {out_dir / 'rte.json'}")
    return {"rte": rows, "rte_rules": by_rule, "eis": eis, "label_conflicts": conflicts}


def export_workdir(workdir: str | os.PathLike, input_path: str, output: str, *,
                   step: int | None = None, normalize: bool | None = None,
                   chunk: int = 4096) -> epath.Path:
    """r and u of ``input_path``'s lines into ``output/explicit``, ``output/implicit``."""
    from dualcse_jax.inference import load

    return serving.export(lambda: load(workdir, step=step), output, input_path=input_path,
                          normalize=normalize, workdir=workdir, chunk=chunk)


def export_hf_workdir(workdir: str | os.PathLike, output: str | os.PathLike, *,
                      step: int | None = None) -> epath.Path:
    """The run as sentence-transformers folders (``Embedder.hf_folders``)."""
    from dualcse_jax.inference import load

    return serving.export_hf(lambda: load(workdir, step=step), output, workdir=workdir)


def run_demo(workdir: str | os.PathLike, num_train_steps: int | None = None, *,
             config=None) -> dict:
    """The README's main job: train (``config``, else ``configs/cross_cpu.py``), evaluate RTE
    beside MiniLM off the shelf, export the INLI test premises' r and u."""
    workdir = storage.as_path(workdir)

    from data_pipelines import inli
    from dualcse_jax.configs import cross_cpu
    from dualcse_jax.trainer import train as train_task

    config = cross_cpu.get_config() if config is None else config
    if num_train_steps:
        config.num_train_steps = num_train_steps
    t0 = time.time()
    print(f"[1/3] training DualCSE-Cross from {config.model} on INLI train "
          f"({config.num_train_steps} steps x {config.batch_size} premises) -> {workdir}")
    train_task(config, workdir)
    t1 = time.time()
    print("[2/3] evaluating RTE on INLI test (and MiniLM off the shelf, itself NLI-trained)")
    result = evaluate_workdir(workdir, baseline=True)
    t2 = time.time()
    premises_file = workdir / "inli_test_premises.txt"
    premises = [ex.premise for ex in inli.read_inli(inli.inli_split_path("test"))]
    write_lines(premises_file, premises)
    print(f"[3/3] exporting both embeddings of the {len(premises)} INLI test premises")
    export_dir = workdir / "export_test_premises"
    export_workdir(workdir, str(premises_file), str(export_dir))
    t3 = time.time()
    rows = result["rte"]
    trained, base = (rows[k] for k in rows)
    print("\nSummary")
    print(f"  trained        implied {100 * trained['implied']:.2f}%  average "
          f"{100 * trained['average']:.2f}%")
    print(f"  off the shelf  implied {100 * base['implied']:.2f}%  average "
          f"{100 * base['average']:.2f}%")
    print(f"  time: train {t1 - t0:.0f}s, evaluate {t2 - t1:.0f}s, export {t3 - t2:.0f}s")
    print(f"  checkpoints:  {workdir / 'checkpoints'}")
    print(f"  TensorBoard:  tensorboard --logdir {workdir}")
    print(f"  metrics:      {workdir / metric_log.METRICS_FILE} "
          f"(plotted: {workdir / metric_log.PLOT_FILE})")
    print(f"  RTE results:  {workdir / 'eval' / 'rte.json'} (baseline: rte_baseline.json)")
    print(f"  embeddings:   {export_dir}/explicit/ and {export_dir}/implicit/ "
          "(embeddings.npy, ids.txt, meta.json)")

    return result
