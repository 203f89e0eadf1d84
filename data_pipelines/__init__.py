"""Corpus readers, tokenisation cache and tf.data input pipelines; no model code.

Importing the package is light (no TensorFlow): import the module you need.

- ``errors.DataError``: bad input, located by file, line and field.
- ``paths``: the shipped ``data/`` folder (``$EMBEDDING_JAX_DATA``) and the cache folder
  (``$EMBEDDING_JAX_CACHE``).
- ``csv_reader``, ``inli``, ``snli``, ``impscore``: strict readers of the CSV formats.
- ``tokenization``: ``tokenizers`` with padding/truncation set per call, and a token cache.
- ``table``, ``dualcse_data``: token tables for DualCSE and SimCSE.
- ``pipeline``: tf.data batches, deterministic, resumable, sliced per host.
- ``tfds_builders``: TensorFlow Datasets builders of the shipped sets::

      import tensorflow_datasets as tfds
      import data_pipelines.tfds_builders  # registers "inli" and "snli_triplets"
      test = tfds.load("inli", split="test")
"""
