"""Server-sent events exactly as OpenAI clients expect, plus `/generate`'s token-coloured chunks.

Design decisions:
- One loop (`sse_events`) drives every endpoint; a small `Format` per endpoint shapes the JSON. Every
  chunk of a response carries the same `id`; chat's first delta carries the role; each choice ends
  with a chunk of empty content carrying its `finish_reason`; a usage chunk (empty `choices`) follows when
  `stream_options.include_usage`; `data: [DONE]` always ends the stream, after an error chunk too.
- Text comes from the engine's deltas, which never split a character; `/generate` additionally
  splits each delta into per-token pieces tagged "ar"/"nar" (the anchor modes: "anchor"/"fill") so
  the demo page can colour them.
  The pieces always concatenate to the delta.
- The engine's "eos" is OpenAI's "stop".
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from yue.decode.types import GenerationStats, StreamEvent, TokenLogprob
from yue.serve.errors import ApiError
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
    """How one choice ended, for its final chunk (or the non-streamed body)."""

    text: str
    finish_reason: str
    stats: GenerationStats
    prompt_tokens: int
    latency_s: float
    ttft_s: float
    logprobs: list[TokenLogprob] | None = None
    prompt_index: int = 0  # which of the request's prompts (n choices of a prompt share it)


@dataclass
class Choice:
    """One generation of a request: its index among the request's choices, its job and its tracker."""

    index: int
    job: Job
    tracker: RequestTracker
    prompt_tokens: int
    prompt_index: int = 0
    # What its events brought so far (`see`): text pieces, token log-probs, the latest event.
    parts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    last: StreamEvent | None = None

    def see(self, event: StreamEvent) -> None:
        """Book an event: queueing time (once) and tokens in the tracker, then its text and log-probs."""
        if self.job.started is not None:
            self.tracker.queued(self.job.started - self.job.enqueued)  # books once
        self.tracker.on_event(event)
        self.parts.append(event.delta)
        self.logprobs.extend(event.logprobs or [])
        self.last = event

    def outcome(self) -> Outcome:
        """The finished choice: its text, finish reason, stats, latency (log-probs when asked for)."""
        last = self.last
        reason = last.finish_reason if last and last.finish_reason else "stop"
        stats = last.stats if last and last.stats else GenerationStats()
        latency = self.tracker.finish(self.prompt_tokens, reason, stats)
        logprobs = self.logprobs if self.job.config.logprobs is not None else None
        text = "".join(self.parts)
        return Outcome(
            text, reason, stats, self.prompt_tokens, latency, self.tracker.ttft_s, logprobs, self.prompt_index
        )


class Format:
    """Shapes chunks for one endpoint; subclasses override what differs. A request may have several
    choices (OpenAI's `n`, a list of prompts); every chunk names its choice by `index`."""

    def __init__(
        self,
        request_id: str,
        created: int,
        model: str,
        include_usage: bool = False,
        tokenizer: YueTokenizer | None = None,
    ) -> None:
        self.id, self.created, self.model, self.include_usage = request_id, created, model, include_usage
        self.tokenizer = tokenizer  # set when the request asked for log-probs
        self._offsets: dict[int, int] = {}  # per choice: characters of token text reported so far
        self.echo: list[str] | None = None  # completions' `echo`: per choice, its prompt's text
        # `echo` with `logprobs`: per choice, its prompt tokens' entries (`Engine.score`)
        self.prompt_logprobs: list[list[TokenLogprob]] | None = None

    def start(self, indices: list[int]) -> list[dict]:
        return []

    def delta(self, index: int, event: StreamEvent) -> dict | None:
        raise NotImplementedError

    def finish(self, index: int, outcome: Outcome) -> list[dict]:
        raise NotImplementedError

    def usage(self, outcomes: list[Outcome]) -> list[dict]:
        return []


class CompletionFormat(Format):
    object = "text_completion"

    def _chunk(self, choice: dict | None, usage_: dict | None = None) -> dict:
        chunk = {"id": self.id, "object": self.object, "created": self.created, "model": self.model}
        chunk["choices"] = [choice] if choice is not None else []
        if self.include_usage:
            chunk["usage"] = usage_
        return chunk

    def _choice(
        self, index: int, text: str | dict, finish_reason: str | None, logprobs: list | None = None
    ) -> dict:
        return {
            "index": index,
            **self._content(text),
            "finish_reason": finish_reason,
            "logprobs": self.logprobs(index, logprobs),
        }

    def _content(self, text: str) -> dict:
        """A chunk choice's text field."""
        return {"text": text}

    def logprobs(self, index: int, entries: list[TokenLogprob] | None) -> dict | None:
        """OpenAI's legacy completions shape: tokens, token_logprobs, top_logprobs, text_offset (each
        token's offset in the choice's text, counting the tokens' own decoded texts). As OpenAI's, each
        top_logprobs entry holds the chosen token too (a sampled one may be outside the top n: n + 1
        entries then)."""
        if self.tokenizer is None or entries is None:
            return None
        tokens = [token_text(self.tokenizer, e.token) for e in entries]
        offsets = []
        for t in tokens:
            offsets.append(self._offsets.get(index, 0))
            self._offsets[index] = offsets[-1] + len(t)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [
                {token_text(self.tokenizer, t): lp for t, lp in _with_chosen(e).items()} for e in entries
            ],
            "text_offset": offsets,
        }

    def start(self, indices: list[int]) -> list[dict]:
        """With `echo`, each choice's stream opens with its prompt's text (and, with `logprobs`, the
        prompt tokens' log-probs)."""
        if self.echo is None:
            return []
        return [
            self._chunk(self._choice(i, self.echo[i], None, self.with_prompt(i, None)))
            for i in indices
            if self.echo[i]
        ]

    def with_prompt(self, index: int, entries: list[TokenLogprob] | None) -> list[TokenLogprob] | None:
        """A choice's log-prob entries behind its prompt's own (`echo` with `logprobs`)."""
        if self.prompt_logprobs is None:
            return entries
        return self.prompt_logprobs[index] + (entries or [])

    def text(self, index: int, generated: str) -> str:
        """A choice's whole text: its prompt's first with `echo`."""
        return generated if self.echo is None else self.echo[index] + generated

    def delta(self, index: int, event: StreamEvent) -> dict | None:
        if not event.delta and not (self.tokenizer and event.logprobs):
            return None
        return self._chunk(self._choice(index, event.delta, None, event.logprobs))

    def finish(self, index: int, outcome: Outcome) -> list[dict]:
        return [self._chunk(self._choice(index, "", openai_finish_reason(outcome.finish_reason)))]

    def usage(self, outcomes: list[Outcome]) -> list[dict]:
        if not self.include_usage:
            return []
        return [self._chunk(None, total_usage(outcomes))]


class ChatFormat(CompletionFormat):
    object = "chat.completion.chunk"

    def __init__(self, *args, pieces_tokenizer: YueTokenizer | None = None, **kw) -> None:
        super().__init__(*args, **kw)
        # yue's `pieces` extension (a request's `"pieces": true`): per choice, a splitter tagging each
        # delta's text by the path that wrote it; the demo page colours by it, OpenAI clients ignore
        # the extra delta key.
        self.pieces_tokenizer = pieces_tokenizer
        self.splitters: dict[int, SourceSplitter] = {}

    def delta(self, index: int, event: StreamEvent) -> dict | None:
        if self.pieces_tokenizer is None:
            return super().delta(index, event)
        splitter = self.splitters.setdefault(index, SourceSplitter(self.pieces_tokenizer))
        pieces = splitter.split(event)  # every event: the splitter follows the tokens held back too
        chunk = super().delta(index, event)
        if chunk is None and not pieces:
            return None
        chunk = chunk or self._chunk(self._choice(index, "", None))
        chunk["choices"][0]["delta"]["pieces"] = pieces
        return chunk

    def _content(self, text: str | dict) -> dict:
        """A chat chunk's delta: a role opening (a dict as given), content, or nothing."""
        return {"delta": text if isinstance(text, dict) else ({"content": text} if text else {})}

    def logprobs(self, index: int, entries: list[TokenLogprob] | None) -> dict | None:
        """OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs: [...]}, ...]}."""
        if self.tokenizer is None or entries is None:
            return None
        return {"content": [chat_logprob(self.tokenizer, e) for e in entries]}

    def start(self, indices: list[int]) -> list[dict]:
        return [self._chunk(self._choice(i, {"role": "assistant", "content": ""}, None)) for i in indices]


def _with_chosen(entry: TokenLogprob) -> dict[int, float]:
    """An entry's top alternatives with its own token among them (where it has a log-prob: a token
    committed unverified has none)."""
    return entry.top if entry.logprob is None else entry.top | {entry.token: entry.logprob}


def token_text(tokenizer: YueTokenizer, token: int) -> str:
    """A token's own text (a token that ends inside a UTF-8 character shows U+FFFD)."""
    return tokenizer.decode([token], skip_special_tokens=False)


def chat_logprob(tokenizer: YueTokenizer, e: TokenLogprob) -> dict:
    text = token_text(tokenizer, e.token)
    top = [
        {"token": (t := token_text(tokenizer, tid)), "logprob": lp, "bytes": list(t.encode())}
        for tid, lp in e.top.items()
    ]
    return {"token": text, "logprob": e.logprob, "bytes": list(text.encode()), "top_logprobs": top}


def total_usage(outcomes: list[Outcome]) -> dict:
    """Usage of a request: each prompt's tokens once (its n choices share it), every choice's completion."""
    prompts = {o.prompt_index: o.prompt_tokens for o in outcomes}
    return usage(sum(prompts.values()), sum(o.stats.new_tokens for o in outcomes))


class GenerateFormat(Format):
    """`/generate`: each chunk has the delta, its per-token pieces [[text, "ar"|"nar"], ...] and
    counts; the last chunk has the same fields as the non-streamed answer plus `"done": true`."""

    def __init__(self, tokenizer: YueTokenizer) -> None:
        self.splitter = SourceSplitter(tokenizer)

    def delta(self, index: int, event: StreamEvent) -> dict | None:
        if not event.delta and not event.token_ids:
            return None
        pieces = self.splitter.split(event)
        return {
            "delta": event.delta,
            "pieces": pieces,
            "token_ids": event.token_ids,
            "sources": event.sources,
        }

    def finish(self, index: int, outcome: Outcome) -> list[dict]:
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


async def collect(choice: Choice) -> Outcome:
    """Run one choice's job to its end and gather its text (the non-streamed path)."""
    async for event in choice.job.events():
        choice.see(event)
    return choice.outcome()


async def _merged(choices: list[Choice]) -> AsyncIterator[tuple[Choice, StreamEvent | None]]:
    """Every choice's events as they come, interleaved; (choice, None) when a choice has ended. An
    exception of any choice is raised here."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump(choice: Choice) -> None:
        try:
            async for event in choice.job.events():
                await queue.put((choice, event))
            await queue.put((choice, None))
        except Exception as e:
            await queue.put((choice, e))

    tasks = [asyncio.ensure_future(pump(c)) for c in choices]
    try:
        for _ in range(len(choices)):
            while True:
                choice, item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield choice, item
                if item is None:
                    break
    finally:
        for t in tasks:
            t.cancel()


async def scored_events(fmt: Format, outcomes: list[Outcome]) -> AsyncIterator[bytes]:
    """The streamed path of a request that generates nothing (max_tokens 0 with echo): each choice's
    prompt chunk, its final chunk, the usage chunk, then `[DONE]`."""
    for chunk in fmt.start(list(range(len(outcomes)))):
        yield sse(chunk)
    for i, outcome in enumerate(outcomes):
        for chunk in fmt.finish(i, outcome):
            yield sse(chunk)
    for chunk in fmt.usage(outcomes):
        yield sse(chunk)
    yield DONE


async def sse_events(choices: list[Choice], fmt: Format) -> AsyncIterator[bytes]:
    """The streamed path: one `data:` event per chunk, each choice's final chunk, the usage chunk,
    then `[DONE]`."""
    try:
        for chunk in fmt.start([c.index for c in choices]):
            yield sse(chunk)
        outcomes = []
        async for choice, event in _merged(choices):
            if event is None:
                outcome = choice.outcome()
                outcomes.append(outcome)
                for chunk in fmt.finish(choice.index, outcome):
                    yield sse(chunk)
                continue
            choice.see(event)
            if (chunk := fmt.delta(choice.index, event)) is not None:
                yield sse(chunk)
        for chunk in fmt.usage(outcomes):
            yield sse(chunk)
    except ApiError as e:  # the drain ran out: its error chunk, then [DONE]
        for c in choices:
            c.tracker.fail(e.code)
        yield sse(e.body())
    except Exception:  # the engine failed mid-stream: an error chunk, then [DONE]
        log.exception("generation failed mid-stream")
        for c in choices:
            c.tracker.fail("engine_error")
        yield sse(
            {"error": {"message": "generation failed", "type": "server_error", "param": None, "code": None}}
        )
    finally:
        for c in choices:
            c.tracker.fail("cancelled")  # a no-op unless the stream was abandoned (the client went away)
    yield DONE
