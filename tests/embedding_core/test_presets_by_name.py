"""``--config=NAME``: every package finds its presets by name (an installed wheel has no
clone to give a path into): ``NAME``, ``NAME.py`` or ``PACKAGE.configs.NAME``."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("module,preset", [
    ("dualcse_jax.main", "simcse"), ("dualcse_jax.main", "dualcse_jax.configs.bi"),
    ("docent_jax.main", "dual_tpu"), ("mrwe_jax.main", "convrr_cpu.py"),
    ("sentence_jax.main", "default")])
def test_every_package_takes_a_preset_by_name(cli, module, preset):
    done = cli(module, "config", f"--config={preset}")
    assert done.returncode == 0, done.stderr[-2000:]
    name = preset.split(".")[-1] if "." in preset and not preset.endswith(".py") else \
        preset.removesuffix(".py")
    assert f"configs/{name}.py: override any field" in done.stdout
    bad = cli(module, "config", "--config=nope")
    assert bad.returncode != 0 and "no such file or preset" in bad.stderr
