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

Why not verl's ``omega_conf_to_dataclass``: it needs a ``_target_`` or a structured-config merge, coerces values
(``"yes"`` becomes ``True``) instead of refusing them, names neither the block nor its valid keys on an unknown key,
and the blocks here hold tuples and unions that OmegaConf's structured configs do not type.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, ListConfig, OmegaConf

from treetune_verl.preflight import PreflightError

__all__ = ["block_keys", "check_block_overrides", "dataclass_from_block", "override_key"]

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
    return {
        name: hints[name]
        for name in block_keys(cls)
        if isinstance(hints[name], type) and dataclasses.is_dataclass(hints[name])
    }


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
