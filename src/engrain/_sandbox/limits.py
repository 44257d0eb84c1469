"""A sandboxed call's limits: CPU (fuel), memory, wall clock, output, and the folders granted read-only.

Each is checked when the limits are made: wasmtime takes sizes as unsigned 64-bit numbers, so a
bad value (-1, NaN) would not be refused there but read as "no limit".
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .._errors import ConfigError


@dataclass(frozen=True)
class Limits:
    """Per-call limits. ``readonly_dirs`` maps guest path -> host dir, mounted read-only.

    A limit of the wrong type or out of range (0, negative, NaN, infinite) is a
    :class:`~engrain.ConfigError` when the limits are made.
    """

    fuel: int | None = 1_000_000_000  # None: no fuel metering (the wall clock still bounds the call)
    memory_bytes: int = 64 * 1024 * 1024
    wall_clock_s: float = 5.0
    output_bytes: int = 1024 * 1024
    readonly_dirs: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # wasmtime takes these as unsigned 64-bit numbers: -1 wrapped to "no limit", and a NaN
        # output cap compared false with every size, so a bad value must never reach it.
        if self.fuel is not None:
            _whole("fuel", self.fuel, _U64)
        _whole("memory_bytes", self.memory_bytes, _I64)
        _whole("output_bytes", self.output_bytes, _I64)
        w = self.wall_clock_s
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not 0 < w <= _MAX_WALL_CLOCK_S:
            raise ConfigError(f"sandbox limit wall_clock_s must be a number of seconds above 0 and at most "
                              f"{_MAX_WALL_CLOCK_S:g}, not {w!r}")
        dirs = self.readonly_dirs
        if not isinstance(dirs, dict) or not all(
                isinstance(g, str) and isinstance(h, (str, os.PathLike)) for g, h in dirs.items()):
            raise ConfigError(f"sandbox limit readonly_dirs must map guest paths to host folders, not {dirs!r}")


_U64 = 2**64 - 1
_I64 = 2**63 - 1
_MAX_WALL_CLOCK_S = 1e9  # its epoch ticks must fit wasmtime's deadline


def _whole(name: str, value: object, most: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ConfigError(f"sandbox limit {name} must be a whole number from 1 to {most}, not {value!r}")
