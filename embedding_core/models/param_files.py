"""A Flax parameter tree as one safetensors file, a tensor per leaf (``docs/export.md``,
"MRWE"): readable with ``safetensors.numpy.load_file`` alone."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np


def save_param_tree(path: str | os.PathLike, params: Mapping[str, Any],
                    metadata: Mapping[str, str] | None = None) -> None:
    """float32 leaves named by ``/``-joined paths, ``metadata`` in the header.
    Raises ValueError: a key holding ``/`` or an empty tree."""
    import flax.linen as nn
    import jax
    from flax import traverse_util

    flat = traverse_util.flatten_dict(jax.device_get(nn.unbox(dict(params))))
    if not flat:
        raise ValueError("no parameters to save")
    bad = ["/".join(map(str, k)) for k in flat if any("/" in str(part) for part in k)]
    if bad:
        raise ValueError(f"parameter keys may not contain '/': {bad}")
    from safetensors.numpy import save_file

    save_file({"/".join(k): np.ascontiguousarray(np.asarray(v, np.float32))
               for k, v in flat.items()}, str(path),
              metadata={"format": "flax", **{str(k): str(v) for k, v in (metadata or {}).items()}})


def load_param_tree(path: str | os.PathLike) -> tuple[dict[str, Any], dict[str, str]]:
    """``(nested float32 numpy tree, metadata)``. Raises FileNotFoundError."""
    from flax import traverse_util
    from safetensors import safe_open
    from safetensors.numpy import load_file

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no such parameter file")
    with safe_open(path, framework="np") as f:
        metadata = dict(f.metadata() or {})
    flat = {tuple(name.split("/")): array for name, array in load_file(path).items()}
    return traverse_util.unflatten_dict(flat), metadata
