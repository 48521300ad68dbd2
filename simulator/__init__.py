"""The simulator worker: a real HTTP server speaking vLLM 0.11's OpenAI API with deterministic
tokens, token ids, logprobs, usage, finish reasons, reasoning and tool calls, configurable
latency, and faults injected by `[[sim ...]]` directives in the prompt. The demo, the tests
and the benchmarks run against it."""

from simulator.server import add_arguments, build_app, run_from_args
from simulator.settings import SimulatorSettings

__all__ = ["SimulatorSettings", "add_arguments", "build_app", "run_from_args"]
