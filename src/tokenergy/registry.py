"""Name → callable registries for plug-ins (energy sources, weightings, environments, …).

Configs refer to plug-ins by name; adding one is a decorator, never a new ``elif``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry"]

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    """A named table of callables with helpful errors for unknown names."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator: ``@REG.register("name")``."""

        def deco(fn: F) -> F:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = fn
            return fn

        return deco

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(self.unknown_message(name)) from None

    def unknown_message(self, name: str) -> str:
        close = difflib.get_close_matches(name, list(self._items), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown {self.kind} {name!r} (choose from {', '.join(sorted(self._items))}){hint}"

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._items))
