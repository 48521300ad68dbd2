"""Server-wide knobs of the simulator, fixed at start so every request sees the same worker."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SimulatorSettings:
    """What one simulated vLLM worker serves and how fast; per-request directives override."""

    model_names: tuple[str, ...] = ()  # empty: any model name is accepted
    ttft_ms: float = 0
    itl_ms: float = 0
    tokens: int = 16  # natural output length before EOS
    reasoning: bool = False
    seed: int = 0
    max_model_len: int = 8192  # vLLM's context limit check and /v1/models `max_model_len`
    # Capacity (simulator.engine): 0 turns each off.
    max_batch: int = 0  # requests decoded at once; more wait in a FIFO queue
    batch_slowdown: float = 0.0  # per-token time grows by this fraction per extra request
    prefill_ms_per_token: float = 0.0  # TTFT added per prompt token not in the prefix cache
    prefix_cache_blocks: int = 0  # blocks the prefix cache holds (LRU)
    block_tokens: int = 16  # tokens per KV block, vLLM's default block size
    fail_status: int = 0  # answer every generation request with this HTTP error status

    @property
    def served_name(self) -> str:
        """The name vLLM reports: its first served model name (`models.model_name()`)."""
        return self.model_names[0] if self.model_names else "simulator"
