"""The exported folder's ``README.md``: a model card in sentence-transformers' layout (YAML
metadata, model details, usage, training datasets and sizes, loss and its arguments,
training arguments, evaluation results, Matryoshka dimensions) from the run's own files."""

from __future__ import annotations

import json
from typing import Any

from embedding_core import as_path

DATASETS_FILE = "training_datasets.json"  # written at train by the trainer (run_files)
_TRAINING_ARGS = ("batch_size", "learning_rate", "warmup_steps", "lr_decay", "weight_decay",
                  "num_epochs", "num_train_steps", "seed", "batch_sampler",
                  "multi_dataset_batch_sampler", "max_seq_length", "dtype")


def _json(path) -> Any:
    path = as_path(path)
    return json.loads(path.read_text()) if path.exists() else None


def _last_eval(workdir) -> dict[str, float]:
    path = as_path(workdir) / "metrics.jsonl"
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    evals = [r for r in rows if r.get("split") == "eval"]
    if not evals:
        return {}
    last = evals[-1]
    return {k: v for k, v in last.items() if k not in ("split", "wall_time")
            and isinstance(v, (int, float))}


def model_card(encoder) -> str:
    """Markdown with YAML front matter. ``encoder``: a ``SentenceEncoder`` of a run."""
    config, workdir = encoder.config, encoder.workdir
    datasets = _json(as_path(workdir) / DATASETS_FILE) or {}
    loss = datasets.get("loss", {"name": config.loss})
    dims = [d for d in str(config.matryoshka_dims).split(",") if d.strip()]
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction",
            "generated_from_trainer", "embedding-jax"]
    meta = ["---", f"base_model: {config.model}", "library_name: sentence-transformers",
            "pipeline_tag: sentence-similarity", "tags:", *[f"- {t}" for t in tags],
            *([f"- loss:{loss['name']}"] if loss else []), "---", ""]
    lines = [
        f"# SentenceTransformer based on {config.model}", "",
        f"Fine-tuned by sentence-jax (embedding-jax) for {encoder.step} steps.", "",
        "## Model Details", "",
        f"- **Base model:** {config.model}",
        f"- **Maximum Sequence Length:** {encoder.max_length} tokens",
        f"- **Output Dimensionality:** {encoder.dim} dimensions",
        f"- **Similarity Function:** {encoder.similarity_fn_name or 'cosine'}",
        *([f"- **Matryoshka dimensions:** {', '.join(dims)}"] if dims else []), "",
        "## Usage", "", "```python", "from sentence_transformers import SentenceTransformer",
        "", "model = SentenceTransformer(\"THIS_FOLDER\")",
        "embeddings = model.encode([\"The weather is lovely today.\"])", "```", "",
        "## Training Details", "", "### Training Datasets", ""]
    for item in datasets.get("datasets", []):
        lines += [f"- `{item['path']}`: {item['rows']:,} rows, columns "
                  f"{', '.join(item['columns'])}" + (f" (label: {item['label']})"
                                                     if item.get("label") else "")]
    lines += ["", f"### Loss: `{loss['name']}`", "", "```json",
              json.dumps(loss.get("args", {}), indent=4, sort_keys=True), "```", "",
              "### Training Hyperparameters", ""]
    lines += [f"- `{name}`: {config[name]}" for name in _TRAINING_ARGS if name in config]
    results = _last_eval(workdir)
    if results:
        lines += ["", "## Evaluation", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.4f} |" for k, v in sorted(results.items()) if k != "step"]
    return "\n".join(meta + lines) + "\n"
