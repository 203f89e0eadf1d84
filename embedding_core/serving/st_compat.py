"""sentence-transformers' ``encode`` arguments, ``similarity`` and ``similarity_pairwise``
for every ``Encoder``, same results (``docs/models.md``, "Encoding")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
SIMILARITY_FNS = ("cosine", "dot", "euclidean", "manhattan")


def quantize(embeddings: np.ndarray, precision: str, *, ranges: np.ndarray | None = None,
             calibration_embeddings: np.ndarray | None = None) -> np.ndarray:
    """sentence-transformers' ``quantize_embeddings`` of ``[n, d]`` floats (int8 / uint8:
    256 steps of ``ranges`` ``[2, d]``, else of the calibration rows or the embeddings;
    binary: ``x > 0`` packed). Raises ValueError: an unknown precision."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: use one of {PRECISIONS}")
    x = np.asarray(embeddings)
    if precision == "float32":
        return x.astype(np.float32)
    if precision.endswith("binary"):
        bits = np.packbits(x > 0, axis=-1)
        return (bits - 128).astype(np.int8) if precision == "binary" else bits
    if ranges is None:
        source = x if calibration_embeddings is None else np.asarray(calibration_embeddings)
        ranges = np.stack([source.min(axis=0), source.max(axis=0)])
    ranges = np.asarray(ranges).astype(np.float32, copy=False)
    starts = ranges[0]
    steps = (ranges[1] - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    q = np.clip(np.floor((x - starts) / steps), 0, 255)
    return q.astype(np.uint8) if precision == "uint8" else (q - 128).astype(np.int8)


def _pairwise_matrix(a: np.ndarray, b: np.ndarray, fn: str) -> np.ndarray:
    if fn == "cosine":
        a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
        b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
        return a @ b.T
    if fn == "dot":
        return a @ b.T
    if fn == "euclidean":
        return -np.sqrt(np.maximum((a * a).sum(-1)[:, None] + (b * b).sum(-1)[None, :]
                                   - 2 * a @ b.T, 0.0))
    return -np.abs(a[:, None, :] - b[None, :, :]).sum(-1)


def check_fn(fn: str) -> str:
    if fn not in SIMILARITY_FNS:
        raise ValueError(f"similarity function {fn!r}: use one of {SIMILARITY_FNS}")
    return fn


def as_matrix(x: Any) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float32)
    return arr[None, :] if arr.ndim == 1 else arr


def similarity(a: Any, b: Any, fn: str = "cosine") -> np.ndarray:
    """``[n, m]`` float32 similarities of ``[n, d]`` and ``[m, d]`` rows (distances negated)."""
    return _pairwise_matrix(as_matrix(a), as_matrix(b), check_fn(fn)).astype(np.float32)


def similarity_pairwise(a: Any, b: Any, fn: str = "cosine") -> np.ndarray:
    """``[n]`` float32 similarity of rows i. Raises ValueError: other shapes, unknown fn."""
    a, b = as_matrix(a), as_matrix(b)
    if a.shape != b.shape:
        raise ValueError(f"similarity_pairwise needs equal shapes, got {a.shape} and {b.shape}")
    fn = check_fn(fn)
    if fn == "cosine":
        a = a / np.maximum(np.linalg.norm(a, axis=-1, keepdims=True), 1e-12)
        b = b / np.maximum(np.linalg.norm(b, axis=-1, keepdims=True), 1e-12)
        return (a * b).sum(-1).astype(np.float32)
    if fn == "dot":
        return (a * b).sum(-1).astype(np.float32)
    if fn == "euclidean":
        return -np.linalg.norm(a - b, axis=-1).astype(np.float32)
    return -np.abs(a - b).sum(-1).astype(np.float32)


def resolve_prompt(prompts: dict[str, str], prompt: str | None, prompt_name: str | None,
                   default_prompt_name: str | None = None) -> str:
    """``prompt``, else ``prompts[prompt_name or default]``, else ``""``. Raises
    ValueError: an unknown ``prompt_name``."""
    if prompt is not None:
        return prompt
    name = prompt_name if prompt_name is not None else default_prompt_name
    if name is None:
        return ""
    if name not in prompts:
        raise ValueError(f"prompt_name {name!r} is not one of this model's prompts "
                         f"{sorted(prompts)}")
    return prompts[name]


def finish(rows: np.ndarray, *, single: bool, precision: str, convert_to_numpy: bool,
           convert_to_tensor: bool, device: str | None) -> Any:
    """``[n, d]`` rows as sentence-transformers returns them: quantized, as a ``jax.Array``,
    numpy array or list; one row for a single string."""
    out = quantize(rows, precision)
    if convert_to_tensor:
        target = jax.devices(device)[0] if device else None
        tensor = jax.device_put(jnp.asarray(out), target)
        return tensor[0] if single else tensor
    if not convert_to_numpy:
        listed = list(out)
        return listed[0] if single else listed
    return out[0] if single else out


def check_device(device: str | None) -> None:
    """Raises ValueError unless ``device`` is None or a JAX platform with devices here."""
    if device is None:
        return
    try:
        jax.devices(device)
    except RuntimeError:
        raise ValueError(f"device {device!r}: no such JAX platform here (have "
                         f"{sorted({d.platform for d in jax.devices()})})") from None


def texts_of(sentences: str | Sequence[str]) -> tuple[list[str], bool]:
    """``(list of texts, whether one string was given)``.

    Raises:
      TypeError: bytes, None or another object that is no list of texts (items are checked
        by ``errors.check_texts``).
    """
    if isinstance(sentences, str):
        return [sentences], True
    if isinstance(sentences, (bytes, bytearray)):
        raise TypeError("encode takes str texts, not bytes: decode them first "
                        "(data.decode('utf-8'))")
    try:
        return list(sentences), False
    except TypeError:
        raise TypeError("encode takes a str or a list of str, got "
                        f"{type(sentences).__name__}") from None
