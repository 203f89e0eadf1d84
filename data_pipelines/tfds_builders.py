"""TFDS builders of the shipped ``inli`` and ``snli_triplets`` (registered on import, read from
:func:`~data_pipelines.paths.data_dir`) and of sharded token tables (:class:`TokenizedCorpus`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from data_pipelines import tf_import  # noqa: F401  (tfds needs TensorFlow: one line if missing)
from data_pipelines.inli import inli_split_path, read_inli
from data_pipelines.snli import read_snli_triplets, snli_triplets_path

_INLI_CITATION = """@inproceedings{havaldar2025inli, title = {Entailed Between the Lines:
Incorporating Implication into NLI}, author = {Havaldar, Shreya and Alvari, Hamidreza and
Palowitch, John and Hosseini, Mohammad Javad and Buthpitiya, Senaka and Fabrikant, Alex},
booktitle = {Proceedings of the 63rd Annual Meeting of the ACL}, year = {2025}}"""
_SNLI_CITATION = """@inproceedings{bowman2015snli, title = {A large annotated corpus for
learning natural language inference}, author = {Bowman, Samuel R. and Angeli, Gabor and Potts,
Christopher and Manning, Christopher D.}, booktitle = {Proceedings of EMNLP}, year = {2015}}"""


class _ShippedDataBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """Base of builders whose data ships in the repository (no downloads)."""

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls) -> epath.Path:
        # tensorflow-datasets 4.9.10 resolves this through the `importlib_resources` backport,
        # which it does not install on Python >= 3.9 (tensorflow/datasets#11212).
        return epath.Path(__file__)


_INLI_FIELDS = ("premise", "explicit_entailment", "implied_entailment", "neutral",
                "contradiction", "dataset")


class Inli(_ShippedDataBuilder):
    """Implied NLI (Havaldar et al., ACL 2025): premises with four hypotheses each."""

    name = "inli"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "google-deepmind/inli data commit d40bfc1, shipped in data/inli."}

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description="Implied NLI: each premise has an explicit entailment, an implied "
            "entailment, a neutral hypothesis and a contradiction; 'dataset' names the source "
            "corpus.",
            features=tfds.features.FeaturesDict(dict.fromkeys(_INLI_FIELDS, tfds.features.Text())),
            homepage="https://github.com/google-deepmind/inli", citation=_INLI_CITATION,
            license="CC BY-SA 4.0", disable_shuffling=True)

    def _split_generators(self, dl_manager):
        del dl_manager  # the data ships with the package; nothing is fetched
        return {name: self._generate_examples(inli_split_path(split)) for name, split in
                (("train", "train"), ("validation", "val"), ("test", "test"))}

    def _generate_examples(self, path):
        for example in read_inli(path):
            yield example.line, {name: getattr(example, name) for name in _INLI_FIELDS}


class SnliTriplets(_ShippedDataBuilder):
    """SNLI 1.0 (Bowman et al. 2015) as SimCSE triplets, the first 100,000 training pairs."""

    name = "snli_triplets"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "27,195 triplets shipped in data/snli."}

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description="SNLI triplets in the SimCSE layout: sent0 a premise, sent1 its "
            "entailment, hard_neg its contradiction.",
            features=tfds.features.FeaturesDict(
                dict.fromkeys(("sent0", "sent1", "hard_neg"), tfds.features.Text())),
            homepage="https://nlp.stanford.edu/projects/snli/", citation=_SNLI_CITATION,
            license="CC BY-SA 4.0", disable_shuffling=True)

    def _split_generators(self, dl_manager):
        del dl_manager  # the data ships with the package; nothing is fetched
        return {"train": self._generate_examples(snli_triplets_path())}

    def _generate_examples(self, path):
        for t in read_snli_triplets(path):
            yield t.line, {"sent0": t.sent0, "sent1": t.sent1, "hard_neg": t.hard_neg}


def tokenized_corpus_features() -> tfds.features.FeaturesDict:
    """A shard record: ``row`` int64, ``lengths`` [F], the real tokens' ``input_ids`` /
    ``token_type_ids`` int32 bytes, ``text_ids`` [F] int32."""
    tokens = {"shape": (None,), "dtype": np.int32, "encoding": tfds.features.Encoding.BYTES}
    return tfds.features.FeaturesDict({
        "row": tfds.features.Scalar(np.int64),
        "input_ids": tfds.features.Tensor(**tokens),
        "token_type_ids": tfds.features.Tensor(**tokens),
        "lengths": tfds.features.Tensor(shape=(None,), dtype=np.int32),
        "text_ids": tfds.features.Tensor(shape=(None,), dtype=np.int32),
    })


class TokenizedCorpus(_ShippedDataBuilder, skip_registration=True):
    """A token table as ArrayRecord shards (one ``train`` split, ``examples()`` order)."""

    name = "tokenized_corpus"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Token-table rows, real tokens only (docs/data.md)."}

    def __init__(self, *, examples: Callable[[], Iterator[tuple[int, dict[str, Any]]]],
                 description: str, **kwargs: Any) -> None:
        self._examples, self._description = examples, description
        super().__init__(**kwargs)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=self._description, features=tokenized_corpus_features(),
            disable_shuffling=True)

    def _split_generators(self, dl_manager):
        del dl_manager  # the rows come from the caller; nothing is fetched
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        yield from self._examples()
