"""`POST /infill` as llama.cpp's server answers it, and the FIM prompt of `/v1/completions`' `suffix`.

Design decisions:
- The route is installed by app.py, which hands it its `_prepare` and `_respond` (the one path every
  generation takes: limits, admission, streaming, metrics); this module owns only what infill adds.
- The prompt is built by `Engine.infill` from the model's own FIM tokens (`yue/infill.py`); a model
  without them is a 400 `no_fim_tokens`, naming the field that asked for infill.
- The answer has llama.cpp's `/completion` shape (`content`, `stop`, `tokens_predicted`,
  `tokens_evaluated`, `stop_type`, `timings`), which editor plugins (llama.vim, llama.vscode) read;
  streamed, each event is `{"content": delta, "stop": false}` and the last has the whole body with
  `content` "" and `stop` true, with no `[DONE]` (llama.cpp sends none on these routes).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from fastapi import FastAPI, Request

from yue.infill import NoFimTokens
from yue.serve import schemas as s
from yue.serve.api_error import ApiError
from yue.serve.streaming import DONE, Format, Outcome

# Our finish reasons as llama.cpp's `stop_type`.
_STOP_TYPE = {"eos": "eos", "stop": "word", "length": "limit"}


def infill_prompt(engine, prefix: str, suffix: str, *, param: str, extra=(), start: str = "") -> list[int]:
    """`Engine.infill`, its `NoFimTokens` as a 400 naming `param`."""
    try:
        return engine.infill(prefix, suffix, extra, start)
    except NoFimTokens as e:
        raise ApiError(400, str(e), param=param, code="no_fim_tokens") from e


def infill_body(o: Outcome, model: str) -> dict:
    """llama.cpp's `/completion` answer for one finished generation."""
    ttft_ms, total_ms = o.ttft_s * 1000, o.latency_s * 1000
    return {
        "content": o.text,
        "stop": True,
        "model": model,
        "tokens_predicted": o.stats.new_tokens,
        "tokens_evaluated": o.prompt_tokens,
        "stop_type": _STOP_TYPE.get(o.finish_reason, "none"),
        "truncated": False,
        "timings": {
            "prompt_n": o.prompt_tokens,
            "prompt_ms": round(ttft_ms, 3),
            "predicted_n": o.stats.new_tokens,
            "predicted_ms": round(total_ms - ttft_ms, 3),
        },
    }


class InfillFormat(Format):
    """Streamed `/infill`: `{"content", "stop": false}` per delta, then the final body."""

    def __init__(self, model: str) -> None:
        super().__init__("", 0, model)

    def delta(self, index: int, event) -> dict | None:
        return {"content": event.delta, "stop": False} if event.delta else None

    def finish(self, index: int, outcome: Outcome) -> list[dict]:
        return [{**infill_body(outcome, self.model), "content": ""}]


async def without_done(events: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """An event stream less its `[DONE]` (llama.cpp's routes end with the `stop: true` event)."""
    async for chunk in events:
        if chunk != DONE:
            yield chunk


def install_infill(app: FastAPI, state, prepare: Callable, respond: Callable) -> None:
    """llama.cpp's /infill (what editor plugins speak): prefix, suffix and other files' chunks in, the
    middle out. `prepare` and `respond` are app.py's `_prepare` and `_respond`."""

    @app.post("/infill", responses={code: {"model": s.ErrorResponse} for code in (400, 401, 413, 500, 503)})
    async def infill(body: s.InfillRequest, request: Request):
        engine = state.ready()

        def prepared():  # off the event loop: redaction (if on) and tokenizing
            prefix = state.screen(body.input_prefix, "input_prefix")
            suffix = state.screen(body.input_suffix, "input_suffix")
            files = [(c.filename, state.screen(c.text, "input_extra")) for c in body.input_extra]
            ids = infill_prompt(engine, prefix, suffix, param="input_suffix", extra=files, start=body.prompt)
            return prepare(state, body, ids, "input_prefix", default_max_tokens=128, temperature=None)

        job = await asyncio.to_thread(prepared)
        fmt = InfillFormat(engine.name)
        build = lambda outcomes: infill_body(outcomes[0], engine.name)  # noqa: E731
        return await respond(state, request, [job], fmt, body.stream, build, without_done)


def suffixed_prompt(state, prompt: str | list[int], suffix: str) -> list[int]:
    """`/v1/completions`' prompt filled in the middle before `suffix` (text prompts only)."""
    if not isinstance(prompt, str):
        raise ApiError(400, "suffix needs text prompts, not token ids", param="suffix", code="invalid_value")
    prompt, suffix = state.screen(prompt, "prompt"), state.screen(suffix, "suffix")
    return infill_prompt(state.engine, prompt, suffix, param="suffix")
