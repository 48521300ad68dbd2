"""`prefix` routing keys on the conversation's opening: turns stay together, prompts spread."""

from __future__ import annotations

import collections
import math

from gateway import affinity, balancer
from schemas import canonical

URLS = tuple(f"http://10.0.0.{i}:8000" for i in range(1, 4))
SHORT_SYSTEM = "You are terse."
LONG_SYSTEM = "You are a helpful assistant for the billing team. " * 12  # > PREFIX_CHARS


def chat(*turns: tuple[str, str]) -> canonical.InferenceRequest:
    return canonical.InferenceRequest(messages=[canonical.Message(r, t) for r, t in turns])


def first_choice(ups: balancer.Upstreams, req: canonical.InferenceRequest) -> str:
    return ups.order(affinity.prefix_key(req))[0]


def conversation_workers(ups: balancer.Upstreams, system: str, topic: str) -> list[str]:
    """The worker each of 8 turns goes to, the history growing as a client sends it."""
    history = [("system", system)]
    where = []
    for turn in range(8):
        history.append(("user", f"turn {turn}: tell me more about {topic}"))
        where.append(first_choice(ups, chat(*history)))
        history.append(("assistant", f"Here is part {turn} about {topic}. " * (turn + 1)))
    return where


def test_every_turn_of_a_conversation_goes_to_one_worker() -> None:
    ups = balancer.Upstreams(URLS, "prefix")
    for system in (SHORT_SYSTEM, LONG_SYSTEM, "x" * (affinity.PREFIX_CHARS - 20)):
        for topic in ("the weather in Paris", "tax forms", "sorting algorithms", "tea"):
            where = conversation_workers(ups, system, topic)
            assert len(set(where)) == 1, (system[:20], topic, where)


def test_conversations_under_a_short_system_prompt_spread() -> None:
    ups = balancer.Upstreams(URLS, "prefix")
    firsts = collections.Counter(
        conversation_workers(ups, SHORT_SYSTEM, f"subject number {i}")[0] for i in range(50))
    assert set(firsts) == set(URLS)
    assert max(firsts.values()) < 50 * 0.6


def test_fifty_different_prompts_spread_over_the_workers() -> None:
    ups = balancer.Upstreams(URLS, "prefix")
    for make in (lambda i: chat(("user", f"question {i}: what is {i} squared?")),
                 lambda i: chat(("system", "You are a helpful assistant."),
                                ("user", f"Summarise document {i} for me.")),
                 lambda i: canonical.InferenceRequest(prompts=[f"doc {i} " + "lorem " * 80])):
        counts = collections.Counter(first_choice(ups, make(i)) for i in range(50))
        assert set(counts) == set(URLS), counts
        assert max(counts.values()) < 50 * 0.6, counts


def test_users_of_a_long_system_prompt_meet_one_worker() -> None:
    ups = balancer.Upstreams(URLS, "prefix")
    chosen = {first_choice(ups, chat(("system", LONG_SYSTEM), ("user", f"user {i} asks")))
              for i in range(20)}
    assert len(chosen) == 1


def test_bounded_load_spills_a_hot_prefix() -> None:
    ups = balancer.Upstreams(URLS, "prefix")
    req = chat(("system", LONG_SYSTEM), ("user", "hello"))
    home = first_choice(ups, req)
    chosen = []
    for i in range(30):  # all stay in flight
        u = first_choice(ups, chat(("system", LONG_SYSTEM), ("user", f"question {i}")))
        ups.begin(u)
        chosen.append(u)
    counts = collections.Counter(chosen)
    assert counts[home] == max(counts.values())
    assert len(counts) > 1
    assert counts[home] <= math.ceil(1.25 * 30 / len(URLS)) + 1


def test_key_is_the_opening_up_to_the_first_user_turn() -> None:
    base = [("system", "Be brief."), ("user", "What is DNS?")]
    key = affinity.prefix_key(chat(*base))
    assert key == "system\nBe brief.\nuser\nWhat is DNS?\n"
    longer = chat(*base, ("assistant", "A name system."), ("user", "And TCP?"))
    assert affinity.prefix_key(longer) == key
    greeting = chat(("assistant", "Hi! How can I help?"), ("user", "Book a table"),
                    ("assistant", "Where?"), ("user", "Paris"))
    assert affinity.prefix_key(greeting).endswith("user\nBook a table\n")


def test_key_is_cut_at_prefix_chars() -> None:
    long_user = chat(("user", "q" * 5000), ("assistant", "a"), ("user", "next"))
    assert affinity.prefix_key(long_user) == ("user\n" + "q" * 5000)[:affinity.PREFIX_CHARS]
    preamble = [("system", "s" * 100), ("assistant", "a" * 100), ("assistant", "b" * 100)]
    assert len(affinity.prefix_key(chat(*preamble, ("user", "late")))) == affinity.PREFIX_CHARS
    assert affinity.prefix_key(canonical.InferenceRequest(prompts=["p" * 1000])) == \
        "p" * affinity.PREFIX_CHARS
    assert affinity.prefix_key(canonical.InferenceRequest(prompts=[[1, 2, 3]])) == "1 2 3"
    assert affinity.prefix_key(canonical.InferenceRequest(prompts=[list(range(1000))])) == \
        " ".join(map(str, range(1000)))[:affinity.PREFIX_CHARS]
