"""How the gateway starts the simulator as a managed worker: its command line, as data.

It speaks vLLM's OpenAI API, and it is up in well under a second, so the gateway waits for it
before serving (a real GPU worker may load for minutes; the gateway serves without it)."""

from __future__ import annotations

COMMAND = ("{python}", "-m", "simulator", "--host", "{host}", "--port", "{port}",
           "--model-name", "{model}")
PROTOCOL = "vllm"
STARTS_FAST = True
SUMMARY = "Run the simulator: a worker speaking vLLM's OpenAI API."
