"""The fields every model shares (declared once), the logical-axis rules, and the run's
saved config: resume check, save, read (``docs/architecture.md``, "Configs")."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable

import ml_collections

from embedding_core.distributed import parallel
from embedding_core.evaluation.run import DEFAULT_BATCH_SIZE
from embedding_core.fields import Field, Fields
from embedding_core.losses.contrastive import StepSplit
from embedding_core.models.encoders import REMAT_POLICIES
from embedding_core.serving.workdirs import (  # noqa: F401 (configs.CONFIG_FILE, as before)
    CONFIG_FILE,
    LEGACY_CONFIG_FILE,
    config_path,
)
from embedding_core.storage import storage
from embedding_core.storage.files import read_json_object

LR_DECAYS = ("linear", "cosine", "constant")
# parallel.LOGICAL_AXIS_RULES as the config stores them ("" = replicated).
DEFAULT_AXIS_RULES = tuple((name, axis or "") for name, axis in parallel.LOGICAL_AXIS_RULES)

BASE = Fields(dict(
    # Optimisation (AdamW, decoupled weight decay on matrices only).
    learning_rate=Field(5e-5, "peak learning rate", above=0),
    warmup_steps=Field(0, "linear warm-up from 0", min=0),
    lr_decay=Field("linear", "after warm-up", choices=LR_DECAYS),
    weight_decay=Field(0.0, "AdamW decoupled weight decay (matrices only)", min=0),
    grad_clip_norm=Field(0.0, "global gradient-norm clip; 0 = off", min=0),
    num_epochs=Field(1.0, "passes over the training examples", min=0, resumable=True),
    num_train_steps=Field(0, ">0 overrides num_epochs", min=0, resumable=True),
    seed=Field(42, "parameter init, dropout and data order"),
    resume_changed_data=Field(False, "resume although a training-data file changed since "
                              "the run started: from the saved step in the new data's order",
                              resumable=True),
    contrastive_chunk_size=Field(
        0, "in-batch contrastive losses: rows per data device per GradCache chunk (same "
        "gradients, one chunk's activations; divides the per-device batch); 0 = off",
        min=0, resumable=True),
    grad_accum_steps=Field(
        1, "other losses (DocEnt-Full MLM, MRWE triplet): micro-batch gradients averaged "
        "per step; divides the per-device batch", min=1),
    # Loop.
    log_every=Field(50, "steps between logged / TensorBoard metrics", min=1, resumable=True),
    checkpoint_every=Field(500, "steps between checkpoints (also on SIGTERM and at the "
                           "end)", min=1, resumable=True),
    keep_checkpoints=Field(3, "checkpoints kept", min=1, resumable=True),
    eval_every=Field(0, ">0: the model's evaluation every N steps and at the end", min=0,
                     resumable=True),
    eval_batch_size=Field(DEFAULT_BATCH_SIZE, "texts per encoder call at evaluation and "
                          "export", min=1, resumable=True),
    eval_files=Field("", "comma-separated KIND:PATH files (ir, sts, pairs, triplets) scored "
                     "every eval_every steps with sentence-transformers' metrics "
                     "(docs/evaluation.md); a comma inside a path is written \\,",
                     resumable=True),
    select_metric=Field("", "an eval metric (e.g. sts/spearman_cosine): the checkpoint "
                        "where it is highest is kept, and evaluate / export load it",
                        resumable=True),
    # Parallelism.
    mesh_data=Field(-1, "data-parallel size; -1 = all devices not used by mesh_model",
                    min=-1, resumable=True),
    mesh_model=Field(1, "tensor / vocabulary-parallel size", min=1, resumable=True),
    coordinator_address=Field("", '"host:port" or "auto" for jax.distributed.initialize',
                              resumable=True),
    num_processes=Field(0, "jax.distributed processes (0 = from the environment)", min=0,
                        resumable=True),
    process_id=Field(-1, "this process (-1 = from the environment)", min=-1,
                     resumable=True),
    logical_axis_rules=Field(
        DEFAULT_AXIS_RULES, "logical axis -> 'data' | 'model' | '' (replicated); names "
        "given override the defaults, e.g. \"(('heads', ''),)\"", resumable=True),
))

REMAT = Field("none", "per-layer rematerialisation of the trained transformer: none | dots "
              "(dense outputs kept, attention recomputed) | full (layer inputs kept); same "
              "gradients, less memory, more compute (docs/performance.md)",
              choices=REMAT_POLICIES, resumable=True)
# The fine-tuned encoder's fields, declared once for the methods that train one.
DTYPE = Field("float32", "encoder compute dtype (params stay float32)",
              choices=("float32", "bfloat16"))
DROPOUT = Field(True, "the checkpoint's dropout rates during training")
DROPOUT_IMPL = Field("hash", "hash (integer-hash mask: same rate, the same mask on any mesh, "
                     "a cheaper step) | flax (threefry bits); docs/performance.md",
                     choices=("flax", "hash"))
LOSS_CHUNK_SIZE = Field(
    0, "loss: query rows per data device scored at a time (same loss, less memory; divides "
    "the per-device batch); 0 = all at once", min=0, resumable=True)  # contrastive.map_rows


def declare(**fields: Field | object) -> Fields:
    """:data:`BASE` extended (:meth:`Fields.extend`)."""
    return BASE.extend(**fields)


def base() -> ml_collections.ConfigDict:
    """The shared fields' defaults as a ConfigDict."""
    return BASE.config()


def axis_rules(config: ml_collections.ConfigDict) -> parallel.LogicalRules:
    """``parallel.LOGICAL_AXIS_RULES`` with the config's ``logical_axis_rules`` replacing
    those of the same name (others appended), ``""`` -> ``None``."""
    given = {str(name): (str(axis) if axis else None) for name, axis in
             (config.get("logical_axis_rules") or ())}
    rules = [(name, given.pop(name, axis)) for name, axis in parallel.LOGICAL_AXIS_RULES]
    return tuple(rules + list(given.items()))


def check_rule_names(config: ml_collections.ConfigDict, model_axes) -> None:
    """Raises ValueError for a ``logical_axis_rules`` name nothing carries (a typo)."""
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


def validate_base(config: ml_collections.ConfigDict, fields: Fields | None = None) -> None:
    """Checks the fields (``fields``, else the shared ones, unknown ones let through) and
    the shared cross-field rules. Raises ValueError: one line naming the field."""
    (fields or BASE).check(config, allow_unknown=fields is None)
    if config.num_train_steps == 0 and not config.num_epochs > 0:
        raise ValueError("config.num_epochs must be positive when num_train_steps is 0")
    if config.mesh_data == 0:
        raise ValueError("config.mesh_data must be >= 1 or -1 (the rest), got 0")
    _check_axis_rules(config.logical_axis_rules or ())
    if config.get("eval_files") or config.get("select_metric"):
        from embedding_core.evaluation.run import parse

        parse(str(config.get("eval_files", "")))
        if int(config.eval_every) <= 0:
            raise ValueError("config.eval_files and config.select_metric need "
                             "config.eval_every > 0")
    StepSplit.from_config(config)  # contrastive_chunk_size xor grad_accum_steps


def validator(fields: Fields, extra: Callable[[ml_collections.ConfigDict], None] | None = None
              ) -> Callable[[ml_collections.ConfigDict], None]:
    """A package's config check: fields, shared rules, ``extra``; ``saved=True`` lets
    fields a later version dropped through (old workdirs)."""

    def validate(config: ml_collections.ConfigDict, *, saved: bool = False) -> None:
        fields.check(config, allow_unknown=saved)
        validate_base(config)
        if extra is not None:
            extra(config)

    validate.fields = fields  # read by check_resume through run()
    return validate


def num_train_steps(config: ml_collections.ConfigDict, steps_per_epoch: int) -> int:
    """``num_train_steps`` when positive, else ``ceil(num_epochs * steps_per_epoch)`` (>= 1)."""
    if int(config.num_train_steps) > 0:
        return int(config.num_train_steps)
    return max(1, math.ceil(float(config.num_epochs) * int(steps_per_epoch)))


def check_resume(config: ml_collections.ConfigDict, workdir: str | os.PathLike,
                 fields: Fields | None = None) -> None:
    """Raises ValueError when the saved config is unreadable, of another model, or differs
    in a field not declared ``resumable`` (each named with both values)."""
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
               if not (fields or BASE).resumable(k) and saved.get(k) != new.get(k)
               and k in saved and k in new]
    if changed:
        raise ValueError(f"{workdir} was trained with other settings ({'; '.join(changed)}); "
                         "resuming would mix two runs: use a new --workdir or the saved values")


def save_config(config: ml_collections.ConfigDict, workdir: str | os.PathLike) -> None:
    """Writes ``workdir/run_config.json`` (before an older ``config.json``)."""
    from embedding_core.storage.files import write_json

    write_json(storage.as_path(workdir) / CONFIG_FILE, config.to_dict())


def read_config(
    workdir: str | os.PathLike,
    defaults: Fields | Callable[[], ml_collections.ConfigDict],
    *,
    prog: str,
    required: Iterable[str] = (),
    validate: Callable[[ml_collections.ConfigDict], None] | None = None,
) -> ml_collections.ConfigDict:
    """The config a run saved (:func:`config_path`) on today's defaults.
    Raises: FileNotFoundError: no workdir or run config. NotADirectoryError. ValueError:
    not a JSON object, a ``required`` field missing, an impossible setting."""
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
    config = defaults.config() if isinstance(defaults, Fields) else defaults()
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
            validate(config, saved=True) if hasattr(validate, "fields") else validate(config)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
    return config
