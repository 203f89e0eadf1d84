"""Finding and reading pretrained checkpoints: a folder (local or ``gs://``), an installed
package's ``model/`` or a hub id (``docs/models.md``)."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from embedding_core.models import hub
from embedding_core.models.encoders import WHAT_TO_PASS, EncoderConfig, TransformerEncoder
from embedding_core.models.packages import package_dir
from embedding_core.storage import storage

_WEIGHTS_FILE = "model.safetensors"
_WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
# Checkpoint entries that are not encoder parameters: buffers, pooler, task heads.
_SKIPPED = re.compile(
    r"^(embeddings\.position_ids|embeddings\.token_type_ids|pooler\.|cls\.|lm_head\.|"
    r"classifier\.|qa_outputs\.|vocab_transform\.|vocab_layer_norm\.|vocab_projector\.|"
    r"discriminator_predictions\.|generator_predictions\.|generator_lm_head\.)"
)
_PREFIXES = ("bert.", "roberta.", "mpnet.", "distilbert.", "electra.")
# Checkpoint names of MPNet and DistilBERT -> BERT's (the module tree is BERT's); their
# inverses name the tensors an export writes back (hf_export).
RENAMES = {
    "mpnet": ((".attention.attn.q.", ".attention.self.query."),
              (".attention.attn.k.", ".attention.self.key."),
              (".attention.attn.v.", ".attention.self.value."),
              (".attention.attn.o.", ".attention.output.dense."),
              (".attention.LayerNorm.", ".attention.output.LayerNorm.")),
    "distilbert": (("transformer.layer.", "encoder.layer."),
                   (".attention.q_lin.", ".attention.self.query."),
                   (".attention.k_lin.", ".attention.self.key."),
                   (".attention.v_lin.", ".attention.self.value."),
                   (".attention.out_lin.", ".attention.output.dense."),
                   (".sa_layer_norm.", ".attention.output.LayerNorm."),
                   (".ffn.lin1.", ".intermediate.dense."), (".ffn.lin2.", ".output.dense."),
                   (".output_layer_norm.", ".output.LayerNorm.")),
}


def rename(name: str, model_type: str, *, inverse: bool = False) -> str:
    """A checkpoint tensor name of ``model_type`` as BERT's (``inverse``: back)."""
    for theirs, ours in RENAMES.get(model_type, ()):
        old, new = (ours, theirs) if inverse else (theirs, ours)
        if old.startswith(".") and old in name:
            name = name.replace(old, new)
        elif name.startswith(old):
            name = new + name[len(old):]
    return name

ENCODER_DIR = "encoder"  # a workdir's copy of its encoder's config and tokenizer files
# What a BERT / RoBERTa tokenizer may need (copied when present); config.json last: its
# presence marks a complete copy.
ENCODER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "vocab.txt", "vocab.json", "merges.txt", "added_tokens.json",
                 "sentencepiece.bpe.model", "spiece.model", "config.json")


def resolve_model_dir(name_or_path: str | os.PathLike) -> pathlib.Path:
    """The absolute local folder of ``name_or_path`` (with ``config.json`` or
    ``model/config.json``). Raises FileNotFoundError, saying what to pass."""
    if isinstance(name_or_path, str) and not name_or_path.strip():
        raise FileNotFoundError(f"The model name is empty. {WHAT_TO_PASS}")
    if storage.is_remote(name_or_path):
        try:
            name_or_path = storage.local_copy(name_or_path)
        except FileNotFoundError:
            raise FileNotFoundError(f"No model folder at {name_or_path}. {WHAT_TO_PASS}") from None
    path = pathlib.Path(name_or_path).expanduser()
    if path.is_dir():
        for candidate in (path, path / "model"):
            if (candidate / "config.json").is_file():
                return candidate.resolve()
        raise FileNotFoundError(f"The folder {path} holds no config.json. {WHAT_TO_PASS}")
    package = package_dir(str(name_or_path))
    if package is not None:
        model_dir = package / "model"
        if (model_dir / "config.json").is_file():
            return model_dir.resolve()
        raise FileNotFoundError(
            f"The installed package {str(name_or_path)!r} at {package} has no model/config.json. "
            f"{WHAT_TO_PASS}"
        )
    if path.exists():
        raise FileNotFoundError(f"{path.absolute()} is a file, not a model folder. "
                                f"{WHAT_TO_PASS}")
    if hub.parse(str(name_or_path)) is not None:
        return hub.download(str(name_or_path)).folder
    raise FileNotFoundError(
        f"No model folder at {str(name_or_path)!r} ({path.absolute()} does not exist) and no "
        f"installed package of that name. {WHAT_TO_PASS}"
    )


def param_shapes(config: EncoderConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
    """Flat parameter paths and shapes of ``TransformerEncoder(config)`` (no compute)."""
    from flax import traverse_util

    model = TransformerEncoder(config)
    ids = jnp.zeros((1, 1), jnp.int32)
    abstract = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), ids, ids)))
    flat = traverse_util.flatten_dict(abstract["params"])
    return {path: tuple(leaf.shape) for path, leaf in flat.items()}


def _flax_path(hf_name: str, model_type: str = "bert") -> tuple[tuple[str, ...], bool] | None:
    """``(our path, transpose?)`` of an HF tensor name; None: skip."""
    for prefix in _PREFIXES:
        if hf_name.startswith(prefix):
            hf_name = hf_name[len(prefix) :]
            break
    if _SKIPPED.match(hf_name):
        return None
    hf_name = rename(hf_name, model_type)
    parts = hf_name.split(".")
    path: list[str] = []
    i = 0
    while i < len(parts):
        if parts[i] == "layer" and i + 1 < len(parts) and parts[i + 1].isdigit():
            path.append(f"layer_{parts[i + 1]}")
            i += 2
        else:
            path.append(parts[i])
            i += 1
    leaf, parent = path[-1], (path[-2] if len(path) > 1 else "")
    transpose = False
    if parent == "LayerNorm" and leaf in ("weight", "gamma"):
        leaf = "scale"
    elif leaf == "beta":
        leaf = "bias"
    elif leaf == "weight" and (parent.endswith("_embeddings")
                               or parent == "relative_attention_bias"):
        leaf = "embedding"
    elif leaf == "weight":
        leaf, transpose = "kernel", True
    return (*path[:-1], leaf), transpose


def _load_safetensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    if not path.is_file():
        raise FileNotFoundError(f"No weights file {path} (named in {_WEIGHTS_INDEX_FILE}). "
                                f"{WHAT_TO_PASS}")
    try:
        return dict(load_file(str(path)))
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{path}: not a readable safetensors file ({err}); a download or "
                         "copy cut short leaves one: copy it again") from None


def _read_safetensors(model_dir: pathlib.Path) -> dict[str, np.ndarray]:
    single = model_dir / _WEIGHTS_FILE
    if single.is_file():
        return _load_safetensors(single)
    index = model_dir / _WEIGHTS_INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            shards = {str(v) for v in dict(weight_map).values()}
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{index}: not a safetensors index (JSON with a 'weight_map' "
                             f"object; {type(err).__name__}: {err})") from None
        tensors: dict[str, np.ndarray] = {}
        for shard in sorted(shards):
            tensors.update(_load_safetensors(model_dir / shard))
        return tensors
    raise FileNotFoundError(
        f"No {_WEIGHTS_FILE} (or {_WEIGHTS_INDEX_FILE}) in {model_dir}; only safetensors "
        f"weights are read. {WHAT_TO_PASS}"
    )


def load_pretrained_params(model_dir: str | os.PathLike, config: EncoderConfig) -> dict[str, Any]:
    """``model.safetensors`` (or a sharded index) as the encoder's float32 numpy tree.
    Raises: FileNotFoundError; ValueError: every missing, unexpected or misshapen tensor."""
    from flax import traverse_util

    model_dir = pathlib.Path(model_dir)
    expected = param_shapes(config)
    filled: dict[tuple[str, ...], np.ndarray] = {}
    unexpected: list[str] = []
    mismatched: list[str] = []
    for name, tensor in _read_safetensors(model_dir).items():
        target = _flax_path(name, config.model_type)
        if target is None:
            continue
        path, transpose = target
        if path not in expected:
            unexpected.append(name)
            continue
        array = np.asarray(tensor, dtype=np.float32)
        if transpose:
            array = np.ascontiguousarray(array.T)
        if array.shape != expected[path]:
            mismatched.append(
                f"{name}: checkpoint {tuple(tensor.shape)}, model {'/'.join(path)} "
                f"{expected[path]}" + (" (after transposing)" if transpose else "")
            )
            continue
        filled[path] = array
    missing = ["/".join(path) for path in expected if path not in filled]
    if missing or unexpected or mismatched:
        problems = []
        if missing:
            problems.append(f"missing parameters (model path): {missing}")
        if unexpected:
            problems.append(f"unexpected tensors (checkpoint name): {unexpected}")
        if mismatched:
            problems.append(f"shape mismatches: {mismatched}")
        raise ValueError(
            f"{model_dir}: the checkpoint does not fit the {config.model_type} config with "
            f"{config.num_layers} layers, hidden {config.hidden_size}: " + "; ".join(problems)
        )
    return traverse_util.unflatten_dict(filled)


@dataclasses.dataclass
class Pretrained:
    """A loaded checkpoint: folder, config, float32 numpy params."""

    model_dir: pathlib.Path
    config: EncoderConfig
    params: dict[str, Any]

    @property
    def module(self) -> TransformerEncoder:
        return TransformerEncoder(self.config)


def load_pretrained(
    name_or_path: str | os.PathLike, dtype: str = "float32", dropout: bool | None = None
) -> Pretrained:
    """A checkpoint of :func:`resolve_model_dir`; ``dropout=False`` sets its rates to 0.
    Raises FileNotFoundError, ValueError."""
    model_dir = resolve_model_dir(name_or_path)
    config = EncoderConfig.from_hf_config(model_dir).replace(dtype=dtype)
    if dropout is False:
        config = config.replace(hidden_dropout_rate=0.0, attention_dropout_rate=0.0)
    return Pretrained(model_dir, config, load_pretrained_params(model_dir, config))


def save_encoder_files(model_dir: str | os.PathLike, dest: str | os.PathLike) -> None:
    """Copies the :data:`ENCODER_FILES` of ``model_dir`` into ``dest``, ``config.json``
    last. Raises FileNotFoundError: no ``config.json`` or ``tokenizer.json``."""
    from embedding_core.storage.files import write_bytes_atomic

    model_dir = storage.as_path(model_dir)
    for required in ("config.json", "tokenizer.json"):
        if not (model_dir / required).is_file():
            raise FileNotFoundError(f"{model_dir} has no {required}: the run cannot keep "
                                    f"a copy of its encoder's files. {WHAT_TO_PASS}")
    dest = storage.as_path(dest)
    for name in ENCODER_FILES:
        if (model_dir / name).is_file():
            write_bytes_atomic(dest / name, (model_dir / name).read_bytes())


def encoder_run_files(model_dir: str | os.PathLike) -> dict[str, Callable[[Any], None]]:
    """``Task.run_files`` entry keeping ``model_dir``'s files in :data:`ENCODER_DIR`."""
    return {ENCODER_DIR: lambda path: save_encoder_files(model_dir, path)}


def workdir_model_dir(workdir: str | os.PathLike,
                      model: str | os.PathLike | None = None) -> pathlib.Path:
    """``workdir/encoder`` when complete, else (older workdirs) ``model``'s folder.
    Raises FileNotFoundError naming both places."""
    copy = storage.as_path(workdir) / ENCODER_DIR
    if (copy / "config.json").is_file() and (copy / "tokenizer.json").is_file():
        return storage.local_copy(copy).resolve()
    if model is None:
        raise FileNotFoundError(f"{copy} holds no config.json and tokenizer.json (a workdir "
                                "trained before runs kept them: pass the run's model)")
    try:
        return resolve_model_dir(model)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"{copy} holds no encoder files (a workdir trained before "
                                f"runs kept them), and the run's model: {err}") from None
