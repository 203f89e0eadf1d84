"""Encoding sentences with a trained (or untrained) model: ``load(workdir).encode(texts)``.

``load`` restores the checkpoint's parameters alone (no optimizer, no Adam moments) and
returns an :class:`Embedder`, an ``embedding_core.inference.Encoder``: ``encode(texts,
kind="explicit")`` gives r, ``kind="implicit"`` gives u, each one float32 ``[N, dim]``
array (``docs/architecture.md``).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import ml_collections
import numpy as np

from data_pipelines.tokenization import load_tokenizer, require_text_tokens, tokenize
from dualcse_jax.configs import default, validate_config
from dualcse_jax.model import KINDS, DualEncoder, build_model, init_fn
from embedding_core import configs, multihost, parallel, storage, training
from embedding_core.encoders import EncoderConfig
from embedding_core.inference import Encoder, encode_in_batches, l2_normalize, token_batch_builder
from embedding_core.pretrained import workdir_model_dir

PROG = "dualcse-jax"
# Fields without which the model cannot be rebuilt from a saved run_config.json.
REQUIRED_FIELDS = ("model", "architecture", "pooling", "max_length", "dtype")


class Embedder(Encoder):
    """Turns sentences into DualCSE's explicit (r) and implicit (u) vectors.

    Sentences are sorted by length and padded to a multiple of ``pad_multiple`` per batch
    (``embedding_core.inference.encode_in_batches``), so few shapes are compiled and little
    padding is computed; rows come back in input order. For a one-vector model (SimCSE, the
    untrained baseline) r and u are the same vector.

    Attributes:
      model, params, tokenizer, config: the Flax module, its parameters, the tokenizer and
        the run's config; ``params`` may be swapped (periodic evaluation does).
      step: the checkpoint step (``None`` for in-memory params).
    """

    def __init__(self, model: DualEncoder, params: Any, tokenizer,
                 config: ml_collections.ConfigDict, *, step: int | None = None,
                 pad_multiple: int = 8):
        self.model = model
        self.params = params
        self.tokenizer = tokenizer
        self.config = config
        self.step = step
        self.default_batch_size = int(config.get("eval_batch_size", 64))
        self.pad_multiple = pad_multiple
        self._apply = jax.jit(self._forward, static_argnums=(4,))

    @property
    def dim(self) -> int:
        return int(self.model.config.hidden_size)

    def _forward(self, params, ids, mask, types, kind):
        return self.model.apply({"params": params}, ids, mask, types, kind,
                                method=DualEncoder.encode_single)

    def _encode(self, texts: list[str], *, batch_size: int, show_progress_bar: bool,
                kind: str = "explicit") -> np.ndarray:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: use 'explicit' (r) or 'implicit' (u)")
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

    def encode(self, texts, *, batch_size: int | None = None, normalize: bool | None = None,
               show_progress_bar: bool = False, kind: str = "explicit") -> np.ndarray:
        """Encodes sentences into one float32 ``[len(texts), dim]`` array; row i = texts[i].

        Args:
          texts: a list of sentences; an empty or whitespace-only one raises ``ValueError``
            naming its index, a single string ``TypeError``.
          batch_size: sentences per encoder call (default: the run's ``eval_batch_size``).
          normalize: unit L2 rows; ``None`` (default) follows the run's
            ``config.normalize`` (False unless the run asked for it).
          show_progress_bar: a tqdm bar over batches.
          kind: ``"explicit"`` for r, ``"implicit"`` for u.

        Raises:
          TypeError, ValueError: bad texts, ``batch_size`` < 1 or an unknown ``kind``.
        """
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}: use 'explicit' (r) or 'implicit' (u)")
        if normalize is None:
            normalize = bool(self.config.get("normalize", False))
        elif not isinstance(normalize, (bool, np.bool_)):
            raise TypeError(f"normalize must be True, False or None, got {normalize!r}")
        out = super().encode(texts, batch_size=batch_size, normalize=False,
                             show_progress_bar=show_progress_bar, kind=kind)
        return l2_normalize(out) if normalize else out


def read_config(workdir: str | os.PathLike) -> ml_collections.ConfigDict:
    """The training config saved in the workdir (``run_config.json``), on today's defaults.

    Raises:
      FileNotFoundError: no workdir or no run config. ValueError: it is not a JSON object,
        lacks a field the model needs, or holds an impossible setting (the message names
        the file).
    """
    return configs.read_config(workdir, default.get_config, prog=PROG,
                               required=REQUIRED_FIELDS, validate=validate_config)


def load(workdir: str | os.PathLike, *, step: int | None = None) -> Embedder:
    """Loads the latest (or a given) checkpoint of a training workdir for encoding.

    Only the checkpoint's parameters are read, onto a data-parallel mesh of all devices;
    each process keeps its own whole copy (``embedding_core.multihost.localize``), so that
    several processes can each encode their slice of the texts.

    Raises:
      FileNotFoundError: no ``run_config.json`` or no checkpoint in ``workdir``, or (a
        workdir without its ``encoder/`` copy) the config's model is gone.
      ValueError: a damaged run_config.json; ``embedding_core.checkpoints.
        IncompatibleCheckpointError`` for a checkpoint of the older layout.
    """
    config = read_config(workdir)
    # The encoder's shape and tokenizer: the workdir's copy, or the base model for older
    # runs; its weights are never read (the checkpoint holds them all).
    model_dir = workdir_model_dir(workdir, config.model)
    model = build_model(config, EncoderConfig.from_hf_config(model_dir))
    step, params = training.restore_params(
        storage.as_path(workdir) / "checkpoints", init_fn(model), parallel.make_mesh(-1, 1),
        step=step, rules=configs.axis_rules(config))
    return Embedder(model, multihost.localize(params), load_tokenizer(model_dir), config,
                    step=step)
