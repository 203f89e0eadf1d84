"""Corpus readers, tokenisation cache and tf.data input pipelines; no model code.

Importing the package is light (no TensorFlow): import the module you need.

- ``errors.DataError``: bad input, located by file, line and field.
- ``paths``: the shipped ``data/`` folder (``$EMBEDDING_JAX_DATA``) and the cache folder
  (``$EMBEDDING_JAX_CACHE``).
- ``csv_reader``, ``inli``, ``snli``, ``impscore``: strict readers of the CSV formats.
- ``records``, ``sentence_files``, ``entity_documents``: the user's own CSV / JSON Lines files
  (DualCSE / SimCSE rows, DocEnt documents and queries), local or ``gs://``.
- ``tokenization``: ``tokenizers`` with padding/truncation set per call, and a token cache.
- ``table``, ``dualcse_data``: token tables for DualCSE and SimCSE.
- ``squad``, ``retrieval_corpus``: SQuAD v1.1 and its paragraph-retrieval corpus and splits.
- ``word_sources``, ``word_features``: word tokenisation, IDF, the GloVe / hashed TF-IDF /
  MiniLM-layer word sources and their on-disk feature cache (multi-resolution embeddings).
- ``amazon``, ``reddit``, ``reviews2movielens``, ``movielens``: DocEnt's review and tag
  readers.
- ``pk_sampler``: P x K batches (P groups, K members each) for the batch-hard triplet loss.
- ``pipeline``: tf.data batches, deterministic, resumable, sliced per host.
- ``shards``, ``sharded_corpus``: a token table written once as ArrayRecord shards with a
  manifest, streamed per host (each host opens only its shards) in a fixed order.
- ``tfds_builders``: TensorFlow Datasets builders of the shipped sets (and of a tokenised
  corpus, ``TokenizedCorpus``)::

      import tensorflow_datasets as tfds
      import data_pipelines.tfds_builders  # registers "inli" and "snli_triplets"
      test = tfds.load("inli", split="test")
"""
