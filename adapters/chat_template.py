"""Hugging Face chat templates: chat messages to the one prompt string a completion worker takes.

Triton's TensorRT-LLM ensemble takes `text_input` only, so the gateway applies the model's
template (SPEC.md: rendered with `messages`, `add_generation_prompt=True` and, when given,
`tools`); a chat failed over to a trtllm-serve or OpenAI worker's completions route is
rendered the same way (`render_opening`, adapters/backends/openai.py). The environment is the
one transformers compiles templates in (`utils/chat_template_utils.py`
`_compile_jinja_template`): a sandbox with `trim_blocks` and
`lstrip_blocks`, the `loopcontrols` extension, a `tojson` filter that does not HTML-escape,
`raise_exception` and `strftime_now`, and the `{% generation %}` tag (which only marks text).
Sans-I/O: the template text is given (the gateway reads a template file, gateway/routing.py);
`strftime_now` reads the clock only when a template asks for the date, through `now`.
The tokenizer's special tokens (transformers passes `special_tokens_map`) are not known here
and render empty: TensorRT-LLM's preprocessing model adds the BOS token itself when it encodes
the prompt (its `add_special_tokens` setting), and a template that needs `eos_token` between
turns should spell the token out in its text.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any

from schemas import canonical, errors

if TYPE_CHECKING:
    import jinja2
    import jinja2.sandbox


@functools.cache
def _jinja() -> tuple[ModuleType, type]:
    """Jinja2 and transformers' AssistantTracker tag, imported when a template is first
    compiled: a serving process that renders none (no Triton chat, no chat failed over to a
    completions route) does without them (27 ms of its start, 2 MiB; bench/RESULTS.md §28)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.parser
    import jinja2.sandbox

    class Generation(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}` renders its body; the indices
        transformers tracks there for training are of no use here."""

        tags = {"generation"}

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    return jinja2, Generation


def _raise(message: str) -> None:
    raise _jinja()[0].TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: Sequence[str] | None = None, sort_keys: bool = False) -> str:
    # transformers overrides jinja's tojson, which HTML-escapes and cannot indent.
    seps = (str(separators[0]), str(separators[1])) if separators else None
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=seps,
                      sort_keys=sort_keys)


@functools.lru_cache(maxsize=32)
def compile_template(text: str) -> jinja2.Template:
    """The compiled template, once per template text; a broken template is the operator's
    error, reported as such (500) on the requests that need it."""
    jinja, generation = _jinja()
    env: jinja2.sandbox.ImmutableSandboxedEnvironment
    env = jinja.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[generation, jinja.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    try:
        return env.from_string(text)
    except jinja.TemplateSyntaxError as exc:
        raise errors.GatewayError(
            f"the model's `chat_template` is not a valid Jinja2 template: {exc.message} "
            f"(line {exc.lineno})") from None


def message(m: canonical.Message) -> dict[str, Any]:
    """A message as Hugging Face templates read it: role and text content, plus tool calls
    (arguments as a mapping, as transformers documents them), tool call id and name."""
    if isinstance(m.content, list) and any(p.get("type") != "text" for p in m.content):
        raise errors.Unsupported("only text content can be rendered with a chat template",
                                 field="messages")
    out: dict[str, Any] = {"role": m.role, "content": m.text()}
    if m.name is not None:
        out["name"] = m.name
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                             for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.reasoning is not None:
        out["reasoning_content"] = m.reasoning
    return out


def _arguments(text: str) -> Any:
    try:
        return json.loads(text) if text else {}
    except ValueError:
        return text


def tool(t: canonical.ToolSpec) -> dict[str, Any]:
    """A tool in the OpenAI shape templates iterate over (`tool.function.name`, ...)."""
    fn: dict[str, Any] = {"name": t.name}
    if t.description is not None:
        fn["description"] = t.description
    fn["parameters"] = t.parameters if t.parameters is not None else {"type": "object",
                                                                      "properties": {}}
    return {"type": "function", "function": fn}


# transformers' special_tokens_map keys, which templates use unguarded (`bos_token + ...`).
SPECIAL_TOKENS = {"bos_token": "", "eos_token": "", "unk_token": "", "pad_token": ""}


def render(text: str, messages: list[canonical.Message],
           tools: list[canonical.ToolSpec] | None = None,
           now: Callable[[], datetime] = datetime.now, *, bos_token: str = "") -> str:
    """The prompt: the template rendered for these messages, ready for the assistant's turn
    (`bos_token`: what the template's `bos_token` renders as, empty by default)."""
    template = compile_template(text)
    variables: dict[str, Any] = {
        **SPECIAL_TOKENS, "bos_token": bos_token, "messages": [message(m) for m in messages],
        "add_generation_prompt": True, "strftime_now": lambda fmt: now().strftime(fmt)}
    if tools:
        variables["tools"] = [tool(t) for t in tools]
    try:
        return template.render(**variables)
    except _jinja()[0].TemplateError as exc:  # raise_exception(...), undefined variables
        raise errors.InvalidRequest(
            f"`messages` cannot be rendered with the model's chat template: {exc.message or exc}",
            field="messages") from None
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise errors.InvalidRequest(
            f"`messages` cannot be rendered with the model's chat template: {exc}",
            field="messages") from None


# What `bos_token` renders as in `render_opening`: private-use characters no template writes.
_BOS_MARK = "\ue000bos\ue001"


def render_opening(text: str, messages: list[canonical.Message],
                   tools: list[canonical.ToolSpec] | None = None,
                   now: Callable[[], datetime] = datetime.now) -> tuple[str, bool]:
    """The prompt as `render` gives it, and whether the template opened it with `bos_token`:
    a worker's chat route renders the real BOS there and encodes the prompt without adding
    special tokens (vLLM, trtllm-serve ChatCompletionRequest `add_special_tokens` false), so a
    completions route given this prompt must add the BOS itself exactly when this is true."""
    marked = render(text, messages, tools, now, bos_token=_BOS_MARK)
    return marked.replace(_BOS_MARK, ""), marked.startswith(_BOS_MARK)
