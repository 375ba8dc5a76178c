"""`POST /infill` as llama.cpp's server answers it, and the FIM prompt of `/v1/completions`' `suffix`.

Design decisions:
- The prompt is built by `Engine.infill` from the model's own FIM tokens (`yue/infill.py`); a model
  without them is a 400 `no_fim_tokens`, naming the field that asked for infill.
- The answer has llama.cpp's `/completion` shape (`content`, `stop`, `tokens_predicted`,
  `tokens_evaluated`, `stop_type`, `timings`), which editor plugins (llama.vim, llama.vscode) read;
  streamed, each event is `{"content": delta, "stop": false}` and the last has the whole body with
  `content` "" and `stop` true, with no `[DONE]` (llama.cpp sends none on these routes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from yue.infill import NoFimTokens
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
