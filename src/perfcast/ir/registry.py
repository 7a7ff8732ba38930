"""One table per extension point: a named registry whose entries are registered by decorator.
Registering a key twice raises; looking up an unknown key raises with the known keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    def __init__(self, what: str):
        self.what = what  # e.g. "leaf kind rule", used in messages
        self._entries: dict[str, T] = {}

    def register(self, *keys: str) -> Callable[[T], T]:
        """Decorator: register the decorated object under each of ``keys``."""

        def deco(entry: T) -> T:
            for key in keys:
                if key in self._entries:
                    raise ValueError(f"{self.what} {key!r} is already registered "
                                     f"({getattr(self._entries[key], '__name__', self._entries[key])})")
                self._entries[key] = entry
            return entry

        return deco

    def keys(self) -> tuple[str, ...]:
        return tuple(sorted(self._entries))

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str, default: T | None = None) -> T | None:
        return self._entries.get(key, default)

    def __getitem__(self, key: str) -> T:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"no {self.what} {key!r}; known: {', '.join(self.keys())}") from None
