"""Chat templates as transformers renders them (utils/chat_template_utils.py
`_compile_jinja_template`: sandbox, trim_blocks + lstrip_blocks, loopcontrols, a tojson that does
not HTML-escape, raise_exception, strftime_now, `{% generation %}`), and the gateway reading a
`chat_template` that names a file (SPEC.md, triton)."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest

from adapters import chat_template
from gateway import config, routing
from schemas import canonical, errors

# Meta-Llama-3-8B-Instruct's tokenizer_config.json chat_template, with the expected rendering
# of apply_chat_template(add_generation_prompt=True) minus the BOS, which TensorRT-LLM's
# preprocessing adds when it tokenizes.
LLAMA3 = (Path(__file__).parents[1] / "golden" / "triton" / "chat_template.jinja").read_text()
USER = canonical.Message("user", "Hi ")


def test_llama3_template_renders_as_transformers_does() -> None:
    out = chat_template.render(LLAMA3, [canonical.Message("system", "Be brief."), USER])
    assert out == ("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                   "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                   "<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_trim_and_lstrip_blocks_as_in_transformers() -> None:
    tmpl = "{% for m in messages %}\n    {{ m.content }}\n{% endfor %}"
    assert chat_template.render(tmpl, [USER, USER]) == "    Hi \n    Hi \n"


def test_tojson_does_not_escape_html_and_takes_an_indent() -> None:
    tools = [canonical.ToolSpec("f", "a <b> & c", {"type": "object"})]
    tmpl = "{{ tools[0].function | tojson }}|{{ {'a': 1} | tojson(indent=2) }}"
    out = chat_template.render(tmpl, [USER], tools)
    assert out.startswith('{"name": "f", "description": "a <b> & c"')
    assert out.endswith('{\n  "a": 1\n}')


def test_raise_exception_is_a_400_naming_messages() -> None:
    tmpl = "{% if messages[0].role != 'system' %}{{ raise_exception('System first!') }}{% endif %}"
    with pytest.raises(errors.InvalidRequest) as exc:
        chat_template.render(tmpl, [USER])
    assert exc.value.field == "messages" and "System first!" in exc.value.message


def test_an_undefined_variable_is_a_400_and_special_tokens_render_empty() -> None:
    assert chat_template.render("{{ bos_token }}x{{ eos_token }}", [USER]) == "x"
    with pytest.raises(errors.InvalidRequest, match="undefined"):
        chat_template.render("{{ nope + 1 }}", [USER])


def test_a_broken_template_is_the_operators_error() -> None:
    with pytest.raises(errors.GatewayError) as exc:
        chat_template.render("{% for %}", [USER])
    assert exc.value.status == 500 and "chat_template" in exc.value.message


def test_strftime_now_reads_the_given_clock() -> None:
    out = chat_template.render("{{ strftime_now('%d %b %Y') }}", [USER],
                               now=lambda: datetime(2024, 7, 26))
    assert out == "26 Jul 2024"


def test_loopcontrols_and_the_generation_tag() -> None:
    tmpl = ("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
            "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}")
    assert chat_template.render(tmpl, [USER, canonical.Message("user", "second")]) == "Hi "


def test_the_sandbox_refuses_unsafe_attribute_access() -> None:
    with pytest.raises(errors.InvalidRequest):
        chat_template.render("{{ messages.__class__.__mro__ }}", [USER])


def test_tool_calls_reach_the_template_with_arguments_as_a_mapping() -> None:
    msg = canonical.Message("assistant", None, tool_calls=[
        canonical.ToolCall("c1", "get_weather", '{"city": "Paris"}')])
    tool = canonical.Message("tool", "sunny", tool_call_id="c1")
    tmpl = ("{% for m in messages %}{% for c in m.tool_calls or [] %}"
            "{{ c.function.name }}({{ c.function.arguments.city }})"
            "{% endfor %}{{ m.tool_call_id or '' }}:{{ m.content }};{% endfor %}")
    assert chat_template.render(tmpl, [msg, tool]) == "get_weather(Paris):;c1:sunny;"


def test_content_parts_are_joined_and_images_refused() -> None:
    parts = canonical.Message("user", [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    assert chat_template.render("{{ messages[0].content }}", [parts]) == "ab"
    image = canonical.Message("user", [{"type": "image_url", "image_url": {"url": "x"}}])
    with pytest.raises(errors.Unsupported) as exc:
        chat_template.render("{{ messages[0].content }}", [image])
    assert exc.value.field == "messages"


def _cfg(template: str) -> config.Config:
    return config.Config.model_validate({"models": [
        {"name": "a", "backend": "triton", "upstreams": ["http://w"], "chat_template": template}]})


def test_a_chat_template_naming_a_file_is_read_from_it(tmp_path: Path) -> None:
    path = tmp_path / "llama3.jinja"
    path.write_text(LLAMA3)
    assert routing.Router(_cfg(str(path))).routes["a"].options["chat_template"] == LLAMA3
    assert routing.Router(_cfg(LLAMA3)).routes["a"].options["chat_template"] == LLAMA3


def test_a_chat_template_naming_no_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(config.ConfigError) as exc:
        routing.Router(_cfg(str(tmp_path / "missing.jinja")))
    assert exc.value.problems[0].startswith("models[0].chat_template:")
