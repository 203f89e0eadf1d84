"""DocEnt's optimizer: AdamW, the entity side's rate, the head-only warm-up (``docs/docent.md``)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import optax

from docent_jax.model import ENTITY_PARAMS, MLM_HEAD_PARAMS
from embedding_core.training.run import default_optimizer


def scale_updates(factors: dict[str, float]) -> optax.GradientTransformation:
    """Scales parameter ``name``'s updates by ``factors[name]`` (AdamW is linear in the rate)."""

    def update(updates, state, params=None):
        return {key: jax.tree.map(lambda u, f=factors[key]: u * f, value) if key in factors
                else value for key, value in updates.items()}, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def head_only_warmup(steps: int) -> optax.GradientTransformation:
    """Only the MLM head updates in the first ``steps`` steps (counted in the state)."""

    def init(params):
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params=None):
        frozen = state.count < steps
        updates = {key: value if key in MLM_HEAD_PARAMS else jax.tree.map(
            lambda u: jnp.where(frozen, jnp.zeros_like(u), u), value)
            for key, value in updates.items()}
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformation(init, update)


def head_warmup_steps(config: ml_collections.ConfigDict, total_steps: int) -> int:
    """``mlm_warmup_steps`` (``mlm_head_init="warmup"``), at most half the run."""
    if config.variant == "dual" or config.mlm_head_init != "warmup":
        return 0
    return min(int(config.mlm_warmup_steps), int(total_steps) // 2)


def make_optimizer(config: ml_collections.ConfigDict, total_steps: int):
    """AdamW at ``learning_rate``; ``ENTITY_PARAMS`` and the MLM head at their own rates (0: the
    encoder's); the head-only warm-up."""
    tx, schedule = default_optimizer(config, total_steps)
    lr = float(config.learning_rate)
    rates = {name: float(config.entity_learning_rate) for name in ENTITY_PARAMS}
    if config.variant != "dual":
        rates.update({name: float(config.mlm_head_learning_rate)
                      for name in MLM_HEAD_PARAMS if name not in ENTITY_PARAMS})
    factors = {name: rate / lr for name, rate in rates.items() if rate and rate != lr}
    parts = [tx]
    if factors:
        parts.append(scale_updates(factors))
    warmup = head_warmup_steps(config, total_steps)
    if warmup > 0:
        parts.append(head_only_warmup(warmup))
    return (parts[0] if len(parts) == 1 else optax.chain(*parts)), schedule
