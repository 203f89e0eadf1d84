"""Declared config fields: checks, the unknown-field line, resume rule and `PROG config`."""

import math

import ml_collections
import pytest

from embedding_core import configs
from embedding_core.fields import Field, unknown_field_message

FIELDS = configs.declare(
    alpha=Field("a", "the first field", choices=("a", "b")),
    rate=Field(0.5, "a share", min=0, max=1),
    width=Field(8, "a width", above=0),
    on=Field(True, "a switch"),
    eval_set=Field("", "evaluation only", resumable=True),
    learning_rate=0.1,  # a shared field's default, its help and bounds kept
)


def test_a_plain_value_changes_a_shared_default_and_keeps_its_bounds():
    assert FIELDS["learning_rate"].default == 0.1
    assert FIELDS["learning_rate"].help == configs.BASE["learning_rate"].help
    c = FIELDS.config()
    c.learning_rate = 0.0
    with pytest.raises(ValueError, match=r"config.learning_rate must be > 0, got 0.0"):
        FIELDS.check(c)
    with pytest.raises(KeyError, match="not a field yet"):
        configs.declare(no_such=3)


@pytest.mark.parametrize("name, value, message", [
    ("alpha", "c", r"config.alpha='c': use one of \('a', 'b'\)"),
    ("rate", 1.5, r"config.rate must be <= 1, got 1.5"),
    ("rate", -0.1, r"config.rate must be >= 0, got -0.1"),
    ("rate", math.nan, r"config.rate must be a finite number, got nan"),
    ("width", 0, r"config.width must be > 0, got 0"),
    ("width", 2.5, r"config.width must be int, got 2.5"),
    ("on", 1, r"config.on must be bool, got 1"),
    ("alpha", 3, r"config.alpha must be str, got 3"),
])
def test_each_bad_value_is_one_line_naming_the_field(name, value, message):
    # ConfigDict refuses most type changes on assignment; a config read from JSON does not.
    c = FIELDS.config().to_dict()
    c[name] = value
    with pytest.raises(ValueError, match=f"^{message}$"):
        FIELDS.check(ml_collections.ConfigDict(c, type_safe=False))


def test_ints_are_floats_but_bools_are_not_ints():
    c = FIELDS.config()
    c.rate = 1  # an int where a float is declared is a float value
    FIELDS.check(c)
    with pytest.raises(ValueError, match="config.width must be int"):
        FIELDS["width"].check("width", True)


def test_an_unknown_field_is_refused_with_the_nearest_name():
    c = FIELDS.config()
    c.widht = 3
    with pytest.raises(ValueError) as err:
        FIELDS.check(c)
    assert str(err.value) == unknown_field_message("widht", FIELDS)
    assert str(err.value) == ("config has no field 'widht' (did you mean 'width'?)")
    FIELDS.check(c, allow_unknown=True)  # saved configs of older versions load


def test_resumable_comes_from_the_declarations():
    assert FIELDS.resumable("eval_set") and FIELDS.resumable("num_train_steps")
    assert not FIELDS.resumable("alpha") and not FIELDS.resumable("learning_rate")
    assert not FIELDS.resumable("undeclared")


def test_resume_check_uses_the_declared_rule(tmp_path):
    c = FIELDS.config()
    configs.save_config(c, tmp_path)
    c.eval_set = "other.csv"  # resumable
    configs.check_resume(c, tmp_path, FIELDS)
    c.alpha = "b"
    with pytest.raises(ValueError, match=r"alpha='a' -> 'b'"):
        configs.check_resume(c, tmp_path, FIELDS)


def test_describe_lists_every_field_once_shared_first_with_values_and_help():
    c = FIELDS.config()
    c.rate = 0.25
    lines = FIELDS.describe(c, "p.py").splitlines()
    assert lines[0] == "# p.py: override any field with --config.FIELD=VALUE"
    rows = {line.split()[0]: line for line in lines[1:]}
    assert sorted(rows) == sorted(c.keys())
    assert lines[1].split()[0] == "learning_rate"  # BASE's order first
    assert lines[-1].split()[0] == "eval_set"
    assert rows["rate"].split("#")[0].strip() == "rate = 0.25"
    assert rows["rate"].split("#", 1)[1].strip() == "a share"
