"""Every client protocol × every worker kind, streaming and not: the right answer in the
client's form, or the documented 4xx in its error form. No cell untested.

Workers: `vllm` and `openai` are the simulator in process (vLLM's API; the `openai` backend
drops what only vLLM takes), `trtllm`, `triton` and `tgi` are fakes built from those servers'
code (tests/fakes/), `simulator` is the simulator as a real process over loopback.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.fakes import vocab
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


# What a client asks for by name and a worker cannot give: a 4xx in the client's error form,
# before any I/O. (client, path, body, worker kinds that cannot) -> the refusal outcome; the
# same request answers on every other kind.
CAPABILITIES: list[tuple[str, str, dict[str, Any], tuple[str, ...], str]] = [
    # OpenAI logprobs need the token text, which Triton's ensemble does not return
    ("openai_chat", "/v1/chat/completions",
     {"model": "m", "messages": harness.MSG, "max_tokens": 5, "logprobs": True},
     ("triton",), "refused 400"),
    # TGI decoder_input_details needs the prompt's tokens: vLLM's prompt_logprobs only
    ("tgi", "/generate", {"inputs": "Say", "parameters": {
        "max_new_tokens": 5, "decoder_input_details": True}},
     ("openai", "trtllm", "triton"), "refused 422"),
    # top tokens: no alternatives from Triton (TGI answers a stream's refusal in-band)
    ("tgi", "/generate_stream", {"inputs": "Say", "parameters": {
        "max_new_tokens": 5, "top_n_tokens": 2}}, ("triton",), "refused in-band 422"),
    ("lmi_inputs", "/predictions/m", {"inputs": "Say", "parameters": {
        "max_new_tokens": 5, "details": True, "top_n_tokens": 2}}, ("triton",), "refused 424"),
]
CAPABILITY_CELLS = [(i, kind) for i in range(len(CAPABILITIES)) for kind in harness.KINDS]


@pytest.mark.anyio
@pytest.mark.parametrize(("case", "kind"), CAPABILITY_CELLS,
                         ids=[f"{CAPABILITIES[i][0]}{i}-{k}" for i, k in CAPABILITY_CELLS])
async def test_capability_cell(case: int, kind: str, sim_url: str) -> None:
    client, path, body, unable, refusal = CAPABILITIES[case]
    answer = await harness.post(kind, sim_url, path, body)
    stream = path == "/generate_stream"
    assert harness.CLIENTS[client][1](answer, stream) == (refusal if kind in unable else "ok")


@pytest.mark.anyio
@pytest.mark.parametrize("kind", list(harness.KINDS))
async def test_tgi_without_max_new_tokens_gets_as_many_as_fit(kind: str, sim_url: str) -> None:
    """TGI's default limit is "as many tokens as fit" (canonical `max_tokens_fit`), which each
    worker says its own way (vLLM `max_tokens: null`; trtllm-serve its own default): no
    worker refuses it (trtllm-serve took the vLLM field as an unknown one: a 422)."""
    answer = await harness.post(kind, sim_url, "/generate", {"inputs": "Say"})
    assert harness.tgi(answer, False) == "ok"


@pytest.mark.anyio
@pytest.mark.parametrize("kind", list(harness.KINDS))
async def test_tgi_keeps_the_matched_stop_string_on_every_worker(kind: str, sim_url: str) -> None:
    """TGI keeps a matched stop sequence in generated_text (SPEC.md); canonical `keep_stop`:
    vLLM and trtllm-serve keep it when told, Triton's decoder keeps it, and where a worker
    drops it the encoder puts the reported match back."""
    first = await harness.post("vllm", sim_url, "/generate", {"inputs": "Say",
                                                              "parameters": {"details": True}})
    word = orjson.loads(first.body)["generated_text"].split()[3]
    answer = await harness.post(kind, sim_url, "/generate", {
        "inputs": "Say", "parameters": {"stop": [word], "details": True}})
    body = orjson.loads(answer.body)
    if kind == "triton":  # its fake writes text of its own; the stop word may not be in it
        assert answer.status == 200
        return
    assert body["generated_text"].endswith(word)
    assert body["details"]["finish_reason"] == "stop_sequence"


def _stream_tokens(answer: harness.Answer) -> list[dict[str, Any]]:
    return [orjson.loads(e)["token"] for e in harness.sse_data(answer.body)]


@pytest.mark.anyio
async def test_a_tokenizer_gives_real_ids_and_special_on_workers_that_give_none(
        sim_url: str, tmp_path: Path) -> None:
    """`models[].tokenizer` (a tokenizer.json made here with `tokenizers`, tests/fakes/
    vocab.py): trtllm-serve and a plain OpenAI server return no token ids, yet the TGI stream
    carries the same ids as from vLLM, which reports them, and the EOS token (in trtllm-serve's
    logprobs) is `special`. Without a tokenizer the ids are -1, "unknown"."""
    extra = {"tokenizer": str(vocab.build(tmp_path / "model"))}
    body = {"inputs": "Say", "parameters": {"max_new_tokens": 40}}
    want = _stream_tokens(await harness.post("vllm", sim_url, "/generate_stream", body))
    assert want[-1]["special"] is False  # vLLM reports ids, not which are special
    trtllm = _stream_tokens(await harness.post("trtllm", sim_url, "/generate_stream", body,
                                               extra))
    assert [t["id"] for t in trtllm] == [t["id"] for t in want]
    assert [t["text"] for t in trtllm] == [t["text"] for t in want]
    assert trtllm[-1]["id"] == 2 and trtllm[-1]["special"] is True  # </s>
    assert not any(t["special"] for t in trtllm[:-1])
    plain = _stream_tokens(await harness.post("openai", sim_url, "/generate_stream", body,
                                              extra))
    assert [t["id"] for t in plain] == [t["id"] for t in want if t["text"]]
    assert all(t["logprob"] is None for t in plain)  # never invented
    unknown = _stream_tokens(await harness.post("openai", sim_url, "/generate_stream", body))
    assert {t["id"] for t in unknown} == {-1}


@pytest.mark.anyio
async def test_lmi_token_lines_get_tokenizer_ids(sim_url: str, tmp_path: Path) -> None:
    extra = {"tokenizer": str(vocab.build(tmp_path / "model"))}
    body = {"inputs": "Say", "stream": True, "parameters": {"max_new_tokens": 8}}
    lines = [orjson.loads(x) for x in (await harness.post(
        "trtllm", sim_url, "/predictions/m", body, extra)).body.splitlines()]
    want = [orjson.loads(x) for x in (await harness.post(
        "vllm", sim_url, "/predictions/m", body)).body.splitlines()]
    assert [ln["token"]["id"] for ln in lines] == [ln["token"]["id"] for ln in want]
    assert all(ln["token"]["id"] >= 1000 for ln in lines)
