"""``load(workdir)``: a sentence-jax run as an Encoder (one view, ``sentence``), and its
export: the base model's own folder (modules, pooling, Dense, Normalize, tokenizer) with the
trained weights, prompts and a model card (``docs/sentence.md``, "Out")."""

from __future__ import annotations

import json
import pathlib
import shutil

import jax
import numpy as np

from data_pipelines.tokenization import load_tokenizer, tokenize
from embedding_core import (
    Encoder,
    EncoderConfig,
    SavesFolder,
    View,
    as_path,
    configs,
    encode_in_batches,
    hf_tensors,
    multihost,
    parallel,
    read_pipeline,
    restore_params,
    token_batch_builder,
    workdir_model_dir,
)
from sentence_jax import card
from sentence_jax.configs import default
from sentence_jax.model import build_model, init_fn

PROG = "sentence-jax"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")


def keep_folder(model_dir) -> dict:
    """``Task.run_files``: the model's folder but its transformer weights, as ``encoder/``
    (the modules, pooling and Dense layers the export writes back)."""

    def save(dest) -> None:
        dest = as_path(dest)
        for path in sorted(pathlib.Path(model_dir).rglob("*")):
            rel = path.relative_to(model_dir)
            if path.is_file() and str(rel) not in WEIGHT_FILES and rel.parts[0] != "onnx":
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                (dest / rel).write_bytes(path.read_bytes())

    return {"encoder": save}


class SentenceEncoder(Encoder, SavesFolder):
    """The trained model: ``encode`` as the folder's own pipeline computes it."""

    name = PROG
    views = (View("sentence"),)

    def __init__(self, model, params, tokenizer, config, step, model_dir, workdir) -> None:
        self.model, self.params, self.tokenizer = model, params, tokenizer
        self.config, self.step, self.model_dir, self.workdir = config, step, model_dir, workdir
        positions = model.config.max_position_embeddings - model.config.position_offset
        self.pipeline = read_pipeline(pathlib.Path(model_dir), positions)
        self.max_length = int(config.max_seq_length) or self.pipeline.max_seq_length
        self.prompts, self.default_prompt_name = trained_prompts(config.prompts)
        self._apply = jax.jit(lambda p, ids, mask, types: model.apply({"params": p}, ids, mask,
                                                                       types))

    @property
    def dim(self) -> int:
        return int(jax.eval_shape(self._apply, self.params, *(np.zeros((1, 4), np.int32),) * 3)
                   .shape[-1])

    def _encode(self, texts, *, batch_size, show_progress_bar):
        if self.pipeline.do_lower_case:
            texts = [t.lower() for t in texts]
        tok = tokenize(self.tokenizer, texts, self.max_length)
        return encode_in_batches(tok.lengths, token_batch_builder(tok, batch_size),
                                 lambda inputs: self._apply(self.params, *inputs),
                                 batch_size=batch_size, max_width=tok.input_ids.shape[1])

    def hf_folders(self):
        return []  # write_hf_files writes the one folder

    def write_hf_files(self, stage) -> None:
        """The base folder with the trained transformer and Dense weights and a model card."""
        stage = pathlib.Path(stage)
        for path in sorted(pathlib.Path(self.model_dir).rglob("*")):
            if path.is_file():
                target = stage / path.relative_to(self.model_dir)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
        params = jax.device_get(self.params)
        _save(stage / "model.safetensors", hf_tensors(params["transformer"], self.model.config))
        modules = json.loads((stage / "modules.json").read_text()) \
            if (stage / "modules.json").is_file() else []
        dense = [m["path"] for m in modules if str(m.get("type", "")).endswith("Dense")]
        for i, folder in enumerate(dense):
            layer = params[f"dense_{i}"]
            tensors = {"linear.weight": np.ascontiguousarray(np.asarray(layer["kernel"]).T)}
            if "bias" in layer:
                tensors["linear.bias"] = np.asarray(layer["bias"], np.float32)
            for old in (stage / folder).glob("*.bin"):
                old.unlink()
            _save(stage / folder / "model.safetensors", tensors)
        settings = stage / "sentence_bert_config.json"
        raw = json.loads(settings.read_text()) if settings.is_file() else {}
        raw["max_seq_length"] = self.max_length
        settings.write_text(json.dumps(raw, indent=2) + "\n")
        (stage / "README.md").write_text(card.model_card(self), encoding="utf-8")
        if default.parse_prompts(self.config.prompts):
            path = stage / "config_sentence_transformers.json"
            raw = json.loads(path.read_text()) if path.is_file() else {}
            raw["prompts"] = {**raw.get("prompts", {}), **self.prompts}
            raw["default_prompt_name"] = self.default_prompt_name
            path.write_text(json.dumps(raw, indent=2) + "\n")


def trained_prompts(text: str) -> tuple[dict[str, str], str | None]:
    """``(prompts, default_prompt_name)`` of ``config.prompts``: one prompt for every text
    is ``"default"`` and used by default; columns' prompts by column name."""
    prompts = default.parse_prompts(text)
    if isinstance(prompts, str):
        return ({"default": prompts}, "default") if prompts else ({}, None)
    flat = {k: v for k, v in prompts.items() if isinstance(v, str)}
    for item in prompts.values():
        flat.update(item if isinstance(item, dict) else {})
    return flat, None


def _save(path: pathlib.Path, tensors) -> None:
    from safetensors.numpy import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: np.asarray(v, np.float32) for k, v in tensors.items()}, str(path),
              metadata={"format": "pt"})


def load(workdir, step: int | None = None) -> SentenceEncoder:
    """A run's checkpoint (``step`` None: the latest). Raises FileNotFoundError."""
    config = configs.read_config(workdir, default.FIELDS, prog=PROG, validate=default.validate)
    model_dir = workdir_model_dir(workdir, config.model)
    positions_config = EncoderConfig.from_hf_config(model_dir)
    positions = positions_config.max_position_embeddings - positions_config.position_offset
    model = build_model(config, positions_config, read_pipeline(model_dir, positions))
    step, params = restore_params(as_path(workdir) / "checkpoints", init_fn(model),
                                  parallel.make_mesh(-1, 1), step=step,
                                  rules=configs.axis_rules(config))
    return SentenceEncoder(model, multihost.localize(params), load_tokenizer(model_dir), config,
                           step, model_dir, workdir)
