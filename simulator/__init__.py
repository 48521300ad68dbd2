"""The simulator worker: a real HTTP server speaking vLLM 0.11's OpenAI API with deterministic
tokens, token ids, logprobs, usage, finish reasons, reasoning and tool calls, configurable
latency, and faults injected by `[[sim ...]]` directives in the prompt. The demo, the tests
and the benchmarks run against it.

The server is imported when first named: the gateway reads only `simulator.worker` (how to
start it as a managed worker), and a serving process has no use for the rest."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.server import add_arguments, build_app, run_from_args
    from simulator.settings import SimulatorSettings

__all__ = ["SimulatorSettings", "add_arguments", "build_app", "run_from_args"]


def __getattr__(name: str) -> Any:
    if name == "SimulatorSettings":
        from simulator import settings

        return settings.SimulatorSettings
    if name in __all__:
        from simulator import server

        return getattr(server, name)
    raise AttributeError(f"module 'simulator' has no attribute {name!r}")
