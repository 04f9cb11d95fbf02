"""What every executor shares: closing on leaving a ``with`` block."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """``with executor:`` closes it on the way out, whatever raised."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
