"""The name -> builder tables behind --model and --dataset, each filled by its module's @register("name")."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

Builder = TypeVar("Builder", bound=Callable[..., Any])


class Registry(dict[str, Builder], Generic[Builder]):
    def register(self, name: str) -> Callable[[Builder], Builder]:
        """A decorator: @register("name") puts the builder under that name and returns it unchanged."""

        def add(builder: Builder) -> Builder:
            self[name] = builder
            return builder

        return add
