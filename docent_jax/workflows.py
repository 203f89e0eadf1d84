"""The CLI's work as plain functions: evaluate a workdir, export the entity table, the demo.

No flags are parsed here, so notebooks and tests call these directly.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from embedding_core.export import write_json


def evaluate_workdir(workdir: str | os.PathLike, *, step: int | None = None,
                     baselines: bool = True, progress: bool = True) -> dict:
    """Held-out ranking metrics of a workdir's checkpoint (and the baselines).

    Prints the table and writes ``workdir/eval/ranking.json`` (``{"protocol", "rows":
    {model: {metric: value}}}``, metrics in [0, 1]).

    Raises:
      FileNotFoundError: not a training workdir / no checkpoint / model folder gone.
    """
    from docent_jax import evaluate
    from docent_jax.inference import load
    from docent_jax.trainer import load_data

    ranker = load(workdir, step=step)
    data = load_data(ranker.config)
    if data.entity_ids != ranker.entity_ids:
        raise ValueError(f"{workdir}/entity_ids.txt does not match the entities of the "
                         "configured data; was the data changed after training?")
    name = f"DocEnt-Dual (step {ranker.step})"
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


def export_workdir(workdir: str | os.PathLike, output: str | os.PathLike | None = None, *,
                   step: int | None = None, block_rows: int = 8192) -> Path:
    """Streams the entity table into ``output`` (entities.npy, entity_ids.txt, meta.json).

    Only one block of ``block_rows`` rows is on the host at a time
    (``embedding_core.export.EmbeddingWriter``); files appear atomically.
    """
    from docent_jax.inference import load

    ranker = load(workdir, step=step)
    output = Path(output) if output else Path(workdir) / "export"
    export_ranker(ranker, output, block_rows=block_rows,
                  meta={"workdir": str(Path(workdir).resolve())})
    print(f"wrote {ranker.num_entities} x {ranker.dim} entities.npy, entity_ids.txt, "
          f"meta.json to {output}")
    return output


def export_ranker(ranker, output: str | os.PathLike, *, block_rows: int = 8192,
                  meta: dict | None = None) -> dict[str, Path]:
    """Streams ``ranker``'s entity table (``inference.EntityRanker``) into ``output``.

    Writes ``entities.npy`` (float32 ``[num_entities, dim]``, row i = entity i),
    ``entity_ids.txt`` (line i = ``ranker.entity_ids[i]``) and ``meta.json`` through
    ``embedding_core.export.EmbeddingWriter``: one block of ``block_rows`` rows at a time on
    the host, files moved into place only when complete.

    Returns:
      The written paths (``{"entities", "ids", "meta"}``).
    """
    from embedding_core.export import export_embeddings

    blocks = ((ids, {"entities": vectors})
              for _, ids, vectors in ranker.iter_entity_blocks(block_rows))
    info = {"model": "DocEnt-Dual", "encoder": ranker.config.model,
            "checkpoint_step": ranker.step,
            "normalisation": "none (raw g(e); score with cosine)",
            "config": ranker.config.to_dict(), **(meta or {})}
    return export_embeddings(output, blocks, num_rows=ranker.num_entities,
                             dims={"entities": ranker.dim}, meta=info,
                             ids_filename="entity_ids.txt")


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
    print(f"[1/3] training DocEnt-Dual ({config.loss} softmax) from {config.model} on the "
          f"SQuAD Wikipedia entity corpus ({config.num_train_steps} steps x "
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
    print(f"  embeddings:  {out}/entities.npy, entity_ids.txt, meta.json")
    return rows
