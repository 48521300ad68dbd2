"""Every client protocol × every worker kind, streaming and not: the right answer in the
client's form, or the documented 4xx in its error form. No cell untested.

Workers: `vllm` and `openai` are the simulator in process (vLLM's API; the `openai` backend
drops what only vLLM takes), `trtllm`, `triton` and `tgi` are fakes built from those servers'
code (tests/fakes/), `simulator` is the simulator as a real process over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration import procs
from tests.matrix import harness

# No basic cell is refused: a plain stream asks for text, and the token ids and logprobs that
# TGI's /generate_stream and LMI's `inputs` lines carry come from the worker, else -1 and null
# (SPEC.md, "Where the sources disagree"). What a client asks for by name and a worker cannot
# give is refused: the capability cells (test_capability_cell).
REFUSED: dict[tuple[str, str, bool], str] = {}

CELLS = [(client, kind, stream)
         for client, (_, _, modes) in harness.CLIENTS.items()
         for kind in harness.KINDS for stream in modes]


@pytest.fixture(scope="module")
def sim_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    proc, url = procs.simulator(Path(tmp_path_factory.mktemp("matrix")))
    try:
        yield url
    finally:
        proc.stop()


def test_the_matrix_is_whole() -> None:
    assert len(harness.KINDS) == 6 and len(harness.CLIENTS) == 7
    assert len(CELLS) == 6 * (2 * 6 + 1)
    assert set(REFUSED) <= set(CELLS)


@pytest.mark.anyio
@pytest.mark.parametrize(("client", "kind", "stream"), CELLS,
                         ids=[f"{c}-{k}-{'stream' if s else 'whole'}" for c, k, s in CELLS])
async def test_cell(client: str, kind: str, stream: bool, sim_url: str) -> None:
    outcome = await harness.run_cell(client, kind, stream, sim_url)
    assert outcome == REFUSED.get((client, kind, stream), "ok")
