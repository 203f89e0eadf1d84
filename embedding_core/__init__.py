"""The core's public surface: what a method package imports (``docs/architecture.md``, "The
public surface"). Each name loads its module on first use (no JAX on import); importing
wires storage first (``storage.configure``: ``gs://`` and the emulator)."""

from __future__ import annotations

import importlib
from typing import Any

from embedding_core.storage import storage as _storage

_storage.configure()

_MODULES = {
    "configs": "embedding_core.configs",  # declare, validator, read_config, axis_rules
    "commands": "embedding_core.commands",  # Program, Command, define_flags, main
    "multihost": "embedding_core.distributed.multihost",
    "parallel": "embedding_core.distributed.parallel",
    "metrics": "embedding_core.evaluation.metrics",
}
_NAMES = {
    # Declaring and training a method.
    "Field": "embedding_core.fields",
    "unknown_field_message": "embedding_core.fields",
    "Task": "embedding_core.training.task",
    "BatchField": "embedding_core.training.task",
    "run": "embedding_core.training.run",
    "restore_params": "embedding_core.training.training",
    "ContrastiveLoss": "embedding_core.losses.contrastive",
    "GradAccumulation": "embedding_core.losses.contrastive",
    "per_example": "embedding_core.losses.contrastive",
    "info_nce": "embedding_core.losses.losses",
    # The encoder and its pretrained weights.
    "EncoderConfig": "embedding_core.models.encoders",
    "TransformerEncoder": "embedding_core.models.encoders",
    "load_pretrained": "embedding_core.models.pretrained",
    "encoder_run_files": "embedding_core.models.pretrained",
    "workdir_model_dir": "embedding_core.models.pretrained",
    # The trained model: encoding and exports.
    "Encoder": "embedding_core.serving.inference",
    "encode_in_batches": "embedding_core.serving.inference",
    "masked_mean": "embedding_core.serving.inference",
    "token_batch_builder": "embedding_core.serving.inference",
    "l2_normalize": "embedding_core.serving.inference",
    "View": "embedding_core.serving.serving",
    "HFFolder": "embedding_core.serving.serving",
    "SavesFolder": "embedding_core.serving.serving",
    "SentenceHead": "embedding_core.serving.hf_export",
    "hf_tensors": "embedding_core.serving.hf_export",
    "load_export": "embedding_core.serving.export",
    "load_encoder": "embedding_core.serving.st_models",
    "read_pipeline": "embedding_core.serving.st_models",
    "pool": "embedding_core.serving.st_models",
    "ACTIVATIONS": "embedding_core.serving.st_models",
    "method_entry_points": "embedding_core.serving.workdirs",
    # Files, local or gs://.
    "as_path": "embedding_core.storage.storage",
    "write_json": "embedding_core.storage.files",
    "read_text_lines": "embedding_core.storage.text_lines",
    "DataError": "embedding_core.errors",
    "json_object": "embedding_core.errors",
}
__all__ = sorted([*_MODULES, *_NAMES])


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    else:
        raise AttributeError(f"module 'embedding_core' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
