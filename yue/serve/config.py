"""Server settings and every per-request limit, validated in one place.

Design decisions:
- `ServeConfig` is a frozen dataclass validated once (bad values raise `ValueError` naming the field),
  like `DecodeConfig`; the CLI builds it from its flags and the app never reads flags itself.
- All limits a request can hit live here and are enforced in two functions, `check_choices` (first,
  before any prompt is tokenized) and `check_limits` (per prompt), except the ones that must act before
  the request is parsed: the API key and the body size (gate.py, an ASGI
  middleware counting bytes as they arrive, so chunked bodies are bounded too) and admission (the
  scheduler's running + waiting slots). The table below is the documentation;
  tests/test_serve_limits.py checks every row.

| limit              | where                  | status | error code / param                          |
|--------------------|------------------------|--------|---------------------------------------------|
| max_body_bytes     | Gate (ASGI middleware) | 413    | request_too_large                           |
| api_key            | Gate (ASGI middleware) | 401    | invalid_api_key                             |
| max_batch_size     | Scheduler (running)    | 503    | overloaded (+ Retry-After)                  |
| max_queue          | Scheduler (waiting)    | 503    | overloaded (+ Retry-After)                  |
| max_prompt_tokens  | check_limits           | 400    | prompt_too_long, param prompt / messages    |
| context length     | check_limits           | 400    | context_length_exceeded, param max_tokens   |
| MAX_STOP (4)       | check_limits           | 400    | invalid_value, param stop                   |
| MAX_CHOICES (16)   | app (prompts x n)      | 400    | invalid_value, param n (also above          |
|                    |                        |        | max_batch_size + max_queue: never admitted) |
| decode fields      | DecodeConfig           | 400    | invalid_value, param = the field            |
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from yue.serve.api_error import ApiError

# OpenAI allows up to 4 stop sequences; more only slows the stop check in the decode loop.
MAX_STOP = 4
# Generations one request may ask for (prompts x n): each is a row of the running batch.
MAX_CHOICES = 16


@dataclass(frozen=True)
class ServeConfig:
    """How `yue serve` runs. Validated once; bad values raise `ValueError` naming the field.

    Attributes:
        host: interface to bind; localhost unless told otherwise (the server has no TLS).
        port: TCP port.
        api_key: when set, /v1/* and /generate require `Authorization: Bearer <key>`.
        max_batch_size: generations running at once, stepped together by one scheduler thread
            (continuous batching); 1 = one request at a time.
        max_batch_tokens: prefill work per decode step, in prompt tokens at a prompt's start (later
            tokens weigh more: they attend to more keys), at least one chunk (chunks of at most 128
            tokens, shorter along a long prompt: `decode.chunks.chunk_end`), so neither a burst of
            arrivals nor a long prompt stalls the running requests for all its prefill at once;
            None = no bound.
        max_queue: admitted requests waiting to join the batch; beyond running + waiting, 503.
        max_prompt_tokens: longest prompt accepted (default 8,192 tokens: a longer prompt is rarely
            meant, and its prefill holds a CPU for minutes); None = the model's context length.
        default_max_tokens: what a chat request without `max_tokens` may generate at most (OpenAI lets
            it run to the context's end, which on a CPU can outlast a drain); completions keep OpenAI's
            16 and /generate its 128.
        max_body_bytes: largest request body, counted as it arrives (chunked bodies included).
        retry_after_s: the Retry-After a 503 suggests.
        drain_timeout_s: after SIGTERM, how long in-flight requests may run; those still running then
            end with a 503 (`draining`), streamed ones with an error chunk and `[DONE]`, and the
            server exits 0.
        prefix_cache_mb: the prefix cache's bound, in MiB of stored K/V (`decode/prefix.py`): earlier
            prompts' prefill chunks and finished answers, so a conversation's earlier turns are not
            prefilled again; 0 disables it. yue-smol's K/V take 45 KiB a token in float32, so the
            default 256 holds ~5,800 tokens.
        redact_pii: personal data in prompts (names, e-mails, phone numbers, cards, IBANs, IPs, US
            SSNs; Presidio with spaCy's small English model, `serve/pii.py`): off; logs = redacted in
            the request log (`--log-level debug` shows prompts); prompts = also removed from the prompt
            before generation. Needs the pii extra; it costs ~10 ms for a chat message, ~125 ms for
            2,000 characters of code (one CPU core; docs/deploy.md).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_batch_size: int = 16
    max_batch_tokens: int | None = 128
    max_queue: int = 32
    max_prompt_tokens: int | None = 8192
    default_max_tokens: int = 2048
    max_body_bytes: int = 1 << 20
    retry_after_s: int = 1
    drain_timeout_s: float = 30.0
    prefix_cache_mb: int = 256
    redact_pii: Literal["off", "logs", "prompts"] = "off"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.api_key is not None and not self.api_key:
            raise ValueError("api_key must be non-empty when set")
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_batch_tokens is not None and self.max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {self.max_batch_tokens}")
        if self.max_queue < 0:
            raise ValueError(f"max_queue must be >= 0, got {self.max_queue}")
        if self.max_prompt_tokens is not None and self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        if self.default_max_tokens < 1:
            raise ValueError(f"default_max_tokens must be >= 1, got {self.default_max_tokens}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.retry_after_s < 1:
            raise ValueError(f"retry_after_s must be >= 1, got {self.retry_after_s}")
        if self.drain_timeout_s < 0:
            raise ValueError(f"drain_timeout_s must be >= 0, got {self.drain_timeout_s}")
        if self.prefix_cache_mb < 0:
            raise ValueError(
                f"prefix_cache_mb must be >= 0 (0 disables the cache), got {self.prefix_cache_mb}"
            )
        if self.redact_pii not in ("off", "logs", "prompts"):
            raise ValueError(f"redact_pii must be one of off, logs, prompts, got {self.redact_pii!r}")


def check_limits(
    config: ServeConfig,
    *,
    prompt_tokens: int,
    max_tokens: int,
    context_length: int,
    stop: tuple[str, ...],
    prompt_param: str,
) -> None:
    """Every per-request size limit, in one place (the table in the module docstring).

    Args:
        config: the server's settings.
        prompt_tokens: tokens in the (templated) prompt.
        max_tokens: tokens the request asks to generate (already >= 1, DecodeConfig checked it).
        context_length: the model's maximum positions; prompt + generation must fit.
        stop: stop strings.
        prompt_param: "prompt" or "messages", to name the field at fault.

    Raises:
        ApiError: 400 naming the param and code of the first limit broken.
    """
    if len(stop) > MAX_STOP:
        raise ApiError(
            400, f"at most {MAX_STOP} stop sequences are allowed", param="stop", code="invalid_value"
        )
    limit = min(config.max_prompt_tokens or context_length, context_length - 1)
    if prompt_tokens > limit:
        raise ApiError(
            400,
            f"the prompt has {prompt_tokens} tokens; this server accepts at most {limit}",
            param=prompt_param,
            code="prompt_too_long",
        )
    if prompt_tokens + max_tokens > context_length:
        raise ApiError(
            400,
            f"this model's maximum context length is {context_length} tokens; you requested "
            f"{prompt_tokens + max_tokens} ({prompt_tokens} in the prompt, {max_tokens} to generate)",
            param="max_tokens",
            code="context_length_exceeded",
        )


def check_choices(config: ServeConfig, prompts: int, n: int) -> None:
    """The generations a request asks for (`prompts` x `n`), checked before any prompt is tokenized (a
    list of 200,000 prompts must not hold the event loop for seconds before its 400): n in [1,
    MAX_CHOICES], and prompts x n at most MAX_CHOICES and at most what the scheduler can ever admit
    (max_batch_size + max_queue: a request above that would get 503 "retry" forever).

    Raises:
        ApiError: 400, param n.
    """
    if not 1 <= n <= MAX_CHOICES:
        raise ApiError(400, f"n must be in [1, {MAX_CHOICES}], got {n}", param="n", code="invalid_value")
    limit = min(MAX_CHOICES, config.max_batch_size + config.max_queue)
    if prompts * n > limit:
        why = "" if limit == MAX_CHOICES else " on this server (its --max-batch-size + --max-queue)"
        raise ApiError(
            400,
            f"at most {limit} generations per request (prompts x n){why}, got {prompts * n}",
            param="n",
            code="invalid_value",
        )
