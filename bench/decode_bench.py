"""Micro-benchmark of the worker decoders' per-chunk path (`feed`), no network.

    python bench/decode_bench.py            # microseconds per token, best of --repeat runs

A stream of --tokens token events per worker protocol, fed as the workers write them (one
event per read, the common case over loopback) and as one read holding the whole stream.
CPU time of this process (a shared machine's other work counts less than in wall time).
Prints one line per (decoder, chunking); compare runs of two checkouts on the same machine.
Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import sys
import time
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))

from adapters.backends import openai_decode, tgi_decode, triton_decode  # noqa: E402


def chat(i: int) -> bytes:
    return (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
            b'"choices":[{"index":0,"delta":{"content":" tok%d"},"logprobs":null,'
            b'"finish_reason":null}]}\n\n' % i)


CHAT_END = (b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
            b'"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}\n\n'
            b"data: [DONE]\n\n")


def tgi(i: int) -> bytes:
    return (b'data: {"index":%d,"token":{"id":%d,"text":" tok%d","logprob":-0.5,'
            b'"special":false},"generated_text":null,"details":null}\n\n' % (i, i, i))


TGI_END = (b'data: {"index":0,"token":{"id":2,"text":"","logprob":-0.5,"special":true},'
           b'"generated_text":"x","details":{"finish_reason":"length","generated_tokens":1,'
           b'"seed":null,"input_length":3}}\n\n')


def triton(i: int) -> bytes:
    return (b'data: {"model_name":"ensemble","model_version":"1","num_input_tokens":3,'
            b'"num_output_tokens":1,"text_output":" tok%d"}\n\n' % i)


CASES: dict[str, tuple[Callable[[], object], Callable[[int], bytes], bytes]] = {
    "openai": (lambda: openai_decode.OpenAIDecoder(True, True), chat, CHAT_END),
    "tgi": (lambda: tgi_decode.TgiStreamDecoder([], False, False), tgi, TGI_END),
    "triton": (lambda: triton_decode.TritonDecoder(True, 10**9, [], False), triton, b""),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    for name, (make, event, end) in CASES.items():
        chunks = [event(i) for i in range(args.tokens)] + ([end] if end else [])
        whole = b"".join(chunks)

        def per_event(chunks: list[bytes] = chunks, make: Callable[[], object] = make) -> None:
            dec = make()
            for c in chunks:
                dec.feed(c)  # type: ignore[attr-defined]
            dec.close()  # type: ignore[attr-defined]

        def one_read(whole: bytes = whole, make: Callable[[], object] = make) -> None:
            dec = make()
            dec.feed(whole)  # type: ignore[attr-defined]
            dec.close()  # type: ignore[attr-defined]

        for label, fn in (("event per read", per_event), ("one read", one_read)):
            best = min(timeit.repeat(fn, number=20, repeat=args.repeat, timer=time.process_time)) / 20
            print(f"{name:7} {label:15} {best / args.tokens * 1e6:6.2f} us/token")


if __name__ == "__main__":
    main()
