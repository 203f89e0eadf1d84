"""Generic data layer: strict readers, tokenisation, token tables, shards, tf.data batches.

Importing the package is light (no TensorFlow): import the module you need. Readers raise
``errors.DataError`` (file, line, field); formats and caches are in ``docs/data.md``.
Method-specific corpora live in their packages (``dualcse_jax.tables``,
``docent_jax.corpora``, ``mrwe_jax.features``).
"""
