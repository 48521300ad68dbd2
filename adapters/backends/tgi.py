"""Hugging Face TGI as a worker: /generate_stream (and /generate) for prompts, its Messages API
(/v1/chat/completions) for chat.

Sources, TGI router @ db931fcf (v3.3.7): `lib.rs` (GenerateParameters, ChatRequest,
`try_into_generate`, GrammarType), `validation.rs` (what it refuses: temperature must be > 0,
top_p and typical_p in (0, 1), top_k > 0, max_new_tokens != 0, at most 4 stop sequences by
default, best_of > 1 only with sampling and no seed), `server.rs` (`generate_stream_internal`
refuses best_of and decoder_input_details in streams). The tables `GENERATE` and `CHAT` map
every canonical field; values TGI would refuse but whose meaning it can say another way are
translated (temperature 0 is `do_sample: false`, top_p 1.0 is no `top_p`), the rest refused
with a 400 naming the field. Non-streaming prompt requests use /generate_stream too (its last
event has `input_length`, which /generate's body lacks); /generate only for what streams cannot
carry (prompt logprobs, best_of).
"""

from __future__ import annotations

from typing import Any

import orjson

from adapters import base, continuation
from adapters.backends import params, stops, tgi_decode
from adapters.backends.params import Drop, Own, Refuse, Send, Translate
from adapters.backends.tgi_messages import answer_so_far, message, trimmed
from schemas import canonical, errors

# TGI router metrics (router/src/infer/queue.rs, `tgi_queue_size`): requests awaiting a batch.
LOAD = base.LoadGauges(queued=("tgi_queue_size",))

WORKER = "tgi"

# launcher/src/main.rs defaults: --max-stop-sequences 4, --max-best-of 2, --max-top-n-tokens 5.
MAX_STOP_SEQUENCES = 4
MAX_BEST_OF = 2
MAX_TOP_N_TOKENS = 5

# What TGI can return besides text: token ids and logprobs per token (/generate details,
# StreamResponse.token; not in its chat API), prompt logprobs only without streaming
# (decoder_input_details), more than one sequence only as best_of without streaming, tool calls
# only through its chat API (grammar-constrained), no reasoning.
# "generate": /generate[_stream]; "generate-whole": /generate only (check() refuses streams).
CAPS: dict[str, str | None] = {
    "token_ids": "generate", "prompt_logprobs": "generate-whole", "n": "generate-whole",
    "tool_calls": "chat", "reasoning": None}


def _capable(flag: str, api: str, rule: params.Rule, why: str, noop: Any = None) -> params.Rule:
    """`rule` where TGI's `api` (generate or chat) can do `flag`, else a refusal."""
    can = CAPS[flag]
    return rule if can is not None and can.startswith(api) else Refuse(why, noop=noop)


COMPLETIONS_DEFAULT_MAX_TOKENS = 16


def _positive(name: str, key: str) -> Translate:
    def fn(v: int) -> dict[str, Any]:
        if v <= 0:
            raise params.invalid(name, "must be strictly positive")
        return {key: v}
    return Translate(fn)


def _open_unit(name: str) -> Translate:
    """validation.rs: top_p and typical_p must be in (0, 1); 1.0 means no cut, so it is left
    out; 0 or less has no meaning."""
    def fn(v: float) -> dict[str, Any]:
        if v <= 0:
            raise params.invalid(name, "must be > 0.0")
        return {name: v} if v < 1.0 else {}
    return Translate(fn)


def _temperature(v: float) -> dict[str, Any]:
    """validation.rs refuses temperature <= 0; 0 means greedy, which is `do_sample: false`.
    Any other temperature samples, as TGI's own chat mapping does (lib.rs try_into_generate)."""
    if v < 0:
        raise params.invalid("temperature", "must be >= 0")
    return {"do_sample": False} if v == 0 else {"temperature": v, "do_sample": True}


def _stop(v: list[str]) -> dict[str, Any]:
    if len(v) > MAX_STOP_SEQUENCES:
        raise params.invalid("stop", f"supports up to {MAX_STOP_SEQUENCES} stop sequences "
                             f"on this model's worker (tgi). Given: {len(v)}")
    return {"stop": v}


def _top_n(key: str) -> Translate:
    """validation.rs `TopNTokens`: at most --max-top-n-tokens alternatives per token, on
    /generate (`top_n_tokens`) and chat (`top_logprobs`, its `top_n_tokens`) alike."""
    def fn(v: int) -> dict[str, Any]:
        if v > MAX_TOP_N_TOKENS:
            raise params.invalid("top_logprobs", f"must be <= {MAX_TOP_N_TOKENS} on this "
                                 f"model's worker (tgi). Given: {v}")
        return {key: v}
    return Translate(fn)


def _top_k(v: int) -> dict[str, Any]:
    # vLLM's "off" values -1 and 0 are no top_k to TGI, which refuses them.
    return {"top_k": v} if v > 0 else {}


def _grammar(v: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's response_format as TGI's GrammarType (`{"type", "value"}`, lib.rs)."""
    kind = v.get("type")
    if kind == "text":
        return {}
    if kind == "json_schema":
        spec = v.get("json_schema") or {}
        value: dict[str, Any] = {"schema": spec.get("schema") or {}}
        if spec.get("name"):
            value["name"] = spec["name"]
        return {"grammar": {"type": "json_schema", "value": value}}
    raise params.refuse("response_format", f"type {kind!r}: TGI's grammars need a JSON schema "
                        "with `properties` (validation.rs)", WORKER)


def _structured_outputs(v: Any) -> dict[str, Any]:
    """vLLM's `structured_outputs` extra (TGI's front end sends its regex grammar so)."""
    if isinstance(v, dict) and isinstance(v.get("regex"), str):
        return {"grammar": {"type": "regex", "value": v["regex"]}}
    if isinstance(v, dict) and isinstance(v.get("json"), dict):
        return {"grammar": {"type": "json", "value": v["json"]}}
    raise params.refuse("structured_outputs", "only `regex` and `json` are supported", WORKER)


def _chat_grammar(v: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": g["grammar"]} if (g := _grammar(v)) else {}


_COMMON: dict[str, params.Rule] = {
    "min_tokens": Refuse("TGI has no minimum length", noop=0),
    "min_p": Refuse("TGI has no `min_p`", noop=0.0),
    "stop": Translate(_stop),
    "stop_token_ids": Refuse("TGI stops on strings, not token ids"),
    "ignore_eos": Refuse("TGI's API cannot ignore the end of sequence", noop=False),
    "length_penalty": Refuse("TGI has no beam search", noop=1.0),
    "num_beams": Refuse("TGI has no beam search", noop=1),
    "logit_bias": Refuse("TGI ignores `logit_bias`"),
    # lib.rs `seed: Option<u64>`: a negative 64-bit seed (vLLM's range) as its u64 bits
    "seed": Translate(lambda v: {"seed": v % 2**64}),
    "frequency_penalty": Send("frequency_penalty"),
    "skip_special_tokens": Drop("TGI always skips special tokens in its text", noop=True),
    "parallel_tool_calls": Drop("TGI calls one tool at a time"),
    "user": Drop("no meaning to the worker"),
    "include_stop_str_in_output": Own("TGI keeps the stop string; the decoder cuts it unless so"),
    "keep_stop": Own("TGI keeps the stop string; the decoder cuts it unless so"),
    "max_tokens_fit": Own("TGI's own default: as many tokens as fit (validation.rs)"),
    "suffix": Refuse("no insertion"),
    # vLLM token bans a client asks for by name (LMI `bad_sequences`, vLLM `bad_words`,
    # `allowed_token_ids`): dropped, they would change the answer unsaid.
    "bad_words": Refuse("TGI has no banned words"),
    "allowed_token_ids": Refuse("TGI cannot restrict the vocabulary"),
}

# canonical field -> GenerateParameters (lib.rs), for POST /generate[_stream].
GENERATE: dict[str, params.Rule] = {
    **_COMMON,
    "max_tokens": _positive("max_tokens", "max_new_tokens"),
    "temperature": Translate(_temperature),
    "top_p": _open_unit("top_p"),
    "top_k": Translate(_top_k),
    "typical_p": _open_unit("typical_p"),
    "repetition_penalty": Send("repetition_penalty"),
    "presence_penalty": Refuse("TGI's /generate has no presence penalty", noop=0.0),
    "do_sample": Send("do_sample"),
    "n": _capable("n", "generate", Own("best_of, without streaming"), "one sequence"),
    "best_of": _capable("n", "generate", Own("best_of, without streaming"), "no best_of"),
    "truncate": Send("truncate"),
    "watermark": Send("watermark"),
    "logprobs": Own("every token comes with its logprob (details)"),
    "top_logprobs": _top_n("top_n_tokens"),
    "prompt_logprobs": _capable("prompt_logprobs", "generate",
                                Own("decoder_input_details, without streaming"), "none"),
    "token_ids": _capable("token_ids", "generate", Own("every token comes with its id"), "none"),
    "per_token": Own("every token comes with its id and logprob (details)"),
    "echo": Own("the decoder puts the prompt before the answer"),
    "tools": _capable("tool_calls", "generate", Own("tools"), "tools need chat messages"),
    "tool_choice": _capable("tool_calls", "generate", Own("tools"), "tools need chat messages"),
    "reasoning_effort": _capable("reasoning", "generate", Own("reasoning"), "no reasoning models"),
    "response_format": Translate(_grammar),
    "structured_outputs": Translate(_structured_outputs),
    "adapter_id": Send("adapter_id"),
}

# canonical field -> ChatRequest (lib.rs), for POST /v1/chat/completions.
CHAT: dict[str, params.Rule] = {
    **_COMMON,
    "max_tokens": _positive("max_tokens", "max_tokens"),
    "temperature": Send("temperature"),  # TGI maps 0 to greedy itself (try_into_generate)
    "top_p": _open_unit("top_p"),
    "top_k": Refuse("TGI's chat API has no `top_k`"),
    "typical_p": Refuse("TGI's chat API has no `typical_p`", noop=1.0),
    # lib.rs try_into_generate: `repetition_penalty = presence_penalty + 2.0`, so TGI's chat
    # API takes a (multiplicative) repetition penalty under that name, and has no additive
    # presence penalty (OpenAI's and vLLM's meaning). Rounded: r - 2 + 2 gives back r exactly.
    "repetition_penalty": Translate(lambda r: {"presence_penalty": round(r - 2.0, 9)}),
    "presence_penalty": Refuse("TGI's chat API reads `presence_penalty` as a repetition "
                               "penalty (presence_penalty + 2)", noop=0.0),
    "do_sample": Translate(lambda v: {} if v else {"temperature": 0.0}),
    "n": _capable("n", "chat", Own("n"), "TGI's chat API answers one choice"),
    "best_of": _capable("n", "chat", Own("n"), "TGI's chat API has no best_of", noop=1),
    "truncate": Refuse("TGI's chat API does not truncate"),
    "watermark": Refuse("TGI's chat API does not watermark", noop=False),
    "logprobs": Send("logprobs"),
    "top_logprobs": _top_n("top_logprobs"),
    "prompt_logprobs": _capable("prompt_logprobs", "chat", Own("prompt"),
                                "TGI's chat API has no prompt logprobs"),
    "token_ids": _capable("token_ids", "chat", Own("ids"), "TGI's chat API returns no token ids"),
    "per_token": Own("ids from the model's tokenizer, else unknown"),
    "echo": Refuse("no echo in chat"),
    "tools": _capable("tool_calls", "chat", Own("OpenAI tools"), "no tools"),
    "tool_choice": _capable("tool_calls", "chat", Own("OpenAI tool_choice"), "no tools"),
    "reasoning_effort": _capable("reasoning", "chat", Own("reasoning"), "no reasoning models"),
    "response_format": Translate(_chat_grammar),
    "structured_outputs": Refuse("use `response_format`"),
}
# A client extra without a rule: TGI ignores unknown fields (serde), so it is dropped, said.
UNKNOWN_EXTRA = Drop("TGI has no such parameter")


def best_of(req: canonical.InferenceRequest) -> int:
    return max(req.sampling.n, req.sampling.best_of or 1)


def whole(req: canonical.InferenceRequest) -> bool:
    """Whether this needs /generate: what /generate_stream refuses (server.rs)."""
    return req.prompt_logprobs is not None or best_of(req) > 1


class TgiBackend:
    """Prompts to /generate_stream (or /generate), chat to TGI's Messages API."""

    # The extras its tables declare (either API); any other is dropped (UNKNOWN_EXTRA).
    ACCEPTED_EXTRAS = params.accepted_extras(GENERATE) | params.accepted_extras(CHAT)

    def check(self, req: canonical.InferenceRequest) -> None:
        if req.is_chat:
            params.apply(CHAT, req, WORKER, unknown=UNKNOWN_EXTRA)
            if req.tools is not None and req.response_format is not None \
                    and _chat_grammar(req.response_format):
                raise params.refuse("response_format", "TGI's chat API takes tools or a "
                                    "grammar, not both (lib.rs try_into_generate)", WORKER)
            return
        params.apply(GENERATE, req, WORKER, unknown=UNKNOWN_EXTRA)
        prompts = req.prompts or []
        if len(prompts) != 1 or not isinstance(prompts[0], str):
            raise params.refuse("prompt", "one text prompt per request, not a list or "
                                "token ids", WORKER)
        if not prompts[0]:  # validation.rs ValidationError::EmptyInput, whatever the model
            raise params.refuse("prompt", "TGI refuses an empty prompt (validation.rs: `inputs` "
                                "cannot be empty)", WORKER)
        if req.stream and req.prompt_logprobs is not None:
            raise params.refuse("prompt_logprobs", "TGI gives prompt logprobs "
                                "(decoder_input_details) only without streaming", WORKER)
        self._check_best_of(req)
        if req.echo and req.logprobs:
            raise params.refuse("echo", "no prompt logprobs to go with the echoed prompt", WORKER)

    def _check_best_of(self, req: canonical.InferenceRequest) -> None:
        n = best_of(req)
        field = "n" if req.sampling.n > 1 else "best_of"
        if n <= 1:
            return
        if req.stream:
            raise params.refuse(field, "TGI returns more than one sequence (best_of) only "
                                "without streaming", WORKER)
        if n > MAX_BEST_OF:
            raise params.invalid(field, f"must be <= {MAX_BEST_OF} on this model's worker (tgi)")
        if req.sampling.seed is not None:
            raise params.invalid("seed", "must not be set when more than one sequence is "
                                 "asked for (TGI validation.rs)")
        if req.sampling.temperature == 0 or req.sampling.do_sample is False:
            raise params.invalid(field, "needs sampling: greedy decoding gives one sequence")

    def build(self, req: canonical.InferenceRequest, target: base.Target) -> base.UpstreamRequest:
        base_url = target.base_url.rstrip("/")
        if req.messages is not None:
            body = self.chat_body(req)
            url = base_url + "/v1/chat/completions"
        else:
            body = self.generate_body(req)
            url = base_url + ("/generate" if whole(req) else "/generate_stream")
        return base.UpstreamRequest("POST", url, orjson.dumps(body),
                                    {"content-type": "application/json"},
                                    streaming=req.stream if req.is_chat else not whole(req))

    def generate_body(self, req: canonical.InferenceRequest) -> dict[str, Any]:
        # Sampling unless greedy was asked for: TGI's own default when `parameters` is absent
        # (lib.rs default_parameters) and its chat mapping; `parameters` without `do_sample`
        # would mean greedy (serde default false).
        p: dict[str, Any] = {"do_sample": True}
        params.apply(GENERATE, req, WORKER, p, unknown=UNKNOWN_EXTRA)
        if req.sampling.temperature == 0:
            # Greedy as vLLM and OpenAI mean it: TGI samples again when top_k, top_p or
            # typical_p is set, even with do_sample false (utils/tokens.py NextTokenChooser:
            # sampling = do_sample or has_warpers).
            for warper in ("top_k", "top_p", "typical_p"):
                p.pop(warper, None)
        if req.sampling.max_tokens is None and not req.sampling.max_tokens_fit:
            # A raw prompt that names no limit: 16, the OpenAI completions default (vLLM's
            # too), not TGI's own (max_total_tokens less the prompt, validation.rs).
            p["max_new_tokens"] = COMPLETIONS_DEFAULT_MAX_TOKENS
        if best_of(req) > 1:
            p["best_of"] = best_of(req)
        if req.prompt_logprobs is not None:
            p["decoder_input_details"] = True
        p["details"] = True  # finish reason, token counts, input_length (StreamDetails)
        return {"inputs": str((req.prompts or [""])[0]), "parameters": p}

    def chat_body(self, req: canonical.InferenceRequest) -> dict[str, Any]:
        # "tgi": any other model name is taken as a LoRA adapter id (lib.rs try_into_generate).
        body: dict[str, Any] = {"model": "tgi",
                                "messages": [message(m) for m in req.messages or []]}
        if req.answer_so_far:
            answer_so_far(body["messages"], req.answer_so_far)
        params.apply(CHAT, req, WORKER, body, unknown=UNKNOWN_EXTRA)
        if body.get("temperature") == 0:
            # Greedy, as on /generate (generate_body): try_into_generate makes temperature 0
            # `do_sample: false` but passes `top_p` on, which samples again (has_warpers).
            body.pop("top_p", None)
        if req.tools is not None:
            body["tools"] = [{"type": "function", "function": {
                "name": t.name, "description": t.description,
                "parameters": t.parameters or {"type": "object", "properties": {}}}}
                for t in req.tools]
        if req.tool_choice is not None:
            body["tool_choice"] = req.tool_choice if req.tool_choice in (
                "auto", "none", "required") else {"type": "function",
                                                  "function": {"name": req.tool_choice}}
        body["stream"] = req.stream
        if req.stream:  # usage is always wanted upstream (chat.rs ChatState: a usage chunk)
            body["stream_options"] = {"include_usage": True}
        return body

    def decoder(self, req: canonical.InferenceRequest, streaming: bool) -> base.StreamDecoder:
        keep = stops.kept(req)
        if req.is_chat:
            return tgi_decode.TgiChatDecoder(streaming, req.sampling.stop, keep,
                                             trimmed(req.answer_so_far))
        echo = str(req.prompts[0]) if req.echo and req.prompts else None
        logprobs = req.logprobs or req.per_token  # TGI gives every token's id and logprob
        if streaming:
            return tgi_decode.TgiStreamDecoder(req.sampling.stop, keep, logprobs, echo)
        return tgi_decode.TgiWholeDecoder(req.sampling.stop, keep, logprobs, echo,
                                          req.sampling.n)

    def parse_error(self, status: int, body: bytes) -> errors.GatewayError:
        return tgi_decode.http_error(status, body)

    def token_limit(self, req: canonical.InferenceRequest) -> int | None:
        """The limit sent: the client's, else 16 for a raw prompt (generate_body); none in chat
        or for "as many as fit" (max_total_tokens less the prompt, validation.rs)."""
        if req.sampling.max_tokens is not None:
            return req.sampling.max_tokens
        if req.is_chat or req.sampling.max_tokens_fit:
            return None
        return COMPLETIONS_DEFAULT_MAX_TOKENS

    def streams_whole(self, req: canonical.InferenceRequest) -> bool:
        """`build` chooses itself: a prompt's whole answer is asked of /generate_stream already,
        /generate only for what streams refuse (prompt logprobs, best_of)."""
        return False

    def tokens_whole(self, req: canonical.InferenceRequest) -> bool:
        """/generate's details list every token (lib.rs); TGI's chat, with its logprobs."""
        return not req.is_chat or req.logprobs

    def health_path(self) -> str:
        return "/health"

    def load_gauges(self) -> base.LoadGauges | None:
        return LOAD

    def continuation(self, req: canonical.InferenceRequest, text_so_far: str,
                     tokens_so_far: int, options: base.Options = base.NO_OPTIONS
                     ) -> canonical.InferenceRequest | None:
        """A prompt plus the text so far on `generate`; a chat with it as its final assistant
        message, which TGI's Messages API continues (since v3.0.0, router/src/infer/
        chat_template.rs `apply`: "if the last message is from the assistant, continue the
        generation prompt"; integration-tests/models/test_continue_final_message.py)."""
        return continuation.answer(req, text_so_far, tokens_so_far)

    def continues(self, req: canonical.InferenceRequest,
                  options: base.Options = base.NO_OPTIONS) -> bool:
        return continuation.possible(req)
