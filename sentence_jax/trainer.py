"""sentence-transformers' training as a ``Task``: the files' text columns tokenized into one
table, each step's rows from the sampler, the loss on the global batch's embeddings."""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

# TensorFlow through data_pipelines (its start-up notices muted) before TensorBoard loads it.
from data_pipelines import pipeline as batching
from data_pipelines.table import stack_fields, text_identity_ids
from data_pipelines.tokenization import load_tokenizer, tokenize
from embedding_core import (
    BatchField,
    ContrastiveLoss,
    Task,
    load_pretrained,
    per_example,
    read_pipeline,
    run,
    write_json,
)
from sentence_jax import card, data, losses, samplers
from sentence_jax.configs import default
from sentence_jax.inference import SentenceEncoder, keep_folder
from sentence_jax.model import build_model, init_fn, pretrained_params


def train_files(config: ml_collections.ConfigDict) -> list[str]:
    return [p.strip() for p in str(config.train_files).split(",") if p.strip()]


def read_datasets(config: ml_collections.ConfigDict, loss) -> list[data.Columns]:
    """Every training file, checked against the loss and against the first file's columns.
    Raises FileNotFoundError, DataError (file, line, column)."""
    scored = isinstance(losses.inner(loss), losses.CoSENTLoss)
    sets = [data.read_columns(path, min_columns=loss.min_columns,
                              max_columns=2 if scored else None, needs_label=scored)
            for path in train_files(config)]
    for other in sets[1:]:
        if len(other.names) != len(sets[0].names):
            raise data.DataError(other.path, int(other.lines[0]), None,
                                 f"{len(other.names)} text columns {list(other.names)}; "
                                 f"{sets[0].path} has {len(sets[0].names)}: every dataset of "
                                 "a run has the same number (one compiled step)")
    return sets


def prompt_of(prompts: str | dict, path: str, column: str) -> str:
    """The prompt of a dataset's column (sentence-transformers' ``prompts`` forms)."""
    if isinstance(prompts, str):
        return prompts
    name = os.path.basename(path)
    item = prompts.get(name, prompts.get(os.path.splitext(name)[0]))
    if isinstance(item, dict):
        return item.get(column, "")
    return item if isinstance(item, str) else prompts.get(column, "")


def build_table(sets: list[data.Columns], tokenizer, max_len: int, lower: bool,
                prompts: str | dict = ""):
    """``(TokenTable [n, F, max_len], labels [n] float32 or None)`` of the datasets in order,
    each text after its prompt."""
    width = len(sets[0].names)
    columns = [[prompt_of(prompts, s.path, s.names[f]) + row[f] for s in sets for row in s.texts]
               for f in range(width)]
    if lower:
        columns = [[t.lower() for t in col] for col in columns]
    names = tuple(f"column_{f}" for f in range(width))
    ids = text_identity_ids([t for col in columns for t in col]).reshape(width, -1)
    table = stack_fields({n: tokenize(tokenizer, col, max_len) for n, col in zip(names, columns,
                                                                              strict=True)},
                         {n: ids[f] for f, n in enumerate(names)})
    labels = None
    if all(s.labels is not None for s in sets):
        labels = np.concatenate([s.labels for s in sets]).astype(np.float32)
    return table, labels


INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def input_suffixes(width: int, group_padding: bool) -> list[str]:
    """The batch's input names end in these: ``_c`` per column with ``group_padding``."""
    return [f"_{c}" for c in range(width)] if group_padding else [""]


def make_loss_fn(model, loss, dropout: bool, suffixes: Sequence[str] = ("",)
                 ) -> ContrastiveLoss:
    """Split at the ``[rows, F, dim]`` float32 embeddings; row i's dropout key is
    ``fold_in(step key, i)`` (and ``fold_in(that, g)`` for input group g), so the global
    batch gives the same loss on any mesh."""

    def embed(params, batch, rows, rng):
        def apply(inputs, key):
            out = []
            for g, (ids, mask, types) in enumerate(inputs):
                r, f, length = ids.shape
                k = None if key is None else key if len(inputs) == 1 else \
                    jax.random.fold_in(key, g)
                out.append(model.apply({"params": params}, ids.reshape(r * f, length),
                                       mask.reshape(r * f, length),
                                       types.reshape(r * f, length), deterministic=k is None,
                                       rngs={} if k is None else {"dropout": k}
                                       ).reshape(r, f, -1))
            return out[0] if len(out) == 1 else jnp.concatenate(out, axis=1)

        inputs = tuple(tuple(batch[name + s] for name in INPUTS) for s in suffixes)
        return per_example(apply, dropout)(inputs, rows, rng)

    def value(params, embeddings, batch, rng):
        columns = [embeddings[:, f] for f in range(embeddings.shape[1])]
        return loss(columns, batch.get("labels"), jax.random.fold_in(rng, 1 << 30)), {}

    return ContrastiveLoss(embed, value)


def build_task(config: ml_collections.ConfigDict, mesh=None) -> Task:
    """The task of a config. Raises ValueError (config, sizes), FileNotFoundError,
    DataError (file, line, column)."""
    loss = default.make_loss(config)
    sets = read_datasets(config, loss)  # before the model loads: a bad row fails fast
    pretrained = load_pretrained(config.model)
    positions = pretrained.config.max_position_embeddings - pretrained.config.position_offset
    pipeline = read_pipeline(pretrained.model_dir, positions)
    max_len = int(config.max_seq_length) or pipeline.max_seq_length
    if max_len > positions:
        raise ValueError(f"config.max_seq_length={max_len}: {config.model} has {positions} "
                         "token positions")
    model = build_model(config, pretrained.config, pipeline)
    if isinstance(loss, losses.MatryoshkaLoss):
        dim = len(pipeline.pooling) * pretrained.config.hidden_size
        try:
            loss.check_dim(int(pipeline.dense[-1][0].shape[1]) if pipeline.dense else dim)
        except ValueError as err:
            raise ValueError(f"config.{err}") from None
    tokenizer = load_tokenizer(pretrained.model_dir)
    prompts = default.parse_prompts(config.prompts)
    if prompts and not pipeline.include_prompt:
        raise ValueError(f"config.prompts: {config.model}'s Pooling leaves the prompt out "
                         "(include_prompt=false), which training does not do yet; train "
                         "without prompts or with a model that pools them")
    table, labels = build_table(sets, tokenizer, max_len, pipeline.do_lower_case, prompts)
    batch = int(config.batch_size)
    values = None
    if config.batch_sampler == "no_duplicates":
        values = [frozenset(row) for s in sets for row in s.texts]
    sampler = samplers.Sampler([len(s) for s in sets], batch, int(config.seed),
                               batch_sampler=config.batch_sampler,
                               multi_dataset_batch_sampler=config.multi_dataset_batch_sampler,
                               values=values, names=[s.path for s in sets])
    width = len(sets[0].names)
    suffixes = input_suffixes(width, bool(config.group_padding))
    spec = {name + s: BatchField("int", ("batch", width // len(suffixes), f"seq{s}"))
            for name in INPUTS for s in suffixes}
    spec["text_ids"] = BatchField("int", ("batch", width))
    row_values = {}
    if isinstance(losses.inner(loss), losses.CoSENTLoss):
        row_values["labels"] = labels
        spec["labels"] = BatchField("float", ("batch",))

    def make_batches(start_step: int):
        return batching.make_batches(table, global_batch_size=batch, seed=int(config.seed),
                       start_step=start_step, process_index=jax.process_index(),
                       process_count=jax.process_count(),
                       pad_multiple=int(config.pad_multiple), order=sampler,
                       row_values=row_values,
                       length_groups=[[c] for c in range(width)] if len(suffixes) > 1 else None)

    return Task(
        name=f"sentence-jax {type(loss).__name__}", init_params=init_fn(model),
        loss_fn=make_loss_fn(model, loss, bool(config.dropout), suffixes),
        make_batches=make_batches,
        num_examples=table.num_examples, steps_per_epoch=sampler.steps_per_epoch(),
        global_batch_size=batch, batch_spec=spec,
        pretrained=pretrained_params(pretrained.params, pipeline),
        encoder_of=_encoder_of(model, tokenizer, config, pretrained.model_dir),
        run_files={**keep_folder(pretrained.model_dir),
                   card.DATASETS_FILE: lambda path: write_json(path, _described(sets, loss))},
        summary=f"data: {', '.join(s.path for s in sets)} ({table.num_examples} rows, "
                f"columns {list(sets[0].names)})",
        logical_axis_sizes={"heads": pretrained.config.num_heads})


def _encoder_of(model, tokenizer, config, model_dir):
    """``(params, step) -> SentenceEncoder`` for ``eval_files`` (one encoder, compiled once)."""
    encoders = []

    def of(params, step):
        if not encoders:
            encoders.append(SentenceEncoder(model, params, tokenizer, config, step, model_dir,
                                            None))
        encoders[0].params, encoders[0].step = params, step
        return encoders[0]

    return of


def _described(sets: list[data.Columns], loss) -> dict:
    """What the model card says of the data and the loss."""
    return {"datasets": [{"path": s.path, "rows": len(s), "columns": list(s.names),
                          "label": s.label_name} for s in sets],
            "loss": {"name": type(loss).__name__, "args": loss.config_dict()}}


def train(config: ml_collections.ConfigDict, workdir: str | os.PathLike, **kwargs):
    """Trains (or resumes) into ``workdir``; a cached loss's ``mini_batch_size`` is the
    GradCache chunk (``contrastive_chunk_size``)."""
    chunk = losses.mini_batch_size(default.make_loss(config))
    if chunk:
        config = ml_collections.ConfigDict(config.to_dict())
        config.contrastive_chunk_size = chunk
    return run(build_task, config, workdir, validate=default.validate, **kwargs)
