"""``load(workdir)``: DualCSE's Encoder (``kind``: explicit r, implicit u) and its views."""

from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections
import numpy as np

from data_pipelines.tokenization import load_tokenizer, require_text_tokens, tokenize
from dualcse_jax.configs import default
from dualcse_jax.model import KINDS, DualEncoder, build_model, init_fn
from embedding_core import (
    Encoder,
    EncoderConfig,
    HFFolder,
    SavesFolder,
    View,
    configs,
    encode_in_batches,
    multihost,
    parallel,
    token_batch_builder,
    workdir_model_dir,
)
from embedding_core.storage import storage
from embedding_core.training import training

PROG = "dualcse-jax"
REQUIRED_FIELDS = ("model", "architecture", "pooling", "max_length", "dtype")


class Embedder(SavesFolder, Encoder):
    """DualCSE's r and u ``[N, dim]`` float32 (simcse: r = u); ``workdir`` None: in memory."""

    views = (View("explicit", encode_kwargs={"kind": "explicit"}),
             View("implicit", encode_kwargs={"kind": "implicit"}))

    def __init__(self, model: DualEncoder, params: Any, tokenizer,
                 config: ml_collections.ConfigDict, *, step: int | None = None,
                 pad_multiple: int = 1, workdir: str | os.PathLike | None = None):
        self.model, self.params, self.tokenizer, self.config = model, params, tokenizer, config
        self.step, self.workdir, self.pad_multiple = step, workdir, pad_multiple
        self.default_batch_size = int(config.get("eval_batch_size", 64))
        self._apply = jax.jit(self._forward, static_argnums=(4,))

    @property
    def name(self) -> str:
        return f"DualCSE-{self.config.architecture}"

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    @property
    def default_normalize(self) -> bool:
        return bool(self.config.get("normalize", False))

    def _forward(self, params, ids, mask, types, kind):
        return self.model.apply({"params": params}, ids, mask, types, kind,
                                method=DualEncoder.encode_single)

    def _encode(self, texts: list[str], *, batch_size: int, show_progress_bar: bool,
                kind: str = "explicit") -> np.ndarray:
        architecture = self.model.architecture
        if architecture == "simcse":
            kind = "explicit"  # one vector: r = u, computed (and compiled) once
        pair = kind if architecture == "cross" else None
        tok = tokenize(self.tokenizer, texts, self.config.max_length, pair=pair)
        require_text_tokens(self.tokenizer, tok, texts, pair)
        return encode_in_batches(
            tok.lengths, token_batch_builder(tok, batch_size),
            lambda inputs: self._apply(self.params, *inputs, kind),
            batch_size=batch_size, pad_multiple=self.pad_multiple,
            max_width=tok.input_ids.shape[1], show_progress_bar=show_progress_bar,
            desc=f"encode {kind}")

    def encode(self, sentences, *args, normalize: bool | None = None,
               normalize_embeddings: bool | None = None, kind: str = "explicit",
               **kwargs) -> Any:
        """``Encoder.encode`` with ``kind``; normalised as ``config.normalize`` unless told.
        TypeError, ValueError: bad texts, ``batch_size`` < 1, unknown ``kind``."""
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: use 'explicit' (r) or 'implicit' (u)")
        chosen = normalize if normalize is not None else normalize_embeddings
        chosen = self.default_normalize if chosen is None else chosen
        return super().encode(sentences, *args, normalize_embeddings=chosen, kind=kind,
                              **kwargs)

    def export_meta(self) -> dict[str, Any]:
        return {"encoder": self.config.model, "architecture": self.config.architecture,
                "pooling": self.config.pooling}

    def hf_folders(self) -> list[HFFolder]:
        """Cross: ``explicit/``, ``implicit/``; bi: two towers; simcse: one folder."""
        from embedding_core.serving import hf_export

        config, arch = self.config, self.config.architecture
        folders = []
        for kind in ("explicit",) if arch == "simcse" else KINDS:
            tower = self.params["encoder" if arch != "bi" else f"{kind}_encoder"]
            mlp = tower["pooler"]["mlp"] if config.pooling == "cls_mlp" else None
            head = hf_export.SentenceHead(
                pooling="mean" if config.pooling == "mean" else "cls",
                dense_kernel=None if mlp is None else mlp["kernel"],
                dense_bias=None if mlp is None else mlp["bias"],
                activation="tanh", normalize=bool(config.normalize))
            suffix = kind if arch == "cross" else None
            what = f"{self.name} " + ("sentence encoder (r = u)" if arch == "simcse" else
                                      f"{kind} view ({'r' if kind == 'explicit' else 'u'})")
            usage = (f"Input: a plain sentence; the tokenizer appends the indicator word "
                     f"(a sentence s is read as [CLS] s [SEP] {kind} [SEP]).\n" if suffix else
                     "Input: a plain sentence.\n")
            folders.append(HFFolder("" if arch == "simcse" else kind, dict(
                encoder_params=tower["transformer"], encoder_config=self.model.config,
                tokenizer=self.tokenizer, max_length=int(config.max_length), head=head,
                suffix=suffix, pooler=None if mlp is None else (mlp["kernel"], mlp["bias"]),
                info={"model": self.name, "view": kind, "input_suffix": suffix,
                      "step": self.step, "workdir": self.workdir and storage.display(self.workdir),
                      "encoder": config.model, "pooling": config.pooling,
                      "normalized": bool(config.normalize), "similarity": "cosine"},
                readme=hf_export.readme(what, usage, step=self.step))))
        return folders


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
    """The saved config on today's fields; FileNotFoundError, ValueError (the file named)."""
    return configs.read_config(workdir, default.FIELDS, prog=PROG, required=REQUIRED_FIELDS,
                               validate=default.validate)


def load(workdir: str | os.PathLike, *, step: int | None = None) -> Embedder:
    """The latest (or ``step``'s) params, a whole copy per process; OSError, ValueError."""
    config = read_config(workdir)
    # Shape and tokenizer from the workdir's copy (older runs: the base model), never weights.
    model_dir = workdir_model_dir(workdir, config.model)
    model = build_model(config, EncoderConfig.from_hf_config(model_dir))
    step, params = training.restore_params(
        storage.as_path(workdir) / "checkpoints", init_fn(model), parallel.make_mesh(-1, 1),
        step=step, rules=configs.axis_rules(config))
    return Embedder(model, multihost.localize(params), load_tokenizer(model_dir), config,
                    step=step, workdir=workdir)
