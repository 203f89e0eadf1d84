"""dualcse-jax: train, evaluate and export DualCSE sentence embeddings.

Usage:
  dualcse-jax train    --config=CONFIG.py --workdir=DIR [--config.FIELD=VALUE ...]
  dualcse-jax evaluate --workdir=DIR [--baseline] [--eis_data=ImpScore.csv]
  dualcse-jax export   --workdir=DIR --input=SENTENCES.txt --output=OUT_DIR

train     trains (or resumes) into DIR: config.json, TensorBoard events, orbax checkpoints.
          CONFIG.py defaults to dualcse_jax/configs/default.py (the paper's settings);
          dualcse_jax/configs/cross_cpu.py is the small CPU preset of the README.
evaluate  RTE on INLI test with the threshold tuned on INLI val; prints the table and
          writes DIR/eval/rte.json ({"explicit","implied","neutral","contradiction",
          "average","threshold"}, accuracies in [0,1]). --baseline adds the untrained
          MiniLM (mean pooling) row. EIS: on --eis_data (ImpScore CSV, test split of
          random.seed(42)) or, without it, on the INLI proxy (labelled as a proxy).
export    encodes one sentence per line of --input and writes OUT_DIR/explicit.npy and
          implicit.npy (float32 [N, dim], row i = line i), ids.txt and meta.json.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from absl import app, flags, logging
from ml_collections import config_flags

_DEFAULT_CONFIG = str(Path(__file__).parent / "configs" / "default.py")
COMMANDS = ("train", "evaluate", "export")

config_flags.DEFINE_config_file("config", _DEFAULT_CONFIG, "Training configuration file.",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Training directory (checkpoints, config, eval).")
flags.DEFINE_string("input", None, "export: text file, one sentence per line (UTF-8).")
flags.DEFINE_string("output", None, "export: output directory.")
flags.DEFINE_integer("step", None, "evaluate/export: checkpoint step (default: latest).")
flags.DEFINE_bool("baseline", False, "evaluate: also score the untrained model.")
flags.DEFINE_string("eis_data", None, "evaluate: ImpScore-format CSV for EIS.")
FLAGS = flags.FLAGS


def _json_write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True))
    os.replace(tmp, path)


def evaluate_workdir(workdir: str | os.PathLike, *, step: int | None = None,
                     baseline: bool = False, eis_data: str | None = None,
                     progress: bool = True) -> dict:
    """RTE (+ EIS) of a workdir's checkpoint; writes ``workdir/eval/rte.json`` and prints."""
    from data_pipelines import impscore, inli
    from dualcse_jax import evaluate
    from dualcse_jax.inference import baseline as make_baseline
    from dualcse_jax.inference import load

    val = inli.read_inli(inli.inli_split_path("val"))
    test = inli.read_inli(inli.inli_split_path("test"))
    embedder = load(workdir, step=step)
    name = f"DualCSE-{embedder.config.architecture} (step {embedder.step})"
    if embedder.config.architecture == "simcse":
        name = f"SimCSE-{embedder.config.train_data} (step {embedder.step})"
    rows = {name: evaluate.evaluate_rte(embedder, val, test, progress=progress)}
    if baseline:
        base = make_baseline(embedder.config.model, max_length=embedder.config.max_length)
        rows["untrained MiniLM (mean)"] = evaluate.evaluate_rte(base, val, test,
                                                                progress=progress)
    if eis_data:
        pairs = evaluate.impscore_pairs(impscore.split_impscore(impscore.read_impscore(eis_data))[2])
        eis = {"eis_accuracy": evaluate.evaluate_eis(embedder, pairs), "eis_data": eis_data,
               "proxy": False}
    else:
        pairs = evaluate.inli_eis_proxy_pairs(test)
        eis = {"eis_accuracy": evaluate.evaluate_eis(embedder, pairs), "proxy": True,
               "eis_data": "INLI test: premise (implicit) vs explicit entailment — a PROXY"}
    out_dir = Path(workdir) / "eval"
    _json_write(out_dir / "rte.json", rows[name])
    _json_write(out_dir / "eis.json", eis)
    if baseline:
        _json_write(out_dir / "rte_baseline.json", rows["untrained MiniLM (mean)"])
    print("\nRTE accuracy (%) on INLI test, threshold tuned on INLI val")
    print(evaluate.format_rte_table(rows))
    label = "EIS accuracy (INLI PROXY)" if eis["proxy"] else "EIS accuracy (ImpScore test)"
    print(f"{label}: {100 * eis['eis_accuracy']:.2f}%")
    print(f"wrote {out_dir / 'rte.json'}")
    return {"rte": rows, "eis": eis}


def read_sentences(path: str | os.PathLike) -> list[str]:
    """One sentence per line, strict UTF-8; an empty line is an error naming the line."""
    from data_pipelines.errors import DataError

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"--input {path} does not exist")
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the final newline ends the last line, it does not start one
    sentences = []
    for lineno, line in enumerate(lines, start=1):
        try:
            text = line.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as e:
            raise DataError(path, lineno, "sentence", f"invalid UTF-8 ({e.reason})") from None
        if not text.strip():
            raise DataError(path, lineno, "sentence", "empty sentence")
        sentences.append(text)
    if not sentences:
        raise DataError(path, None, "sentence", "no sentences in file")
    return sentences


def export_workdir(workdir: str | os.PathLike, input_path: str, output: str,
                   *, step: int | None = None, chunk: int = 4096) -> Path:
    """Streams both embeddings of ``input_path``'s sentences into ``output`` atomically."""
    from dualcse_jax.inference import load
    from embedding_core.export import export_embeddings

    sentences = read_sentences(input_path)
    embedder = load(workdir, step=step)

    def blocks():
        for start in range(0, len(sentences), chunk):
            part = sentences[start:start + chunk]
            r, u = embedder.encode(part, progress=False)
            yield part, {"explicit": r, "implicit": u}

    meta = {
        "model": embedder.config.model, "architecture": embedder.config.architecture,
        "pooling": embedder.config.pooling, "checkpoint_step": embedder.step,
        "workdir": str(Path(workdir).resolve()), "input": str(Path(input_path).resolve()),
        "normalisation": "l2" if embedder.config.normalize else "none (raw pooled vectors; "
        "compare with cosine)", "config": embedder.config.to_dict(),
    }
    dim = embedder.model.config.hidden_size
    export_embeddings(output, blocks(), num_rows=len(sentences),
                      dims={"explicit": dim, "implicit": dim}, meta=meta)
    print(f"wrote {len(sentences)} x {dim} explicit.npy / implicit.npy, ids.txt, meta.json "
          f"to {output}")
    return Path(output)


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"give one command: {' | '.join(COMMANDS)} (see --help)")
    if not FLAGS.workdir:
        raise app.UsageError("--workdir is required")
    command = argv[1]
    if command == "train":
        from dualcse_jax.trainer import train

        train(FLAGS.config, FLAGS.workdir)
        print(f"checkpoints and TensorBoard events in {FLAGS.workdir}")
    elif command == "evaluate":
        evaluate_workdir(FLAGS.workdir, step=FLAGS.step, baseline=FLAGS.baseline,
                         eis_data=FLAGS.eis_data)
    else:
        if not FLAGS.input or not FLAGS.output:
            raise app.UsageError("export needs --input=FILE and --output=DIR")
        export_workdir(FLAGS.workdir, FLAGS.input, FLAGS.output, step=FLAGS.step)


def run() -> None:
    """Console-script entry point."""
    main_module = sys.modules.get("__main__")
    if main_module is not None and not getattr(main_module, "__doc__", None):
        main_module.__doc__ = __doc__  # absl prints __main__'s docstring for --help
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    logging.set_verbosity(logging.INFO)
    app.run(main)


if __name__ == "__main__":
    run()
