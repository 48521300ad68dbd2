"""Failover mid-stream against real simulator workers, for every client protocol.

The simulator's fault directives cut a stream after K tokens (a reset, an in-band engine
error, a stall past the idle timeout); the gateway asks the other worker to continue from the
text already sent. The client must get the whole answer once: exactly the text the worker
would have produced uncut (computed by the simulator's own generator from the body the first
worker received), one response id, and usage counting the answer as one.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest

from simulator import chat, completions, directives, resume, settings
from tests.fakes import tgi_fake, triton_fake, trtllm_fake
from tests.integration import procs

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, list[str]]]:
    tmp = tmp_path_factory.mktemp("failover")
    sims = [procs.simulator(tmp) for _ in range(2)]
    urls = [u for _, u in sims]
    gw, url = procs.gateway(tmp, f"""
server: {{failover_attempts: 1, timeouts: {{first_byte: 10, idle: 1}},
          health: {{eject_after: 1000}}}}  # every test cuts a worker: none may be ejected
default_model: demo
models:
  - name: demo
    backend: vllm
    routing: round_robin
    upstreams: [{urls[0]}, {urls[1]}]
""")
    try:
        yield url, urls
    finally:
        gw.stop()
        for proc, _ in sims:
            proc.stop()


def requests_seen(sims: list[str]) -> list[dict[str, Any]]:
    """The last generation request each worker received."""
    return [httpx.get(u + "/_sim/last_request", timeout=5).json() for u in sims]


def uncut(sims: list[str]) -> tuple[str, int, int]:
    """The answer (text, prompt tokens, completion tokens) the first worker would have sent
    had it not been cut: the one whose last request is not a continuation."""
    bodies = [r["body"] for r in requests_seen(sims)]
    firsts = [b for b in bodies if not b.get("continue_final_message")]
    if all("prompt" in b for b in bodies):  # completions: the continuation extends the prompt
        firsts = [min(bodies, key=lambda b: len(b["prompt"]))]
    body = firsts[0]
    endpoint = chat if "messages" in body else completions
    faults = resume.uncut(directives.parse(endpoint.directive_texts(body)))
    job = endpoint.parse(body, settings.SimulatorSettings(), faults, None)
    o = job.outcomes[0]
    return o.content or "", len(job.prompts[0]), len(o.tokens)


def both_served(sims: list[str], before: list[int]) -> bool:
    """Each worker got one more generation request: the cut one and the continuation."""
    now = [httpx.get(u + "/_sim/stats", timeout=5).json()["requests"] for u in sims]
    return [a - b for a, b in zip(now, before, strict=True)] == [1, 1]


def counts(sims: list[str]) -> list[int]:
    return [httpx.get(u + "/_sim/stats", timeout=5).json()["requests"] for u in sims]


@pytest.mark.parametrize("fault", ["drop_after=4", "error_after=4", "hang_after=4"])
def test_openai_chat_stream_is_continued(env: tuple[str, list[str]], fault: str) -> None:
    gw, sims = env
    before = counts(sims)
    client = openai.OpenAI(base_url=gw + "/v1", api_key="x", max_retries=0, timeout=20)
    msgs = [{"role": "user", "content": f"tell me [[sim tokens=12 itl_ms=20 {fault}]]"}]
    chunks = list(client.chat.completions.create(
        model="demo", messages=msgs, max_tokens=30, stream=True,  # type: ignore[arg-type]
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected, prompt, completion = uncut(sims)
    assert text == expected and len(text.split()) == 12
    assert len({c.id for c in chunks}) == 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    roles = [c for c in chunks if c.choices and c.choices[0].delta.role]
    assert len(roles) == 1
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, completion)
    assert both_served(sims, before)


@pytest.mark.parametrize("fault", ["drop_after=4", "hang_after=4"])
def test_a_whole_answer_folded_from_a_stream_is_continued(env: tuple[str, list[str]],
                                                          fault: str) -> None:
    """A whole answer that may be longer than first_byte * 2 tokens (30 > 20 here) is asked
    as a stream and folded (gateway.whole); a worker failing after its first token is
    continued elsewhere as a stream would be, and the client gets one whole answer."""
    gw, sims = env
    before = counts(sims)
    client = openai.OpenAI(base_url=gw + "/v1", api_key="x", max_retries=0, timeout=20)
    msgs = [{"role": "user", "content": f"whole [[sim tokens=12 itl_ms=20 {fault}]]"}]
    done = client.chat.completions.create(model="demo", messages=msgs,  # type: ignore[arg-type]
                                          max_tokens=30)
    expected, prompt, completion = uncut(sims)
    assert done.choices[0].message.content == expected and len(expected.split()) == 12
    assert done.choices[0].finish_reason == "stop"
    assert done.usage is not None
    assert (done.usage.prompt_tokens, done.usage.completion_tokens) == (prompt, completion)
    assert both_served(sims, before)
    assert all(r["body"]["stream"] is True for r in requests_seen(sims))


def test_each_choice_of_an_n_chat_stream_is_continued(env: tuple[str, list[str]]) -> None:
    """n=2: each unfinished choice is continued from its own text, as a request of its own
    (vLLM's `continue_final_message` takes one assistant turn), merged into the one stream:
    every choice's whole answer once, one role and one finish per choice, one usage counting
    the prompt once and every choice's tokens (vLLM serving_chat.py: `prompt_tokens` once,
    `completion_tokens` summed over the choices)."""
    gw, sims = env
    before = counts(sims)
    client = openai.OpenAI(base_url=gw + "/v1", api_key="x", max_retries=0, timeout=20)
    chunks = list(client.chat.completions.create(
        model="demo", n=2, max_tokens=30, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "two [[sim tokens=8 itl_ms=10 drop_after=3]]"}]))
    now = counts(sims)
    assert sorted(a - b for a, b in zip(now, before, strict=True)) == [1, 2]  # cut, 2 more
    bodies = [r["body"] for r in requests_seen(sims)]
    first = next(b for b in bodies if not b.get("continue_final_message"))
    job = chat.parse(first, settings.SimulatorSettings(),
                     resume.uncut(directives.parse(chat.directive_texts(first))), None)
    for i, outcome in enumerate(job.outcomes):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert "".join(c.delta.content or "" for c in mine) == outcome.content
        assert [c.delta.role for c in mine if c.delta.role] == ["assistant"]
        assert [c.finish_reason for c in mine if c.finish_reason] == ["stop"]
    assert len({c.id for c in chunks}) == 1 and len({c.created for c in chunks}) == 1
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert [c for c in chunks if c.usage is not None] == [chunks[-1]]
    assert usage.prompt_tokens == len(job.prompts[0])
    assert usage.completion_tokens == sum(len(o.tokens) for o in job.outcomes)


def test_each_choice_of_an_n_completions_stream_is_continued(
        env: tuple[str, list[str]]) -> None:
    """n=3 with logprobs: each choice cut after 4 tokens is continued with what is left of
    its budget (max_tokens 6), so each ends `length` after exactly 6 tokens; `text_offset`
    runs on through each choice's own text, and the one usage counts all 18 tokens."""
    gw, _ = env
    r = httpx.post(gw + "/v1/completions", timeout=20, json={
        "model": "demo", "prompt": "three [[sim tokens=10 drop_after=4]]", "n": 3,
        "max_tokens": 6, "logprobs": 1, "stream": True,
        "stream_options": {"include_usage": True}})
    datas = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]" and datas.count("[DONE]") == 1 and '"error"' not in r.text
    chunks = [orjson.loads(d) for d in datas[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    for i in range(3):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        tokens = [c for c in mine if c["logprobs"] and c["logprobs"]["tokens"]]
        assert len(tokens) == 6
        offsets = [c["logprobs"]["text_offset"][0] for c in tokens]
        texts = [c["text"] for c in tokens]
        assert offsets == [sum(len(t) for t in texts[:k]) for k in range(6)]
        assert [c["finish_reason"] for c in mine if c["finish_reason"]] == ["length"]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usage) == 1 and usage[0]["completion_tokens"] == 18


def test_openai_completions_stream_is_continued(env: tuple[str, list[str]]) -> None:
    gw, sims = env
    before = counts(sims)
    client = openai.OpenAI(base_url=gw + "/v1", api_key="x", max_retries=0, timeout=20)
    chunks = list(client.completions.create(
        model="demo", prompt="once upon a time [[sim tokens=10 drop_after=3]]", max_tokens=30,
        stream=True))
    assert both_served(sims, before)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == uncut(sims)[0] and len(text.split()) == 10
    assert len({c.id for c in chunks}) == 1


def test_tgi_generate_stream_is_continued(env: tuple[str, list[str]]) -> None:
    gw, sims = env
    before = counts(sims)
    r = httpx.post(gw + "/generate_stream", timeout=20, json={
        "inputs": "a story [[sim tokens=9 drop_after=5]]",
        "parameters": {"max_new_tokens": 20, "details": True}})
    events = [orjson.loads(e.removeprefix("data:")) for e in r.text.split("\n\n") if e]
    assert [e["index"] for e in events] == list(range(1, 11))
    text = "".join(e["token"]["text"] for e in events)
    assert text == uncut(sims)[0] and len(text.split()) == 9
    assert events[-1]["generated_text"] == text
    assert events[-1]["details"]["generated_tokens"] == 10  # 9 words and EOS, counted once
    assert both_served(sims, before)


def test_lmi_jsonlines_stream_is_continued(env: tuple[str, list[str]]) -> None:
    gw, sims = env
    before = counts(sims)
    r = httpx.post(gw + "/invocations", timeout=20, json={
        "inputs": "a poem [[sim tokens=8 drop_after=2]]", "stream": True,
        "parameters": {"max_new_tokens": 20, "details": True}})
    lines = [orjson.loads(x) for x in r.text.splitlines()]
    text = "".join(x["token"]["text"] for x in lines[:-1])  # the last is the EOS token, `</s>`
    assert text == uncut(sims)[0] and len(text.split()) == 8
    assert lines[-1]["token"]["text"] == "</s>" and lines[-1]["generated_text"] == text
    assert lines[-1]["details"]["finish_reason"] == "eos_token"
    assert both_served(sims, before)


def test_elastic_chat_stream_is_continued(env: tuple[str, list[str]]) -> None:
    gw, sims = env
    before = counts(sims)
    r = httpx.post(gw + "/_inference/chat_completion/demo/_stream", timeout=20,
                   headers={"accept": "text/event-stream"},
                   json={"messages": [{"role": "user",
                                       "content": "x [[sim tokens=8 drop_after=3]]"}]})
    datas = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert datas[-1] == "[DONE]" and "event: error" not in r.text
    chunks = [orjson.loads(d)["chat_completion"] for d in datas[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in chunks if c.get("choices"))
    assert text == uncut(sims)[0] and len(text.split()) == 8
    assert len({c["id"] for c in chunks}) == 1
    assert both_served(sims, before)


TRITON_TEMPLATE = Path(__file__).parents[1] / "golden" / "triton" / "chat_template.jinja"
FAKES = {  # backend: (fake module, its readiness path, the model's extra config, its script)
    "tgi": ("tests.fakes.tgi_fake", "/health", {}, "".join(t for t, _ in tgi_fake.SCRIPT)),
    "triton": ("tests.fakes.triton_fake", "/v2/health/ready",
               {"upstream_model": "ensemble", "chat_template": str(TRITON_TEMPLATE)},
               "".join(triton_fake.SCRIPT)),
}


@pytest.mark.parametrize("backend", sorted(FAKES))
def test_a_chat_stream_cut_on_a_fake_worker_is_continued(tmp_path: Path, backend: str) -> None:
    """TGI's Messages API continues a final assistant message (text-generation-inference
    router/src/infer/chat_template.rs `apply`); for Triton the gateway renders the template
    and appends the text so far. Two fake workers as processes, the first cutting its
    connection after 3 responses: one stream, the whole script once, one role, one finish."""
    module, ready, extra, script = FAKES[backend]
    ports = [procs.free_port() for _ in range(2)]
    workers = [procs.Proc([sys.executable, "-m", module, str(p)], tmp_path / f"w{p}.log")
               for p in ports]
    gw: procs.Proc | None = None
    try:
        for w, p in zip(workers, ports, strict=True):
            w.wait_http(f"http://127.0.0.1:{p}{ready}")
        gw, url = procs.gateway(tmp_path, orjson.dumps({
            "server": {"failover_attempts": 1, "timeouts": {"first_byte": 5, "idle": 5}},
            "default_model": "m", "models": [{
                "name": "m", "backend": backend, "routing": "round_robin", **extra,
                "upstreams": [f"http://127.0.0.1:{p}" for p in ports]}]}).decode())
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
        chunks = list(client.chat.completions.create(
            model="m", stream=True, stream_options={"include_usage": True},
            messages=[{"role": "user", "content": "go [[drop_after=3]]"}]))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == script
        assert len({c.id for c in chunks}) == 1
        assert len([c for c in chunks if c.choices and c.choices[0].delta.role]) == 1
        assert [c.choices[0].finish_reason for c in chunks
                if c.choices and c.choices[0].finish_reason] == ["stop"]
        assert [c for c in chunks if c.usage is not None] == [chunks[-1]]
    finally:
        if gw is not None:
            gw.stop()
        for w in workers:
            w.stop()


@pytest.mark.parametrize("backend", ["trtllm", "openai"])
def test_a_chat_stream_cut_on_a_completions_worker_is_continued(tmp_path: Path,
                                                                backend: str) -> None:
    """trtllm-serve's chat route cannot continue an assistant turn (openai_protocol.py
    ChatCompletionRequest: no `continue_final_message`), nor can a plain OpenAI server: with
    the model's `chat_template` the gateway asks the other worker's /v1/completions for the
    chat rendered with it (generation prompt added) plus the text so far. Two trtllm-serve
    fakes (tests/fakes/trtllm_fake.py: a rendered chat plus an answer's start is continued
    only with the chat route's one BOS), the first cutting its stream after 4 tokens: the
    chat.completion.chunk stream has the uncut answer once, one role, one finish and one
    usage counting the answer as one."""
    ports = [procs.free_port() for _ in range(2)]
    workers = [procs.Proc([sys.executable, "-m", "tests.fakes.trtllm_fake", str(p)],
                          tmp_path / f"w{p}.log") for p in ports]
    sims = [f"http://127.0.0.1:{p}" for p in ports]
    gw: procs.Proc | None = None
    try:
        for w, u in zip(workers, sims, strict=True):
            w.wait_http(u + "/health")
        gw, url = procs.gateway(tmp_path, orjson.dumps({
            "server": {"failover_attempts": 1, "timeouts": {"first_byte": 5, "idle": 5}},
            "default_model": "m", "models": [{
                "name": "m", "backend": backend, "routing": "round_robin",
                "upstream_model": "demo", "chat_template": trtllm_fake.TEMPLATE,
                "upstreams": sims}]}).decode())
        before = counts(sims)
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=20)
        chunks = list(client.chat.completions.create(
            model="m", stream=True, stream_options={"include_usage": True}, max_tokens=30,
            messages=[{"role": "user", "content": "go [[sim tokens=12 itl_ms=20 drop_after=4]]"}]))
        assert both_served(sims, before)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        expected, prompt, completion = uncut(sims)
        assert text == expected and len(text.split()) == 12
        assert {c.object for c in chunks} == {"chat.completion.chunk"}
        assert len({c.id for c in chunks}) == 1
        assert len([c for c in chunks if c.choices and c.choices[0].delta.role]) == 1
        assert [c.choices[0].finish_reason for c in chunks
                if c.choices and c.choices[0].finish_reason] == ["stop"]
        assert [c for c in chunks if c.usage is not None] == [chunks[-1]]
        usage = chunks[-1].usage
        assert usage is not None
        assert (usage.prompt_tokens, usage.completion_tokens) == (prompt, completion)
    finally:
        if gw is not None:
            gw.stop()
        for w in workers:
            w.stop()


def test_a_stream_no_worker_can_continue_ends_with_the_error_event(
        env: tuple[str, list[str]]) -> None:
    """Choices of several prompts cannot be continued (each prompt's would need a request of
    its own, their usage apart): the in-band error as before failover existed."""
    gw, _ = env
    r = httpx.post(gw + "/v1/completions", timeout=20, json={
        "model": "demo", "stream": True, "max_tokens": 30,
        "prompt": ["x [[sim tokens=8 drop_after=3]]", "y [[sim tokens=8 drop_after=3]]"]})
    events = [e for e in r.text.split("\n\n") if e]
    assert '"error"' in events[-2] and events[-1] == "data: [DONE]"


def test_a_sidecar_upstream_ejected_once_is_ready_again_without_traffic(
        tmp_path: Path) -> None:
    """The sidecar topology: one upstream, /health the readiness probe. One request failing
    on it (and its retries) ejects it; with no traffic to try it half-open (a pod out of its
    Service gets none), /health is 200 again once the 1 s backoff is over, and the next
    active probe restores it (Envoy ends an ejection when its time is up)."""
    sim, sim_url = procs.simulator(tmp_path, "--tokens", "3")
    gw, url = procs.gateway(tmp_path, f"""
server: {{retries: 2, health: {{eject_after: 3, backoff: 1, probe_interval: 0.5}}}}
default_model: demo
models: [{{name: demo, backend: vllm, upstreams: [{sim_url}]}}]
""")
    try:
        # one client for both: /health must come within the 1 s ejection, and a new client
        # (httpx.get) builds a TLS context first, a tenth of a second on a loaded runner
        with httpx.Client(timeout=10) as client:
            bad = client.post(url + "/v1/chat/completions", json={
                "model": "demo", "messages": [{"role": "user", "content": "x [[sim fail=503]]"}]})
            assert bad.status_code >= 500
            assert client.get(url + "/health").status_code == 503  # ejected
        seen, gauge = [], ""
        for _ in range(40):  # bounded: 4 s for a 1 s backoff and a 0.5 s probe period
            seen.append(httpx.get(url + "/health", timeout=5).status_code)
            gauge = next(line for line in httpx.get(url + "/metrics", timeout=5).text
                         .splitlines() if line.startswith("gateway_upstream_healthy{"))
            if seen[-1] == 200 and gauge.endswith(" 1.0"):
                break
            time.sleep(0.1)
        assert seen[-1] == 200 and gauge.endswith(" 1.0"), (seen, gauge)
        assert "upstream_restored" in gw.output()
    finally:
        gw.stop()
        sim.stop()
