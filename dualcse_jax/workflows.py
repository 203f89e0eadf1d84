"""The CLI's work as plain functions: train, evaluate a workdir, export embeddings, the demo.

No flags are parsed here, so notebooks and tests call these directly.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

from etils import epath

from embedding_core import multihost, storage
from embedding_core.files import write_json, write_lines

VIEWS = ("explicit", "implicit")  # export folders: r and u


def train(config, workdir: str | os.PathLike, *, stop_after: int | None = None):
    """Trains (or resumes) into ``workdir``; see :func:`dualcse_jax.trainer.train`."""
    from dualcse_jax.trainer import train as train_task

    state = train_task(config, workdir, stop_after=stop_after)
    print(f"checkpoints and TensorBoard events in {workdir}")
    return state


def evaluate_workdir(workdir: str | os.PathLike, *, step: int | None = None,
                     baseline: bool = False, eis_data: str | None = None,
                     progress: bool = True, overrides: dict | None = None,
                     rules: Sequence[str] | None = None) -> dict:
    """RTE (+ EIS) of a workdir's checkpoint; writes ``workdir/eval/rte.json`` and prints.

    ``rte.json`` holds the accuracies of the first rule, its name (``rule``) and
    ``label_conflicts`` (``{"val", "test"}``: the rows that give one sentence under an
    entailed and a non-entailed class, see ``evaluate.label_conflicts``); with several
    rules, ``rules`` maps each rule to its accuracies as well.

    ``overrides`` (``val_file``, ``test_file``, ``eval_rte_score_rule``) replace the run's
    evaluation settings for this call. ``rules``: the RTE score rules to report, each as
    its own table from one encoding (``None``: the run's ``eval_rte_score_rule``); the
    model is not retrained.

    Raises:
      ValueError: an unknown rule or override field (before the model loads).
    """
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
    rows = {name: by_rule[rules[0]]}
    if baseline:
        rows["MiniLM off the shelf (mean)"] = base_rule[rules[0]]
    if eis_data:
        eis = {"eis_accuracy": evaluate.evaluate_eis(embedder, eis_pairs),
               "eis_data": eis_data, "proxy": False}
    else:
        pairs = evaluate.inli_eis_proxy_pairs(test)
        eis = {"eis_accuracy": evaluate.evaluate_eis(embedder, pairs), "proxy": True,
               "eis_data": "INLI test: premise (implicit) vs its implied entailment "
                           "(explicit) — a PROXY"}
    out_dir = storage.as_path(workdir) / "eval"
    # Rows that score one pair under two opposite labels: counted next to the accuracies.
    conflicts = {"val": evaluate.label_conflicts(val), "test": evaluate.label_conflicts(test)}
    extra = {"rules": by_rule} if len(rules) > 1 else {}
    if multihost.is_primary():  # every process holds the same results; one writes them
        write_json(out_dir / "rte.json", dict(rows[name], rule=rules[0], **extra,
                                              label_conflicts=conflicts))
        write_json(out_dir / "eis.json", eis)
        if baseline:
            write_json(out_dir / "rte_baseline.json",
                       dict(rows["MiniLM off the shelf (mean)"], rule=rules[0],
                            **({"rules": base_rule} if len(rules) > 1 else {}),
                            label_conflicts=conflicts))
    for rule in rules:
        table = {name: by_rule[rule]}
        if baseline:
            table["MiniLM off the shelf (mean)"] = base_rule[rule]
        print(f"\nRTE accuracy (%) on {data.rte_sets_label(config)}; score rule {rule}: "
              f"{evaluate.RULE_TEXT[rule]}")
        print(evaluate.format_rte_table(table))
    if note := evaluate.format_label_conflicts(conflicts):
        print(note)
    label = "EIS accuracy (INLI PROXY)" if eis["proxy"] else "EIS accuracy (ImpScore test)"
    print(f"{label}: {100 * eis['eis_accuracy']:.2f}%")
    print(f"wrote {out_dir / 'rte.json'}")
    return {"rte": rows, "rte_rules": by_rule, "eis": eis, "label_conflicts": conflicts}


def read_sentences(path: str | os.PathLike) -> list[str]:
    """One sentence per line, strict UTF-8; an empty line is an error naming the line."""
    from data_pipelines.text_lines import read_text_lines

    return read_text_lines(path, "sentence")


def export_workdir(workdir: str | os.PathLike, input_path: str, output: str,
                   *, step: int | None = None, normalize: bool | None = None,
                   chunk: int = 4096) -> epath.Path:
    """Streams r and u of ``input_path``'s sentences into ``output/explicit`` and
    ``output/implicit`` (``embeddings.npy``, ``ids.txt``, ``meta.json`` each, written
    atomically by ``embedding_core.export.export_view``).

    Args:
      normalize: unit-length rows; ``None`` follows the run's ``config.normalize``.

    Raises:
      FileExistsError: ``output`` is a file; FileNotFoundError, IsADirectoryError,
        DataError: a bad ``input_path`` (nothing is written then).
    """
    from dualcse_jax.inference import load
    from embedding_core.export import ExportFolder

    folder = ExportFolder(output)  # refuses an --output that is a file, before any work
    sentences = read_sentences(input_path)
    embedder = load(workdir, step=step)
    config = embedder.config
    normalize = bool(config.normalize if normalize is None else normalize)

    def blocks(kind):
        for start in range(0, len(sentences), chunk):
            part = sentences[start:start + chunk]
            # Each process encodes a slice of the chunk; process 0 writes (ExportFolder).
            yield part, multihost.encode(embedder, part, kind=kind, normalize=normalize)

    with folder:
        for kind in VIEWS:
            meta = {"model": f"DualCSE-{config.architecture}", "encoder": config.model,
                    "config": config.to_dict(), "step": embedder.step,
                    "normalized": normalize, "similarity": "cosine", "view": kind,
                    "architecture": config.architecture, "pooling": config.pooling,
                    "workdir": storage.display(workdir),
                    "input": storage.display(input_path)}
            folder.view(kind, blocks(kind), num_rows=len(sentences), dim=embedder.dim,
                        meta=meta)
    print(f"wrote {len(sentences)} x {embedder.dim} embeddings to {output}/explicit/ (r) and "
          f"{output}/implicit/ (u): embeddings.npy, ids.txt, meta.json each")
    return storage.as_path(output)


def export_hf_workdir(workdir: str | os.PathLike, output: str | os.PathLike, *,
                      step: int | None = None) -> epath.Path:
    """Writes the run's encoder as Hugging Face / sentence-transformers folders.

    ``output/explicit/`` encodes r and ``output/implicit/`` u, each a folder that
    ``SentenceTransformer(folder).encode(texts)`` and ``transformers.AutoModel`` load with
    no code of this project (``embedding_core.hf_export``, ``docs/export.md``): the
    cross-encoder's indicator word is written into each folder's tokenizer (``s`` is read as
    ``[CLS] s [SEP] explicit [SEP]``), so both folders hold the same weights; the
    bi-encoder's folders hold its two encoders. A ``simcse`` run (r = u) is one folder,
    ``output`` itself. Pooling ``cls_mlp`` adds a tanh Dense module; ``config.normalize``
    a Normalize module, so ``encode`` returns what ``load(workdir).encode`` returns.

    Raises:
      FileExistsError: ``output`` is a file or a non-empty folder (before any work).
      FileNotFoundError, ValueError: not a training workdir, no checkpoint (at ``step``).
    """
    from dualcse_jax.inference import load
    from embedding_core import hf_export

    with hf_export.staged_output(output) as stage:
        embedder = load(workdir, step=step)
        config = embedder.config
        params = embedder.params
        kinds = ("explicit",) if config.architecture == "simcse" else VIEWS
        for kind in kinds:
            tower = params["encoder" if config.architecture != "bi" else f"{kind}_encoder"]
            mlp = tower["pooler"]["mlp"] if config.pooling == "cls_mlp" else None
            head = hf_export.SentenceHead(
                pooling="mean" if config.pooling == "mean" else "cls",
                dense_kernel=None if mlp is None else mlp["kernel"],
                dense_bias=None if mlp is None else mlp["bias"],
                activation="tanh", normalize=bool(config.normalize))
            suffix = kind if config.architecture == "cross" else None
            what = (f"DualCSE-{config.architecture} " +
                    ("sentence encoder (r = u)" if config.architecture == "simcse" else
                     f"{kind} view ({'r' if kind == 'explicit' else 'u'})"))
            usage = (f"Input: a plain sentence; the tokenizer appends the indicator word "
                     f"(a sentence s is read as [CLS] s [SEP] {kind} [SEP]).\n" if suffix else
                     "Input: a plain sentence.\n")
            hf_export.write_sentence_transformer(
                stage if len(kinds) == 1 else stage / kind,
                encoder_params=tower["transformer"], encoder_config=embedder.model.config,
                tokenizer=embedder.tokenizer, max_length=int(config.max_length), head=head,
                suffix=suffix, pooler=None if mlp is None else (mlp["kernel"], mlp["bias"]),
                info={"model": f"DualCSE-{config.architecture}", "view": kind,
                      "input_suffix": suffix, "step": embedder.step,
                      "workdir": storage.display(workdir), "encoder": config.model,
                      "pooling": config.pooling, "normalized": bool(config.normalize),
                      "similarity": "cosine"},
                readme=hf_export.readme(what, usage, step=embedder.step))
    where = storage.display(output)
    print(f"wrote {where}: " + (" and ".join(f"{k}/" for k in kinds) if len(kinds) > 1 else
                                 "one folder") + " (sentence-transformers / transformers)")
    return storage.as_path(output)


def run_demo(workdir: str | os.PathLike, num_train_steps: int | None = None, *,
             config=None) -> dict:
    """The README's main job: train DualCSE-Cross from MiniLM on shipped INLI (CPU preset),
    evaluate RTE next to MiniLM off the shelf, export both embeddings of INLI test premises.

    Args:
      workdir: run folder (created; an existing run there is resumed).
      num_train_steps: overrides the preset's step count.
      config: an ``ml_collections.ConfigDict`` instead of ``configs/cross_cpu.py``.

    Returns:
      ``{"rte": {row name: accuracies}, ...}`` as written by :func:`evaluate_workdir`.
    """
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
    print(f"  RTE results:  {workdir / 'eval' / 'rte.json'} (baseline: rte_baseline.json)")
    print(f"  embeddings:   {export_dir}/explicit/ and {export_dir}/implicit/ "
          "(embeddings.npy, ids.txt, meta.json)")

    return result
