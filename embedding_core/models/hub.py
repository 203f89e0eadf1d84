"""Hub ids ``org/name[@revision]``: fetched through ``huggingface_hub`` (its ``HF_*``
variables) and pinned to the commit a run started from (``docs/models.md``)."""

from __future__ import annotations

import dataclasses
import pathlib
import re

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.\-]*/[A-Za-z0-9][\w.\-]*)(@(?P<rev>[\w.\-/]+))?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")
MODEL_FILES = (
    "config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
    "vocab.txt", "vocab.json", "merges.txt", "added_tokens.json", "sentencepiece.bpe.model",
    "spiece.model", "model.safetensors", "model.safetensors.index.json", "model-*.safetensors",
    "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
    "*_Pooling/config.json", "*_Dense/config.json", "*_Dense/model.safetensors",
)  # no ONNX, TF, Flax or PyTorch-pickle weights
CONVERT_COMMAND = "python -m embedding_core.models.convert_weights FOLDER"


@dataclasses.dataclass(frozen=True)
class HubModel:
    """A snapshot ``folder`` and the ``commit`` the requested revision pointed at."""

    folder: pathlib.Path
    repo_id: str
    commit: str

    @property
    def pinned(self) -> str:
        """``org/name@<commit>``."""
        return f"{self.repo_id}@{self.commit}"


def parse(name: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision or None)`` of a hub id, ``None`` for anything else."""
    text = str(name)
    if "://" in text or text.startswith((".", "/", "~")) or pathlib.Path(text).exists():
        return None
    match = HUB_ID.match(text)
    return (match["repo"], match["rev"]) if match else None


def cache_dir() -> str:
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def download(name: str) -> HubModel:
    """The cached snapshot of ``name``, missing :data:`MODEL_FILES` downloaded.
    Raises: ValueError: not a hub id. FileNotFoundError (one line): offline and not cached,
    no such repo or revision, the hub unreachable, no safetensors weights."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    parsed = parse(name)
    if parsed is None:
        raise ValueError(f"{name!r} is not a hub id (org/name[@revision])")
    repo_id, revision = parsed
    where = f"{repo_id}" + (f"@{revision}" if revision else "")
    try:
        folder = pathlib.Path(snapshot_download(repo_id, revision=revision,
                                                allow_patterns=list(MODEL_FILES)))
    except (RepositoryNotFoundError, GatedRepoError):
        raise FileNotFoundError(
            f"{where}: no local folder of that name and no such model on {_endpoint()} (or "
            "it is private or gated: set HF_TOKEN to a token that may read it)") from None
    except RevisionNotFoundError:
        raise FileNotFoundError(f"{where}: the model has no revision {revision!r} on "
                                f"{_endpoint()}") from None
    except LocalEntryNotFoundError:
        if _offline():
            raise FileNotFoundError(
                f"{where}: not in the hub cache {cache_dir()} and HF_HUB_OFFLINE=1 forbids "
                "downloading it (unset HF_HUB_OFFLINE, or fetch it once where the hub is "
                f"reachable); {_what_works_here()}") from None
        raise FileNotFoundError(
            f"{where}: not in the hub cache {cache_dir()} and {_endpoint()} cannot be "
            f"reached (check the network or HF_ENDPOINT); {_what_works_here()}") from None
    return _with_weights(HubModel(folder, repo_id, folder.name))


def _what_works_here() -> str:
    from embedding_core.models.packages import installed_model_packages

    names = installed_model_packages()
    packages = (f"an installed model package ({', '.join(names)}), or " if names else "")
    return (f"without the hub, pass {packages}a local folder holding config.json, "
            "model.safetensors and tokenizer.json")


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def _with_weights(model: HubModel) -> HubModel:
    """``model``, or its ``pytorch_model.bin`` converted into a folder of its own."""
    if any(model.folder.glob("*.safetensors")) or not (model.folder / "config.json").exists():
        return model
    from embedding_core.models import convert_weights

    folder = convert_weights.converted_snapshot(model.repo_id, model.commit, model.folder)
    return dataclasses.replace(model, folder=folder)


def pin(value: str, saved: str | None = None) -> str:
    """A hub id pinned to its commit (``saved``'s pin of the same repo kept when ``value``
    names no revision), anything else unchanged. Raises FileNotFoundError."""
    parsed = parse(value)
    if parsed is None:
        return value
    repo_id, revision = parsed
    if revision and COMMIT.match(revision):
        return value
    if revision is None and saved:
        kept = parse(saved)
        if kept and kept[0] == repo_id and kept[1] and COMMIT.match(kept[1]):
            return saved
    return download(value).pinned


def resolve(name: str) -> pathlib.Path | None:
    """The local snapshot folder of a hub id, ``None`` when ``name`` is not one."""
    if parse(name) is None:
        return None
    return download(name).folder
