"""The core's public surface (embedding_core/__init__.py): every name resolves to the object
its module defines, and importing the package loads no JAX."""

import importlib
import subprocess
import sys

import pytest

import embedding_core


@pytest.mark.parametrize("name", embedding_core.__all__)
def test_every_surface_name_is_its_modules_object(name):
    value = getattr(embedding_core, name)
    if name in embedding_core._MODULES:
        assert value is importlib.import_module(embedding_core._MODULES[name])
    else:
        assert value is getattr(importlib.import_module(embedding_core._NAMES[name]), name)
    assert name in dir(embedding_core)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Trainer'"):
        embedding_core.Trainer  # noqa: B018
    with pytest.raises(ImportError):
        from embedding_core import Trainer  # noqa: F401


def test_import_loads_no_jax():
    code = "import sys, embedding_core; print('jax' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"
