"""Hugging Face / sentence-transformers folders from a trained encoder (``docs/export.md``).

A folder written by :func:`write_sentence_transformer` loads, with no code of this
project and no JAX, as

* ``transformers.AutoModel.from_pretrained(folder)``: ``config.json`` (a BERT / RoBERTa
  config built from :class:`~embedding_core.encoders.EncoderConfig`) and
  ``model.safetensors`` (:func:`hf_tensors`, the inverse of
  ``embedding_core.pretrained.load_pretrained_params``: our names back to the checkpoint's,
  dense kernels transposed back to torch's ``[out, in]``);
* ``transformers.AutoTokenizer.from_pretrained(folder)``: ``tokenizer.json`` is the
  tokenizer the run encodes with (padding and truncation off), with
  ``tokenizer_config.json`` and ``special_tokens_map.json`` naming its special tokens;
* ``sentence_transformers.SentenceTransformer(folder)``: ``modules.json``,
  ``sentence_bert_config.json`` (``max_seq_length`` = the run's ``max_length``),
  ``1_Pooling/`` (CLS or mean), ``2_Dense/`` where the model has a head after pooling
  (DualCSE ``cls_mlp``: tanh; DocEnt-Dual's projection: identity) and a Normalize module
  where the run's vectors are unit length. The files follow the layout of
  ``sentence-transformers/all-MiniLM-L6-v2`` (``sentence_transformers.models.*`` module
  names, the ``pooling_mode_*`` keys), which every sentence-transformers release reads.

An input that always carries a fixed second segment (DualCSE's cross-encoder reads
``[CLS] s [SEP] explicit [SEP]``) is written into the exported tokenizer's post-processor
(:func:`suffix_template`), so that a plain ``encode([s])`` or ``tokenizer(s)`` builds
exactly that input; one folder per segment.

:func:`staged_output` writes a whole export or nothing: files go to a local staging folder
that is renamed into place (or uploaded to ``gs://``, removed again if an upload fails).
"""

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

from embedding_core import storage
from embedding_core.encoders import EncoderConfig
from embedding_core.files import default_file_mode
from embedding_core.pretrained import param_shapes

WEIGHTS_FILE = "model.safetensors"
INFO_FILE = "export_info.json"
"""What was exported (workdir, step, view, input format): read by people and tests only."""
POOLINGS = ("cls", "mean")
ACTIVATIONS = {"identity": "torch.nn.modules.linear.Identity",
               "tanh": "torch.nn.modules.activation.Tanh"}
SIMILARITIES = ("cosine", "dot", "euclidean")
"""Also sentence-transformers' names (``similarity_fn_name``)."""
_HF_ARCHITECTURES = {"bert": "BertModel", "roberta": "RobertaModel"}
# Special tokens by role, in the order they are looked for in a tokenizer's vocabulary.
_SPECIAL_ROLES = {
    "cls_token": ("[CLS]", "<s>"), "sep_token": ("[SEP]", "</s>"),
    "pad_token": ("[PAD]", "<pad>"), "unk_token": ("[UNK]", "<unk>"),
    "mask_token": ("[MASK]", "<mask>"), "bos_token": ("<s>",), "eos_token": ("</s>",),
}


# --------------------------------------------------------------------------- weights


def hf_name(path: tuple[str, ...]) -> tuple[str, bool]:
    """The checkpoint tensor name of one of our encoder parameter paths, and whether its
    array is transposed on the way (dense kernels: flax ``[in, out]``, torch ``[out, in]``).

    ``("encoder", "layer_3", "attention", "self", "query", "kernel")`` ->
    ``("encoder.layer.3.attention.self.query.weight", True)``; LayerNorm ``scale`` and
    embedding tables become ``weight``.

    Raises:
      ValueError: a leaf that no BERT / RoBERTa checkpoint tensor maps to.
    """
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
    """Our encoder parameter tree as Hugging Face checkpoint tensors.

    The inverse of ``embedding_core.pretrained.load_pretrained_params``: names without a
    ``bert.`` / ``roberta.`` prefix (as ``BertModel.save_pretrained`` writes them), no
    pooler, no ``position_ids`` buffer.

    Args:
      params: ``TransformerEncoder(config)``'s parameters (nested dict of arrays, boxed or
        not, on device or host).
      config: the encoder config they belong to.

    Returns:
      ``{name: float32 C-contiguous array}``, dense kernels transposed to ``[out, in]``.

    Raises:
      ValueError: the tree is not that of ``TransformerEncoder(config)`` (missing or extra
        parameters, wrong shapes; all listed).
    """
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
        array = np.asarray(value, dtype=np.float32)
        tensors[name] = np.ascontiguousarray(array.T if transpose else array)
    return tensors


def hf_config(config: EncoderConfig, tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """A transformers ``BertConfig`` / ``RobertaConfig`` dict for ``config.json``.

    ``EncoderConfig.from_hf_config`` of the result gives ``config`` back (compute dtype and
    dropout implementation aside, which are not HF fields). With ``tokenizer``, RoBERTa's
    ``bos_token_id`` / ``eos_token_id`` are taken from it.
    """
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
        # The weights are float32 whatever the run computed in (transformers v4 / v5 keys).
        "torch_dtype": "float32",
        "dtype": "float32",
    }
    if config.model_type == "roberta" and tokenizer is not None:
        for key, token in (("bos_token_id", "<s>"), ("eos_token_id", "</s>")):
            token_id = tokenizer.token_to_id(token)
            if token_id is not None:
                out[key] = int(token_id)
    return out


# ------------------------------------------------------------------------- tokenizer


def suffix_template(tokenizer: Tokenizer, suffix: str) -> processors.TemplateProcessing:
    """A post-processor that turns every single text ``s`` into the pair ``(s, suffix)``.

    The template is read off the tokenizer's own pair encoding of ``("a", suffix)``: its
    special tokens and the suffix's pieces become fixed template tokens with the type ids
    the pair gives them (BERT ``[CLS] $A [SEP] explicit:1 [SEP]:1``, RoBERTa
    ``<s> $A </s> </s> explicit </s>``). Truncation then shortens only the text, as
    ``data_pipelines.tokenization.tokenize(..., pair=suffix)`` does. (A pair input, which
    the model never saw, gets its second text appended after the suffix.)

    Raises:
      ValueError: the suffix gives no token, or the tokenizer's pair template is not
        ``specials, A, specials, B, specials``.
    """
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
    """``{"cls_token": "[CLS]", "pad_token": "[PAD]", ...}``: the roles transformers needs,
    found among the tokenizer's special tokens (BERT and RoBERTa spellings)."""
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
    """``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json`` of a
    ``tokenizers.Tokenizer``, for ``transformers.AutoTokenizer``.

    ``tokenizer.json`` is the tokenizer itself with padding and truncation turned off (the
    caller pads and truncates, as ``data_pipelines.tokenization.tokenize`` does), and, with
    ``suffix``, the post-processor of :func:`suffix_template`. The config names the
    generic fast tokenizer class, so that no model-specific class rebuilds the
    post-processor; ``model_max_length`` is ``max_length``.

    Raises:
      ValueError: see :func:`suffix_template`.
    """
    work = Tokenizer.from_str(tokenizer.to_str())
    work.no_padding()
    work.no_truncation()
    if suffix is not None:
        work.post_processor = suffix_template(work, suffix)
    roles = special_tokens(work)
    # The generic class returns only the inputs it is told to: BERT's segment ids matter
    # (the cross-encoder's indicator is segment 1).
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(max_length),
              "clean_up_tokenization_spaces": False,
              "model_input_names": ["input_ids", "token_type_ids", "attention_mask"], **roles}
    return {"tokenizer.json": work.to_str(pretty=True).encode("utf-8"),
            "tokenizer_config.json": _json_bytes(config),
            "special_tokens_map.json": _json_bytes(roles)}


# ----------------------------------------------------------------- sentence-transformers


@dataclass(frozen=True)
class SentenceHead:
    """What follows the transformer: pooling, an optional dense layer, optional L2 norm.

    Attributes:
      pooling: ``"cls"`` (first token's state) or ``"mean"`` (over real tokens).
      dense_kernel: ``[in, out]`` float kernel (flax layout) of a dense layer after pooling,
        or None.
      dense_bias: ``[out]`` bias of that layer (None: no bias).
      activation: ``"identity"`` or ``"tanh"``, applied after the dense layer.
      normalize: the vectors are scaled to unit L2 norm last.
    """

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
        """Width of the vectors for an encoder of ``hidden_size``."""
        return hidden_size if self.dense_kernel is None else int(np.shape(self.dense_kernel)[1])


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _save_tensors(path: pathlib.Path, tensors: Mapping[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    # transformers refuses a safetensors file whose metadata does not name its format.
    save_file(dict(tensors), str(path), metadata={"format": "pt"})


def write_sentence_transformer(
    folder: str | os.PathLike,
    *,
    encoder_params: Mapping[str, Any],
    encoder_config: EncoderConfig,
    tokenizer: Tokenizer,
    max_length: int,
    head: SentenceHead,
    similarity: str = "cosine",
    suffix: str | None = None,
    pooler: tuple[Any, Any] | None = None,
    info: Mapping[str, Any] | None = None,
    readme: str = "",
) -> None:
    """Writes one Hugging Face + sentence-transformers folder (see the module docstring).

    Args:
      folder: a local folder (created; normally inside :func:`staged_output`'s staging).
      encoder_params, encoder_config: the transformer's parameters and config.
      tokenizer: the tokenizer the run encodes with.
      max_length: tokens per input, special tokens included (``max_seq_length``).
      head: pooling, dense layer and normalisation after the transformer.
      similarity: how the vectors compare (``cosine``, ``dot``, ``euclidean``).
      suffix: a fixed second segment of every input (see :func:`suffix_template`).
      pooler: ``(kernel [hidden, hidden], bias [hidden])`` written as BERT's pooler
        (``pooler_output = tanh(W h_CLS + b)``), for a model whose head is exactly that;
        None writes zeros (``pooler_output`` is then 0: our models have no NSP pooler, and
        transformers would otherwise fill it with random weights, with a warning).
      info: JSON-serialisable provenance, written as ``export_info.json``.
      readme: text of ``README.md`` (how to load and what the input is).

    Raises:
      ValueError: see :func:`hf_tensors` and :func:`suffix_template`; a dense kernel whose
        input width is not the hidden size; an unknown similarity.
      TypeError: ``info`` is not JSON-serialisable.
    """
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
    """The ``README.md`` of an exported folder: what it is, its input, how to load it."""
    return (f"# {title}\n\nExported by embedding-jax `export-hf` from a training run "
            f"(checkpoint step {step}).\n\n{usage}\n"
            "```python\nfrom sentence_transformers import SentenceTransformer\n\n"
            "model = SentenceTransformer(\"THIS_FOLDER\")\n"
            "vectors = model.encode([\"A sentence.\"])\n```\n\n"
            "`transformers.AutoModel` and `AutoTokenizer` load the transformer alone; the "
            "pooling and any head after it are the sentence-transformers modules listed in "
            "`modules.json`. `export_info.json` records the run.\n")


# --------------------------------------------------------------------- any parameter tree


def save_param_tree(path: str | os.PathLike, params: Mapping[str, Any],
                    metadata: Mapping[str, str] | None = None) -> None:
    """Writes a Flax parameter tree as one safetensors file, a tensor per leaf.

    Names are the leaves' paths joined by ``/`` (``tower/block_0/dense/kernel``); arrays
    are float32 as in training, in the Flax layout (no transposition: there is no torch
    module to match). Readable with ``safetensors.numpy.load_file`` alone;
    :func:`load_param_tree` rebuilds the tree.

    Args:
      path: a local file.
      params: nested dict of arrays (boxed or not, on device or host); keys without ``/``.
      metadata: strings stored in the file's header (e.g. the model kind and step).

    Raises:
      ValueError: a key holding ``/`` or an empty tree.
    """
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
    """``(nested dict of float32 numpy arrays, header metadata)`` of a
    :func:`save_param_tree` file.

    Raises:
      FileNotFoundError: no such file.
    """
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


# ------------------------------------------------------------------------------ output


def _check_output(out) -> None:
    if out.exists() and (not out.is_dir() or any(True for _ in out.iterdir())):
        raise FileExistsError(f"--output {os.fspath(out)} exists and is not an empty folder; "
                              "export-hf writes a new folder (remove it or choose another)")


@contextlib.contextmanager
def staged_output(output: str | os.PathLike) -> Iterator[pathlib.Path]:
    """A local staging folder that becomes ``output`` when the ``with`` block succeeds.

    Local ``output``: the staging folder is made beside it and renamed into place, so
    ``output`` appears whole or not at all. ``gs://`` output: staged in a local temporary
    folder and uploaded file by file, ``config.json`` and ``modules.json`` of each folder
    last; if an upload fails, the objects already uploaded are deleted. The staging folder
    is always removed.

    Raises:
      FileExistsError: ``output`` is a file or a folder that is not empty (checked before
        the block runs, so before any work).
    """
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
