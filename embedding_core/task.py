"""The Task seam: what a model package tells the core so that the core can train it.

A package describes its model as a :class:`Task`; :func:`embedding_core.run.run` does the
rest (config checks, mesh and multi-host start-up, sharded state, resume, the loop,
periodic evaluation, checkpoints, TensorBoard). See ``docs/architecture.md``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
import optax

from embedding_core.contrastive import GradAccumulation
from embedding_core.table_update import FusedTableUpdate

# (params, global batch, dropout key) -> (scalar loss, {name: scalar}); traced under jit.
LossFn = Callable[[Any, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, dict]]
# start_step -> iterator over this process's host batches ({name: numpy array}), in order.
BatchFactory = Callable[[int], Iterator[Mapping[str, np.ndarray]]]
# (params, step) -> {metric name: float}; params are the sharded training params.
Evaluator = Callable[[Any, int], Mapping[str, float]]
# (config, total_steps) -> (optimizer, learning-rate schedule).
OptimizerFactory = Callable[[ml_collections.ConfigDict, int],
                            tuple[optax.GradientTransformation, optax.Schedule]]


@dataclasses.dataclass
class Task:
    """One model's training, as the core needs it.

    Attributes:
      name: shown in logs (e.g. ``"DualCSE-cross"``).
      init_params: ``rng -> params`` whose leaves are ``nn.LogicallyPartitioned`` boxes
        (``module.init(...)["params"]``); traced for shapes and shardings, run once under
        jit to build the state in place.
      loss_fn: the loss on the *global* batch (see :data:`LossFn`). An in-batch contrastive
        loss given as an ``embedding_core.contrastive.ContrastiveLoss`` (split at its
        embeddings) can be chunked by ``config.contrastive_chunk_size`` (GradCache).
      make_batches: resumable host batches (see :data:`BatchFactory`); a ``"step"`` entry,
        when present, is checked against the loop's step.
      num_examples: training examples (for logs and the epoch count).
      steps_per_epoch: optimizer steps in one pass over the examples.
      global_batch_size: rows of one global batch, recorded with the data position so
        that a resume with another batch size is refused.
      pretrained: ``{param path: numpy tree}`` placed over the fresh init (e.g.
        ``{("encoder", "transformer"): minilm}``); structures and shapes must match.
      evaluate: optional periodic evaluation, called every ``config.eval_every`` steps.
      run_files: ``{file name: writer(path)}``, files the run keeps beside its config
        (tokenizer, entity ids, feature recipe); written once by process 0.
      make_optimizer: a package-specific optimizer; default AdamW from the config's
        shared fields (``embedding_core.run.default_optimizer``).
      summary: one line for the log (data, sizes).
      grad_accumulation: set when the loss may be averaged over micro-batches
        (``config.grad_accum_steps``; ``embedding_core.contrastive.GradAccumulation``:
        the micro-batch weight); ``None`` refuses accumulation (an in-batch contrastive
        loss would lose negatives: it chunks instead).
      fused_table: set when the loss stops a softmax table's gradient and hands over its
        statistics: the step updates that table block by block
        (``embedding_core.table_update.FusedTableUpdate``; DocEnt's
        ``config.fused_table_update``).
      logical_axis_sizes: counts of logical axes that parameter shapes do not show, which a
        mesh axis must divide to split them (``embedding_core.parallel.fit_rules``), e.g.
        ``{"heads": 12}``: the ``"heads"`` columns of a 12-head encoder are split over
        ``model`` only when its size divides 12 (whole heads per device).
    """

    name: str
    init_params: Callable[[jax.Array], Any]
    loss_fn: LossFn
    make_batches: BatchFactory
    num_examples: int
    steps_per_epoch: int
    global_batch_size: int
    pretrained: Mapping[tuple[str, ...], Any] = dataclasses.field(default_factory=dict)
    evaluate: Evaluator | None = None
    run_files: Mapping[str, Callable[[Any], None]] = dataclasses.field(default_factory=dict)
    make_optimizer: OptimizerFactory | None = None
    summary: str = ""
    grad_accumulation: GradAccumulation | None = None
    logical_axis_sizes: Mapping[str, int] = dataclasses.field(default_factory=dict)
    fused_table: FusedTableUpdate | None = None
