"""Declared config fields, from which the config, its validation, the resume rule and the
``PROG config`` listing derive (``docs/architecture.md``, "Configs")."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import ml_collections


@dataclasses.dataclass(frozen=True)
class Field:
    """One config field: ``default`` gives its type (a float accepts ints); ``min``/``max``
    inclusive, ``above``/``below`` exclusive bounds; ``resumable``: a resume may change it;
    ``pretrained``: a model (a hub id is pinned); ``data``: training data (fingerprinted)."""

    default: Any
    help: str = ""
    choices: tuple = ()
    min: float | None = None
    max: float | None = None
    above: float | None = None
    below: float | None = None
    resumable: bool = False
    pretrained: bool = False
    data: bool = False

    def check(self, name: str, value: Any) -> None:
        """Raises ValueError naming ``config.NAME`` when ``value`` breaks this field."""
        if not _same_type(self.default, value):
            raise ValueError(f"config.{name} must be {type(self.default).__name__}, got "
                             f"{value!r}")
        if self.choices and value not in self.choices:
            raise ValueError(f"config.{name}={value!r}: use one of {self.choices}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"config.{name} must be a finite number, got {value}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if self.min is not None and value < self.min:
                raise ValueError(f"config.{name} must be >= {self.min}, got {value}")
            if self.max is not None and value > self.max:
                raise ValueError(f"config.{name} must be <= {self.max}, got {value}")
            if self.above is not None and not value > self.above:
                raise ValueError(f"config.{name} must be > {self.above}, got {value}")
            if self.below is not None and not value < self.below:
                raise ValueError(f"config.{name} must be < {self.below}, got {value}")


def _same_type(default: Any, value: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float))
    if isinstance(default, (tuple, list)):
        return isinstance(value, (tuple, list))
    return isinstance(value, type(default))


def unknown_field_message(name: str, known) -> str:
    """The one line for a field no declaration has (CLI and Python alike)."""
    close = difflib.get_close_matches(name, list(known), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"config has no field {name!r}{hint}"


class Fields(Mapping[str, Field]):
    """An ordered, immutable ``{name: Field}``; :meth:`extend` makes a package's own."""

    def __init__(self, fields: Mapping[str, Field]) -> None:
        self._fields = dict(fields)

    def __getitem__(self, name: str) -> Field:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    def extend(self, **fields: Field | Any) -> Fields:
        """Plus ``fields``: a :class:`Field` replaces or adds one, a plain value a default.
        Raises KeyError: a plain value for a name not declared yet."""
        out = dict(self._fields)
        for name, value in fields.items():
            if isinstance(value, Field):
                out[name] = value
            elif name in out:
                out[name] = dataclasses.replace(out[name], default=value)
            else:
                raise KeyError(f"{name!r} is not a field yet: declare it with Field(...)")
        return Fields(out)

    def config(self) -> ml_collections.ConfigDict:
        """A fresh ConfigDict holding every default."""
        return ml_collections.ConfigDict({k: f.default for k, f in self._fields.items()})

    def check(self, config: ml_collections.ConfigDict, *, allow_unknown: bool = False) -> None:
        """Raises ValueError naming the first unknown (unless ``allow_unknown``) or bad
        field."""
        for name in config.keys():
            if name not in self._fields:
                if allow_unknown:
                    continue
                raise ValueError(unknown_field_message(name, self._fields))
            self._fields[name].check(name, config[name])

    def resumable(self, name: str) -> bool:
        """Whether a resumed run may change ``name`` (undeclared names may not)."""
        field = self._fields.get(name)
        return bool(field and field.resumable)

    def describe(self, config: ml_collections.ConfigDict, source: str = "") -> str:
        """``field = value  # help`` per field, declaration order, for ``PROG config``."""
        rows = [(f"{k} = {config[k]!r}", self._fields[k].help if k in self._fields else "")
                for k in [*self._fields, *sorted(set(config.keys()) - set(self._fields))]
                if k in config]
        width = max((len(left) for left, _ in rows if len(left) <= 40), default=0)
        head = f"# {source}: " if source else "# "
        lines = [head + "override any field with --config.FIELD=VALUE"]
        lines += [f"{left:<{width}}  # {text}" if text else left for left, text in rows]
        return "\n".join(lines)
