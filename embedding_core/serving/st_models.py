"""A sentence-transformers folder (Transformer, Pooling, Dense, Normalize) or a plain HF
encoder folder (mean pooling) as an ``inference.Encoder`` with sentence-transformers'
numbers (``docs/models.md``, "load_encoder")."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from embedding_core.models import pretrained
from embedding_core.serving.inference import (
    Encoder,
    check_truncate_dim,
    encode_in_batches,
    masked_mean,
)
from embedding_core.serving.st_tokenizer import CallableTokenizer
from embedding_core.storage import storage

POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
_LEGACY_POOLING = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                   "pooling_mode_mean_tokens": "mean",
                   "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                   "pooling_mode_weightedmean_tokens": "weightedmean",
                   "pooling_mode_lasttoken": "lasttoken"}
ACTIVATIONS = {"Identity": lambda x: x, "Tanh": jnp.tanh, "ReLU": jax.nn.relu,
                "GELU": lambda x: jax.nn.gelu(x, approximate=False), "Sigmoid": jax.nn.sigmoid}


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """A folder's modules after the transformer; ``dense``: ``(kernel [in, out], bias,
    activation)`` each."""

    pooling: tuple[str, ...] = ("mean",)
    include_prompt: bool = True
    dense: tuple[tuple[np.ndarray, np.ndarray | None, str], ...] = ()
    normalize: bool = False
    max_seq_length: int = 512
    do_lower_case: bool = False
    model_max_length: int = 512


def _json(path: pathlib.Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: line {err.lineno}: invalid JSON ({err.msg})") from None


def _pooling(folder: pathlib.Path) -> tuple[tuple[str, ...], bool]:
    raw = _json(folder / "config.json")
    modes = raw.get("pooling_mode")
    if modes is None:
        modes = [m for key, m in _LEGACY_POOLING.items() if raw.get(key)]
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    bad = [m for m in modes if m not in POOLING_MODES]
    if bad or not modes:
        raise ValueError(f"{folder / 'config.json'}: pooling mode {bad or modes} is not one of "
                         f"{POOLING_MODES}")
    return modes, bool(raw.get("include_prompt", True))


def _dense(folder: pathlib.Path) -> tuple[np.ndarray, np.ndarray | None, str]:
    from safetensors.numpy import load_file

    raw = _json(folder / "config.json")
    name = str(raw.get("activation_function", "torch.nn.modules.linear.Identity")).split(".")[-1]
    if name not in ACTIVATIONS:
        raise ValueError(f"{folder / 'config.json'}: activation {name!r} is not one of "
                         f"{sorted(ACTIVATIONS)}")
    weights = folder / "model.safetensors"
    if not weights.is_file():
        raise FileNotFoundError(f"{folder} has no model.safetensors (the Dense layer's weights)")
    tensors = load_file(str(weights))
    kernel = np.asarray(tensors["linear.weight"], np.float32).T  # torch [out, in]
    bias = tensors.get("linear.bias")
    return kernel, None if bias is None else np.asarray(bias, np.float32), name


def read_pipeline(model_dir: pathlib.Path, max_positions: int) -> Pipeline:
    """The modules of ``model_dir`` (none: mean pooling). Raises ValueError: a module type
    we do not run, or a bad module config."""
    bert_config = model_dir / "sentence_bert_config.json"
    settings = _json(bert_config) if bert_config.is_file() else {}
    tokenizer_config = model_dir / "tokenizer_config.json"
    model_max = _json(tokenizer_config).get("model_max_length") if tokenizer_config.is_file() \
        else None
    limit = max_positions if not isinstance(model_max, int) else min(max_positions, model_max)
    base = dict(max_seq_length=int(settings.get("max_seq_length") or limit),
                do_lower_case=bool(settings.get("do_lower_case", False)),
                model_max_length=int(limit))
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return Pipeline(**base)
    pooling, include_prompt, dense, normalize = ("mean",), True, [], False
    for module in _json(modules_file):
        kind = str(module.get("type", "")).split(".")[-1]
        path = model_dir / module.get("path", "")
        if kind == "Transformer":
            continue
        if kind == "Pooling":
            pooling, include_prompt = _pooling(path)
        elif kind == "Dense":
            dense.append(_dense(path))
        elif kind == "Normalize":
            normalize = True
        else:
            raise ValueError(f"{modules_file}: module type {module.get('type')!r} is not one "
                             "we run (Transformer, Pooling, Dense, Normalize)")
    return Pipeline(pooling=pooling, include_prompt=include_prompt, dense=tuple(dense),
                    normalize=normalize, **base)


def pool(hidden: jax.Array, mask: jax.Array, modes: tuple[str, ...]) -> jax.Array:
    """sentence-transformers' ``Pooling``: ``[b, L, d]``, mask ``[b, L]`` -> float32
    ``[b, len(modes) * d]``."""
    m = mask.astype(jnp.float32)
    h = hidden.astype(jnp.float32)
    out = []
    for mode in modes:
        if mode == "cls":  # the first position the mask keeps
            first = jnp.argmax(mask, axis=1)
            out.append(jnp.take_along_axis(h, first[:, None, None], axis=1)[:, 0])
        elif mode == "max":
            out.append(jnp.max(jnp.where(m[..., None] > 0, h, -jnp.inf), axis=1))
        elif mode == "mean":
            out.append(masked_mean(h, mask))
        elif mode == "mean_sqrt_len_tokens":
            total = jnp.sum(h * m[..., None], axis=1)
            out.append(total / jnp.sqrt(jnp.maximum(jnp.sum(m, axis=1, keepdims=True), 1e-9)))
        elif mode == "weightedmean":  # position weights 1, 2, ... (right padding)
            w = m * jnp.arange(1, m.shape[1] + 1, dtype=jnp.float32)[None]
            out.append(jnp.sum(h * w[..., None], axis=1)
                       / jnp.maximum(jnp.sum(w, axis=1, keepdims=True), 1e-9))
        elif mode == "lasttoken":
            last = jnp.maximum(jnp.sum(mask, axis=1) - 1, 0).astype(jnp.int32)
            out.append(jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0])
    return jnp.concatenate(out, axis=-1)


class PretrainedEncoder(Encoder):
    """A pretrained encoder folder (:func:`load_encoder`)."""

    default_batch_size = 32

    def __init__(self, model_dir: pathlib.Path, name: str) -> None:
        from tokenizers import Tokenizer

        self.model_dir, self.name = model_dir, name
        tokenizer_file = model_dir / "tokenizer.json"
        if not tokenizer_file.is_file():  # checked before the weights load
            raise FileNotFoundError(f"No tokenizer.json in {model_dir}. "
                                    f"{pretrained.WHAT_TO_PASS}")
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
        except Exception as err:  # tokenizers raises a bare Exception
            raise ValueError(f"{tokenizer_file}: not a tokenizer.json the tokenizers "
                             f"library reads ({err})") from None
        self.pretrained = pretrained.load_pretrained(model_dir)
        config = self.pretrained.config
        self.pipeline = read_pipeline(model_dir,
                                      config.max_position_embeddings - config.position_offset)
        self._max_length = self.pipeline.max_seq_length
        self._tokenizer = tokenizer
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self.tokenizer = CallableTokenizer(
            self._tokenizer, model_max_length=self.pipeline.model_max_length,
            token_types=config.model_type in ("bert", "electra"),
            pad_token_id=_pad_id(self._tokenizer, config.pad_token_id))
        st_config = model_dir / "config_sentence_transformers.json"
        extra = _json(st_config) if st_config.is_file() else {}
        self.prompts = dict(extra.get("prompts") or {})
        self.default_prompt_name = extra.get("default_prompt_name")
        self.similarity_fn_name = extra.get("similarity_fn_name") or "cosine"
        self.params = jax.device_put(self.pretrained.params)
        module, pipe = self.pretrained.module, self.pipeline

        def forward(params, ids, mask, types, prompt_length):
            hidden = module.apply({"params": params}, ids, mask, types).last_hidden_state
            keep = mask
            if not pipe.include_prompt:  # prompt tokens (and [CLS]) out of the pooling
                keep = jnp.where(jnp.arange(ids.shape[1])[None] < prompt_length, 0, mask)
            x = pool(hidden, keep, pipe.pooling)
            for kernel, bias, act in pipe.dense:
                x = x @ kernel + (0.0 if bias is None else bias)
                x = ACTIVATIONS[act](x)
            if pipe.normalize:
                x = x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)
            return x

        self._forward = jax.jit(forward)
        self._hidden = jax.jit(
            lambda params, ids, mask, types: module.apply({"params": params}, ids, mask, types)
            .last_hidden_state.astype(jnp.float32))
        self._sharding = None

    def use_local_devices(self) -> None:
        """Split each batch over this process's devices, parameters replicated."""
        from jax.sharding import Mesh, NamedSharding, PartitionSpec

        devices = jax.local_devices()
        if len(devices) > 1:
            mesh = Mesh(np.array(devices), ("data",))
            self._sharding = NamedSharding(mesh, PartitionSpec("data"))
            self.params = jax.device_put(self.params, NamedSharding(mesh, PartitionSpec()))

    @property
    def dim(self) -> int:
        if self.pipeline.dense:
            return int(self.pipeline.dense[-1][0].shape[1])
        return len(self.pipeline.pooling) * int(self.pretrained.config.hidden_size)

    @property
    def max_seq_length(self) -> int:
        return self._max_length

    @max_seq_length.setter
    def max_seq_length(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 2:
            raise ValueError(f"max_seq_length must be an int >= 2, got {value!r}")
        config = self.pretrained.config
        positions = config.max_position_embeddings - config.position_offset
        if value > positions:  # it would fail at the first long text, inside the model
            raise ValueError(f"max_seq_length {value} is more than the {positions} token "
                             f"positions {self.name} has; give at most {positions}")
        self._max_length = int(value)

    def save(self, folder: str) -> None:
        """The folder as loaded, with the current ``max_seq_length``. Raises
        FileExistsError: ``folder`` is a file or not empty."""
        from embedding_core.serving import hf_export

        with hf_export.staged_output(folder) as stage:
            for path in sorted(self.model_dir.rglob("*")):
                if path.is_file():
                    target = stage / path.relative_to(self.model_dir)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(path.read_bytes())
            settings = stage / "sentence_bert_config.json"
            raw = _json(settings) if settings.is_file() else {}
            raw["max_seq_length"] = self._max_length
            settings.write_text(json.dumps(raw, indent=2))

    def encode(self, sentences, prompt_name=None, prompt=None, *args, **kwargs) -> Any:
        from embedding_core.serving import st_compat

        # The prompt's own token count (less its closing special token), for include_prompt.
        text = st_compat.resolve_prompt(self.prompts, prompt, prompt_name,
                                        self.default_prompt_name)
        self._prompt_length = (len(self._tokenizer.encode(self._case(text)).ids) - 1
                               if text else 0)
        return super().encode(sentences, prompt_name, prompt, *args, **kwargs)

    def tokenize(self, texts: Sequence[str | tuple[str, str]]) -> dict[str, np.ndarray]:
        """sentence-transformers' ``tokenize`` of texts or pairs: int64 ``[len(texts), L]``
        numpy arrays."""
        if isinstance(texts, str) or texts is None or not hasattr(texts, "__iter__"):
            raise TypeError("tokenize takes a list of texts or of (text, text) pairs, got "
                            f"{type(texts).__name__}")
        texts = list(texts)
        pairs = [(t, None) if isinstance(t, str) else t for t in texts]
        for i, pair in enumerate(pairs):
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                    and isinstance(pair[0], str) and isinstance(pair[1], (str, type(None)))):
                raise TypeError(f"texts[{i}] is a {type(texts[i]).__name__}, not a str or a "
                                "(str, str) pair")
        if not pairs:
            return {k: np.zeros((0, 0), np.int64) for k in self.tokenizer.model_input_names}
        first = [self._case(str(a).strip()) for a, _ in pairs]
        second = None if all(b is None for _, b in pairs) else \
            [self._case(str(b).strip()) for _, b in pairs]
        return dict(self.tokenizer(first, second, padding=True, truncation=True,
                                   max_length=self._max_length, return_tensors="np"))

    preprocess = tokenize  # sentence-transformers 6's name for it

    def __repr__(self) -> str:
        raw = _json(self.model_dir / "config.json")
        architecture = (raw.get("architectures") or [raw.get("model_type")])[0]
        pipe, hidden = self.pipeline, int(self.pretrained.config.hidden_size)
        modules = [f"Transformer({{'max_seq_length': {self._max_length}, 'do_lower_case': "
                   f"{pipe.do_lower_case}, 'architecture': {architecture!r}}})",
                   f"Pooling({{'embedding_dimension': {hidden}, 'pooling_mode': "
                   f"{(pipe.pooling[0] if len(pipe.pooling) == 1 else pipe.pooling)!r}, "
                   f"'include_prompt': {pipe.include_prompt}}})"]
        modules += [f"Dense({{'in_features': {kernel.shape[0]}, 'out_features': "
                    f"{kernel.shape[1]}, 'bias': {bias is not None}, 'activation_function': "
                    f"{act!r}}})" for kernel, bias, act in pipe.dense]
        modules += ["Normalize()"] * pipe.normalize
        lines = "".join(f"  ({i}): {m}\n" for i, m in enumerate(modules))
        return f"{type(self).__name__}(\n{lines})"

    def _case(self, text: str) -> str:
        return text.lower() if self.pipeline.do_lower_case else text

    token_outputs = True

    def _token_ids(self, texts: list[str]) -> tuple[list, np.ndarray]:
        """The encodings (a template may give a suffix type 1) and their lengths."""
        self._tokenizer.enable_truncation(max_length=self._max_length)
        try:
            encodings = self._tokenizer.encode_batch([self._case(t) for t in texts])
        finally:
            self._tokenizer.no_truncation()
        return encodings, np.array([len(e.ids) for e in encodings])

    def _token_rows(self, texts: list[str], *, batch_size: int, show_progress_bar: bool
                    ) -> list[dict[str, np.ndarray]]:
        ids, lengths = self._token_ids(texts)
        hidden = self._run(ids, lengths, batch_size, show_progress_bar,
                           lambda x: self._hidden(self.params, *x), rows_out=True)
        return [{"input_ids": np.asarray(e.ids, np.int32), "token_embeddings": h[:n]}
                for e, h, n in zip(ids, hidden, lengths, strict=True)]

    def _encode(self, texts: list[str], *, batch_size: int, show_progress_bar: bool
                ) -> np.ndarray:
        ids, lengths = self._token_ids(texts)
        prompt_length = getattr(self, "_prompt_length", 0)
        return self._run(ids, lengths, batch_size, show_progress_bar,
                         lambda x: self._forward(self.params, *x, prompt_length))

    def _run(self, ids, lengths, batch_size, show_progress_bar, forward, rows_out=False):
        pad_id = self.tokenizer.pad_token_id

        rows_per_call = batch_size
        if self._sharding is not None:  # a whole number of rows per device
            rows_per_call = -(-batch_size // self._sharding.mesh.size) * self._sharding.mesh.size

        def build(rows: np.ndarray, width: int):
            batch = np.full((rows_per_call, width), pad_id, np.int32)
            mask = np.zeros((rows_per_call, width), np.int32)
            types = np.zeros((rows_per_call, width), np.int32)
            for j, r in enumerate(rows):
                batch[j, :lengths[r]] = ids[r].ids
                types[j, :lengths[r]] = ids[r].type_ids
                mask[j, :lengths[r]] = 1
            if self._sharding is not None:
                return jax.device_put((batch, mask, types), self._sharding)
            return batch, mask, types

        return encode_in_batches(
            lengths, build, forward, batch_size=batch_size,
            max_width=int(lengths.max()), show_progress_bar=show_progress_bar, desc="encode",
            rows_out=rows_out)


def _pad_id(tokenizer, fallback: int) -> int:
    for token in ("[PAD]", "<pad>"):
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return int(fallback)


def load_encoder(name_or_path: str | os.PathLike, *, truncate_dim: int | None = None
                 ) -> Encoder:
    """A folder (local or ``gs://``), installed package, hub id or workdir of ours as an
    ``Encoder`` (``docs/models.md``, "load_encoder").

    Raises: FileNotFoundError, ValueError: one line each; ``truncate_dim`` not an int >= 1.
    """
    from embedding_core.serving import workdirs

    check_truncate_dim(truncate_dim)
    if not isinstance(name_or_path, str) or "://" in name_or_path \
            or os.path.exists(name_or_path):
        if workdirs.is_workdir(name_or_path):
            encoder = workdirs.load_workdir(name_or_path)
            encoder.truncate_dim = truncate_dim
            return encoder
    model_dir = pretrained.resolve_model_dir(name_or_path)
    encoder = PretrainedEncoder(model_dir, name=storage.display(name_or_path)
                                if storage.is_remote(name_or_path) else str(name_or_path))
    encoder.truncate_dim = None if truncate_dim is None else int(truncate_dim)
    return encoder
