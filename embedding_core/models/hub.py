"""Models named by a Hugging Face hub id, ``org/name[@revision]``: fetched through
``huggingface_hub`` into its cache (only the files an encoder needs), and pinned to the
commit a run started from (``docs/models.md``).

``huggingface_hub`` reads ``HF_HOME``, ``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, ``HF_TOKEN`` and
``HF_ENDPOINT`` itself; nothing here overrides them.
"""

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
)
"""What is downloaded: config, tokenizer, safetensors weights and the sentence-transformers
module files (no ONNX, TF, Flax or PyTorch-pickle weights)."""
CONVERT_COMMAND = "python -m embedding_core.models.convert_weights FOLDER"


@dataclasses.dataclass(frozen=True)
class HubModel:
    """A resolved hub model: its snapshot ``folder`` in the cache, ``repo_id`` and the
    ``commit`` (40 hex digits) the requested revision pointed at."""

    folder: pathlib.Path
    repo_id: str
    commit: str

    @property
    def pinned(self) -> str:
        """``org/name@<commit>``: the same weights wherever and whenever it is resolved."""
        return f"{self.repo_id}@{self.commit}"


def parse(name: str) -> tuple[str, str | None] | None:
    """``(repo_id, revision or None)`` of a hub id, ``None`` for anything else (a path
    that exists locally, ``gs://``, a name without exactly one ``/``)."""
    text = str(name)
    if "://" in text or text.startswith((".", "/", "~")) or pathlib.Path(text).exists():
        return None
    match = HUB_ID.match(text)
    return (match["repo"], match["rev"]) if match else None


def cache_dir() -> str:
    """The hub cache ``huggingface_hub`` uses (``HF_HUB_CACHE``, else ``HF_HOME/hub``)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def download(name: str) -> HubModel:
    """The snapshot of hub id ``name`` (``org/name[@revision]``) in the hub cache,
    downloading :data:`MODEL_FILES` that are missing.

    Raises:
      FileNotFoundError: one line: offline and not cached (names the id, the cache and
        ``HF_HUB_OFFLINE``), no such repo or revision (or private: ``HF_TOKEN``), the hub
        unreachable and not cached, or no safetensors weights (names the conversion).
    """
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
    """What a model argument may name without the hub: the installed model packages
    (``packages.installed_model_packages``) or a local folder."""
    from embedding_core.models.packages import installed_model_packages

    names = installed_model_packages()
    packages = (f"an installed model package ({', '.join(names)}), or " if names else "")
    return (f"without the hub, pass {packages}a local folder holding config.json, "
            "model.safetensors and tokenizer.json")


def _endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


def _with_weights(model: HubModel) -> HubModel:
    """``model`` itself when it has safetensors weights; a checkpoint with only
    ``pytorch_model.bin`` is converted (``convert_weights``) into a folder of its own."""
    if any(model.folder.glob("*.safetensors")) or not (model.folder / "config.json").exists():
        return model
    from embedding_core.models import convert_weights

    folder = convert_weights.converted_snapshot(model.repo_id, model.commit, model.folder)
    return dataclasses.replace(model, folder=folder)


def pin(value: str, saved: str | None = None) -> str:
    """The value a run records for a model field: a hub id pinned to its commit
    (``org/name@<commit>``), anything else unchanged. A resumed run whose saved value pins
    the same repo (``saved``) keeps that pin when ``value`` names no revision (the same
    weights as before, without a network call).

    Raises:
      FileNotFoundError: as :func:`download`.
    """
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
