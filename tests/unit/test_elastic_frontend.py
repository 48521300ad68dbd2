"""The Elastic front end's request side: Elasticsearch's bodies to canonical requests, its
refusals (UnifiedCompletionRequest.PARSER, InferenceAction.Request.PARSER, RestController), and
the routes in the registry."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from adapters import base, registry
from adapters.frontends import elastic, elastic_endpoints
from adapters.frontends import elastic_encode as enc
from schemas import canonical, errors
from schemas import events as ev

MSGS = [{"role": "user", "content": "What is Elastic?"}]


def ctx(name: str = "demo", framing: str = "documented",
        headers: Mapping[str, str] | None = None) -> base.RequestContext:
    def options(model: str | None) -> Mapping[str, Any]:
        if model in (None, "demo", "my-chat"):
            return {"name": "demo", "elastic": {"framing": framing}}
        return {}

    return base.RequestContext(f"/_inference/chat_completion/{name}/_stream", {"id": name},
                               headers or {"content-type": "application/json"}, options)


def chat_translator(body: dict[str, Any], **kw: Any) -> elastic.ChatTranslator:
    return elastic.ElasticChatFrontend().parse(orjson.dumps(body), ctx(**kw))


def chat(body: dict[str, Any], **kw: Any) -> canonical.InferenceRequest:
    return chat_translator(body, **kw).request


def refused(body: Any, fe: base.Frontend | None = None, **kw: Any) -> errors.GatewayError:
    fe = fe or elastic.ElasticChatFrontend()
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    with pytest.raises(errors.GatewayError) as info:
        fe.parse(raw, ctx(**kw))
    return info.value


def test_the_path_id_picks_the_model_and_a_body_model_is_not_used() -> None:
    """Seed 004's first example sends `"model": "gpt-4o"`; the endpoint's model serves it."""
    req = chat({"model": "gpt-4o", "messages": MSGS}, name="my-chat")
    assert req.model == "my-chat"
    assert "model" not in req.extra


def test_every_chat_answer_streams_with_usage() -> None:
    t = chat_translator({"messages": MSGS})
    assert t.request.stream and t.request.include_usage
    assert t.state.framing == "documented"
    assert chat_translator({"messages": MSGS}, framing="server").state.framing == "server"


def test_seed_fields_map_to_canonical() -> None:
    req = chat({
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
            {"role": "tool", "content": "cold", "tool_call_id": "c1"}],
        "max_completion_tokens": 20, "stop": "END", "temperature": "0.5", "top_p": 0.9,
        "tools": [{"type": "function", "function": {"name": "get_weather", "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}})
    s = req.sampling
    assert (s.max_tokens, s.stop, s.temperature, s.top_p) == (20, ["END"], 0.5, 0.9)
    assert req.tool_choice == "get_weather"
    assert req.tools == [canonical.ToolSpec("get_weather", None, None, True)]
    assert req.messages is not None
    system, _, assistant, tool = req.messages
    assert system.content == [{"type": "text", "text": "Be brief."}]
    assert assistant.tool_calls == [canonical.ToolCall("c1", "get_weather", '{"city":"Oslo"}')]
    assert assistant.content is None
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "c1", "cold")


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_tool_choice_strings(choice: str) -> None:
    assert chat({"messages": MSGS, "tool_choice": choice}).tool_choice == choice


def test_one_bare_item_is_a_list_of_one() -> None:
    """ObjectParser array fields take a single value (declareObjectArray, declareStringArray)."""
    req = chat({"messages": MSGS[0], "stop": "x"})
    assert req.messages is not None and len(req.messages) == 1 and req.sampling.stop == ["x"]


# MSGS serialized: `{"messages":[{"role":"user","content":"What is Elastic?"}],` is 59 bytes.
@pytest.mark.parametrize(("body", "message", "es_type", "param"), [
    ({"messages": MSGS, "max_tokens": 5},
     "[1:60] [UnifiedCompletionRequest] unknown field [max_tokens]",
     "x_content_parse_exception", "max_tokens"),
    ({"messages": MSGS, "stream": True}, "[1:60] [UnifiedCompletionRequest] unknown field [stream]",
     "x_content_parse_exception", "stream"),
    ({"messages": MSGS, "n": 1}, "[1:60] [UnifiedCompletionRequest] unknown field [n]",
     "x_content_parse_exception", "n"),
    ({"messages": MSGS, "top_k": 1},
     "[1:60] [UnifiedCompletionRequest] unknown field [top_k] did you mean [top_p]?",
     "x_content_parse_exception", "top_k"),
    ({"messages": MSGS, "model": 5},
     "[1:68] [UnifiedCompletionRequest] model doesn't support values of type: VALUE_NUMBER",
     "x_content_parse_exception", "model"),
    ({"messages": MSGS, "temperature": "hot"},
     "[1:74] [UnifiedCompletionRequest] failed to parse field [temperature]",
     "x_content_parse_exception", "temperature"),
    ({"messages": MSGS, "max_completion_tokens": "2.x"},
     "[1:84] [UnifiedCompletionRequest] failed to parse field [max_completion_tokens]",
     "x_content_parse_exception", "max_completion_tokens"),
    ({"messages": MSGS, "max_completion_tokens": 2**63},
     "[1:84] [UnifiedCompletionRequest] failed to parse field [max_completion_tokens]",
     "x_content_parse_exception", "max_completion_tokens"),
    ({"messages": [{"role": "user", "content": "x", "name": "n"}]},
     "[UnifiedCompletionRequest] failed to parse field [messages]",
     "x_content_parse_exception", "messages[0].name"),
    ({"messages": MSGS, "tool_choice": "requrired"},  # seed 004's own typo
     "[1:74] [UnifiedCompletionRequest] failed to parse field [tool_choice]",
     "x_content_parse_exception", "tool_choice"),
    ({"messages": MSGS, "tool_choice": {"type": "function"}},
     "[UnifiedCompletionRequest] failed to parse field [tool_choice]",
     "x_content_parse_exception", "tool_choice"),
    ({"messages": MSGS, "tools": [{"type": "code_interpreter", "function": {"name": "f"}}]},
     "[UnifiedCompletionRequest] failed to parse field [tools]",
     "x_content_parse_exception", "tools[0].type"),
    ({"messages": []}, "Validation Failed: 1: Field [messages] cannot be an empty array;",
     "action_request_validation_exception", None),
    ({}, "Required [messages]", "illegal_argument_exception", "messages"),
])
def test_refusals_as_elasticsearch_words_them(body: dict[str, Any], message: str, es_type: str,
                                              param: str | None) -> None:
    exc = refused(body)
    assert (exc.status, exc.message, enc.es_type(exc), exc.field) == (400, message, es_type,
                                                                       param)
    assert not enc.rest_layer(exc)


def test_values_elasticsearch_takes_reach_the_worker() -> None:
    """UnifiedCompletionRequest.PARSER: declareLong / declareFloat have no range, and
    XContentParser.longValue() coerces (AbstractXContentParser: Jackson's getLongValue cuts a
    JSON fraction, toLong a string's via BigDecimal.toBigInteger); Message.PARSER takes any
    `role` string (declareString) and `content` is an optionalConstructorArg. The worker
    decides, and its refusal comes back as the provider error."""
    req = chat({"messages": [{"role": "critic"}, MSGS[0]], "max_completion_tokens": 2.7,
                "temperature": 5, "top_p": "3"})
    s = req.sampling
    assert (s.max_tokens, s.temperature, s.top_p) == (2, 5.0, 3.0)
    assert req.messages is not None and req.messages[0] == canonical.Message("critic", None)
    for given, read in [("2.7", 2), (-2.7, -2), ("-3.9", -3), ("1e3", 1000), (0, 0),
                        ("+7", 7), (2**63 - 1, 2**63 - 1)]:
        assert chat({"messages": MSGS, "max_completion_tokens": given}).sampling.max_tokens \
            == read, given
    for bad in ["NaN", "Infinity", " 5", "1_000", "0x10", 1e19, str(-(2**63) - 1)]:
        exc = refused({"messages": MSGS, "max_completion_tokens": bad})
        assert "failed to parse field [max_completion_tokens]" in exc.message, bad


def test_the_location_is_jacksons_line_and_byte_column() -> None:
    """XContentParseException.getMessage: `[line:column] ` from XContentLocation, which
    JsonXContentParser takes from Jackson's token location: UTF8StreamJsonParser counts lines
    at \\n, \\r and \\r\\n and columns in bytes from 1 (`_updateNameLocation`: the input
    pointer after the name's opening quote, less `_currInputRowStart`). ES's own test
    (ScriptSortBuilderTests.testParseBadFieldNameExceptions) reads `[1:15]` for a name whose
    quote is the 15th character."""
    body = '{"messages":[{"role":"user","content":"Café"}], "top_k":1}'.encode()
    assert refused(body).message.startswith("[1:50] ")  # é is two bytes: 49 in characters
    body = b'{\r\n  "messages": [{"role": "user", "content": "x"}],\r"n": 1,\n\n "stop": 5}'
    assert refused(body).message == \
        "[3:1] [UnifiedCompletionRequest] unknown field [n]"
    body = b'{"messages": [{"role": "user", "content": "x"}],\r\n\t"stop" :\n  5}'
    assert refused(body).message == \
        "[3:3] [UnifiedCompletionRequest] stop doesn't support values of type: VALUE_NUMBER"


def test_an_empty_messages_array_is_a_generic_validation_error() -> None:
    """UnifiedCompletionAction.Request.validate() runs in TransportAction.execute, whose failure
    reaches the raw listener: TransportInferenceActionProxy.sendUnifiedCompletionRequest wraps
    only what parsing throws in UnifiedChatCompletionException.fromThrowable. So ES's generic
    form, on the stream (SSE) and on the whole route (RestInferenceAction.sendFailure: not an
    XContentFormattedException)."""
    exc = refused({"messages": []})
    generic = {"error": {"root_cause": [{"type": "action_request_validation_exception",
                                         "reason": exc.message}],
                         "type": "action_request_validation_exception", "reason": exc.message},
               "status": 400}
    r = elastic.ElasticChatFrontend().render_error(exc)
    assert (r.status, r.body) == (400, b"event: error\ndata: " + orjson.dumps(generic) + b"\n\n")
    whole = elastic.ElasticChatWholeFrontend()
    r = whole.render_error(refused({"messages": []}, whole))
    assert (r.status, r.media_type, orjson.loads(r.body)) == (400, "application/json", generic)


def test_unified_errors_carry_no_param() -> None:
    """UnifiedChatCompletionException.fromThrowable passes a null `param`, which
    toXContentChunked leaves out; the field stays on the exception for the gateway's log."""
    exc = refused({"messages": MSGS, "max_tokens": 5})
    assert exc.field == "max_tokens"
    for fe in (elastic.ElasticChatFrontend(), elastic.ElasticChatWholeFrontend()):
        body = fe.render_error(exc).body
        assert b'"param"' not in body and b'"code":"bad_request"' in body


def any_task(path: str, name: str) -> base.RequestContext:
    def options(model: str | None) -> Mapping[str, Any]:
        return {"name": "demo"} if model in (None, "demo") else {}
    return base.RequestContext(path.format(name), {"id": name},
                               {"content-type": "application/json"}, options)


@pytest.mark.parametrize("body", [b"{nope", b'{"messages":[],"max_tokens":1}', b"[1]"])
def test_without_a_task_type_the_endpoint_is_looked_up_first(body: bytes) -> None:
    """TransportInferenceActionProxy.doExecute: for TaskType.ANY (no task type in the path)
    ModelRegistry.getModelWithSecrets runs before the body is parsed, and its failure reaches
    the listener outside the unified wrapper: a generic 404 whatever the body. With the task
    type in the path the body is parsed first (sendUnifiedCompletionRequest)."""
    fe = elastic.ElasticAnyTaskChatFrontend()
    with pytest.raises(errors.ModelNotFound) as info:
        fe.parse(body, any_task("/_inference/{}/_stream", "nope"))
    r = fe.render_error(info.value)
    assert (r.status, r.media_type) == (404, "text/event-stream")
    assert orjson.loads(r.body.split(b"data: ")[1]) == {"error": {
        "root_cause": [{"type": "resource_not_found_exception",
                        "reason": "Inference endpoint not found [nope]"}],
        "type": "resource_not_found_exception",
        "reason": "Inference endpoint not found [nope]"}, "status": 404}
    typed = elastic.ElasticChatFrontend()
    with pytest.raises(errors.InvalidRequest):
        typed.parse(body, any_task("/_inference/chat_completion/{}/_stream", "nope"))
    assert fe.parse(orjson.dumps({"messages": MSGS}), any_task("/_inference/{}/_stream", "demo"))


def test_without_a_task_type_rest_checks_still_come_first() -> None:
    """RestController and BaseInferenceAction.prepareRequest (requiredContent) run before the
    transport action looks anything up."""
    fe = elastic.ElasticAnyTaskChatFrontend()
    with pytest.raises(errors.InvalidRequest) as info:
        fe.parse(b" ", any_task("/_inference/{}/_stream", "nope"))
    assert info.value.message == "request body is required" and enc.rest_layer(info.value)


def test_inference_route_picks_the_task_from_the_body() -> None:
    """POST _inference/{id} (RestInferenceAction INFERENCE_ID_PATH, elasticsearch-py
    `inference.inference`): `input` is the completion task; any other body is parsed as
    TransportInferenceActionProxy parses it for a chat_completion endpoint (a unified request)
    and answered whole (PR #158022); an unknown id is a generic 404 before the body is read."""
    fe = elastic.ElasticInferenceFrontend()
    ctx_ = any_task("/_inference/{}", "demo")
    done = fe.parse(orjson.dumps({"input": "x"}), ctx_)
    assert isinstance(done, elastic.CompletionTranslator) and not done.stream
    chat_t = fe.parse(orjson.dumps({"messages": MSGS}), ctx_)
    assert isinstance(chat_t, elastic.ChatTranslator) and not chat_t.request.stream
    with pytest.raises(errors.InvalidRequest) as info:
        fe.parse(orjson.dumps({"input": "x", "top_n": 2}), ctx_)
    assert b"root_cause" in fe.render_error(info.value).body  # the completion task's form
    with pytest.raises(errors.InvalidRequest) as info:
        fe.parse(orjson.dumps({"messages": MSGS, "stream": True}), ctx_)
    assert orjson.loads(fe.render_error(info.value).body)["error"]["code"] == "bad_request"
    with pytest.raises(errors.ModelNotFound) as missing:
        fe.parse(b"{nope", any_task("/_inference/{}", "nope"))
    r = fe.render_error(missing.value)
    assert (r.status, r.media_type) == (404, "application/json")
    assert orjson.loads(r.body)["error"]["type"] == "resource_not_found_exception"


def test_unknown_endpoint_is_404_with_elasticsearchs_message() -> None:
    exc = refused({"messages": MSGS}, name="nope")
    assert isinstance(exc, errors.ModelNotFound)
    assert exc.message == "Inference endpoint not found [nope]"


@pytest.mark.parametrize("ctype", ["application/json", "application/json; charset=UTF-8",
                                   "application/vnd.elasticsearch+json; compatible-with=9",
                                   "application/vnd.elasticsearch+json;compatible-with=8"])
def test_json_content_types_are_accepted(ctype: str) -> None:
    fe = elastic.ElasticChatFrontend()
    assert fe.parse(orjson.dumps({"messages": MSGS}), ctx(headers={"content-type": ctype}))


def test_rest_layer_refusals_are_json() -> None:
    exc = refused({"messages": MSGS}, headers={"content-type": "text/plain"})
    assert exc.status == 406 and enc.rest_layer(exc)
    r = elastic.ElasticChatFrontend().render_error(exc)
    assert r.media_type == "application/json"
    assert orjson.loads(r.body) == {
        "error": "Content-Type header [text/plain] is not supported", "status": 406}
    exc = refused(b"  ")
    assert exc.message == "request body is required" and enc.rest_layer(exc)


def test_bad_json_is_a_parse_error_in_the_stream() -> None:
    exc = refused(b"{nope")
    assert enc.es_type(exc) == "x_content_parse_exception" and not enc.rest_layer(exc)


def test_a_refusal_carries_its_requests_framing() -> None:
    """render_error sees only the exception: parse chains the request's framing to each
    refusal (enc.EsNote), and the frontend, shared by every request, keeps none of it."""
    fe = elastic.ElasticChatFrontend()
    server = refused({"messages": []}, fe, framing="server")
    unknown = refused({"messages": MSGS}, fe, framing="server", name="nope")  # default's options
    documented = refused({"messages": []}, fe)
    assert fe.framing == "documented"
    for exc in (server, unknown):
        assert fe.render_error(exc).body.startswith(enc.BOM + b"event: error\ndata: ")
    assert fe.render_error(documented).body.startswith(b"event: error\ndata: ")
    assert enc.es_type(unknown) == "resource_not_found_exception"
    assert enc.es_type(server) == "action_request_validation_exception"


# ---- the completion task ----


def completion_translator(body: dict[str, Any], stream: bool = False,
                          headers: Mapping[str, str] | None = None) -> elastic.CompletionTranslator:
    fe = elastic.ElasticCompletionFrontend(stream)
    return fe.parse(orjson.dumps(body), ctx(headers=headers))


def completion(body: dict[str, Any], stream: bool = False,
               headers: Mapping[str, str] | None = None) -> canonical.InferenceRequest:
    return completion_translator(body, stream, headers).request


def test_completion_input_is_one_user_turn() -> None:
    req = completion({"input": "What is Elastic?", "task_settings": {"user": "u",
                                                                    "temperature": 0.3}})
    assert req.messages == [canonical.Message("user", "What is Elastic?")]
    assert (req.stream, req.user, req.sampling.temperature) == (False, "u", 0.3)
    assert completion({"input": ["x"]}, stream=True).stream


@pytest.mark.parametrize(("body", "message"), [
    ({}, "Validation Failed: 1: Field [input] cannot be null;"),
    ({"input": []}, "Validation Failed: 1: Field [input] cannot be an empty array;"),
    ({"input": "x", "top_n": 2},
     "Validation Failed: 1: Field [top_n] cannot be specified for task type [completion];"),
    ({"input": "x", "input_type": "search"},
     "Validation Failed: 1: Field [input_type] cannot be specified for task type [completion];"),
    ({"inputs": "x"},
     "[1:2] [cluster:internal/xpack/inference] unknown field [inputs] did you mean [input]?"),
    ({"input": 5},
     "[1:10] [cluster:internal/xpack/inference] input doesn't support values of type: "
     "VALUE_NUMBER"),
    ({"input": ["a", "b"]}, "completion only accepts 1 input"),
    ({"input": "x", "task_settings": {"seed": 1}},
     "Model configuration contains settings [{seed=1}] unknown to the [gateway] service"),
])
def test_completion_refusals(body: dict[str, Any], message: str) -> None:
    exc = refused(body, elastic.ElasticCompletionFrontend())
    assert exc.status == 400 and exc.message == message


def test_completion_answers_in_the_compatible_with_type_asked_for() -> None:
    vnd = "application/vnd.elasticsearch+json; compatible-with=9"
    t = completion_translator({"input": "x"}, headers={"content-type": vnd, "accept": vnd})
    done = canonical.Completion.fold([])
    done.choices[0].text = "answer"
    meta = base.ResponseMeta("i", 1, "demo")
    r = t.render(done, meta)
    assert r.media_type == "application/vnd.elasticsearch+json;compatible-with=9"
    assert orjson.loads(r.body) == {"completion": [{"result": "answer"}]}
    assert r.headers == {"x-elastic-product": "Elasticsearch"}


def test_a_whole_chat_answer_is_the_chunk_shape_with_message() -> None:
    """Elasticsearch 9.6 (PR #158022) answers a chat completion without `_stream` with
    ChatCompletionChunkResponse's non-streaming form: `message` for `delta`, object
    `chat.completion`, no `created`, null fields left out, tool calls index-first."""
    t = elastic.ElasticChatFrontend(stream=False).parse(orjson.dumps({"messages": MSGS}), ctx())
    assert not t.request.stream
    meta = base.ResponseMeta("i", 1, "demo")
    events: list[ev.Event] = [ev.TextDelta(0, "Hi"), ev.ToolCallDelta(0, 0, "c", "f", "{}"),
                              ev.Finish(0, "tool_calls"), ev.Usage(2, 3)]
    r = t.render(canonical.Completion.fold(events), meta)
    assert (r.status, r.media_type) == (200, "application/json")
    assert r.body == (
        b'{"id":"chatcmpl-i","choices":[{"message":{"content":"Hi","role":"assistant",'
        b'"tool_calls":[{"index":0,"id":"c","function":{"arguments":"{}","name":"f"},'
        b'"type":"function"}]},"finish_reason":"tool_calls","index":0}],"model":"demo",'
        b'"object":"chat.completion","usage":{"completion_tokens":3,"prompt_tokens":2,'
        b'"total_tokens":5}}')
    assert r.headers == {"x-elastic-product": "Elasticsearch"}


def test_a_whole_chat_error_is_the_unified_error_as_json() -> None:
    fe = elastic.ElasticChatFrontend(stream=False)
    r = fe.render_error(errors.ModelNotFound("Inference endpoint not found [x]"))
    assert (r.status, r.media_type) == (404, "application/json")
    assert orjson.loads(r.body)["error"]["code"] == "not_found"
    t = fe.parse(orjson.dumps({"messages": MSGS}), ctx())
    after = t.render_error(errors.UpstreamUnavailable("worker down"))
    assert (after.status, after.media_type) == (503, "application/json")
    assert orjson.loads(after.body)["error"]["code"] == "service_unavailable"


def test_registry_routes() -> None:
    routes = {path: make() for path, make in registry.INFERENCE_ROUTES
              if path.startswith("/_inference")}
    chat_paths = {"/_inference/{id}/_unified", "/_inference/{id}/_stream",
                  "/_inference/chat_completion/{id}/_unified",
                  "/_inference/chat_completion/{id}/_stream", "/_inference/chat_completion/{id}"}
    assert chat_paths | {"/_inference/completion/{id}", "/_inference/completion/{id}/_stream",
                         "/_inference/{id}", "/_inference/{task_type}/{id}"} == set(routes)
    assert all(isinstance(routes[p], elastic.ElasticChatFrontend) for p in chat_paths)
    assert isinstance(routes["/_inference/{id}"], elastic.ElasticInferenceFrontend)
    assert isinstance(routes["/_inference/{task_type}/{id}"], elastic.ElasticTaskTypeFrontend)
    # its task decided by the body: `input` streams the completion task
    assert isinstance(routes["/_inference/{id}/_stream"], elastic.ElasticAnyTaskStreamFrontend)
    assert all(routes[p].lookup_first == ("chat_completion" not in p)  # type: ignore[attr-defined]
               for p in chat_paths)
    assert not routes["/_inference/chat_completion/{id}"].stream  # type: ignore[attr-defined]
    whole = routes["/_inference/completion/{id}"]
    streamed = routes["/_inference/completion/{id}/_stream"]
    assert isinstance(whole, elastic.ElasticCompletionFrontend) and not whole.stream
    assert isinstance(streamed, elastic.ElasticCompletionFrontend) and streamed.stream


def test_the_root_answers_elasticsearch_clients_as_rest_main_action_does() -> None:
    """server/.../rest/root/MainResponse.java toXContent, pretty-printed by RestMainAction
    (Jackson's DefaultPrettyPrinter: two-space indent, `"key" : value`, then a newline), with
    X-Elastic-Product (RestController); only for a request an Elastic client sent."""
    view = base.GatewayView((), None, "0", 0, 1, 1)
    es_headers = {"accept": "application/vnd.elasticsearch+json; compatible-with=9",
                  "x-elastic-client-meta": "es=9.5.1,py=3.11.7,t=9.4.2,ur=2.5.0"}
    answer = dict(registry.STATUS_ROUTES)["/"]
    r = answer(view, base.RequestContext(headers=es_headers))
    assert r.status == 200 and r.headers == {"x-elastic-product": "Elasticsearch"}
    assert r.media_type == "application/vnd.elasticsearch+json;compatible-with=9"
    assert r.body.startswith(b'{\n  "name" : "gateway",\n  "cluster_name" : "gateway",\n')
    assert r.body.endswith(b'  },\n  "tagline" : "You Know, for Search"\n}\n')
    assert elastic_endpoints.from_client({"x-elastic-client-meta": "es=8.18.0"})
    tgi = answer(view, base.RequestContext(headers={"user-agent": "python-requests/2.32"}))
    assert (tgi.status, tgi.headers) == (503, {})  # TGI's health, no worker in this view
    assert b"healthcheck" in tgi.body
