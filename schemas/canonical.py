"""The canonical request and folded completion every protocol translates to and from.

One model for all clients (OpenAI, LMI, TGI, Elastic) and all workers: a field exists here when
at least one client can send it and at least one worker can honour it. Slotted dataclasses, not
pydantic: wire validation happens in the protocol's own pydantic models at the edge.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, assert_never

from schemas import events as ev

Role = Literal["system", "user", "assistant", "tool", "developer"]
ContentPart = dict[str, Any]  # {"type": "text", "text": ...} or {"type": "image_url", ...}


@dataclass(slots=True)
class ToolCall:
    """A whole tool call, as sent back by the assistant or folded from deltas."""

    id: str
    name: str
    arguments: str  # JSON text, as every protocol carries it


@dataclass(slots=True)
class Message:
    """One chat turn; `content` keeps content-part arrays as given so nothing is lost."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None

    def text(self) -> str:
        """The text of the turn, content parts joined, for workers that take plain text."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


@dataclass(slots=True)
class ToolSpec:
    """A function the model may call."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


@dataclass(slots=True)
class Sampling:
    """The union of decoding parameters clients send; None means "the worker's default"."""

    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    typical_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    length_penalty: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool | None = None
    do_sample: bool | None = None
    n: int = 1
    best_of: int | None = None
    num_beams: int | None = None
    logit_bias: dict[str, float] | None = None
    truncate: int | None = None
    watermark: bool | None = None
    skip_special_tokens: bool | None = None
    # No limit: as many tokens as fit the worker's context (TGI's default when `max_new_tokens`
    # is absent, validation.rs), where `max_tokens` None is the worker's own default (vLLM and
    # OpenAI completions: 16). Each worker protocol says it in its own terms.
    max_tokens_fit: bool = False
    # A matched stop string stays at the end of the text (TGI's StopSequenceCriteria keeps it;
    # LMI's `include_stop_str_in_output`), where OpenAI and vLLM drop it.
    keep_stop: bool = False


ToolChoice = Literal["auto", "none", "required"] | str | None


@dataclass(slots=True)
class InferenceRequest:
    """A client's request in canonical form: chat `messages` or raw `prompts`, never both."""

    model: str | None = None
    messages: list[Message] | None = None
    prompts: list[str | list[int]] | None = None  # raw prompts: text or token ids, one per item
    sampling: Sampling = field(default_factory=Sampling)
    stream: bool = False
    include_usage: bool = False
    # vLLM's `stream_options.continuous_usage_stats`: usage so far on every chunk of a stream
    continuous_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    prompt_logprobs: int | None = None
    token_ids: bool = False  # the client wants the generated (and prompt) token ids
    # The client's format carries an id and a log prob on every generated token (TGI stream
    # tokens and details, LMI token lines) although the client asked for text: they come from
    # the worker where it gives them, else ids from the model's tokenizer (`models[].tokenizer`),
    # else -1 ("unknown") and a null log prob. Never a reason to refuse the request.
    per_token: bool = False
    echo: bool = False
    tools: list[ToolSpec] | None = None
    tool_choice: str | None = None  # "auto" | "none" | "required" | a function name
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    user: str | None = None
    # Fields of the client's protocol with no canonical meaning, for workers that take them as is.
    extra: dict[str, Any] = field(default_factory=dict)
    # A chat's answer as far as another worker gave it (failover, adapters/continuation.py):
    # the worker goes on from this text, the start of the assistant's turn. Never a client's.
    answer_so_far: str | None = None

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    @property
    def choice_count(self) -> int:
        return self.sampling.n * (len(self.prompts) if self.prompts else 1)


@dataclass(slots=True)
class Choice:
    """One folded choice of a non-streaming answer."""

    index: int
    text: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    token_ids: list[int] | None = None
    token_texts: list[str] | None = None  # the text of each id in `token_ids`
    logprobs: list[ev.TokenLogprob] | None = None
    finish: ev.Finish | None = None


@dataclass(slots=True)
class Completion:
    """A whole answer: the fold of its event stream, as TGI's generate folds its stream."""

    choices: list[Choice]
    usage: ev.Usage | None = None
    prompt: list[ev.PromptInfo] = field(default_factory=list)
    # The request is `per_token`: a text delta without ids still stands for its tokens (one, or
    # one per logprob), kept with id -1 as a stream lists them, not merged into the text.
    per_token: bool = False

    @classmethod
    def fold(cls, events: Iterable[ev.Event], choice_count: int = 1,
             per_token: bool = False) -> Completion:
        # positional: a class called with keywords builds a dict and unpacks it (per answer)
        done = cls([Choice(i) for i in range(choice_count)])
        done.per_token = per_token
        for e in events:
            done.add(e)
        return done

    def prompt_tokens(self, choice: int) -> list[tuple[int, ev.TokenLogprob | None]]:
        """(id, logprob) per prompt token of a choice, as the worker reported them (vLLM gives
        no logprob, and so no text, for the first); [] when it reported no prompt ids."""
        info = next((p for p in self.prompt if p.choice == choice), None)
        info = info or (self.prompt[0] if self.prompt else None)
        if info is None or info.token_ids is None:
            return []
        lps = info.logprobs or []
        return [(tid, lps[i] if i < len(lps) else None) for i, tid in enumerate(info.token_ids)]

    def choice(self, index: int) -> Choice:
        while len(self.choices) <= index:
            self.choices.append(Choice(len(self.choices)))
        return self.choices[index]

    def add(self, e: ev.Event) -> None:
        """Fold one event in."""
        match e:
            case ev.Role():
                self.choice(e.choice)
            case ev.TextDelta():
                _add_text(self.choice(e.choice), e, self.per_token)
            case ev.ReasoningDelta():
                c = self.choice(e.choice)
                c.reasoning = (c.reasoning or "") + e.text
            case ev.ToolCallDelta():
                _add_tool_call(self.choice(e.choice), e)
            case ev.Finish():
                self.choice(e.choice).finish = e
            case ev.Usage():
                self.usage = e
            case ev.PromptInfo():
                self.prompt.append(e)
            case _:
                assert_never(e)


def _add_text(c: Choice, e: ev.TextDelta, per_token: bool) -> None:
    # lists extended in place (the choice's own, never an event's): a folded stream of n
    # chunks copies each entry once, not n / 2 times
    c.text += e.text
    if e.token_ids is not None or (per_token and (e.text or e.logprobs)):
        tokens = e.per_token()
        if c.token_ids is None:
            c.token_ids = []
        if c.token_texts is None:
            c.token_texts = []
        c.token_ids.extend(e.token_ids if e.token_ids is not None else
                           [tid for tid, _, _ in tokens])
        c.token_texts.extend([t for _, t, _ in tokens])
    if e.logprobs is not None:
        if c.logprobs is None:
            c.logprobs = []
        c.logprobs.extend(e.logprobs)


def _add_tool_call(c: Choice, e: ev.ToolCallDelta) -> None:
    while len(c.tool_calls) <= e.index:
        c.tool_calls.append(ToolCall(id="", name="", arguments=""))
    call = c.tool_calls[e.index]
    if e.id:
        call.id = e.id
    if e.name:
        call.name += e.name
    call.arguments += e.arguments
