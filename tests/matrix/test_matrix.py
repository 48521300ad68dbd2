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

# The documented refusals. Each is a 4xx in the client's own error form, before any I/O:
# TGI's /generate_stream and LMI's streamed `inputs` lines carry a token id on every event
# (TGI lib.rs StreamResponse.token.id; seed 003 token lines), and these workers give none
# (trtllm-serve and plain OpenAI servers have no `return_token_ids`; Triton's ensemble returns
# `output_log_probs` without token ids or texts). TGI answers such a stream's refusal as its
# validation event after HTTP 200 (server.rs generate_stream_internal).
REFUSED = {
    ("lmi_inputs", "openai", True): "refused 424",
    ("lmi_inputs", "trtllm", True): "refused 424",
    ("lmi_inputs", "triton", True): "refused 424",
    ("tgi", "openai", True): "refused in-band 422",
    ("tgi", "trtllm", True): "refused in-band 422",
    ("tgi", "triton", True): "refused in-band 422",
}

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
