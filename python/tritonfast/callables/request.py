"""What a bound callable receives for each request: its inputs by name (a mapping of numpy
arrays), the request's parameters and the outputs it asked for, as PyTriton's ``Request``."""

from __future__ import annotations

import dataclasses
from collections.abc import ItemsView, Iterator, KeysView, ValuesView
from typing import Any

import numpy as np


@dataclasses.dataclass
class Request:
    data: dict[str, np.ndarray]
    parameters: dict[str, Any] | None = None
    span: Any = None
    requested_output_names: list[str] | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        return self.data[name]

    def __setitem__(self, name: str, value: np.ndarray) -> None:
        self.data[name] = value

    def __delitem__(self, name: str) -> None:
        del self.data[name]

    def __contains__(self, name: object) -> bool:
        return name in self.data

    def __len__(self) -> int:
        return len(self.data)

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def keys(self) -> KeysView[str]:
        return self.data.keys()

    def values(self) -> ValuesView[np.ndarray]:
        return self.data.values()

    def items(self) -> ItemsView[str, np.ndarray]:
        return self.data.items()
