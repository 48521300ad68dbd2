"""LMI LoRA adapters: the body's `adapters` and SageMaker's adapter header name the model served.

Sources: DJL Serving @ d21927c4 `engines/python/setup/djl_python/input_parser.py`
(`format_input`, `parse_adapters`, `_fetch_adapters_from_input`: the header overrides the
body's `adapters`, one adapter per input, "Number of adapters is not equal to the number of
inputs", "Adapter <alias or name> is not registered", refused as "Input Parsing failed" 424),
`lmi_vllm/vllm_async_service.py` `preprocess_request` with `async_utils._extract_lora_adapter`
(every body, `prompt` included; the header first; an unknown adapter 424), and
`serving/docs/adapters.md` ("If the adapters is not passed, the base model will be used";
`""` is the base model for an element of a batch).
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from adapters import base
from adapters.frontends import lmi
from schemas import errors

PROMPT = "How is the weather"
MSGS = [{"role": "user", "content": PROMPT}]
# Config names (and aliases) as the router gives their options; any other name is unknown.
MODELS: dict[str, dict[str, Any]] = {
    "demo": {"name": "demo", "lmi": {}},
    "my-lora": {"name": "my-lora", "lmi": {}},
    "sql-lora": {"name": "my-lora", "lmi": {}},  # an alias of my-lora
    "tgi-lora": {"name": "tgi-lora", "lmi": {"tgi_compat": True}},
}


def ctx(headers: dict[str, str] | None = None, model: str | None = None) -> base.RequestContext:
    params = {"model": model} if model else {}
    return base.RequestContext("/invocations", params, headers or {},
                               lambda name: MODELS.get(name or "demo", {}))


def translate(body: dict[str, Any], c: base.RequestContext | None = None) -> lmi.LmiTranslator:
    return lmi.LmiFrontend().parse(orjson.dumps(body), c or ctx())


def served(body: dict[str, Any], c: base.RequestContext | None = None) -> str | None:
    return translate(body, c).request.model


def refusal(body: dict[str, Any], c: base.RequestContext | None = None) -> tuple[int, bytes]:
    fe = lmi.LmiFrontend()
    with pytest.raises(errors.GatewayError) as info:
        fe.parse(orjson.dumps(body), c or ctx())
    out = fe.render_error(info.value)
    return out.status, out.body


@pytest.mark.parametrize("body", [
    {"inputs": PROMPT, "parameters": {"max_new_tokens": 25}},
    {"messages": MSGS},
    {"prompt": PROMPT},
], ids=["inputs", "messages", "prompt"])
def test_body_adapters_name_the_model(body: dict[str, Any]) -> None:
    """adapters.md's recommended call, `{"inputs": ..., "adapters": "adapter_1"}`; DJL reads it
    from chat bodies too (input_parser.py: ChatProperties ignores it, parse_adapters pops it)
    and from `prompt` bodies in async mode (`_extract_lora_adapter`). Before: `inputs` was
    refused ("Extra inputs are not permitted") and the other two silently served the base
    model."""
    assert served({**body, "adapters": "my-lora"}) == "my-lora"
    assert served({**body, "adapters": "sql-lora"}) == "sql-lora"  # an alias, as a model name
    assert served({**body, "adapters": ["my-lora"]}) == "my-lora"  # a list of one, one input
    assert served(body) is None  # no adapter: the route's model (/invocations: the default)


def test_the_header_names_the_model_and_wins_over_the_body() -> None:
    """`X-Amzn-SageMaker-Adapter-Identifier` (the only way on SageMaker, adapters.md) is read
    after the body's `adapters` and overrides it (_fetch_adapters_from_input; the async
    reader checks the header first)."""
    header = {"x-amzn-sagemaker-adapter-identifier": "my-lora"}
    assert served({"inputs": PROMPT}, ctx(header)) == "my-lora"
    assert served({"messages": MSGS, "adapters": "tgi-lora"}, ctx(header)) == "my-lora"
    assert served({"prompt": PROMPT, "adapters": "nope"}, ctx(header)) == "my-lora"


def test_an_unknown_adapter_is_refused_in_lmi_form() -> None:
    """DJL raises "Adapter <alias or name> is not registered" while parsing; the request fails
    with 424 `{"error", "code"}` (parse_input_with_formatter, Request.java addResponse). The
    alias header, where SageMaker sends one, is the name the message gives."""
    assert refusal({"inputs": PROMPT, "adapters": "nope"}) == (
        424, b'{"error":"Adapter nope is not registered","code":424}')
    headers = {"x-amzn-sagemaker-adapter-identifier": "ic-0001",
               "x-amzn-sagemaker-adapter-alias": "my-alias"}
    assert refusal({"messages": MSGS}, ctx(headers)) == (
        424, b'{"error":"Adapter my-alias is not registered","code":424}')
    status, body = refusal({"inputs": PROMPT, "adapters": 7})
    assert status == 424 and b"`adapters` must be an adapter name" in body


def test_the_base_model_for_empty_names_and_missing_lists() -> None:
    """`""` is the base model (adapters.md; `if adapter_name and ...` skips it); `[]` and
    null name no adapter; an empty header is the base model over the body's adapter."""
    assert served({"inputs": PROMPT, "adapters": ""}) is None
    assert served({"inputs": PROMPT, "adapters": []}) is None
    assert served({"inputs": PROMPT, "adapters": None}) is None
    c = ctx({"x-amzn-sagemaker-adapter-identifier": ""}, model="demo")
    assert served({"inputs": PROMPT, "adapters": "my-lora"}, c) == "demo"


def test_a_dynamic_batch_takes_one_adapter_per_input() -> None:
    """parse_adapters: `len(inputs) != len(adapters)` is refused, so a batch lists one adapter
    for each input (a single name, or the header, with two inputs is refused as DJL does). The
    gateway sends a batch to one model: a batch naming different adapters is refused, in the
    dynamic-batch error body."""
    t = translate({"inputs": ["a", "b"], "adapters": ["my-lora", "my-lora"]})
    assert t.request.model == "my-lora" and t.request.prompts == ["a", "b"]
    pretty = b'{\n  "code":424,\n  "message":"invoke handler failure",\n  "error":"'  # outputs.py _encode_json
    status, body = refusal({"inputs": ["a", "b"], "adapters": "my-lora"})
    assert status == 424 and body == (
        pretty + b'Number of adapters is not equal to the number of inputs"\n}')
    status, body = refusal({"inputs": ["a", "b"], "adapters": ["my-lora", ""]})
    assert status == 424 and body.startswith(pretty + b"`adapters` must name one adapter")
    status, body = refusal({"inputs": "a", "adapters": ["my-lora", "my-lora"]})
    assert (status, body) == (
        424, b'{"error":"Number of adapters is not equal to the number of inputs","code":424}')


def test_a_predictions_path_model_must_exist_and_the_lora_frames_the_answer() -> None:
    """DJL routes /predictions/{model} first (404 for an unknown one); the adapter then names
    the LoRA, whose own config entry's `lmi` options frame the answer."""
    status, body = refusal({"inputs": PROMPT, "adapters": "my-lora"}, ctx(model="gone"))
    assert status == 404 and b"`gone`" in body
    t = translate({"inputs": PROMPT, "adapters": "tgi-lora"}, ctx(model="demo"))
    assert t.request.model == "tgi-lora" and t.state.tgi_compat
