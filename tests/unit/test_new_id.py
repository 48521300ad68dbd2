"""Request and response ids: 32 hex digits of `random.randbytes(16)`, whatever spelling."""

from __future__ import annotations

import random

from gateway.http_cycle import new_id


def test_new_id_is_randbytes_hex() -> None:
    state = random.getstate()
    try:
        random.seed(17)
        expected = [random.randbytes(16).hex() for _ in range(50)]
        random.seed(17)
        got = [new_id() for _ in range(50)]
    finally:
        random.setstate(state)
    assert got == expected
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in got)
