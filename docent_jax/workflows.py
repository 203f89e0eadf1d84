"""The CLI's work as plain functions: evaluate a workdir, export its views, the demo.

No flags are parsed here, so notebooks and tests call these directly.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

from data_pipelines.text_lines import read_text_lines
from embedding_core.files import write_json

MODEL_NAME = "DocEnt-Dual"


def evaluate_workdir(workdir: str | os.PathLike, *, step: int | None = None,
                     baselines: bool = True, progress: bool = True) -> dict:
    """Held-out ranking metrics of a workdir's checkpoint (and the baselines).

    Prints the table and writes ``workdir/eval/ranking.json`` (``{"protocol", "rows":
    {model: {metric: value}}}``, metrics in [0, 1]).

    Raises:
      FileNotFoundError: not a training workdir / no checkpoint / model folder gone.
    """
    from docent_jax import data as docent_data
    from docent_jax import evaluate
    from docent_jax.inference import load

    ranker = load(workdir, step=step)
    data = docent_data.load_data(ranker.config)
    if data.entity_ids != ranker.entity_ids:
        raise ValueError(f"{workdir}/entity_ids.txt does not match the entities of the "
                         "configured data; was the data changed after training?")
    name = f"{MODEL_NAME} (step {ranker.step})"
    rows = {name: evaluate.evaluate_ranker(ranker, data.queries, progress=progress)}
    if baselines:
        from docent_jax.baselines import evaluate_baselines

        rows.update(evaluate_baselines(data, model=ranker.config.model,
                                       max_length=ranker.config.max_length,
                                       progress=progress))
    write_json(Path(workdir) / "eval" / "ranking.json",
               {"protocol": data.description, "rows": rows})
    print(f"\nZero-shot entity ranking (%), {int(rows[name]['num_queries'])} held-out queries "
          f"over {data.num_entities} entities")
    print(f"data: {data.description}")
    print(evaluate.format_table(rows))
    print(f"wrote {Path(workdir) / 'eval' / 'ranking.json'}")
    return rows


def _view_meta(ranker, **extra) -> dict:
    return {"model": MODEL_NAME, "encoder": ranker.config.model,
            "config": ranker.config.to_dict(), "step": ranker.step, "normalized": False,
            "similarity": "cosine", **extra}


def export_entities(ranker, out_dir: str | os.PathLike, *, block_rows: int = 8192,
                    meta: dict | None = None) -> dict[str, Path]:
    """Streams ``ranker``'s entity table ``g`` (``inference.EntityRanker``) into one view.

    ``out_dir`` gets ``embeddings.npy`` (float32 ``[num_entities, dim]``, row i = entity
    i, raw: compare with cosine), ``ids.txt`` (line i = ``ranker.entity_ids[i]``) and
    ``meta.json`` through ``embedding_core.export.export_view``: one block of
    ``block_rows`` rows on the host at a time, files moved into place when complete.
    """
    from embedding_core.export import export_view

    return export_view(out_dir, ((ids, v) for _, ids, v in ranker.iter_entity_blocks(block_rows)),
                       num_rows=ranker.num_entities, dim=ranker.dim,
                       meta=_view_meta(ranker, **(meta or {})))


def export_queries(ranker, queries: list[str], out_dir: str | os.PathLike, *,
                   block_rows: int = 4096, meta: dict | None = None) -> dict[str, Path]:
    """``f(q)`` of each query into one view (``ids.txt`` line i = query i), streamed in
    blocks of ``block_rows`` queries; raw vectors, compare with cosine."""
    from embedding_core.export import export_view

    def blocks() -> Iterator[tuple[list[str], object]]:
        for start in range(0, len(queries), block_rows):
            part = queries[start:start + block_rows]
            yield part, ranker.encode(part)

    return export_view(out_dir, blocks(), num_rows=len(queries), dim=ranker.dim,
                       meta=_view_meta(ranker, **(meta or {})))


def export_workdir(workdir: str | os.PathLike, output: str | os.PathLike | None = None, *,
                   input_path: str | os.PathLike | None = None, step: int | None = None,
                   block_rows: int = 8192) -> Path:
    """Exports a workdir's checkpoint: ``output/entities/`` and, with ``input_path`` (one
    query per line), ``output/queries/`` (default output ``workdir/export``).

    Each view holds ``embeddings.npy``, ``ids.txt`` and ``meta.json``
    (``embedding_core.export.load_export(output)`` reads them back).

    Raises:
      FileNotFoundError: not a training workdir / no checkpoint / no input file.
      FileExistsError: ``output`` is a file. DataError: a bad input file.
    """
    from docent_jax.inference import load
    from embedding_core.export import ExportFolder

    output = Path(output) if output else Path(workdir) / "export"
    folder = ExportFolder(output)  # refuses an --output that is a file, before any work
    queries = read_text_lines(input_path, "query") if input_path is not None else None
    ranker = load(workdir, step=step)
    meta = {"workdir": str(Path(workdir).resolve())}
    with folder:
        export_entities(ranker, output / "entities", block_rows=block_rows,
                        meta={**meta, **folder.tag("entities")})
        print(f"wrote {ranker.num_entities} x {ranker.dim} entities to {output / 'entities'}")
        if queries is not None:
            export_queries(ranker, queries, output / "queries",
                           meta={**meta, "input": str(Path(input_path).resolve()),
                                 **folder.tag("queries")})
            print(f"wrote {len(queries)} x {ranker.dim} queries to {output / 'queries'}")
    return output


def run_demo(workdir: str | os.PathLike, config=None, num_train_steps: int | None = None
             ) -> dict:
    """Train (CPU preset), evaluate with baselines, export; prints timings."""
    from docent_jax.configs import dual_cpu
    from docent_jax.trainer import train

    workdir = Path(workdir)
    config = config if config is not None else dual_cpu.get_config()
    if num_train_steps:
        config.num_train_steps = num_train_steps
    t0 = time.time()
    print(f"[1/3] training {MODEL_NAME} ({config.softmax} softmax) from {config.model} on "
          f"the SQuAD Wikipedia entity corpus ({config.num_train_steps} steps x "
          f"{config.batch_size} sentences) -> {workdir}")
    train(config, workdir)
    t1 = time.time()
    print("[2/3] zero-shot ranking of held-out questions (and baselines)")
    rows = evaluate_workdir(workdir, baselines=True)
    t2 = time.time()
    print("[3/3] exporting the entity table")
    out = export_workdir(workdir)
    t3 = time.time()
    print(f"\ntime: train {t1 - t0:.0f}s, evaluate {t2 - t1:.0f}s, export {t3 - t2:.0f}s, "
          f"total {t3 - t0:.0f}s")
    print(f"  checkpoints: {workdir / 'checkpoints'}")
    print(f"  TensorBoard: tensorboard --logdir {workdir}")
    print(f"  ranking:     {workdir / 'eval' / 'ranking.json'}")
    print(f"  embeddings:  {out / 'entities'}/embeddings.npy, ids.txt, meta.json")
    return rows
