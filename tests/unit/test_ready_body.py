"""A request body that is all here when the endpoint starts (most come with their head) is
taken by `Cycle.ready_body` without the `timeouts.request_read` deadline: exactly what
`receive` would have returned at once, and nothing while any of it is still to come."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway import config, serving
from gateway.http_cycle import Cycle
from schemas import errors


class Link:
    def __init__(self) -> None:
        self.loop = asyncio.get_event_loop_policy().new_event_loop()
        self.resumed = 0

    def resume_reading(self) -> None:
        self.resumed += 1

    def pause_reading(self) -> None:
        pass


def cycle(link: Any) -> Cycle:
    return Cycle(link, "POST", b"/v1/completions", b"", [(b"content-type", b"application/json")],
                 "1.1", True)


@pytest.mark.parametrize("parts", [[b'{"a":1}'], [b'{"a"', b":1}"], []])
def test_a_body_all_here_is_taken_as_receive_takes_it(parts: list[bytes]) -> None:
    link_a, link_b = Link(), Link()
    a, b = cycle(link_a), cycle(link_b)
    for c in (a, b):
        for p in parts:
            c.on_body(p)
        c.on_complete()
    message = link_b.loop.run_until_complete(b.receive())
    assert a.ready_body() == message["body"] == b"".join(parts)
    assert message["more_body"] is False
    assert (a.delivered, a.body, a.body_size, link_a.resumed) == \
        (b.delivered, b.body, b.body_size, link_b.resumed)
    assert a.ready_body() is None  # taken once
    for link in (link_a, link_b):
        link.loop.close()


def test_nothing_is_taken_while_the_body_is_still_coming_or_the_client_is_gone() -> None:
    link = Link()
    c = cycle(link)
    c.on_body(b'{"a"')
    assert c.ready_body() is None
    assert c.body == [b'{"a"'] and not c.delivered
    c.on_complete()
    c.on_lost()
    assert c.ready_body() is None
    link.loop.close()


def test_a_ready_body_past_the_limit_is_refused_as_one_read_would_be() -> None:
    server = config.ServerConfig.model_validate({"max_request_bytes": 4})

    async def never() -> dict[str, Any]:
        raise AssertionError("a ready body is not read again")

    with pytest.raises(errors.PayloadTooLarge, match="exceeds 4 bytes"):
        asyncio.run(serving.read_body(never, {}, server, b"12345"))
    assert asyncio.run(serving.read_body(never, {}, server, b"1234")) == b"1234"
