"""DocEnt's optimizer: the shared AdamW, a separate learning rate for the entity side and
the optional head-only MLM warm-up (``docs/docent.md``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax

from docent_jax.model import ENTITY_PARAMS, MLM_HEAD_PARAMS
from embedding_core.run import default_optimizer


def scale_entity_updates(factor: float) -> optax.GradientTransformation:
    """Multiplies the updates of the entity table and scale (``ENTITY_PARAMS``) by ``factor``.

    Chained after AdamW with learning rate ``lr`` this is AdamW with ``factor * lr`` on those
    parameters (Adam's update, weight decay included, is linear in the learning rate), with
    a stateless transformation: no masked optimizer states to shard or checkpoint.
    """

    def update(updates, state, params=None):
        return {key: jax.tree.map(lambda u: u * factor, value) if key in ENTITY_PARAMS
                else value for key, value in updates.items()}, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def head_only_warmup(steps: int) -> optax.GradientTransformation:
    """Zeroes the updates of every parameter but the fresh MLM head (``MLM_HEAD_PARAMS``)
    during the first ``steps`` optimizer steps (``config.mlm_head_init="warmup"``).

    The step count lives in the state, so a resumed run freezes exactly the steps the
    uninterrupted one would have.
    """

    def init(params):
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params=None):
        frozen = state.count < steps
        updates = {key: value if key in MLM_HEAD_PARAMS else jax.tree.map(
            lambda u: jnp.where(frozen, jnp.zeros_like(u), u), value)
            for key, value in updates.items()}
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformation(init, update)


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int):
    """The shared AdamW; the entity table, bias and scale get ``entity_learning_rate`` when
    set (a fresh table learns from scratch while the encoder is fine-tuned: our choice, the
    paper gives no rates); Full/Hybrid with ``mlm_head_init="warmup"`` train only the MLM
    head for the first ``mlm_warmup_steps`` steps."""
    tx, schedule = default_optimizer(config, total_steps)
    parts = [tx]
    if config.entity_learning_rate and config.entity_learning_rate != config.learning_rate:
        parts.append(scale_entity_updates(config.entity_learning_rate / config.learning_rate))
    if config.variant != "dual" and config.mlm_head_init == "warmup" and \
            int(config.mlm_warmup_steps) > 0:
        parts.append(head_only_warmup(int(config.mlm_warmup_steps)))
    return (parts[0] if len(parts) == 1 else optax.chain(*parts)), schedule
