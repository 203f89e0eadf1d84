"""Hugging Face / sentence-transformers folders from a trained encoder (``docs/export.md``)."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from tokenizers import Tokenizer, processors

from embedding_core.models.encoders import DISTILBERT_FIELDS, OFFSET_POSITIONS, EncoderConfig
from embedding_core.models.pretrained import param_shapes, rename
from embedding_core.storage import storage
from embedding_core.storage.files import default_file_mode

WEIGHTS_FILE = "model.safetensors"
INFO_FILE = "export_info.json"  # provenance, for people and tests
POOLINGS = ("cls", "mean")
ACTIVATIONS = {"identity": "torch.nn.modules.linear.Identity",
               "tanh": "torch.nn.modules.activation.Tanh"}
SIMILARITIES = ("cosine", "dot", "euclidean")  # sentence-transformers' similarity_fn_name
_HF_ARCHITECTURES = {"bert": "BertModel", "roberta": "RobertaModel", "mpnet": "MPNetModel",
                     "distilbert": "DistilBertModel", "electra": "ElectraModel"}
# Special tokens by role, in the order they are looked for in a tokenizer's vocabulary.
_SPECIAL_ROLES = {
    "cls_token": ("[CLS]", "<s>"), "sep_token": ("[SEP]", "</s>"),
    "pad_token": ("[PAD]", "<pad>"), "unk_token": ("[UNK]", "<unk>"),
    "mask_token": ("[MASK]", "<mask>"), "bos_token": ("<s>",), "eos_token": ("</s>",),
}


def hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """``(checkpoint tensor name, transposed?)``: ``("encoder", "layer_3", ..., "kernel")``
    -> ``("encoder.layer.3....weight", True)``. Raises ValueError: an unknown leaf."""
    parts: list[str] = []
    for part in path[:-1]:
        if part.startswith("layer_") and part[len("layer_"):].isdigit():
            parts += ["layer", part[len("layer_"):]]
        else:
            parts.append(part)
    leaf = path[-1]
    names = {"kernel": ("weight", True), "scale": ("weight", False),
             "embedding": ("weight", False), "bias": ("bias", False)}
    if leaf not in names:
        raise ValueError(f"encoder parameter {'/'.join(path)}: no checkpoint name for a "
                         f"{leaf!r} leaf")
    name, transpose = names[leaf]
    return ".".join([*parts, name]), transpose


def hf_tensors(params: Mapping[str, Any], config: EncoderConfig) -> dict[str, np.ndarray]:
    """Encoder params as float32 HF checkpoint tensors, the inverse of
    ``pretrained.load_pretrained_params``. Raises ValueError: the tree differs (all listed)."""
    import flax.linen as nn
    import jax
    from flax import traverse_util

    flat = traverse_util.flatten_dict(jax.device_get(nn.unbox(dict(params))))
    expected = param_shapes(config)
    problems = [f"missing {'/'.join(p)}" for p in expected if p not in flat]
    problems += [f"unexpected {'/'.join(p)}" for p in flat if p not in expected]
    problems += [f"{'/'.join(p)}: shape {tuple(np.shape(v))}, the config gives {expected[p]}"
                 for p, v in flat.items() if p in expected and tuple(np.shape(v)) != expected[p]]
    if problems:
        raise ValueError(f"the parameters are not those of a {config.model_type} encoder with "
                         f"{config.num_layers} layers, hidden {config.hidden_size}: "
                         + "; ".join(problems))
    tensors = {}
    for path, value in flat.items():
        name, transpose = hf_name(path)
        name = rename(name, config.model_type, inverse=True)
        array = np.asarray(value, dtype=np.float32)
        tensors[name] = np.ascontiguousarray(array.T if transpose else array)
    return tensors


def hf_config(config: EncoderConfig, tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """The HF ``config.json`` dict ``EncoderConfig.from_hf_config`` reads back."""
    out: dict[str, Any] = {
        "architectures": [_HF_ARCHITECTURES[config.model_type]],
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_act,
        "hidden_dropout_prob": config.hidden_dropout_rate,
        "attention_probs_dropout_prob": config.attention_dropout_rate,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    if config.model_type == "mpnet":
        out["relative_attention_num_buckets"] = config.relative_attention_num_buckets
    if config.model_type == "electra":
        out["embedding_size"] = config.embedding_width
    if config.model_type in ("mpnet", "distilbert"):  # no token types
        del out["type_vocab_size"]
    if config.model_type == "distilbert":  # its own field names
        for ours, theirs in DISTILBERT_FIELDS.items():
            out[theirs] = out.pop(ours)
        out["sinusoidal_pos_embds"] = False
        del out["position_embedding_type"]
    if config.model_type in OFFSET_POSITIONS and tokenizer is not None:
        for key, token in (("bos_token_id", "<s>"), ("eos_token_id", "</s>")):
            token_id = tokenizer.token_to_id(token)
            if token_id is not None:
                out[key] = int(token_id)
    return out


def suffix_template(tokenizer: Tokenizer, suffix: str) -> processors.TemplateProcessing:
    """A post-processor making each text ``s`` the pair ``(s, suffix)`` (BERT: ``[CLS] $A
    [SEP] explicit:1 [SEP]:1``). Raises ValueError: no suffix token, or an odd template."""
    work = Tokenizer.from_str(tokenizer.to_str())
    work.no_padding()
    work.no_truncation()
    encoding = work.encode("a", suffix)
    pieces: list[str] = []
    special: dict[str, int] = {}
    for token, token_id, type_id, seq in zip(encoding.tokens, encoding.ids, encoding.type_ids,
                                             encoding.sequence_ids, strict=True):
        if seq == 0:
            if not pieces or pieces[-1] != f"$A:{type_id}":
                pieces.append(f"$A:{type_id}")
            continue
        if ":" in token or special.get(token, token_id) != token_id:
            raise ValueError(f"cannot write the suffix {suffix!r} into a template: token "
                             f"{token!r} (id {token_id})")
        special[token] = token_id
        pieces.append(f"{token}:{type_id}")
    if sum(p.startswith("$A") for p in pieces) != 1 or 1 not in encoding.sequence_ids:
        raise ValueError(f"the tokenizer's pair encoding of ('a', {suffix!r}) is "
                         f"{encoding.tokens}: expected the text once and the suffix's tokens")
    a_type = next(p for p in pieces if p.startswith("$A")).split(":")[1]
    pair = list(pieces) + [f"$B:{a_type}"]
    return processors.TemplateProcessing(single=pieces, pair=pair,
                                         special_tokens=list(special.items()))


def special_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    """``{"cls_token": "[CLS]", ...}`` among the tokenizer's special tokens."""
    added = {t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special}
    roles = {}
    for role, candidates in _SPECIAL_ROLES.items():
        for token in candidates:
            if token in added:
                roles[role] = token
                break
    return roles


def tokenizer_files(tokenizer: Tokenizer, max_length: int,
                    suffix: str | None = None) -> dict[str, bytes]:
    """``tokenizer.json``, ``tokenizer_config.json`` (the generic fast class keeps the
    post-processor) and ``special_tokens_map.json``. Raises ValueError (:func:`suffix_template`)."""
    work = Tokenizer.from_str(tokenizer.to_str())
    work.no_padding()
    work.no_truncation()
    if suffix is not None:
        work.post_processor = suffix_template(work, suffix)
    roles = special_tokens(work)
    # The generic class returns only the inputs named: segment ids carry the indicator.
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(max_length),
              "clean_up_tokenization_spaces": False,
              "model_input_names": ["input_ids", "token_type_ids", "attention_mask"], **roles}
    return {"tokenizer.json": work.to_str(pretty=True).encode("utf-8"),
            "tokenizer_config.json": _json_bytes(config),
            "special_tokens_map.json": _json_bytes(roles)}


@dataclass(frozen=True)
class SentenceHead:
    """Pooling, an optional dense layer (``dense_kernel`` ``[in, out]``) and unit rows."""

    pooling: str
    dense_kernel: Any = None
    dense_bias: Any = None
    activation: str = "identity"
    normalize: bool = False

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling {self.pooling!r}: use one of {POOLINGS}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation {self.activation!r}: use one of {tuple(ACTIVATIONS)}")
        if self.dense_kernel is None and self.dense_bias is not None:
            raise ValueError("dense_bias without dense_kernel")
        if self.dense_kernel is not None and np.ndim(self.dense_kernel) != 2:
            raise ValueError(f"dense_kernel must be [in, out], got shape "
                             f"{np.shape(self.dense_kernel)}")

    def dim(self, hidden_size: int) -> int:
        return hidden_size if self.dense_kernel is None else int(np.shape(self.dense_kernel)[1])


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _save_tensors(path: pathlib.Path, tensors: Mapping[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    # transformers refuses a safetensors file whose metadata names no format.
    save_file(dict(tensors), str(path), metadata={"format": "pt"})


def write_sentence_transformer(folder: str | os.PathLike, *, encoder_params: Mapping[str, Any],
                               encoder_config: EncoderConfig, tokenizer: Tokenizer, max_length: int,
                               head: SentenceHead, similarity: str = "cosine",
                               suffix: str | None = None, pooler: tuple[Any, Any] | None = None,
                               info: Mapping[str, Any] | None = None, readme: str = "") -> None:
    """Writes one Hugging Face + sentence-transformers folder; ``pooler``: BERT's
    ``(kernel, bias)`` (None: zeros); ``info``: ``export_info.json``.

    Raises: ValueError: :func:`hf_tensors`, :func:`suffix_template`, a dense kernel not
    taking the hidden size, an unknown similarity. TypeError: ``info`` not JSON."""
    if similarity not in SIMILARITIES:
        raise ValueError(f"similarity {similarity!r}: use one of {SIMILARITIES}")
    hidden = encoder_config.hidden_size
    if head.dense_kernel is not None and np.shape(head.dense_kernel)[0] != hidden:
        raise ValueError(f"dense kernel {np.shape(head.dense_kernel)} does not take the "
                         f"encoder's {hidden}-wide vectors")
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, bytes] = {
        "config.json": _json_bytes(hf_config(encoder_config, tokenizer)),
        "sentence_bert_config.json": _json_bytes({"max_seq_length": int(max_length),
                                                  "do_lower_case": False}),
        "config_sentence_transformers.json": _json_bytes({
            "prompts": {}, "default_prompt_name": None,
            "similarity_fn_name": similarity}),
        "1_Pooling/config.json": _json_bytes({
            "word_embedding_dimension": hidden,
            "pooling_mode_cls_token": head.pooling == "cls",
            "pooling_mode_mean_tokens": head.pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False}),
        **tokenizer_files(tokenizer, max_length, suffix),
    }
    modules = [("", "Transformer"), ("1_Pooling", "Pooling")]
    if head.dense_kernel is not None:
        kernel = np.asarray(head.dense_kernel, np.float32)
        files["2_Dense/config.json"] = _json_bytes({
            "in_features": int(kernel.shape[0]), "out_features": int(kernel.shape[1]),
            "bias": head.dense_bias is not None,
            "activation_function": ACTIVATIONS[head.activation]})
        modules.append(("2_Dense", "Dense"))
    if head.normalize:
        modules.append((f"{len(modules)}_Normalize", "Normalize"))
    files["modules.json"] = _json_bytes([
        {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
        for i, (path, kind) in enumerate(modules)])
    if info is not None:
        files[INFO_FILE] = _json_bytes(dict(info))
    if readme:
        files["README.md"] = readme.encode("utf-8")
    # Weights first (the check of the tree raises before anything is written).
    tensors = hf_tensors(encoder_params, encoder_config)
    if pooler is None:
        pooler = (np.zeros((hidden, hidden), np.float32), np.zeros((hidden,), np.float32))
    kernel_p, bias_p = (np.asarray(x, np.float32) for x in pooler)
    if kernel_p.shape != (hidden, hidden) or bias_p.shape != (hidden,):
        raise ValueError(f"pooler kernel {kernel_p.shape} / bias {bias_p.shape}: expected "
                         f"({hidden}, {hidden}) / ({hidden},)")
    tensors["pooler.dense.weight"] = np.ascontiguousarray(kernel_p.T)
    tensors["pooler.dense.bias"] = bias_p
    _save_tensors(folder / WEIGHTS_FILE, tensors)
    if head.dense_kernel is not None:
        (folder / "2_Dense").mkdir(exist_ok=True)
        dense = {"linear.weight": np.ascontiguousarray(kernel.T)}
        if head.dense_bias is not None:
            dense["linear.bias"] = np.asarray(head.dense_bias, np.float32)
        _save_tensors(folder / "2_Dense" / WEIGHTS_FILE, dense)
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def readme(title: str, usage: str, *, step: int | None) -> str:
    """The ``README.md`` of an exported folder."""
    return (f"# {title}\n\nExported by embedding-jax `export-hf` from a training run "
            f"(checkpoint step {step}).\n\n{usage}\n"
            "```python\nfrom sentence_transformers import SentenceTransformer\n\n"
            "model = SentenceTransformer(\"THIS_FOLDER\")\n"
            "vectors = model.encode([\"A sentence.\"])\n```\n\n"
            "`transformers.AutoModel` and `AutoTokenizer` load the transformer alone; the "
            "pooling and any head after it are the sentence-transformers modules listed in "
            "`modules.json`. `export_info.json` records the run.\n")


def _check_output(out) -> None:
    if out.exists() and (not out.is_dir() or any(True for _ in out.iterdir())):
        raise FileExistsError(f"--output {os.fspath(out)} exists and is not an empty folder; "
                              "export-hf writes a new folder (remove it or choose another)")


@contextlib.contextmanager
def staged_output(output: str | os.PathLike) -> Iterator[pathlib.Path]:
    """A local folder renamed or uploaded (``config.json``, ``modules.json`` last) to
    ``output`` when the block succeeds. Raises FileExistsError: ``output`` is not empty."""
    out = storage.as_path(output)
    _check_output(out)
    remote = storage.is_remote(out)
    parent = None
    if not remote:
        parent = pathlib.Path(os.fspath(out)).absolute().parent
        parent.mkdir(parents=True, exist_ok=True)
    staging = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}.staging.", dir=parent))
    try:
        yield staging
        file_mode = default_file_mode()
        dir_mode = file_mode | ((file_mode & 0o444) >> 2)  # r -> x: what mkdir would give
        for path in [staging, *staging.rglob("*")]:
            # mkdtemp makes the folder 0700; others may read an export.
            os.chmod(path, dir_mode if path.is_dir() else file_mode)
        if remote:
            _upload_all(staging, out)
        else:
            _check_output(out)  # made meanwhile?
            if out.exists():
                out.rmdir()
            os.rename(staging, os.fspath(out))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _upload_all(staging: pathlib.Path, out) -> None:
    files = sorted(p for p in staging.rglob("*") if p.is_file())
    # What makes a folder loadable goes last: a reader never finds it before the weights.
    last = ("config.json", "modules.json")
    files.sort(key=lambda p: (p.name in last, p.name == "modules.json", str(p)))
    placed = []
    try:
        for path in files:
            dest = out / path.relative_to(staging).as_posix()
            placed.append(dest)
            storage.upload(path, dest)
    except BaseException:
        for dest in placed:
            with contextlib.suppress(OSError):
                dest.unlink()
        raise
