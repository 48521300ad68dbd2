"""Triton's generate extension in front of a TensorRT-LLM ensemble: text in, text out.

Request: `POST {base}/v2/models/{model}/generate` (or `generate_stream`) with the ensemble's
inputs as top-level keys (schemas/triton.py, from ensemble/config.pbtxt). The names are those
of TensorRT-LLM >= 0.20 (NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/
ensemble/config.pbtxt: `seed`, `min_tokens`); tensorrtllm_backend v0.19.0 and before called
them `random_seed` and `min_length` (renamed in its c2e65b8). Triton refuses an input its config
does not declare (core: "unexpected inference input"), so one set is sent: README says which. The ensemble takes
text only, so chat messages become `text_input` through the model's Hugging Face chat template
(adapters/chat_template.py); `max_tokens` is required, so an absent limit gets a default. The
parameter mapping is the table `TRITON`; what Triton cannot do at all is the capability set
`CAPS`. Answers carry no finish reason: the decoder infers it (triton_decode.py).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import orjson

from adapters import base, chat_template, continuation
from adapters.backends import params, stops, triton_decode
from adapters.backends.params import Drop, Own, Refuse, Send, Translate
from schemas import canonical, errors

WORKER = "triton"

# OpenAI's completions default (api-reference: `max_tokens` defaults to 16), which vLLM applies
# too and Triton's own OpenAI front end sends (server python/openai/openai_frontend/main.py
# `--default-max-tokens` 16): for raw prompts that name no limit.
DEFAULT_MAX_TOKENS = 16
# Chat and "as many as fit" (TGI's front end) have no limit in their protocols. TensorRT-LLM
# lowers a limit past the engine's max sequence length to what fits (batch_manager llmRequest.h
# `validate`: "Number of requested output tokens is changed to ..."), so this bounds a runaway
# answer without refusing long prompts.
UNLIMITED_MAX_TOKENS = 4096

# What the ensemble can return besides text (config.pbtxt outputs): no token ids, logprobs
# without their token text, no prompt logprobs, one sequence per request over /generate, no
# tool-call or reasoning parsing.
CAPS = {"token_ids": False, "logprobs": False, "prompt_logprobs": False, "n": False,
        "tool_calls": False, "reasoning": False}

# Client extras the ensemble takes as is (inputs of config.pbtxt a JSON client may set).
PASSTHROUGH = frozenset({"bad_words", "end_id", "pad_id", "lora_task_id",
                         "embedding_bias_words", "embedding_bias_weights"})


def _temperature(v: float) -> dict[str, Any]:
    """Greedy decoding is `top_k` 1 to TensorRT-LLM (wire-formats.md section 8, greedy switch)."""
    return {"top_k": 1} if v == 0 else {"temperature": v}


def _top_k(v: int) -> dict[str, Any]:
    # vLLM's "off" values are -1 and 0; TensorRT-LLM's is 0 (runtime_top_k), so both are omitted.
    return {"top_k": v} if v > 0 else {}


def _tool_choice(v: str) -> dict[str, Any]:
    if v not in ("auto", "none"):
        raise params.refuse("tool_choice", "the template's output is not parsed for tool calls, "
                            "so a call cannot be required", WORKER)
    return {}


def _response_format(v: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's response_format as TensorRT-LLM guided decoding (tensorrt_llm/1/model.py
    `get_guided_decoding_params_from_request`: json, json_schema, regex, ebnf_grammar), as
    Triton's own OpenAI front end sends it (engine/utils/triton.py)."""
    kind = v.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"guided_decoding_guide_type": "json"}
    if kind == "json_schema":
        schema = (v.get("json_schema") or {}).get("schema") or {}
        return {"guided_decoding_guide_type": "json_schema",
                "guided_decoding_guide": orjson.dumps(schema).decode()}
    raise params.invalid("response_format", f"type {kind!r} is not supported")


def _structured_outputs(v: Any) -> dict[str, Any]:
    """vLLM's `structured_outputs` extra (TGI's front end sends a `regex` grammar so)."""
    if isinstance(v, dict) and isinstance(v.get("regex"), str):
        return {"guided_decoding_guide_type": "regex", "guided_decoding_guide": v["regex"]}
    if isinstance(v, dict) and v.get("json") is not None:
        return _response_format({"type": "json_schema", "json_schema": {"schema": v["json"]}})
    raise params.refuse("structured_outputs", "only `regex` and `json` are supported", WORKER)


def _capable(flag: str, rule: params.Rule, why: str, noop: Any = None) -> params.Rule:
    return rule if CAPS[flag] else Refuse(why, noop=noop)


# canonical field -> what the ensemble makes of it (ensemble/config.pbtxt inputs).
TRITON: dict[str, params.Rule] = {
    "max_tokens": Own("`max_tokens` is required; a default when absent"),
    "min_tokens": Send("min_tokens"),
    "temperature": Translate(_temperature),
    "top_p": Send("top_p"),
    "top_k": Translate(_top_k),
    "min_p": Refuse("the ensemble has no `min_p` input", noop=0.0),
    "typical_p": Refuse("the ensemble has no `typical_p` input", noop=1.0),
    "repetition_penalty": Send("repetition_penalty"),
    "presence_penalty": Send("presence_penalty"),
    "frequency_penalty": Send("frequency_penalty"),
    "length_penalty": Send("length_penalty"),
    # TYPE_UINT64, read with AsUInt (server http_server.cc): a negative 64-bit seed (vLLM's
    # range) as its u64 bits, as TGI's `seed: Option<u64>` gets it (tgi.py)
    "seed": Translate(lambda v: {"seed": v % 2**64}),
    "stop": Send("stop_words"),
    "stop_token_ids": Refuse("the ensemble takes stop words, not token ids"),
    "ignore_eos": Refuse("the ensemble cannot ignore the end of sequence", noop=False),
    "do_sample": Translate(lambda v: {} if v else {"top_k": 1}),
    "n": _capable("n", Own("n"), "one sequence per request over /generate"),
    "best_of": Refuse("no best-of selection", noop=1),
    "num_beams": Refuse("beams are not returned one by one", noop=1),
    "logit_bias": Refuse("the ensemble biases words, not token ids"),
    "truncate": Refuse("the ensemble does not truncate prompts"),
    "watermark": Refuse("no watermarking", noop=False),
    "skip_special_tokens": Drop("a setting of the postprocessing model", noop=True),
    "max_tokens_fit": Own("a limit past what fits is lowered by TensorRT-LLM"),
    "keep_stop": Own("the decoder keeps a matched stop string"),
    "logprobs": _capable("logprobs", Own("logprobs"),
                         "`output_log_probs` come without their token text"),
    "top_logprobs": _capable("logprobs", Own("logprobs"), "no alternatives per token"),
    "prompt_logprobs": _capable("prompt_logprobs", Own("prompt"), "no prompt logprobs"),
    "token_ids": _capable("token_ids", Own("ids"), "the ensemble returns text only"),
    "per_token": Own("ids from the model's tokenizer, else unknown; null log probs"),
    "echo": Own("the decoder puts the prompt before the answer"),
    "tools": Own("rendered by the chat template"),
    "tool_choice": Translate(_tool_choice),
    "parallel_tool_calls": Drop("tool calls are not parsed from the output"),
    "response_format": Translate(_response_format),
    "reasoning_effort": _capable("reasoning", Own("reasoning"), "no reasoning models"),
    "user": Drop("no meaning to the worker"),
    # extras of the client protocols (adapters/frontends), then the ensemble's own inputs
    "include_stop_str_in_output": Own("the decoder keeps a matched stop string"),
    "suffix": Refuse("no insertion"),
    "structured_outputs": Translate(_structured_outputs),
    # vLLM's vocabulary restriction: dropped, it would change the answer unsaid.
    "allowed_token_ids": Refuse("the ensemble cannot restrict the vocabulary"),
    **{name: Send(name) for name in PASSTHROUGH},
}
# An extra with no rule: Triton would take it as a request parameter the ensemble ignores.
UNKNOWN_EXTRA = Drop("the ensemble has no such input")


def max_tokens(req: canonical.InferenceRequest) -> int:
    """The limit sent: the client's, or a default (the decoder compares the count with it)."""
    if req.sampling.max_tokens is not None:
        return req.sampling.max_tokens
    if req.is_chat or req.sampling.max_tokens_fit:
        return UNLIMITED_MAX_TOKENS
    return DEFAULT_MAX_TOKENS


class TritonBackend:
    """One request per client request; chat is rendered to a prompt with the model's template."""

    # The extras its table declares; any other is dropped (UNKNOWN_EXTRA).
    ACCEPTED_EXTRAS = params.accepted_extras(TRITON)

    def check(self, req: canonical.InferenceRequest) -> None:
        params.apply(TRITON, req, WORKER, unknown=UNKNOWN_EXTRA)
        prompts = req.prompts or []
        if not req.is_chat and (len(prompts) != 1 or not isinstance(prompts[0], str)):
            raise params.refuse("prompt", "one text prompt per request, not a list or "
                                "token ids", WORKER)
        if req.echo and req.logprobs:
            raise params.refuse("echo", "no prompt logprobs to go with the echoed prompt", WORKER)

    def build(self, req: canonical.InferenceRequest, target: base.Target) -> base.UpstreamRequest:
        body: dict[str, Any] = {
            "text_input": self.prompt(req, target), "max_tokens": max_tokens(req),
            "stream": req.stream,
            # Only the answer (the default depends on the model config, wire-formats.md 6.2);
            # an echo is added back by the decoder.
            "exclude_input_in_output": True,
            # Usage: per response, the prompt's length and the tokens in that response
            # (tensorrt_llm/1/model.py convert_response: num_output_tokens = output_ids.size).
            "return_num_input_tokens": True, "return_num_output_tokens": True,
        }
        params.apply(TRITON, req, WORKER, body, unknown=UNKNOWN_EXTRA)
        if req.sampling.temperature == 0 or req.sampling.do_sample is False:
            # Greedy whatever top_k / top_p say, as vLLM and OpenAI decode at temperature 0;
            # TensorRT-LLM would sample with the client's runtime_top_k / runtime_top_p.
            body["top_k"] = 1
            body.pop("top_p", None)
        elif "top_k" not in body and "top_p" not in body:
            # Sampling, as the client's protocol means it unsaid (OpenAI: temperature 1, top_p
            # 1): TensorRT-LLM decodes greedily when neither runtime_top_k nor runtime_top_p is
            # set, so top_p 1 is sent, as Triton's own OpenAI front end sends its default
            # (server python/openai/openai_frontend: schemas/openai.py top_p = 1,
            # engine/utils/triton.py _create_trtllm_inference_request).
            body["top_p"] = 1.0
        kind = "generate_stream" if req.stream else "generate"
        url = f"{target.base_url.rstrip('/')}/v2/models/{quote(target.model, safe='')}/{kind}"
        return base.UpstreamRequest("POST", url, orjson.dumps(body),
                                    {"content-type": "application/json"}, streaming=req.stream)

    def prompt(self, req: canonical.InferenceRequest, target: base.Target) -> str:
        """The raw prompt, or the chat rendered with the model's `chat_template`."""
        if req.messages is None:
            return str((req.prompts or [""])[0])
        template = target.options.get("chat_template")
        if not template:
            raise errors.InvalidRequest(
                f"model `{target.options.get('name', target.model)}` has no `chat_template` "
                "(config key `models[].chat_template`), which a triton worker needs to turn "
                "chat messages into a prompt", field="chat_template")
        tools = req.tools if req.tool_choice != "none" else None
        prompt = chat_template.render(str(template), req.messages, tools)
        # A continuation (failover): the assistant's turn, opened by the generation prompt as
        # on the first attempt, goes on from the text already sent to the client.
        return prompt + req.answer_so_far if req.answer_so_far else prompt

    def decoder(self, req: canonical.InferenceRequest, streaming: bool) -> base.StreamDecoder:
        echo = str(req.prompts[0]) if req.echo and req.prompts else None
        return triton_decode.TritonDecoder(streaming, max_tokens(req), req.sampling.stop,
                                           stops.kept(req), echo)

    def token_limit(self, req: canonical.InferenceRequest) -> int | None:
        return max_tokens(req)  # always sent: the ensemble requires it

    def streams_whole(self, req: canonical.InferenceRequest) -> bool:
        return False

    def tokens_whole(self, req: canonical.InferenceRequest) -> bool:
        """A `generate` body is the whole text in one `text_output` (tensorrt_llm/1/model.py
        convert_response), where `generate_stream` sends one response per step (wire-formats.md
        6.2), each standing for its token."""
        return False

    def parse_error(self, status: int, body: bytes) -> errors.GatewayError:
        """http_server.cc HttpCodeFromError: 400 invalid argument, 404 unknown model (another
        upstream may have it), 500 internal, 501 unsupported, 503 unavailable. Triton writes no
        429 itself; a rate limit in front of it does: that worker is busy, and another upstream
        may take the request, as with the other backends (openai.py, tgi_decode.py)."""
        message = triton_decode.error_message(body) or f"the worker answered HTTP {status}"
        detail = body[:500].decode("utf-8", "replace")  # for the log line only
        if status >= 500 or status == 404:
            return errors.UpstreamUnavailable(message, status=503 if status in (404, 503)
                                              else 502, detail=detail)
        if status == 429:
            return errors.UpstreamUnavailable(message, status=429, detail=detail)
        return errors.UpstreamRejected(message, status=status, detail=detail)

    def health_path(self) -> str:
        return "/v2/health/ready"  # Triton's readiness (docs/protocol: health extension)

    def load_gauges(self) -> base.LoadGauges | None:
        return None  # Triton publishes metrics on another port (8002), not beside generate

    def continuation(self, req: canonical.InferenceRequest, text_so_far: str,
                     tokens_so_far: int, options: base.Options = base.NO_OPTIONS
                     ) -> canonical.InferenceRequest | None:
        """A prompt plus the text so far; a chat as its rendered prompt (the gateway applies
        the template, `prompt`) plus the text so far: the same `text_input` a completion
        continuation would be. `exclude_input_in_output` keeps that text out of the answer."""
        return continuation.answer(req, text_so_far, tokens_so_far)

    def continues(self, req: canonical.InferenceRequest,
                  options: base.Options = base.NO_OPTIONS) -> bool:
        return continuation.possible(req)

