"""The CLI's work as plain functions: evaluate a workdir, export its views, the demo.

No flags are parsed here, so notebooks and tests call these directly.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

from etils import epath

from data_pipelines.text_lines import read_text_lines
from embedding_core import multihost, storage
from embedding_core.files import write_json

MODEL_NAMES = {"dual": "DocEnt-Dual", "full": "DocEnt-Full", "hybrid": "DocEnt-Hybrid"}
DEMO_PRESETS = ("dual", "full", "hybrid")


def model_name(ranker) -> str:
    """``DocEnt-<Variant>`` of a loaded ranker."""
    return MODEL_NAMES[ranker.variant]


def evaluate_workdir(workdir: str | os.PathLike, *, step: int | None = None,
                     baselines: bool = True, progress: bool = True,
                     per_query: bool = False, overrides: dict | None = None,
                     mesh_model: int = 1) -> dict:
    """Held-out ranking metrics of a workdir's checkpoint (any variant) and the baselines.

    Prints the table and writes ``workdir/eval/ranking.json`` (``{"protocol", "rows":
    {model: {metric: value}}}``, metrics in [0, 1]).

    ``overrides`` changes evaluation-only fields (``eval_*``, e.g. ``eval_reddit_path``, the
    ranking queries of an Amazon run) for this evaluation. ``mesh_model > 1`` loads the
    entity table split by rows over that many devices (``inference.load(mesh=...)``) and
    ranks it shard by shard.

    Returns:
      ``{model: metrics}``; with ``per_query=True`` ``(rows, {model: {metric: [n_queries]
      float64}})`` (for paired intervals).

    Raises:
      FileNotFoundError: not a training workdir / no checkpoint / model folder gone.
      ValueError: the data has no ranking queries (``train_data="amazon"`` without
        ``eval_reddit_path``, ``train_file`` without ``eval_queries_file``), or its
        entities differ from the trained ones.
    """
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
    name = f"{model_name(ranker)} (step {ranker.step})"
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
    print(f"\nZero-shot entity ranking (%), {int(rows[name]['num_queries'])} held-out queries "
          f"over {data.num_entities} entities")
    print(f"data: {data.description}")
    print(evaluate.format_table(rows))
    print(f"wrote {storage.as_path(workdir) / 'eval' / 'ranking.json'}")
    return (rows, details) if per_query else rows


def _mesh(mesh_model: int):
    """``None`` (the default load: a whole copy per process) for 1, else the
    ``("data", "model")`` mesh of all devices with ``model=mesh_model``."""
    if isinstance(mesh_model, bool) or int(mesh_model) != mesh_model or mesh_model < 1:
        raise ValueError(f"mesh_model must be a positive integer, got {mesh_model!r}")
    if mesh_model == 1:
        return None
    from embedding_core import parallel

    return parallel.make_mesh(-1, int(mesh_model))


def _view_meta(ranker, **extra) -> dict:
    meta = {"model": model_name(ranker), "encoder": ranker.config.model,
            "config": ranker.config.to_dict(), "step": ranker.step, "normalized": False,
            "similarity": "cosine"}
    if ranker.variant == "full":
        # Full ranks by the logits t . g(e) + b_e; the per-entity bias is not in the rows.
        meta.update(similarity="dot", score="dot + entity_bias (not exported; "
                    "docent_jax.load(workdir).score includes it)")
    return {**meta, **extra}


def export_entities(ranker, out_dir: str | os.PathLike, *, block_rows: int = 8192,
                    meta: dict | None = None) -> dict[str, epath.Path]:
    """Streams ``ranker``'s entity table (``inference.EntityRanker``, any variant; Full: its
    entity rows, hidden width) into one view.

    ``out_dir`` gets ``embeddings.npy`` (float32 ``[num_entities, dim]``, row i = entity
    i, raw), ``ids.txt`` (line i = ``ranker.entity_ids[i]``) and
    ``meta.json`` through ``embedding_core.export.export_view``: one block of at most
    ``block_rows`` rows on the host at a time, files moved into place when complete. A
    table split over ``"model"`` is read shard by shard (``ranker.iter_entity_blocks``),
    never gathered.
    """
    from embedding_core.export import export_view

    return export_view(out_dir, ((ids, v) for _, ids, v in ranker.iter_entity_blocks(block_rows)),
                       num_rows=ranker.num_entities, dim=ranker.dim,
                       meta=_view_meta(ranker, **(meta or {})))


def export_queries(ranker, queries: list[str], out_dir: str | os.PathLike, *,
                   block_rows: int = 4096, meta: dict | None = None
                   ) -> dict[str, epath.Path]:
    """The query vector of each query (``ranker.encode``: ``f(q)``, Full: the head output at
    the entity slot) into one view (``ids.txt`` line i = query i), streamed in blocks of
    ``block_rows`` queries; raw vectors."""
    from embedding_core.export import export_view

    def blocks() -> Iterator[tuple[list[str], object]]:
        for start in range(0, len(queries), block_rows):
            part = queries[start:start + block_rows]
            yield part, multihost.encode(ranker, part)  # a slice per process

    return export_view(out_dir, blocks(), num_rows=len(queries), dim=ranker.dim,
                       meta=_view_meta(ranker, **(meta or {})))


def export_workdir(workdir: str | os.PathLike, output: str | os.PathLike | None = None, *,
                   input_path: str | os.PathLike | None = None, step: int | None = None,
                   block_rows: int = 8192, mesh_model: int = 1) -> epath.Path:
    """Exports a workdir's checkpoint: ``output/entities/`` and, with ``input_path`` (one
    query per line), ``output/queries/`` (default output ``workdir/export``).
    ``mesh_model > 1`` restores the table split over that many devices and streams it
    shard by shard (same files).

    Each view holds ``embeddings.npy``, ``ids.txt`` and ``meta.json``
    (``embedding_core.export.load_export(output)`` reads them back).

    Raises:
      FileNotFoundError: not a training workdir / no checkpoint / no input file.
      FileExistsError: ``output`` is a file. DataError: a bad input file.
    """
    from docent_jax.inference import load
    from embedding_core.export import ExportFolder

    output = storage.as_path(output) if output else storage.as_path(workdir) / "export"
    folder = ExportFolder(output)  # refuses an --output that is a file, before any work
    queries = read_text_lines(input_path, "query") if input_path is not None else None
    ranker = load(workdir, step=step, mesh=_mesh(mesh_model))
    meta = {"workdir": storage.display(workdir)}
    with folder:
        export_entities(ranker, output / "entities", block_rows=block_rows,
                        meta={**meta, **folder.tag("entities")})
        print(f"wrote {ranker.num_entities} x {ranker.dim} entities to {output / 'entities'}")
        if queries is not None:
            export_queries(ranker, queries, output / "queries",
                           meta={**meta, "input": storage.display(input_path),
                                 **folder.tag("queries")})
            print(f"wrote {len(queries)} x {ranker.dim} queries to {output / 'queries'}")
    return output


def export_hf_workdir(workdir: str | os.PathLike, output: str | os.PathLike, *,
                      step: int | None = None) -> epath.Path:
    """Writes a DocEnt-Dual or -Hybrid run's query encoder ``f`` as one Hugging Face /
    sentence-transformers folder, with its entity table in ``output/entities/``.

    ``SentenceTransformer(output).encode(queries)`` gives ``f(q)`` (``load(workdir).encode``):
    the transformer, CLS or mean pooling and, with ``projection_dim``, the projection as an
    identity-activation Dense module (``embedding_core.hf_export``, ``docs/export.md``).
    ``entities/`` is an export view (``embeddings.npy`` ``[num_entities, dim]`` raw
    ``g(e)``, ``ids.txt``, ``meta.json``); a query ranks entities by
    ``cos(f(q), g(e))`` (the learned scale a, in ``export_info.json``, multiplies every
    score alike and changes no ranking).

    Raises:
      FileExistsError: ``output`` is a file or a non-empty folder (before any work).
      ValueError: a DocEnt-Full run: its query vector is the MLM head's output at the
        ``[MASK]`` of ``[CLS] [MASK] [SEP] q [SEP]`` over an entity-extended vocabulary,
        not a pooled sentence encoder (``docent-jax export`` writes its vectors).
      FileNotFoundError: not a training workdir, no checkpoint (at ``step``).
    """
    from docent_jax.data import sentence_length
    from docent_jax.inference import load, read_config
    from docent_jax.model import DocEntDual
    from embedding_core import hf_export

    with hf_export.staged_output(output) as stage:
        if read_config(workdir).get("variant", "dual") == "full":
            raise ValueError(
                f"{workdir} is a DocEnt-Full run: its query vector is the MLM head's output at "
                "the [MASK] of '[CLS] [MASK] [SEP] query [SEP]' over the word pieces and one "
                "token per entity, not a pooled sentence encoder, so export-hf (Dual and "
                "Hybrid only) cannot write it; `docent-jax export --input=QUERIES.txt` "
                "exports its entity and query vectors")
        ranker = load(workdir, step=step)
        config, params = ranker.config, ranker.params
        projection = params.get("projection") if int(config.projection_dim) else None
        head = hf_export.SentenceHead(
            pooling=config.pooling,
            dense_kernel=None if projection is None else projection["kernel"],
            dense_bias=None if projection is None else projection["bias"])
        scale = float(ranker.model.apply({"params": params}, method=DocEntDual.scale))
        name = model_name(ranker)
        hf_export.write_sentence_transformer(
            stage, encoder_params=params["transformer"], encoder_config=ranker.model.config,
            tokenizer=ranker.tokenizer, max_length=sentence_length(config), head=head,
            info={"model": name, "view": "queries", "step": ranker.step,
                  "workdir": storage.display(workdir), "encoder": config.model,
                  "pooling": config.pooling, "projection_dim": int(config.projection_dim),
                  "scale": scale, "normalized": False, "similarity": "cosine",
                  "entities": "entities/ (embeddings.npy, ids.txt, meta.json)"},
            readme=hf_export.readme(
                f"{name} query encoder f", "Input: a query or sentence. The entity vectors "
                "g(e) are in entities/embeddings.npy (row i = line i of entities/ids.txt); "
                f"score(e, q) = {scale:.4g} * cos(f(q), g(e)).\n", step=ranker.step))
        export_entities(ranker, stage / "entities",
                        meta={"workdir": storage.display(workdir)})
    print(f"wrote {storage.display(output)}: the query encoder (sentence-transformers / "
          f"transformers) and entities/ ({ranker.num_entities} x {ranker.dim})")
    return storage.as_path(output)


def run_demo(workdir: str | os.PathLike, config=None, num_train_steps: int | None = None,
             variants: tuple[str, ...] = DEMO_PRESETS) -> dict:
    """Trains each variant with its CPU preset into ``workdir/<variant>`` (a finished run is
    skipped: its checkpoint is already at the last step), evaluates each on the held-out
    questions, scores the baselines once and prints one table, with paired-bootstrap 95%
    intervals of each variant's MAP minus BoS-MiniLM's; exports each entity table.

    ``config`` (one config for a single run into ``workdir`` itself) replaces the presets.
    """
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
        print(f"[{index + 1}/{len(runs)}] {MODEL_NAMES[variant]} from {cfg.model} on "
              f"{cfg.train_data} ({cfg.num_train_steps} steps x {cfg.batch_size} sentences) "
              f"-> {run_dir}")
        train(cfg, run_dir)
        t1 = time.time()
        first = not rows
        r, d = evaluate_workdir(run_dir, baselines=first, per_query=True)
        t2 = time.time()
        export_workdir(run_dir)
        t3 = time.time()
        timings.append((MODEL_NAMES[variant], t1 - t0, t2 - t1, t3 - t2))
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
    """``{model: "+d [lo, hi]"}``: the paired-bootstrap 95% interval of ``metric`` (model
    minus ``reference``, percentage points) over the same queries
    (``embedding_core.stats.paired_bootstrap``)."""
    from embedding_core.stats import format_interval, paired_bootstrap

    return {name: format_interval(paired_bootstrap(details[name][metric],
                                                   details[reference][metric]))
            for name in models}
