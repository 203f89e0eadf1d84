"""``sentence-jax demo``: MultipleNegativesRankingLoss on the shipped SNLI triplets, scored on
1,000 held-out triplets before and after, then the sentence-transformers folder."""

from __future__ import annotations

import csv
import io

from data_pipelines.snli import snli_triplets_path
from embedding_core import as_path
from sentence_jax import inference, trainer

HELD_OUT = 1000


def split_shipped(workdir) -> tuple[str, str]:
    """The shipped triplets as ``train.csv`` and the last 1,000 as ``heldout.csv`` (both in
    ``workdir/data``), written once."""
    folder = as_path(workdir) / "data"
    train, heldout = folder / "train.csv", folder / "heldout.csv"
    if not heldout.exists():
        with open(snli_triplets_path(), newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        folder.mkdir(parents=True, exist_ok=True)
        for path, part in ((train, rows[1:-HELD_OUT]), (heldout, rows[-HELD_OUT:])):
            text = io.StringIO(newline="")
            writer = csv.writer(text)
            writer.writerow(["anchor", "positive", "negative"])
            writer.writerows(part)
            path.write_text(text.getvalue(), encoding="utf-8")
    return str(train), str(heldout)


def run_demo(workdir, config, num_train_steps: int | None = None) -> None:
    """Trains ``config`` (its ``train_files`` and ``eval_files`` set to the shipped data;
    ``num_train_steps`` or the config's, else 100) into ``workdir/run`` and exports
    ``workdir/model``."""
    train, heldout = split_shipped(workdir)
    config = config.copy_and_resolve_references()
    config.train_files, config.eval_files = train, f"triplets:{heldout}"
    config.num_train_steps = int(num_train_steps or config.num_train_steps or 100)
    config.eval_every = config.num_train_steps
    run = as_path(workdir) / "run"
    trainer.train(config, run)
    model = as_path(workdir) / "model"
    if not model.exists():
        inference.load(run).save(model)
    print(f"sentence-jax demo: the trained folder is {model} (SentenceTransformer loads it)")
