"""The registry of algorithm records: a group's `algorithm` option names one of these, or is a
record itself (a variant: `dataclasses.replace(MUON, orthogonalize=...)`). Adding an algorithm is
one module of this package defining its record (and, if it wants one, its convenience class): the
registry finds every module-level `Algorithm` of the package's modules at its first use."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from typing import Any, Iterator, Mapping

from optimizers.algorithms.base import Algorithm, StateKey


@functools.cache
def _discovered() -> dict[str, Algorithm]:
    """name -> record, of every module of this package (imported here, after the package itself: the
    modules may subclass `optimizers.Muon`). Two distinct records of one name are a ValueError."""
    found: dict[str, Algorithm] = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for value in vars(module).values():
            if isinstance(value, Algorithm):
                if found.setdefault(value.name, value) is not value:
                    raise ValueError(f"two algorithm records are named {value.name!r} ({__name__}.{info.name})")
    return dict(sorted(found.items()))


class _Registry(Mapping[str, Algorithm]):
    """The registered records by name, read-only, discovered at first use (no state of its own: the
    discovery's memoization holds them)."""

    __slots__ = ()

    def __getitem__(self, name: str) -> Algorithm:
        return _discovered()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(_discovered())

    def __len__(self) -> int:
        return len(_discovered())

    def __repr__(self) -> str:
        return f"REGISTRY({sorted(_discovered())})"


REGISTRY: Mapping[str, Algorithm] = _Registry()


def resolve(where: str, algorithm: Any) -> Algorithm:
    """The record of a group's `algorithm` option: a record as it is, a registered name looked up."""
    if isinstance(algorithm, Algorithm):
        return algorithm
    if isinstance(algorithm, str) and algorithm in REGISTRY:
        return REGISTRY[algorithm]
    raise ValueError(f"{where}: unknown algorithm {algorithm!r}; expected an Algorithm record or one of "
                     f"{tuple(REGISTRY)}")


__all__ = ["Algorithm", "REGISTRY", "StateKey", "resolve"]
