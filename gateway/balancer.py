"""A model's upstream set: round-robin over healthy base URLs, changed live by the supervisor."""

from __future__ import annotations

import itertools


class Upstreams:
    """Static upstreams from the config plus managed workers added once healthy."""

    def __init__(self, static: tuple[str, ...] = ()):
        self._static = list(static)
        self._managed: list[str] = []
        self._counter = itertools.count()

    @property
    def all(self) -> list[str]:
        return self._static + self._managed

    def add(self, url: str) -> None:
        if url not in self._managed:
            self._managed.append(url)

    def remove(self, url: str) -> None:
        if url in self._managed:
            self._managed.remove(url)

    def order(self) -> list[str]:
        """Every upstream once, starting at the next in turn: attempt 1 there, retries after."""
        urls = self.all
        if not urls:
            return []
        start = next(self._counter) % len(urls)
        return urls[start:] + urls[:start]
