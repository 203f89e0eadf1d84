"""The data layer: strict readers, tokenisation, token tables, shards, tf.data (docs/data.md)"""
