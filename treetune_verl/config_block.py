# Copyright 2026 treetune-verl contributors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Typed config blocks: a frozen dataclass per block of the run config, built by one parser that refuses unknown keys.

A block (``cpo``, ``cpo.hint``, ``treetune.rollout_health``...) is a dataclass whose fields are the block's keys and
whose ``__post_init__`` checks the values. :func:`dataclass_from_block` builds it from the composed config (an
OmegaConf node, a mapping or None for all defaults), recursing into fields typed as a dataclass, so a nested block is
one typed object built once. :func:`check_block_overrides` reads the same dataclasses to refuse, in one line and
before Hydra composes anything, a command-line override of a key the block does not have (Hydra's own message for
``cpo.x=1`` is a multi-line struct error, and ``+cpo.x=1`` composes silently) or of a value it refuses.

The type of each value is checked once, from the field's annotation: a block's ``__post_init__`` starts with
:func:`check_field_types` (so a block built in Python is checked too, not only one read from the config) and then
checks only ranges and choices.

Why not verl's ``omega_conf_to_dataclass``: it needs a ``_target_`` or a structured-config merge, coerces values
(``"yes"`` becomes ``True``) instead of refusing them, names neither the block nor its valid keys on an unknown key,
and the blocks here hold tuples and unions that OmegaConf's structured configs do not type.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf

from treetune_verl.preflight import PreflightError

__all__ = [
    "block_keys",
    "check_block_overrides",
    "check_field_types",
    "dataclass_from_block",
    "field_type_problems",
    "override_key",
]

T = TypeVar("T")


def override_key(text: str) -> str:
    """The dotted key a Hydra command-line override names: ``++a.b=1``, ``+a.b=1``, ``~a.b``, ``a.b=1`` -> ``a.b``."""
    return text.lstrip("+~").partition("=")[0]


def block_keys(cls: type) -> list[str]:
    """The keys of the block ``cls`` describes: its fields set by ``__init__``, in declaration order."""
    return [field.name for field in dataclasses.fields(cls) if field.init]


@functools.cache
def _nested_blocks(cls: type) -> dict[str, type]:
    """Fields of ``cls`` whose type is itself a dataclass (a nested block), by name."""
    hints = typing.get_type_hints(cls)
    return {name: hints[name] for name in block_keys(cls) if _is_block(hints[name])}


@functools.cache
def _field_hints(cls: type) -> dict[str, Any]:
    """The annotation of each key of block ``cls``, resolved (the modules write them as strings)."""
    hints = typing.get_type_hints(cls)
    return {name: hints[name] for name in block_keys(cls)}


def check_field_types(obj: Any, where: str) -> None:
    """Refuse a block whose values do not fit their fields' annotations; set the ones that fit to their annotated form.

    Call it first in a block's ``__post_init__``; the rest of ``__post_init__`` then checks ranges and choices only.
    What each annotation accepts: :func:`field_type_problems`.

    Raises:
        ValueError: one line naming the first wrong key, ``cpo.sdpo.top_k must be an integer, got True.``
    """
    problems = field_type_problems(obj, where)
    if problems:
        raise ValueError(next(iter(problems.values())))


def field_type_problems(obj: Any, where: str) -> dict[str, str]:
    """Each key of dataclass ``obj`` (block ``where``) whose value does not fit its annotation -> one line saying so.

    ``bool`` takes only true or false; ``int`` an int, not a bool; ``float`` an int or a float, not a bool (set to a
    float); ``str`` a string; ``X | None`` also None; ``tuple[X, ...]`` and ``list[X]`` a list or a tuple of X (set to
    the annotated container); a dataclass an instance of it (a nested block: built from a mapping by
    :func:`dataclass_from_block`). Other annotations (``Any``...) are not checked. A value that fits is set on
    ``obj`` in its annotated form (frozen dataclasses included); fields with ``init=False`` are skipped.
    """
    problems = {}
    for name, hint in _field_hints(type(obj)).items():
        value = getattr(obj, name)
        conformed = _conform(value, hint)
        if conformed is _MISMATCH:
            how = "; build the whole block from its mapping (dataclass_from_block)" if _is_block(hint) else ""
            problems[name] = f"{where}.{name} must be {_join(_describe(hint))}, got {value!r}{how}."
        elif conformed is not value:
            object.__setattr__(obj, name, conformed)
    return problems


_MISMATCH = object()


def _conform(value: Any, hint: Any) -> Any:
    """``value`` in the form ``hint`` annotates (an int made a float, a list made a tuple), or ``_MISMATCH``."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        for option in typing.get_args(hint):
            conformed = _conform(value, option)
            if conformed is not _MISMATCH:
                return conformed
        return _MISMATCH
    if hint is type(None):
        return value if value is None else _MISMATCH
    if hint is bool or hint is str:
        return value if isinstance(value, hint) else _MISMATCH
    if hint is int or hint is float:
        if isinstance(value, bool) or not isinstance(value, int | hint):
            return _MISMATCH
        return float(value) if hint is float and type(value) is not float else value
    if origin is tuple or origin is list:
        if not isinstance(value, list | tuple):
            return _MISMATCH
        item = _item_hint(hint)
        items = [_conform(element, item) for element in value]
        if any(element is _MISMATCH for element in items):
            return _MISMATCH
        if type(value) is origin and all(new is old for new, old in zip(items, value)):
            return value
        return origin(items)
    if _is_block(hint):
        return value if isinstance(value, hint) else _MISMATCH
    return value


def _is_block(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _item_hint(hint: Any) -> Any:
    """The element annotation of ``tuple[X, ...]`` or ``list[X]``; Any (unchecked) for a fixed-length tuple."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple:
        return args[0] if len(args) == 2 and args[1] is Ellipsis else Any
    return args[0] if args else Any


_WORDS = {bool: ["true", "false"], int: ["an integer"], float: ["a number"], str: ["a string"], type(None): ["null"]}
_PLURALS = {bool: "true/false values", int: "integers", float: "numbers", str: "strings"}


def _describe(hint: Any) -> list[str]:
    """What ``hint`` accepts, as alternatives: ``float | None`` -> ["a number", "null"]."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return [word for option in typing.get_args(hint) for word in _describe(option)]
    if hint in _WORDS:
        return _WORDS[hint]
    if origin is tuple or origin is list:
        item = _item_hint(hint)
        return [f"a list of {_PLURALS[item]}" if item in _PLURALS else "a list"]
    name = getattr(hint, "__name__", str(hint))
    return [f"{'an' if name[:1] in 'AEIOU' else 'a'} {name}"]


def _join(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def dataclass_from_block(cls: type[T], block: Any, where: str) -> T:
    """Build the dataclass ``cls`` from the config block found at ``where``.

    Args:
        cls: the block's dataclass; a field typed as a dataclass is a nested block, built the same way.
        block: an OmegaConf node (interpolations resolved), a mapping, an instance of ``cls`` (returned as is) or
            None (all defaults).
        where: the block's dotted path in the run config, for the messages (``cpo``, ``cpo.hint``).

    Raises:
        ValueError: one line naming the block and its valid keys, on a block that is not a mapping or has keys
            ``cls`` does not; any error of ``cls``'s own checks.
    """
    if isinstance(block, cls):
        return block
    if isinstance(block, DictConfig | ListConfig):
        block = OmegaConf.to_container(block, resolve=True)
    if block is None:
        block = {}
    keys = block_keys(cls)
    if not isinstance(block, Mapping):
        raise ValueError(f"{where} must be a mapping of its keys ({', '.join(keys)}), got {block!r}.")
    unknown = sorted(set(map(str, block)) - set(keys))
    if unknown:
        raise ValueError(f"Unknown {where} key(s) {unknown}; valid keys: {', '.join(keys)}.")
    nested = _nested_blocks(cls)
    values = {
        key: dataclass_from_block(nested[key], value, f"{where}.{key}") if key in nested else value
        for key, value in block.items()
    }
    return cls(**values)


def check_block_overrides(overrides: Iterable[str], where: str, cls: type) -> None:
    """Refuse the Hydra command-line overrides of block ``where`` that ``cls`` would refuse, before composition.

    Every override of a key under ``where`` (``where.key=v``, ``+where.key=v``, ``++where.key=v``, ``~where.key``)
    must name a key of the block or of a nested block; the values of the plain ones (not sweeps, not
    interpolations) are then checked together by building ``cls`` from them on top of its defaults. Other overrides
    are ignored. The composed block is checked again later: this only turns a bad command line into one clear line.

    Raises:
        PreflightError: one line, naming the override, the block's valid keys or the value's valid values.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    prefix = where + "."
    mine = [text for text in overrides if text.lstrip("+~").startswith(prefix)]
    if not mine:
        return
    parser = OverridesParser.create()
    block: dict[str, Any] = {}
    for text in mine:
        override = parser.parse_override(text)
        path = override.key_or_group[len(prefix) :].split(".")
        _check_key_path(cls, where, path, text)
        if override.is_delete() or override.is_sweep_override():
            continue
        value = override.value()
        if isinstance(value, str) and "${" in value:  # an interpolation: resolved only in the composed config
            continue
        node = block
        for key in path[:-1]:  # nested blocks (checked above); a later override wins over an earlier one
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = value
    try:
        dataclass_from_block(cls, block, where)
    except ValueError as error:
        raise PreflightError(str(error)) from None


def _check_key_path(cls: type, where: str, path: list[str], text: str) -> None:
    """Raise :class:`PreflightError` unless ``path`` names a key of block ``cls`` (at ``where``) or a nested one."""
    for depth, key in enumerate(path):
        keys = block_keys(cls)
        if key not in keys:
            raise PreflightError(f"{text}: {where} has no key {key!r}; valid keys of {where}: {', '.join(keys)}.")
        nested = _nested_blocks(cls).get(key)
        if depth < len(path) - 1 and nested is None:
            raise PreflightError(f"{text}: {where}.{key} is a value, not a block of keys.")
        cls, where = nested, f"{where}.{key}"
