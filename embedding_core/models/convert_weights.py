"""``python -m embedding_core.models.convert_weights FOLDER``: ``pytorch_model.bin`` ->
``model.safetensors`` (we read safetensors only; needs torch)."""

from __future__ import annotations

import argparse
import pathlib
import sys

from embedding_core.storage import storage
from embedding_core.storage.files import write_bytes_atomic

BIN_FILE = "pytorch_model.bin"
SAFETENSORS_FILE = "model.safetensors"


def _torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def convert(bin_file: str | pathlib.Path, out_file: str | pathlib.Path) -> None:
    """Every tensor of ``bin_file`` (``weights_only=True``: no pickled code runs) into
    ``out_file``. Raises ModuleNotFoundError (no torch), FileNotFoundError."""
    import torch
    from safetensors.numpy import save

    bin_file = pathlib.Path(bin_file)
    if not bin_file.is_file():
        raise FileNotFoundError(f"no {bin_file}")
    state = torch.load(bin_file, map_location="cpu", weights_only=True)
    arrays = {k: (v.float() if v.dtype == torch.bfloat16 else v).contiguous().numpy()
              for k, v in state.items() if isinstance(v, torch.Tensor)}
    write_bytes_atomic(out_file, save(arrays))


def converted_snapshot(repo_id: str, commit: str, snapshot: pathlib.Path) -> pathlib.Path:
    """A folder beside the hub cache: ``snapshot``'s files linked and the repo's
    ``pytorch_model.bin`` converted, once per commit. Raises FileNotFoundError (one line)."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    name = f"{repo_id}@{commit}"
    folder = storage.cache_dir() / "converted" / repo_id.replace("/", "--") / commit
    if (folder / SAFETENSORS_FILE).is_file():
        return folder
    try:
        bin_file = pathlib.Path(hf_hub_download(repo_id, BIN_FILE, revision=commit))
    except EntryNotFoundError:
        raise FileNotFoundError(f"{name}: the model has neither safetensors nor "
                                f"{BIN_FILE} weights") from None
    if not _torch_available():
        raise FileNotFoundError(
            f"{name} has only {BIN_FILE} weights (read as safetensors only): install torch "
            f"to convert them on load, or convert once with `python -m "
            f"embedding_core.models.convert_weights {bin_file.parent}` and pass that folder")
    folder.mkdir(parents=True, exist_ok=True)
    for item in snapshot.iterdir():
        link = folder / item.name
        if not link.exists():
            link.symlink_to(item.resolve(), target_is_directory=item.is_dir())
    convert(bin_file, folder / SAFETENSORS_FILE)  # last: marks the folder complete
    return folder


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m embedding_core.models.convert_weights",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("folder", help=f"a model folder holding {BIN_FILE}")
    args = p.parse_args(argv)
    folder = pathlib.Path(args.folder)
    try:
        convert(folder / BIN_FILE, folder / SAFETENSORS_FILE)
    except (FileNotFoundError, ModuleNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    print(f"wrote {folder / SAFETENSORS_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
