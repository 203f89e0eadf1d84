"""sentence-jax presets: ``default`` (MNRL on MiniLM, CPU sizes)."""
