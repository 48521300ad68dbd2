"""A whole answer's details list one token per generated token on every worker kind, the same
tokens its stream gives (SPEC.md: ids from the worker, else the tokenizer, else -1 and a null
log prob; "never a silently wrong answer").

TGI's `details.tokens` (router/src/lib.rs `Details`) and LMI's (seed 003, `details.tokens`;
DJL `get_details_dict`, with `tgi_compat`'s list-wrapped body) hold every generated token, and
`generated_tokens` counts them. A Triton ensemble's `generate` body is one `text_output`
(tensorrt_llm/1/model.py convert_response) and a plain OpenAI server's body one text, so such an
answer is asked of the worker as a stream and folded (gateway.whole). TGI keeps a matched stop
sequence in generated_text and in its last token (SPEC.md; TGI issue #332); an OpenAI server
strips it, so a last token of its own carries it. Clients: huggingface_hub InferenceClient
(`text_generation(details=True)`, POST /), text-generation 0.7.0 `Client.generate` (POST /,
details always on), LMI `/invocations` and `/predictions/{model}` with `details` and
`tgi_compat`. One gateway per worker: the triton fake, `openai` in front of the trtllm fake,
and `openai` in front of the simulator (tests/fakes, simulator/).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from huggingface_hub import InferenceClient

from tests.integration import procs

pytestmark = pytest.mark.integration

TEMPLATE = Path(__file__).parents[1] / "golden" / "triton" / "chat_template.jinja"
WORKERS: dict[str, tuple[str, str, dict[str, Any]]] = {  # (module or "sim", ready, model config)
    "triton": ("tests.fakes.triton_fake", "/v2/health/ready",
               {"backend": "triton", "upstream_model": "ensemble",
                "chat_template": str(TEMPLATE)}),
    "openai-trtllm": ("tests.fakes.trtllm_fake", "/health",
                      {"backend": "openai", "upstream_model": "org/m"}),
    "openai-sim": ("sim", "/health", {"backend": "openai", "upstream_model": "org/demo-model"}),
}


@pytest.fixture(scope="module", params=sorted(WORKERS))
def gw(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
       ) -> Iterator[str]:
    module, ready, model = WORKERS[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    started: list[procs.Proc] = []
    try:
        if module == "sim":
            sim, worker_url = procs.simulator(tmp)
            started.append(sim)
        else:
            port = procs.free_port()
            started.append(procs.Proc([sys.executable, "-m", module, str(port)],
                                      tmp / "worker.log"))
            worker_url = f"http://127.0.0.1:{port}"
            started[-1].wait_http(worker_url + ready)
        # first_byte 60: every answer here is bounded small, so only its tokens make it a stream
        gateway, url = procs.gateway(tmp, orjson.dumps({
            "server": {"timeouts": {"first_byte": 60, "idle": 5}}, "default_model": "m",
            "models": [{"name": "m", **model, "upstreams": [worker_url]},
                       {"name": "compat", **model, "upstreams": [worker_url],
                        "lmi": {"tgi_compat": True}}]}).decode())
        started.append(gateway)
        yield url
    finally:
        for p in reversed(started):
            p.stop()


def whole_tokens(details: Any, generated_text: str) -> list[tuple[int, str]]:
    """The details' tokens, checked against their count and the text."""
    tokens = [(t.id, t.text) for t in details.tokens]
    assert len(tokens) == details.generated_tokens > 0
    assert "".join(text for _, text in tokens) == generated_text
    assert all(t.logprob is None for t in details.tokens)  # no worker logprobs asked or given
    return tokens


def test_huggingface_hub_details_list_every_token(gw: str) -> None:
    hf = InferenceClient(base_url=gw, timeout=20)
    out = hf.text_generation("Hi", max_new_tokens=5, details=True, return_full_text=False)
    assert out.details is not None and out.details.finish_reason == "length"
    tokens = whole_tokens(out.details, out.generated_text)
    assert len(tokens) == 5 and all(tid == -1 for tid, _ in tokens)  # neither worker nor tokenizer
    events = list(hf.text_generation("Hi", max_new_tokens=5, stream=True, details=True,
                                     return_full_text=False))
    assert [(e.token.id, e.token.text) for e in events] == tokens  # as its stream gives them
    # TGI's stop rule: the matched sequence ends generated_text and the tokens
    stop = out.generated_text.split()[2]
    stopped = hf.text_generation("Hi", max_new_tokens=5, details=True, return_full_text=False,
                                 stop=[stop])
    assert stopped.details is not None and stopped.details.finish_reason == "stop_sequence"
    assert stopped.generated_text.endswith(stop)
    whole_tokens(stopped.details, stopped.generated_text)
    streamed = list(hf.text_generation("Hi", max_new_tokens=5, stream=True, details=True,
                                       return_full_text=False, stop=[stop]))
    assert "".join(e.token.text for e in streamed) == stopped.generated_text


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # its own pydantic `.dict()` calls
def test_text_generation_client_details_list_every_token(gw: str) -> None:
    """text-generation 0.7.0 posts / with `details: true` always (client.py Client.generate)."""
    import text_generation as tg

    client = tg.Client(gw, timeout=20)
    out = client.generate("Hi", max_new_tokens=4)
    assert whole_tokens(out.details, out.generated_text)
    assert out.details.generated_tokens == 4
    stop = out.generated_text.split()[1]
    stopped = client.generate("Hi", max_new_tokens=4, stop_sequences=[stop])
    assert stopped.details.finish_reason == tg.types.FinishReason.StopSequence
    whole_tokens(stopped.details, stopped.generated_text)


@pytest.mark.parametrize("path", ["/invocations", "/predictions/compat"])
def test_lmi_details_list_every_token(gw: str, path: str) -> None:
    """Seed 003 `details.tokens` ({id, text, log_prob}); under `tgi_compat` TGI's names and a
    list-wrapped body, details on by default (DJL tgi_compat)."""
    body: dict[str, Any] = {"inputs": "Hi", "parameters": {"max_new_tokens": 5}}
    if path == "/invocations":
        body["parameters"]["details"] = True
    out = httpx.post(gw + path, json=body, timeout=20).json()
    out = out[0] if path != "/invocations" else out
    details = out["details"]
    tokens = details["tokens"]
    assert len(tokens) == details["generated_tokens"] == 5
    assert "".join(t["text"] for t in tokens) == out["generated_text"]
    logprob = "logprob" if path != "/invocations" else "log_prob"
    assert all(t["id"] == -1 and t[logprob] is None for t in tokens)
    lines = httpx.post(gw + "/invocations", json={**body, "stream": True}, timeout=20)
    streamed = [orjson.loads(line)["token"] for line in lines.text.splitlines() if line]
    assert [t["text"] for t in streamed] == [t["text"] for t in tokens]
