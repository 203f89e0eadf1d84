"""Multi-resolution word embeddings with ConvRR / FCRR retrieval (docs/mrwe.md)."""
from importlib import import_module  # each part on first use: importing the package loads no JAX


def train(config, workdir, **kwargs):  # .trainer.train
    return import_module(".trainer", __name__).train(config, workdir, **kwargs)


def load(workdir, **kwargs):  # .inference.load
    return import_module(".inference", __name__).load(workdir, **kwargs)


def config_fields() -> list[str]:  # the run config's fields (embedding_core.serving.workdirs)
    return list(import_module(".configs.default", __name__).FIELDS)


__all__ = ["train", "load"]
