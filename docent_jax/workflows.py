"""The CLI's work as plain functions: evaluate, export (``serving`` over ``EntityRanker``), demo."""

from __future__ import annotations

import os
import time

from etils import epath

from docent_jax.model import NAMES
from embedding_core import multihost, write_json
from embedding_core.serving import serving
from embedding_core.storage import storage

DEMO_PRESETS = ("dual", "full", "hybrid")


def evaluate_workdir(workdir: str | os.PathLike, *, step: int | None = None,
                     baselines: bool = True, progress: bool = True,
                     per_query: bool = False, overrides: dict | None = None,
                     mesh_model: int = 1) -> dict:
    """Held-out ranking of a checkpoint beside the baselines, written to ``eval/ranking.json``
    (``mesh_model > 1``: the table split); FileNotFoundError, ValueError."""
    from docent_jax import data as docent_data
    from docent_jax import evaluate
    from docent_jax.inference import load

    ranker = load(workdir, step=step, mesh=_mesh(mesh_model))
    config = ranker.config.copy_and_resolve_references()
    for key, value in (overrides or {}).items():
        if not key.startswith("eval_") or key not in config:
            raise ValueError(f"evaluate may change only the eval_* fields, not {key!r} (the "
                             "others describe the trained run)")
        config[key] = value
    data = docent_data.load_data(config)
    if data.entity_ids != ranker.entity_ids:
        raise ValueError(f"{workdir}/entity_ids.txt does not match the entities of the "
                         "configured data; was the data changed after training?")
    if not data.queries:
        raise ValueError(f"{workdir}: the configured data has no ranking queries ("
                         f"{data.description}); give queries on this evaluate line: "
                         "--config.eval_queries_file=FILE (JSON Lines {\"query\", "
                         "\"entities\"}, docs/data.md) or, for an Amazon run, "
                         "--config.eval_reddit_path=FILE; for MovieLens tags run "
                         "`docent-jax evaluate --task=tags`")
    name = f"{ranker.name} (step {ranker.step})"
    rows, details = {}, {}
    rows[name], details[name] = evaluate.evaluate_ranker(ranker, data.queries,
                                                         progress=progress, per_query=True)
    if baselines:
        from docent_jax.baselines import evaluate_baselines

        for key, (summary, per) in evaluate_baselines(
                data, model=ranker.config.model, max_length=ranker.config.max_length,
                progress=progress, per_query=True).items():
            rows[key], details[key] = summary, per
    if multihost.is_primary():  # every process holds the same rows; one writes them
        write_json(storage.as_path(workdir) / "eval" / "ranking.json",
                   {"protocol": data.description, "rows": rows})
        queries_file = str(config.get("eval_queries_file", "") or "").strip()
        source = f"queries from {queries_file}" if queries_file else "held-out queries"
        print(f"\nZero-shot entity ranking (%), {int(rows[name]['num_queries'])} {source} "
              f"over {data.num_entities} entities")
        print(f"data: {data.description}")
        print(evaluate.format_table(rows))
        print(f"wrote {storage.as_path(workdir) / 'eval' / 'ranking.json'}")
    return (rows, details) if per_query else rows


def _mesh(mesh_model: int):
    """``None`` (a whole copy per process) for 1, else all devices with ``model=mesh_model``."""
    if isinstance(mesh_model, bool) or int(mesh_model) != mesh_model or mesh_model < 1:
        raise ValueError(f"mesh_model must be a positive integer, got {mesh_model!r}")
    if mesh_model == 1:
        return None
    from embedding_core import parallel

    return parallel.make_mesh(-1, int(mesh_model))


def loader(workdir: str | os.PathLike, *, step: int | None = None, mesh_model: int = 1,
           block_rows: int | None = None):
    """``() -> EntityRanker`` of a workdir, the table over ``mesh_model`` devices."""

    def load():
        from docent_jax.inference import load as load_ranker

        ranker = load_ranker(workdir, step=step, mesh=_mesh(mesh_model))
        ranker.block_rows = block_rows or ranker.block_rows
        return ranker

    return load


def export_workdir(workdir: str | os.PathLike, output: str | os.PathLike | None = None, *,
                   input_path: str | os.PathLike | None = None, step: int | None = None,
                   block_rows: int | None = None, mesh_model: int = 1) -> epath.Path:
    """``serving.export``: ``output/entities/`` and, with ``input_path``, ``/queries/``."""
    return serving.export(loader(workdir, step=step, mesh_model=mesh_model,
                                 block_rows=block_rows),
                          output or storage.as_path(workdir) / "export", input_path=input_path,
                          workdir=workdir, text_name="query")


def export_hf_workdir(workdir: str | os.PathLike, output: str | os.PathLike, *,
                      step: int | None = None) -> epath.Path:
    """``serving.export_hf``: Dual or Hybrid's ``f`` and ``entities/`` (Full: ValueError)."""
    return serving.export_hf(loader(workdir, step=step), output, workdir=workdir)


def run_demo(workdir: str | os.PathLike, config=None, num_train_steps: int | None = None,
             variants: tuple[str, ...] = DEMO_PRESETS) -> dict:
    """Trains each variant's CPU preset into ``workdir/<variant>`` (finished runs skipped),
    evaluates, exports, prints one table with paired-bootstrap intervals; ``config``: one run."""
    import importlib

    from docent_jax import evaluate
    from docent_jax.trainer import train

    workdir = storage.as_path(workdir)
    runs = [(config.variant, workdir, config)] if config is not None else [
        (v, workdir / v, importlib.import_module(f"docent_jax.configs.{v}_cpu").get_config())
        for v in variants]
    rows: dict = {}
    details: dict = {}
    timings = []
    for index, (variant, run_dir, cfg) in enumerate(runs):
        if num_train_steps:
            cfg.num_train_steps = num_train_steps
        t0 = time.time()
        print(f"[{index + 1}/{len(runs)}] {NAMES[variant]} from {cfg.model} on "
              f"{cfg.train_data} ({cfg.num_train_steps} steps x {cfg.batch_size} sentences) "
              f"-> {run_dir}")
        train(cfg, run_dir)
        t1 = time.time()
        first = not rows
        r, d = evaluate_workdir(run_dir, baselines=first, per_query=True)
        t2 = time.time()
        export_workdir(run_dir)
        t3 = time.time()
        timings.append((NAMES[variant], t1 - t0, t2 - t1, t3 - t2))
        for key in r:
            rows[key], details[key] = r[key], d[key]
    baselines = [k for k in rows if not k.startswith("DocEnt")]
    models = [k for k in rows if k.startswith("DocEnt")]
    order = models + baselines
    rows = {k: rows[k] for k in order}
    table = evaluate.format_table(rows)
    intervals = paired_intervals(details, models, "BoS-MiniLM") if "BoS-MiniLM" in details \
        else {}
    print(f"\nZero-shot entity ranking (%), all variants; {workdir}")
    print(table)
    if intervals:
        print("\nMAP minus BoS-MiniLM, paired bootstrap 95% interval (10,000 resamples of "
              "the queries), percentage points:")
        for name, text in intervals.items():
            print(f"  {name:<28} {text}")
    print("\ntime (s):        train  evaluate  export")
    for name, tr, ev, ex in timings:
        print(f"  {name:<14} {tr:7.0f} {ev:9.0f} {ex:7.0f}")
    write_json(workdir / "demo_ranking.json", {"rows": rows, "map_minus_bos_minilm": intervals,
                                               "seconds": {n: {"train": a, "evaluate": b,
                                                               "export": c}
                                                           for n, a, b, c in timings}})
    print(f"wrote {workdir / 'demo_ranking.json'}")
    return rows


def paired_intervals(details: dict, models: list[str], reference: str,
                     metric: str = "MAP") -> dict[str, str]:
    """``{model: "+d [lo, hi]"}``: paired-bootstrap 95% intervals of model minus reference."""
    from embedding_core.evaluation.stats import format_interval, paired_bootstrap

    return {name: format_interval(paired_bootstrap(details[name][metric],
                                                   details[reference][metric]))
            for name in models}
