"""The config fields every model shares, declared once, and the run's saved config.

Each preset is ``get_config()`` in a package's ``configs/`` that starts from :func:`base` and
adds only its model's fields (see ``docs/architecture.md``). Fields are flat and commented
so that ``--config.FIELD=VALUE`` overrides them and ``--help`` can list them.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable

import ml_collections
from etils import epath

from embedding_core import parallel, storage
from embedding_core.files import read_json_object

CONFIG_FILE = "run_config.json"
"""The run's own config in a workdir; never ``config.json``, the name Hugging Face tools
take for a model's config (``docs/architecture.md``, "What a workdir holds")."""
LEGACY_CONFIG_FILE = "config.json"
"""Where workdirs written before ``run_config.json`` keep their run config."""
LR_DECAYS = ("linear", "cosine", "constant")
# Fields a resumed run may change: how long, how often, on which devices. Every other field
# shapes the model, its data or its optimisation, so a run resumed with another value would
# mix two runs in one workdir (and rewrite the config that inference rebuilds the model from).
RESUMABLE_FIELDS = frozenset({
    "num_train_steps", "num_epochs", "log_every", "checkpoint_every", "keep_checkpoints",
    "eval_every", "eval_batch_size", "eval_examples", "mesh_data", "mesh_model",
    "coordinator_address", "num_processes", "process_id", "logical_axis_rules",
    "val_file", "test_file",  # DualCSE's evaluation sets: they do not shape the training
    "contrastive_chunk_size",  # memory only: the chunked step's gradients are the same
    "fused_table_update",  # DocEnt: memory only, the same step and optimizer-state layout
})


DEFAULT_AXIS_RULES = tuple((name, axis or "") for name, axis in parallel.LOGICAL_AXIS_RULES)
"""``parallel.LOGICAL_AXIS_RULES`` as the config stores them (``""`` = replicated)."""

RESUMABLE_PREFIXES = ("eval_", "tag_")
"""Evaluation-only fields (``eval_*``, DocEnt's ``tag_*``) may change on resume as well."""


def resumable(field: str) -> bool:
    """Whether ``field`` may differ between invocations on one workdir."""
    return field in RESUMABLE_FIELDS or field.startswith(RESUMABLE_PREFIXES)


def base() -> ml_collections.ConfigDict:
    """The loop, optimizer, mesh and logical-axis-rule fields of every model's config."""
    c = ml_collections.ConfigDict()
    # Optimisation (AdamW, decoupled weight decay on matrices only).
    c.learning_rate = 5e-5
    c.warmup_steps = 0  # linear warm-up from 0
    c.lr_decay = "linear"  # linear | cosine | constant after warm-up
    c.weight_decay = 0.0
    c.grad_clip_norm = 0.0  # 0 = off
    c.num_epochs = 1.0
    c.num_train_steps = 0  # >0 overrides num_epochs
    c.seed = 42  # parameter init, dropout and data order
    # Batches beyond device memory (embedding_core/contrastive.py, docs/architecture.md).
    c.contrastive_chunk_size = 0  # >0: in-batch contrastive losses (DualCSE, SimCSE, DocEnt
    #   in-batch) embed the batch in chunks of this many rows per data device and backprop
    #   chunk by chunk (GradCache): same gradients, activations of one chunk; must divide
    #   the per-device batch. 0 = off
    c.grad_accum_steps = 1  # >1: losses that are not in-batch contrastive (DocEnt-Full MLM,
    #   MRWE triplet) average this many micro-batch gradients per step (triplet mining then
    #   sees one micro-batch); must divide the per-device batch
    # Loop.
    c.log_every = 50  # steps between logged/TensorBoard training metrics
    c.checkpoint_every = 500  # steps between checkpoints (also on SIGTERM and at the end)
    c.keep_checkpoints = 3
    c.eval_every = 0  # >0: the model's evaluation every N steps and at the end
    c.eval_batch_size = 64  # texts per encoder call at evaluation and export
    # Parallelism.
    c.mesh_data = -1  # -1 = all devices not used by mesh_model
    c.mesh_model = 1  # tensor / vocabulary-parallel size
    c.coordinator_address = ""  # "host:port" or "auto" for jax.distributed.initialize
    c.num_processes = 0
    c.process_id = -1
    c.logical_axis_rules = DEFAULT_AXIS_RULES  # logical axis -> "data" | "model" | ""
    #   (replicated). Names given override these defaults, the others stay, e.g.
    #   --config.logical_axis_rules="(('heads', ''),)". "entities" (DocEnt's table rows) is
    #   split over model, "vocab" (word pieces) replicated; an axis the mesh size does not
    #   divide (12 heads, model=8) is replicated with a warning (docs/architecture.md)
    return c


def axis_rules(config: ml_collections.ConfigDict) -> parallel.LogicalRules:
    """The rules in force: ``parallel.LOGICAL_AXIS_RULES`` with the config's
    ``logical_axis_rules`` entries replacing those of the same name (others appended), as
    flax expects them (``""`` -> ``None``)."""
    given = {str(name): (str(axis) if axis else None) for name, axis in
             (config.get("logical_axis_rules") or ())}
    rules = [(name, given.pop(name, axis)) for name, axis in parallel.LOGICAL_AXIS_RULES]
    return tuple(rules + list(given.items()))


def check_rule_names(config: ml_collections.ConfigDict, model_axes) -> None:
    """Refuses a ``logical_axis_rules`` name that neither the defaults
    (``parallel.LOGICAL_AXIS_RULES``) nor any parameter of the model carries: such a rule
    would do nothing, which is almost always a typo (``"entitys"``).

    Args:
      model_axes: the model's logical axis names (``parallel.logical_dims`` of its
        abstract parameters, or any iterable of names).

    Raises:
      ValueError: naming the unknown names and the known ones.
    """
    known = {name for name, _ in parallel.LOGICAL_AXIS_RULES} | set(model_axes)
    given = [str(name) for name, _ in (config.get("logical_axis_rules") or ())]
    unknown = [name for name in given if name not in known]
    if unknown:
        raise ValueError(f"config.logical_axis_rules names {unknown} that nothing in this "
                         f"model carries; the logical axes are {sorted(known)}")


def _check_axis_rules(rules) -> None:
    if isinstance(rules, str) or not isinstance(rules, (tuple, list)):
        raise ValueError(f"config.logical_axis_rules must be a tuple of (name, mesh axis) "
                         f"pairs, got {rules!r}")
    seen = set()
    for entry in rules:
        if isinstance(entry, str) or not isinstance(entry, (tuple, list)) or len(entry) != 2:
            raise ValueError(f"config.logical_axis_rules: {entry!r} is not (name, mesh axis)")
        name, axis = entry
        if not isinstance(name, str) or not name:
            raise ValueError(f"config.logical_axis_rules: {entry!r}: the logical name must "
                             "be a non-empty string")
        if axis is None:
            axis = ""
        if axis not in ("", *parallel.MESH_AXES):
            raise ValueError(f"config.logical_axis_rules: {entry!r}: the mesh axis must be "
                             f"one of {parallel.MESH_AXES} or '' (replicated)")
        if name in seen:
            raise ValueError(f"config.logical_axis_rules names {name!r} twice")
        seen.add(name)


def validate_base(config: ml_collections.ConfigDict) -> None:
    """Checks the shared fields before anything is loaded or compiled.

    Raises:
      ValueError: naming the field and what it must be.
    """
    if config.lr_decay not in LR_DECAYS:
        raise ValueError(f"config.lr_decay={config.lr_decay!r}: use one of {LR_DECAYS}")
    if not (math.isfinite(config.learning_rate) and config.learning_rate > 0):
        raise ValueError("config.learning_rate must be a finite positive number, got "
                         f"{config.learning_rate}")
    # inf or nan here would reach the optimizer and make every parameter non-finite.
    for name in ("weight_decay", "grad_clip_norm", "num_epochs"):
        if not math.isfinite(float(config[name])):
            raise ValueError(f"config.{name} must be a finite number, got {config[name]}")
    for name in ("log_every", "checkpoint_every", "keep_checkpoints", "eval_batch_size"):
        if int(config[name]) < 1:
            raise ValueError(f"config.{name} must be >= 1, got {config[name]}")
    for name in ("warmup_steps", "eval_every", "num_train_steps"):
        if int(config[name]) < 0:
            raise ValueError(f"config.{name} must be >= 0, got {config[name]}")
    if config.num_train_steps == 0 and not config.num_epochs > 0:
        raise ValueError("config.num_epochs must be positive when num_train_steps is 0")
    if config.weight_decay < 0 or config.grad_clip_norm < 0:
        raise ValueError("config.weight_decay and config.grad_clip_norm must be >= 0")
    if config.mesh_model < 1 or (config.mesh_data < 1 and config.mesh_data != -1):
        raise ValueError(f"config.mesh_data={config.mesh_data}, mesh_model="
                         f"{config.mesh_model}: sizes >= 1 (mesh_data may be -1 = the rest)")
    _check_axis_rules(config.get("logical_axis_rules") or ())
    chunk = int(config.get("contrastive_chunk_size", 0))
    accum = int(config.get("grad_accum_steps", 1))
    if chunk < 0:
        raise ValueError(f"config.contrastive_chunk_size must be >= 0 (rows per device in "
                         f"each chunk; 0 = unchunked), got {chunk}")
    if accum < 1:
        raise ValueError(f"config.grad_accum_steps must be >= 1 (micro-batches per step; "
                         f"1 = no accumulation), got {accum}")
    if chunk > 0 and accum > 1:
        raise ValueError(f"config.contrastive_chunk_size={chunk} and config.grad_accum_steps="
                         f"{accum}: set one of them (chunking already bounds the memory)")


def num_train_steps(config: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
    """``num_train_steps`` when positive, else ``ceil(num_epochs * steps_per_epoch)`` (>= 1)."""
    if int(config.num_train_steps) > 0:
        return int(config.num_train_steps)
    return max(1, math.ceil(float(config.num_epochs) * int(steps_per_epoch)))


def config_path(workdir: str | os.PathLike) -> epath.Path:
    """The file holding ``workdir``'s run config, local or ``gs://``.

    ``run_config.json`` when present; else the ``config.json`` of a workdir trained
    before that name, unless that file is a Hugging Face model config (it has
    ``model_type``); else the ``run_config.json`` path (absent: the caller reports it).
    An unreadable ``config.json`` counts as a run config, so that reading it names it.
    """
    workdir = storage.as_path(workdir)
    path = workdir / CONFIG_FILE
    legacy = workdir / LEGACY_CONFIG_FILE
    if path.is_file() or not legacy.is_file():
        return path
    try:
        raw = json.loads(legacy.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return legacy
    return path if isinstance(raw, dict) and "model_type" in raw else legacy


def check_resume(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> None:
    """Refuses to train into a workdir whose saved config describes another run.

    Called before anything is written, so a refused run leaves the workdir as it was.
    Fields in :data:`RESUMABLE_FIELDS` may change between invocations.

    Raises:
      ValueError: the saved run config (:func:`config_path`) is unreadable, belongs to
        another model (other field names) or differs in a field that is not resumable
        (each such field named with both values).
    """
    path = config_path(workdir)
    if not path.is_file():
        return
    try:
        saved = read_json_object(path)
    except ValueError as err:
        raise ValueError(f"{err}; use a new --workdir") from None
    new = json.loads(json.dumps(config.to_dict()))  # tuples -> lists, as saved
    # Fields the saved run lacks are new in this version (their defaults rebuild the old
    # model); fields this model lacks mean the workdir belongs to another model.
    foreign = sorted(set(saved) - set(new))
    if len(foreign) > 3:
        raise ValueError(f"{workdir} holds a run of another model (its {path.name} has "
                         f"fields {foreign[:6]}... this model lacks); use a new --workdir")
    changed = [f"{k}={saved.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(saved) | set(new))
               if not resumable(k) and saved.get(k) != new.get(k)
               and k in saved and k in new]
    if changed:
        raise ValueError(f"{workdir} was trained with other settings ({'; '.join(changed)}); "
                         "resuming would mix two runs: use a new --workdir or the saved values")


def save_config(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> None:
    """Writes ``workdir/run_config.json`` (local or ``gs://``) atomically (process 0 only).

    A ``config.json`` left by an older version stays as it was; ``run_config.json`` takes
    precedence over it from now on (:func:`config_path`).
    """
    from embedding_core.files import write_json

    write_json(storage.as_path(workdir) / CONFIG_FILE, config.to_dict())


def read_config(
    workdir: str | os.PathLike,
    defaults: Callable[[], ml_collections.ConfigDict],
    *,
    prog: str,
    required: Iterable[str] = (),
    validate: Callable[[ml_collections.ConfigDict], None] | None = None,
) -> ml_collections.ConfigDict:
    """The config a run saved in its workdir (:func:`config_path`), on today's defaults.

    Fields added to the defaults after a run was trained keep their default value; fields
    the saved config has and the defaults lack are kept too (the saved run is the truth).

    Args:
      defaults: the package's ``configs/default.py:get_config``.
      prog: the command-line tool's name, for the message.
      required: fields without which the model cannot be rebuilt.
      validate: the package's config check; its error is prefixed with the file.

    Raises:
      FileNotFoundError: the workdir or its run config is missing.
      ValueError: not a JSON object, missing a required field, or an impossible setting
        (the message names the file).
    """
    workdir = storage.as_path(workdir)
    path = config_path(workdir)
    if workdir.exists() and not workdir.is_dir():
        raise NotADirectoryError(f"workdir {workdir} is a file, not a training folder")
    if not workdir.is_dir():
        raise FileNotFoundError(f"workdir {workdir} does not exist; train first with "
                                f"`{prog} train --workdir={workdir}`")
    raw = read_json_object(path, f"is {workdir} a {prog} training workdir?")
    missing = sorted(set(required) - set(raw))
    if missing:
        raise ValueError(f"{path}: missing config fields {missing}; is {workdir} a {prog} "
                         "workdir (of another model, or written by hand)?")
    config = defaults()
    config.unlock()
    for key, value in raw.items():
        if key in config and isinstance(config[key], tuple) and isinstance(value, list):
            value = tuple(tuple(v) if isinstance(v, list) else v for v in value)
        try:
            config[key] = value
        except TypeError as err:
            raise ValueError(f"{path}: field {key!r}: {err}") from None
    if validate is not None:
        try:
            validate(config)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
    return config
