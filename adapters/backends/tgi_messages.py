"""TGI's chat messages (router lib.rs `Message`) as the tgi backend sends them, and the answer so
far of a continued chat put where TGI continues it (its final assistant message)."""

from __future__ import annotations

from typing import Any

from schemas import canonical


def answer_so_far(messages: list[dict[str, Any]], text: str) -> None:
    """The answer so far as the final assistant message, which TGI continues: it renders the
    chat with the generation prompt, then cuts the prompt after the last occurrence of that
    message's content and trims the whitespace at its end (chat_template.rs `apply`, after
    transformers' text-generation pipeline). A client's own final assistant message (a
    prefill TGI was already continuing) takes the text after its content."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and isinstance(last.get("content"), str):
        last["content"] += text
    else:
        messages.append({"role": "assistant", "content": text})


def trimmed(text: str | None) -> str:
    """The whitespace TGI trims off the end of a continued assistant message: the model writes
    it again (a token opens with its space or newline), and the client has it already."""
    return text[len(text.rstrip()):] if text else ""


def message(m: canonical.Message) -> dict[str, Any]:
    """TGI's `Message` (lib.rs): `content` or `tool_calls` (an untagged body, so a `null`
    content is left out), and `name`; TGI ignores `tool_call_id` but it is kept for templates."""
    out: dict[str, Any] = {"role": m.role}
    if m.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    else:
        out["content"] = m.content if m.content is not None else ""
    if m.name is not None:
        out["name"] = m.name
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out
