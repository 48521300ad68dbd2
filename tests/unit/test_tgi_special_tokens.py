"""TGI tokens' `special` flag and text, and the prompt's first token, whatever the worker.

Sources, TGI @ db931fcf (v3.3.7): server/text_generation_server/models/flash_causal_lm.py
`generate_token` (a token's text from `decode_token`, special tokens kept, so the EOS token reads
`</s>`; `Tokens(..., [nid in self.all_special_ids for nid in _next_token_ids])`; generated_text
decoded with `skip_special_tokens=True`; prefill texts from `batch_decode(...,
skip_special_tokens=False)` with a NaN logprob for the first), router/src/lib.rs (`Token`,
`PrefillToken`; serde writes the NaN as null). The worker's flag and text travel in the
canonical TokenLogprob (`special`); the OpenAI text leaves special tokens out as the worker's
does.
"""

from __future__ import annotations

import orjson

from adapters.backends import tgi_decode
from adapters.frontends import tgi_encode
from schemas import canonical
from schemas import events as ev

ST = tgi_encode.TgiState(details=True)


def worker_stream(tokens: list[tuple[int, str, bool]], reason: str) -> bytes:
    """A TGI worker's /generate_stream answer (server.rs generate_stream_internal)."""
    out = b""
    for i, (tid, text, special) in enumerate(tokens):
        last = i == len(tokens) - 1
        out += b"data: " + orjson.dumps({
            "index": i + 1, "token": {"id": tid, "text": text, "logprob": -0.5,
                                      "special": special},
            "generated_text": "".join(t for _, t, s in tokens if not s) if last else None,
            "details": {"finish_reason": reason, "generated_tokens": len(tokens), "seed": None,
                        "input_length": 3} if last else None}) + b"\n\n"
    return out


def relay(data: bytes, special: frozenset[int] = frozenset()) -> list[dict[str, object]]:
    dec = tgi_decode.TgiStreamDecoder([], True, True)
    enc = tgi_encode.StreamEncoder(ST, special)
    out = b"".join(enc.encode(e) for e in dec.feed(data) + dec.close()) + enc.finish()
    return [orjson.loads(part[6:]) for part in out.split(b"\n\n") if part]


def test_a_special_token_mid_stream_keeps_the_workers_text_and_flag() -> None:
    """Not the end of sequence, so only the worker's flag can say it is special."""
    events = relay(worker_stream([(7, "Hi", False), (32001, "<|im_end|>", True),
                                  (9, "!", False)], "length"))
    assert [e["token"] for e in events] == [
        {"id": 7, "text": "Hi", "logprob": -0.5, "special": False},
        {"id": 32001, "text": "<|im_end|>", "logprob": -0.5, "special": True},
        {"id": 9, "text": "!", "logprob": -0.5, "special": False}]
    assert events[-1]["generated_text"] == "Hi!"


def test_the_workers_flag_wins_over_the_tokenizer() -> None:
    """A TGI worker that says `special: false` for a token the tokenizer lists."""
    events = relay(worker_stream([(7, "Hi", False), (8, "", False)], "eos_token"),
                   special=frozenset({8}))
    assert events[-1]["token"] == {"id": 8, "text": "", "logprob": -0.5, "special": False}


def test_the_openai_text_leaves_the_special_token_out() -> None:
    dec = tgi_decode.TgiStreamDecoder([], False, True)
    events = dec.feed(worker_stream([(7, "Hi", False), (2, "</s>", True)], "eos_token"))
    assert "".join(e.text for e in events if isinstance(e, ev.TextDelta)) == "Hi"


def test_the_workers_eos_token_in_a_whole_answer() -> None:
    """/generate details.tokens (folded from the worker's stream): `</s>`, special."""
    dec = tgi_decode.TgiStreamDecoder([], True, True)
    done = canonical.Completion.fold(dec.feed(worker_stream(
        [(7, "Hi", False), (2, "</s>", True)], "eos_token")) + dec.close())
    tokens = tgi_encode.generate_body(ST, done, done.choices[0], [])["details"]["tokens"]
    assert tokens == [{"id": 7, "text": "Hi", "logprob": -0.5, "special": False},
                      {"id": 2, "text": "</s>", "logprob": -0.5, "special": True}]


def test_without_a_worker_flag_the_tokenizer_decides() -> None:
    """vLLM reports ids, not which are special: the model's tokenizer (`models[].tokenizer`)
    says, else no token is special."""
    events = [ev.TextDelta(0, "Hi", [7], [ev.TokenLogprob("Hi", -0.5)]),
              ev.TextDelta(0, "", [2], [ev.TokenLogprob("</s>", -0.25)]),
              ev.Finish(0, "eos"), ev.Usage(3, 2)]
    for special, flag in ((frozenset({2}), True), (frozenset(), False)):
        enc = tgi_encode.StreamEncoder(ST, special)
        out = b"".join(enc.encode(e) for e in events)
        assert orjson.loads(out.split(b"\n\n")[-2][6:])["token"]["special"] is flag


def test_the_first_prefill_token_keeps_its_text_with_a_null_logprob() -> None:
    """decoder_input_details from a TGI worker's /generate body (PrefillToken)."""
    body = {"generated_text": "Hi", "details": {
        "finish_reason": "length", "generated_tokens": 1, "seed": None,
        "prefill": [{"id": 100, "text": "Hello", "logprob": None},
                    {"id": 101, "text": " there", "logprob": -1.5}],
        "tokens": [{"id": 7, "text": "Hi", "logprob": -0.5, "special": False}]}}
    dec = tgi_decode.TgiWholeDecoder([], True, True, None, 1)
    done = canonical.Completion.fold(dec.feed(orjson.dumps(body)) + dec.close())
    st = tgi_encode.TgiState(details=True, prefill=True)
    details = tgi_encode.generate_body(st, done, done.choices[0], [])["details"]
    assert details["prefill"] == [{"id": 100, "text": "Hello", "logprob": None},
                                  {"id": 101, "text": " there", "logprob": -1.5}]
    assert done.choices[0].logprobs and done.choices[0].logprobs[0].special is not None
