"""`yue bench-serve --chat-turns N`: time to first token, per turn, of N-turn chats on `yue serve` with the
prefix cache and without it.

Design decisions:
- Two real servers in this process (`LocalServer`, one request at a time each): one with the prefix
  cache at its default bound, one with none; the clients in a process of their own
  (`serving.client_process`), streamed `/v1/chat/completions` as an OpenAI client sends them.
- Rounds interleaved (`serving.interleaved`: off, on, then on, off), each round's chats new (the next
  held-out code prompts), so a round never finds a whole chat of an earlier one; every chat shares one
  system prompt (`CHAT_SYSTEM`), as a deployment's do. One client sends the chats one after another,
  `--think-s` between turns (a reader's pause, in which the cache fills an answer while idle), so time
  to first token holds no queueing.
- Honest: each turn's answers are compared between the two servers; the hits each request booked are
  read from the cached server's `/metrics` around it; a ratio is taken within each round and reported
  as its median and range; a table, then one JSON document as the last line.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict

import httpx
import torch

from yue.bench.metrics import percentile
from yue.bench.prompts import CODE_TEST
from yue.bench.serving import (
    ChatTurn,
    ServeBench,
    ServeBenchConfig,
    _counters,
    client_process,
    interleaved,
    stream_timed,
)
from yue.jsonl import iter_jsonl

# The chat bench's system prompt (~260 tokens on yue's tokenizers): what a coding assistant's deployment
# puts before every conversation, so that a chat's turns share a long start.
CHAT_SYSTEM = (
    "You are a careful senior Python engineer helping a colleague. Answer with code first and prose "
    "second. Follow these rules in every answer. Use the standard library unless asked otherwise. Type "
    "every public function with PEP 604 unions, and write a Google-style docstring with Args and Returns. "
    "Prefer small pure functions over classes with hidden state. Never swallow exceptions: raise "
    "ValueError with the name of the bad argument. Keep lines under 100 characters. When you change "
    "code, show the whole function, not a diff. When a test would help, write one with pytest, named "
    "after the invariant it checks. If a question is ambiguous, state the assumption you made in one "
    "sentence. Do not invent APIs: if you are unsure that a function exists, say so. Prefer clear names "
    "over comments, and comments that say why over comments that say what. Measure before optimising, "
    "and say what you measured. Be brief: the colleague reads code faster than prose."
)
# What each later turn of a chat asks (turn 2 the first of these).
CHAT_FOLLOW_UPS = (
    "Now add type hints and a docstring.",
    "Write a pytest test for it.",
    "Make it faster, and say why it is faster.",
    "Explain it in one sentence.",
)


def chat_conversations(prompts: Sequence[str], n: int, turns: int, round_: int) -> list[list[str]]:
    """The user messages of a round's `n` chats, one per turn: a held-out code prompt to complete, then
    `CHAT_FOLLOW_UPS` in turn; each round takes the next n prompts (a new chat, not one cached)."""
    firsts = [prompts[(round_ * n + c) % len(prompts)] for c in range(n)]
    ups = [CHAT_FOLLOW_UPS[t % len(CHAT_FOLLOW_UPS)] for t in range(turns - 1)]
    return [["Complete this code:\n\n" + first, *ups] for first in firsts]


def _chat_turn(client: httpx.Client, url: str, messages: list[dict], mode: str, max_tokens: int):
    """One streamed chat completion: (text, seconds to the first content chunk, prompt tokens)."""
    body = {"messages": messages, "max_tokens": max_tokens, "mode": mode}
    return stream_timed(client, url, "/v1/chat/completions", body, "content", "prompt_tokens")


def _chats(url: str, conversations: list[list[str]], mode: str, max_tokens: int, think_s: float, system: str):
    """Each chat in turn, one client (no queueing in the figures): per chat, per turn, (TTFT seconds,
    answer, prompt tokens, prefix-cache hit tokens booked by that request); `think_s` between turns."""
    hits = ["yue_prefix_cache_hits"]
    out = []
    with httpx.Client() as http:
        for messages_in in conversations:
            messages, turns = [{"role": "system", "content": system}], []
            for t, message in enumerate(messages_in):
                if t:
                    time.sleep(think_s)
                messages.append({"role": "user", "content": message})
                before = _counters(url, hits)["yue_prefix_cache_hits"]
                text, ttft, prompt_tokens = _chat_turn(http, url, messages, mode, max_tokens)
                hit = _counters(url, hits)["yue_prefix_cache_hits"] - before
                turns.append((ttft, text, prompt_tokens, int(hit)))
                messages.append({"role": "assistant", "content": text})
            out.append(turns)
    return out


def bench_chat(
    engine,
    cfg: ServeBenchConfig,
    *,
    prompts: list[str] | None = None,
    log: Callable[[str], None] = lambda s: None,
    precision: str = "float32",
    system: str = CHAT_SYSTEM,
) -> ServeBench:
    """Time to first token of `cfg.chat_turns`-turn chats (`system`, then `chat_conversations`'
    messages), `cfg.n_prompts` chats a round, on a server with the prefix cache (its default bound) and
    one without, in the same run, interleaved by round (`interleaved`); each round's chats are new. Each
    turn's answers are compared between the two servers. Greedy, `cfg.mode`, `cfg.max_tokens` a turn."""
    from yue.serve import ServeConfig
    from yue.serve.server import LocalServer

    if prompts is None:
        prompts = [row["prompt"] for _, row in iter_jsonl(CODE_TEST)]
    result = ServeBench(
        engine.name, cfg.mode, cfg.max_tokens, cfg.n_prompts, torch.get_num_threads(), os.cpu_count() or 0
    )
    result.precision, result.think_s = precision, cfg.think_s
    result.load_average["start"] = [round(x, 2) for x in os.getloadavg()]
    with contextlib.ExitStack() as stack:
        default_mb = ServeConfig().prefix_cache_mb
        urls = {
            cache: stack.enter_context(
                LocalServer(engine, ServeConfig(prefix_cache_mb=default_mb if cache else 0, max_batch_size=1))
            ).url
            for cache in (False, True)
        }
        clients = stack.enter_context(client_process())
        warm = [["Say hi."]]
        for url in urls.values():  # warm-up (imports, first forwards), not reported
            clients.submit(_chats, url, warm, cfg.mode, 4, 0.0, system).result()
        answers: dict[tuple[int, bool], list] = {}
        for r, cache in interleaved([False, True], cfg.rounds):
            chats = chat_conversations(prompts, cfg.n_prompts, cfg.chat_turns, r)
            answers[(r, cache)] = clients.submit(
                _chats, urls[cache], chats, cfg.mode, cfg.max_tokens, cfg.think_s, system
            ).result()
            log(f"round {r}, cache {'on' if cache else 'off'}: {len(chats)} chats done")
        for (r, cache), runs in sorted(answers.items()):
            other = answers.get((r, not cache))
            for t in range(cfg.chat_turns):
                rows = [turns[t] for turns in runs]
                ttfts = [row[0] * 1e3 for row in rows]
                same = sum(other is not None and row[1] == other[c][t][1] for c, row in enumerate(rows))
                turn = ChatTurn(
                    t + 1,
                    cache,
                    r,
                    len(rows),
                    sum(row[2] for row in rows),
                    round(percentile(ttfts, 50), 1),
                    round(max(ttfts), 1),
                    sum(row[3] for row in rows),
                    same,
                )
                log(json.dumps(asdict(turn)))
                result.chat_turns.append(turn)
    result.load_average["end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def chat_report(result: ServeBench) -> str:
    """The chat bench's table (per turn, medians over rounds) and, last, one JSON line."""
    lines = [
        f"`yue serve` chats, {result.model} ({result.precision}), {result.mode}, greedy, {result.max_tokens} "
        f"tokens a turn, {result.prompts} chats a round, {result.think_s} s between turns, one client, "
        f"{result.torch_threads} torch threads, {result.cpus} CPUs, load average (1/5/15 min) "
        f"{result.load_average['start']} at start, {result.load_average['end']} at end",
        "",
        "| turn | rounds | requests | prompt tokens | TTFT p50 no cache (ms) | TTFT p50 cache (ms) "
        "| speed-up (median, range) | cache hit tokens | answers identical |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    medians = result.chat_medians()
    for m in medians:
        sp = m["speedup"]
        lines.append(
            f"| {m['turn']} | {m['rounds']} | {m['requests']} | {m['prompt_tokens']} | {m['ttft_p50_ms_off']} "
            f"| {m['ttft_p50_ms_on']} | {sp['median']}x ({sp['range'][0]}-{sp['range'][1]}) "
            f"| {m['hit_tokens']} | {m['identical']}/{m['requests']} |"
        )
    doc = asdict(result) | {"chat_medians": medians}
    return "\n".join(lines) + "\n" + json.dumps(doc)
