"""Test set-up: 8 fake CPU devices before JAX starts, persistent compile cache."""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
    os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402

jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("JAX_TEST_CACHE", os.path.join(os.path.dirname(__file__), "..", ".cache", "jax")),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
