"""A request body that is all here when the endpoint starts (most come with their head) is
taken by `Cycle.ready_body` without the `timeouts.request_read` deadline: exactly what
`receive` would have returned at once; and nothing while any of it is still to come, nor an
empty body or one past the size limit, which `receive` reads as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.http_cycle import Cycle


class Link:
    def __init__(self) -> None:
        self.loop = asyncio.get_event_loop_policy().new_event_loop()
        self.resumed = 0

    def resume_reading(self) -> None:
        self.resumed += 1

    def pause_reading(self) -> None:
        pass


def cycle(link: Any, parts: list[bytes], complete: bool = True) -> Cycle:
    c = Cycle(link, "POST", b"/v1/completions", b"", [(b"content-type", b"application/json")],
              "1.1", True)
    for p in parts:
        c.on_body(p)
    if complete:
        c.on_complete()
    return c


@pytest.mark.parametrize("parts", [[b'{"a":1}'], [b'{"a"', b":1}"]])
def test_a_body_all_here_is_taken_as_receive_takes_it(parts: list[bytes]) -> None:
    link_a, link_b = Link(), Link()
    a, b = cycle(link_a, parts), cycle(link_b, parts)
    message = link_b.loop.run_until_complete(b.receive())
    assert a.ready_body(7) == message["body"] == b"".join(parts)
    assert message["more_body"] is False
    assert (a.delivered, a.body, a.body_size, link_a.resumed) == \
        (b.delivered, b.body, b.body_size, link_b.resumed)
    assert a.ready_body(7) is None  # taken once
    for link in (link_a, link_b):
        link.loop.close()


@pytest.mark.parametrize(("parts", "complete", "limit"), [
    ([b'{"a"'], False, 100),  # still coming
    ([], True, 100),  # empty: receive answers it
    ([b"12345"], True, 4),  # past the limit: receive reads it, and it is refused there
])
def test_nothing_is_taken_otherwise(parts: list[bytes], complete: bool, limit: int) -> None:
    link = Link()
    c = cycle(link, parts, complete)
    assert c.ready_body(limit) is None
    assert (c.body, c.delivered, link.resumed) == (parts, False, 0)
    if complete:
        message = link.loop.run_until_complete(c.receive())
        assert message["body"] == b"".join(parts)
    link.loop.close()


def test_nothing_is_taken_once_the_client_is_gone() -> None:
    link = Link()
    c = cycle(link, [b"{}"])
    c.on_lost()
    assert c.ready_body(100) is None
    link.loop.close()
