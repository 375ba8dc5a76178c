"""Server-sent events exactly as OpenAI clients expect, plus `/generate`'s token-coloured chunks.

Design decisions:
- One loop (`sse_events`) drives every endpoint; a small `Format` per endpoint shapes the JSON. Every
  chunk of a response carries the same `id`; chat's first delta carries the role; the last content
  chunk carries `finish_reason`; a usage chunk (empty `choices`) follows when
  `stream_options.include_usage`; `data: [DONE]` always ends the stream, after an error chunk too.
- Text comes from the engine's deltas, which never split a character; `/generate` additionally
  splits each delta into per-token pieces tagged "ar"/"nar" so the demo page can colour them.
  The pieces always concatenate to the delta.
- The engine's "eos" is OpenAI's "stop".
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from yue.decode.types import GenerationStats, StreamEvent
from yue.serve.metrics import RequestTracker
from yue.serve.scheduler import Job
from yue.tokenizer import IncrementalDetokenizer, YueTokenizer

log = logging.getLogger("yue.serve")
DONE = b"data: [DONE]\n\n"


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def openai_finish_reason(reason: str) -> str:
    return "stop" if reason == "eos" else reason


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass
class Outcome:
    """How a request ended, for the final chunk (or the non-streamed body)."""

    text: str
    finish_reason: str
    stats: GenerationStats
    prompt_tokens: int
    latency_s: float
    ttft_s: float


class Format:
    """Shapes chunks for one endpoint; subclasses override what differs."""

    def __init__(self, request_id: str, created: int, model: str, include_usage: bool = False) -> None:
        self.id, self.created, self.model, self.include_usage = request_id, created, model, include_usage

    def start(self) -> list[dict]:
        return []

    def delta(self, event: StreamEvent) -> dict | None:
        raise NotImplementedError

    def finish(self, outcome: Outcome) -> list[dict]:
        raise NotImplementedError


class CompletionFormat(Format):
    object = "text_completion"

    def _chunk(self, choice: dict | None, usage_: dict | None = None) -> dict:
        chunk = {"id": self.id, "object": self.object, "created": self.created, "model": self.model}
        chunk["choices"] = [choice] if choice is not None else []
        if self.include_usage:
            chunk["usage"] = usage_
        return chunk

    def _choice(self, text: str, finish_reason: str | None) -> dict:
        return {"index": 0, "text": text, "finish_reason": finish_reason, "logprobs": None}

    def delta(self, event: StreamEvent) -> dict | None:
        return self._chunk(self._choice(event.delta, None)) if event.delta else None

    def finish(self, outcome: Outcome) -> list[dict]:
        chunks = [self._chunk(self._choice("", openai_finish_reason(outcome.finish_reason)))]
        if self.include_usage:
            chunks.append(self._chunk(None, usage(outcome.prompt_tokens, outcome.stats.new_tokens)))
        return chunks


class ChatFormat(CompletionFormat):
    object = "chat.completion.chunk"

    def _choice(self, text: str | dict, finish_reason: str | None) -> dict:
        delta = text if isinstance(text, dict) else ({"content": text} if text else {})
        return {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}

    def start(self) -> list[dict]:
        return [self._chunk(self._choice({"role": "assistant", "content": ""}, None))]


class GenerateFormat(Format):
    """`/generate`: each chunk has the delta, its per-token pieces [[text, "ar"|"nar"], ...] and
    counts; the last chunk has the same fields as the non-streamed answer plus `"done": true`."""

    def __init__(self, tokenizer: YueTokenizer) -> None:
        self.splitter = SourceSplitter(tokenizer)

    def delta(self, event: StreamEvent) -> dict | None:
        if not event.delta and not event.token_ids:
            return None
        pieces = self.splitter.split(event)
        return {
            "delta": event.delta,
            "pieces": pieces,
            "token_ids": event.token_ids,
            "sources": event.sources,
        }

    def finish(self, outcome: Outcome) -> list[dict]:
        return [{"done": True, **generate_body(outcome)}]


def generate_body(o: Outcome) -> dict:
    s = o.stats
    return {
        "text": o.text,
        "tokens": s.new_tokens,
        "prompt_tokens": o.prompt_tokens,
        "finish_reason": o.finish_reason,
        "latency_ms": round(o.latency_s * 1000, 3),
        "ttft_ms": round(o.ttft_s * 1000, 3),
        "ar_tokens": s.ar_tokens,
        "nar_tokens": s.nar_tokens,
        "drafted": s.drafted,
        "accepted": s.accepted,
        "forwards": s.forwards,
    }


class SourceSplitter:
    """Splits each chunk's delta into per-token pieces, each tagged with the path that wrote it.

    It detokenizes the same tokens again, one at a time, remembering which token completed each
    character; the engine's delta (which may hold text back while a stop string could be starting)
    then selects a span of that text, cut at token boundaries.
    """

    def __init__(self, tokenizer: YueTokenizer) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.text = ""
        self.owner: list[int] = []  # per character of self.text: index of the token that completed it
        self.sources: list[str] = []  # per token
        self.emitted = 0  # characters of self.text the engine has emitted

    def split(self, event: StreamEvent) -> list[list[str]]:
        # 1. Detokenize token by token; a token ending inside a character completes nothing, and the
        #    character belongs to the token that completes it.
        for token, source in zip(event.token_ids, event.sources, strict=True):
            piece = self.detok.push([token])
            self.text += piece
            self.owner += [len(self.sources)] * len(piece)
            self.sources.append(source)
        # 2. The delta is the next span of the text; group its characters by owning token.
        start, end = self.emitted, self.emitted + len(event.delta)
        self.emitted = end
        if self.text[start:end] != event.delta:  # cannot happen with one tokenizer; stay correct anyway
            return [[event.delta, event.sources[-1] if event.sources else "ar"]] if event.delta else []
        pieces: list[list[str]] = []
        for i in range(start, end):
            if i == start or self.owner[i] != self.owner[i - 1]:
                pieces.append(["", self.sources[self.owner[i]]])
            pieces[-1][0] += self.text[i]
        return pieces


async def collect(job: Job, tracker: RequestTracker, prompt_tokens: int) -> Outcome:
    """Run a job to its end and gather its text (the non-streamed path)."""
    parts, last = [], None
    async for event in job.events():
        _seen(tracker, job, event)
        parts.append(event.delta)
        last = event
    return _outcome("".join(parts), last, tracker, prompt_tokens)


def _seen(tracker: RequestTracker, job: Job, event: StreamEvent) -> None:
    if job.started is not None:
        tracker.queued(job.started - job.enqueued)  # books once
    tracker.on_event(event)


def _outcome(text: str, last: StreamEvent | None, tracker: RequestTracker, prompt_tokens: int) -> Outcome:
    reason = last.finish_reason if last and last.finish_reason else "stop"
    stats = last.stats if last and last.stats else GenerationStats()
    latency = tracker.finish(prompt_tokens, reason, stats)
    return Outcome(text, reason, stats, prompt_tokens, latency, tracker.ttft_s)


async def sse_events(
    job: Job, tracker: RequestTracker, fmt: Format, prompt_tokens: int
) -> AsyncIterator[bytes]:
    """The streamed path: one `data:` event per chunk, the final chunk(s), then `[DONE]`."""
    try:
        for chunk in fmt.start():
            yield sse(chunk)
        parts, last = [], None
        async for event in job.events():
            _seen(tracker, job, event)
            parts.append(event.delta)
            last = event
            if (chunk := fmt.delta(event)) is not None:
                yield sse(chunk)
        for chunk in fmt.finish(_outcome("".join(parts), last, tracker, prompt_tokens)):
            yield sse(chunk)
    except Exception:  # the engine failed mid-stream: an error chunk, then [DONE]
        log.exception("generation failed mid-stream")
        tracker.fail("engine_error")
        yield sse(
            {"error": {"message": "generation failed", "type": "server_error", "param": None, "code": None}}
        )
    finally:
        tracker.fail("cancelled")  # a no-op unless the stream was abandoned (the client went away)
    yield DONE
