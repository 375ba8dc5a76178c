"""Prompts written by the model itself (Magpie, Xu et al. 2024): the chat template up to the start of a
user turn, sampled, yields the kind of request the instruct model was tuned on.

Why: drafts trained only on answers to standard-library questions transfer poorly to everyday chat (on
SmolLM2, slot-2 accuracy .60 on held-out standard-library prompts but .24 on hand-written everyday ones).
The model's own prior over user requests is broad, costs no data from anywhere, and shares no text with
any evaluation set; a content-hash check against the shipped sets drops any accidental duplicate.
"""

from __future__ import annotations

import hashlib
import json

from tqdm.auto import tqdm

from yue.engine import Engine

SENTINEL = "\x00YUE-USER-TURN\x00"


def user_turn_prefix(engine: Engine) -> str:
    """The rendered chat template up to where a user's message begins (system prompt included)."""
    text = engine.chat_prompt([{"role": "user", "content": SENTINEL}])
    if SENTINEL not in text:
        raise ValueError("the chat template does not show the user's message verbatim")
    return text[: text.index(SENTINEL)]


def content_hash(text: str) -> str:
    return hashlib.sha256(" ".join(text.lower().split()).encode()).hexdigest()


def model_written_prompts(
    engine: Engine,
    n: int,
    seed: int = 0,
    batch_size: int = 32,
    max_tokens: int = 48,
    temperature: float = 1.0,
    top_p: float = 0.95,
    exclude: set[str] = frozenset(),
    progress: bool = True,
) -> list[list[dict]]:
    """`n` distinct user requests sampled from the model (finished ones only: they ended with EOS),
    as chat conversations; texts whose `content_hash` is in `exclude` are dropped."""
    prefix = user_turn_prefix(engine)
    seen, out, batch_seed = set(exclude), [], seed
    bar = tqdm(total=n, desc="model-written prompts", unit="prompt", disable=not progress)
    while len(out) < n:
        results = engine.generate(
            [prefix] * batch_size,
            mode="ar",
            max_new_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=batch_seed,
        )
        batch_seed += 1
        for r in results:
            text = r.text.strip()
            h = content_hash(text)
            if r.finish_reason != "eos" or len(text) < 8 or h in seen:
                continue
            seen.add(h)
            out.append([{"role": "user", "content": text}])
            bar.update(1)
            if len(out) == n:
                break
    bar.close()
    return out


def shipped_set_hashes(paths: list[str]) -> set[str]:
    """Content hashes of every user message in JSONL chat sets (to keep them out of training)."""
    hashes = set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    for m in json.loads(line).get("messages", []):
                        hashes.add(content_hash(m["content"]))
    return hashes
