"""`server.cors`: how the gateway answers browsers (gateway/cors.py), as its own small model so
that the config module stays one screenful per section."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator


class CorsConfig(BaseModel):
    """The settings of Starlette's CORSMiddleware, whose answers gateway/cors.py gives. The
    defaults are vLLM's API server's (vllm/entrypoints/openai/cli_args.py FrontendArgs:
    `--allowed-origins`, `--allowed-methods`, `--allowed-headers` ["*"], `--allow-credentials`
    off), so a chat page that called vLLM directly keeps working behind the gateway. No origin
    and no regex: no CORS at all (a preflight is then a 405, as any OPTIONS)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_origins: tuple[str, ...] = ("*",)
    allow_origin_regex: str | None = None  # an origin it matches in full is allowed too
    allow_credentials: bool = False
    allow_methods: tuple[str, ...] = ("*",)
    allow_headers: tuple[str, ...] = ("*",)
    expose_headers: tuple[str, ...] = ()  # response fields a page may read (x-request-id)
    allow_private_network: bool = False  # Chrome's Private Network Access preflights
    # seconds a browser may keep a preflight's answer; strict: a YAML `yes` is no number
    max_age: int = Field(600, ge=0, strict=True)

    @property
    def enabled(self) -> bool:
        return bool(self.allow_origins or self.allow_origin_regex)

    @field_validator("allow_origin_regex")
    @classmethod
    def _regex(cls, value: str | None) -> str | None:
        """A pattern that does not compile is a config error, not a 500 on the first browser."""
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return value
