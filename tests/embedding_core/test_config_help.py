"""``PROG config``: the fields of a preset with their values and source comments."""

from __future__ import annotations

import importlib.util
import re

from embedding_core import configs
from embedding_core.config_help import describe, field_comments

PRESET = '''from embedding_core import configs


def get_config():
    c = configs.base()
    # A section header, not a field's comment.
    c.alpha = "a"  # the first field, whose comment
    #                goes on here
    # Another header.
    c.warmup_steps = 3
    c.seed = 7  # the preset's own word
    return c
'''


def test_field_comments_of_a_hand_written_preset():
    assert field_comments(PRESET) == [
        ("alpha", "the first field, whose comment goes on here"),
        ("warmup_steps", ""), ("seed", "the preset's own word")]


def test_describe_takes_the_nearest_comment_and_the_command_line_values(tmp_path):
    path = tmp_path / "preset.py"
    path.write_text(PRESET)
    spec = importlib.util.spec_from_file_location("preset_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    config.seed = 9  # as --config.seed=9 would
    lines = describe(config, path).splitlines()
    assert lines[0] == f"# {path}: override any field with --config.FIELD=VALUE"
    rows = {line.split(" = ")[0]: re.split(r" +# ", line, maxsplit=1) for line in lines[1:]}
    assert sorted(rows) == sorted(config.keys())  # every field once
    assert [line.split()[0] for line in lines[1:3]] == ["learning_rate", "warmup_steps"]
    assert lines[-1].split()[0] == "alpha"  # base() fields first, in source order
    assert rows["alpha"] == ["alpha = 'a'", "the first field, whose comment goes on here"]
    # No comment in the preset: base()'s; the preset's own comment wins over base()'s.
    assert rows["warmup_steps"] == ["warmup_steps = 3", "linear warm-up from 0"]
    assert rows["seed"] == ["seed = 9", "the preset's own word"]
    assert rows["learning_rate"] == [f"learning_rate = {configs.base().learning_rate}"]
