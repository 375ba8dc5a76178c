"""Request fields checked before a request is prepared: OpenAI fields yue cannot honour (a 400 rather than
an answer that ignores them), the completion prompt's forms, and `logit_bias`'s keys."""

from __future__ import annotations

from yue.serve import schemas as s
from yue.serve.errors import ApiError


def logit_bias(bias: dict[str, float], vocab: int) -> dict[int, float]:
    """OpenAI's `logit_bias` (token ids as JSON object keys, so strings) -> {token id: bias}; a key that
    is not a token id of this model is a 400 (the biases' range is `DecodeConfig`'s to check)."""
    out, width = {}, len(str(vocab))
    for key, value in bias.items():
        # The length first: int() of a key over 4,300 digits raises (Python's conversion limit).
        if not (key.isascii() and key.isdigit()) or len(key) > width or int(key) >= vocab:
            raise ApiError(
                400,
                f"logit_bias: {key!r} is not a token id of this model (integers in [0, {vocab}))",
                param="logit_bias",
                code="invalid_value",
            )
        out[int(key)] = value
    return out


def check_unsupported(body: s.CompletionRequest) -> None:
    """A 400 for OpenAI completion fields yue cannot honour, rather than an answer that ignores them."""
    if body.suffix and body.echo:
        raise ApiError(400, "suffix is not supported with echo", param="suffix", code="unsupported")
    if body.best_of not in (None, 1):
        raise ApiError(400, "best_of is not supported: use n", param="best_of", code="unsupported")
    if body.max_tokens == 0 and not body.echo:
        raise ApiError(
            400,
            "max_tokens 0 generates nothing: only with echo (to score the prompt, with logprobs)",
            param="max_tokens",
            code="invalid_value",
        )


def check_unsupported_chat(body: s.ChatCompletionRequest) -> None:
    """A 400 for OpenAI chat fields yue cannot honour (tool calls, JSON mode), rather than an answer
    that ignores them."""
    for name in ("tools", "functions"):
        if getattr(body, name):
            raise ApiError(400, f"{name} is not supported (no tool calls)", param=name, code="unsupported")
    if body.response_format and body.response_format.get("type", "text") != "text":
        raise ApiError(
            400, "response_format: only type 'text' is supported", param="response_format", code="unsupported"
        )


def completion_prompts(prompt, engine) -> list[str | list[int]]:
    """/v1/completions' prompt as a list of prompts: texts, or token-id lists (checked against the vocabulary)."""
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise ApiError(400, "prompt: the list is empty", param="prompt", code="invalid_value")
    if isinstance(prompt[0], int):
        prompt = [prompt]
    vocab = engine.model_config.vocab_size
    for p in prompt:
        if isinstance(p, list) and (not p or not all(0 <= t < vocab for t in p)):
            raise ApiError(
                400,
                f"prompt: token ids must be a non-empty list in [0, {vocab})",
                param="prompt",
                code="invalid_value",
            )
    return list(prompt)
