"""The prefix cache: KV columns of prompts prefilled before, so that a later prompt starting with the same
tokens (a conversation's earlier turns) is not prefilled again, and its output does not change by a bit.

Design decisions:
- Reuse happens only at the prefill chunk grid (`loop.chunk_end` from position 0: a function of positions
  alone). A position's float32 K/V bits depend on which rows shared its forward, so stored columns equal
  what a fresh prefill would write only if the same chunks wrote them: the grid's chunks [b0, b1),
  [b1, b2), ... A prompt whose first b_j tokens equal a stored prefix's starts its prefill at b_j, in the
  very state a prefill without the cache reaches there, and the rest follows the same grid.
- An entry is one chunk's columns, every layer's K and V ((L, Hkv, n, Dh) each, copies), keyed by a
  digest of all the tokens up to its end (blake2b, 128 bits): a key names the whole prefix, whatever
  follows it. A lookup tries the grid's boundaries from the start and stops at the first miss.
- Prefill chunks compute no slots and no logits, so their K/V do not depend on the decode config: one
  cache serves every mode and batch of a model.
- Bounded in bytes, evicted least recently used. A hit touches its chain deepest first, so a prefix is
  more recent than its extensions (an extension left without its prefix is unreachable; it is next in
  line anyway). A hit copies the columns into the request's own cache, so eviction never touches a
  running request.
- Decoded tokens' K/V are not a prefill's bits either (other rows, other kernels), so an answer is
  reused only once `PrefixFill` has prefilled it on the grid, while the server idles (`batcher.py`).
- Counters follow vLLM's prefix-cache metrics (queries and hits counted in tokens), plus lookups by
  result; `serve.metrics` exposes them.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from yue.model.cache import KVCache
from yue.model.masks import decode_mask
from yue.model.mot import YueForCausalLM

# One MiB, the unit of `--prefix-cache-mb`.
MIB = 1 << 20


def prefix_key(tokens: list[int]) -> bytes:
    """The entry key of a token prefix: a 128-bit blake2b digest of the token ids (int64)."""
    return hashlib.blake2b(array("q", tokens).tobytes(), digest_size=16).digest()


@dataclass
class PrefixStats:
    """What the cache did, since it was made.

    Attributes:
        queried_tokens: prompt tokens of the requests looked up (vLLM's prefix_cache_queries).
        hit_tokens: prompt tokens found, not prefilled again (vLLM's prefix_cache_hits).
        hits/misses: lookups that found at least one chunk, and those that found none.
        evictions: entries dropped for room.
        filled_tokens: tokens prefilled while idle to extend the cache with finished answers
            (`batcher.Batcher`), no request waiting on them.
    """

    queried_tokens: int = 0
    hit_tokens: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    filled_tokens: int = 0


@dataclass
class PrefixHit:
    """A lookup's result: the first `length` tokens are cached, as `chunks` ((start, k, v) per chunk, in
    order; k and v (L, Hkv, n, Dh))."""

    length: int = 0
    chunks: list[tuple[int, torch.Tensor, torch.Tensor]] = field(default_factory=list)


class PrefixCache:
    """Chunks of prefilled K/V by prefix key, at most `max_bytes` of them, least recently used first out.

    Single-threaded by contract, like the batcher that owns it (the server's scheduler thread); the
    counters in `stats` may be read from another thread.

    Args:
        max_bytes: the bound on the stored tensors' bytes (> 0).
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes <= 0:
            raise ValueError(f"prefix cache max_bytes must be > 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self.stats = PrefixStats()
        # key -> (start, k, v), oldest use first.
        self._entries: OrderedDict[bytes, tuple[int, torch.Tensor, torch.Tensor]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tokens: list[int]) -> bool:
        return prefix_key(tokens) in self._entries

    def lookup(self, tokens: list[int], ends: list[int], count: bool = True) -> PrefixHit:
        """The longest run of cached chunks at the start of `tokens`, trying chunk ends `ends` (the grid's
        boundaries the caller may resume at, ascending). `count`: book it in `stats` (a request's lookup;
        the cache's own, by an idle fill, is not)."""
        hit, keys = PrefixHit(), []
        for end in ends:
            key = prefix_key(tokens[:end])
            entry = self._entries.get(key)
            if entry is None:
                break
            keys.append(key)
            hit.chunks.append(entry)
            hit.length = end
        for key in reversed(keys):  # deepest first: a prefix ends more recent than its extensions
            self._entries.move_to_end(key)
        if count:
            s = self.stats
            s.queried_tokens += len(tokens)
            s.hit_tokens += hit.length
            s.hits += hit.length > 0
            s.misses += hit.length == 0
        return hit

    def put(self, tokens: list[int], start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the chunk [start, len(tokens)) of prefix `tokens`: its K and V (L, Hkv, n, Dh), which the
        cache then owns (pass copies). A key already there is only touched; a chunk larger than the
        whole bound is not stored."""
        key = prefix_key(tokens)
        if key in self._entries:
            self._entries.move_to_end(key)
            return
        size = k.nbytes + v.nbytes
        if size > self.max_bytes:
            return
        while self.bytes + size > self.max_bytes:
            _, (_, old_k, old_v) = self._entries.popitem(last=False)
            self.bytes -= old_k.nbytes + old_v.nbytes
            self.stats.evictions += 1
        self._entries[key] = (start, k, v)
        self.bytes += size


def write_hit(cache: KVCache, b: int, hit: PrefixHit, after: int) -> None:
    """Copy a hit's chunks that start at or after column `after` into row b of `cache` (its pointer is
    the caller's to move)."""
    for start, k, v in hit.chunks:  # k, v: (L, Hkv, n, Dh)
        if start >= after:
            cache.k[:, b, :, start : start + k.shape[2]] = k
            cache.v[:, b, :, start : start + v.shape[2]] = v


def feed_chunk(
    model: YueForCausalLM,
    cache: KVCache,
    prompt: torch.Tensor,
    done: int,
    end: int,
    offsets: torch.Tensor,
    prefix_cache: PrefixCache | None,
) -> None:
    """Feed prompt columns [done, end) of rows `prompt` (B, T) into `cache` (which holds [0, done)), no
    logits; with `prefix_cache`, store each row's new columns there (`end` must be on the chunk grid).
    offsets: arange(end - done) on the model's device."""
    n = end - done
    mask = decode_mask(cache.length, n, 0, cache.key_valid, model.device)
    model.step(prompt[:, done:end], cache.positions(offsets), n, mask, cache, 0)
    cache.advance(n)
    if prefix_cache is not None:
        for b, tokens in enumerate(prompt[:, :end].tolist()):
            k, v = cache.k[:, b, :, done:end].clone(), cache.v[:, b, :, done:end].clone()  # (L, Hkv, n, Dh)
            prefix_cache.put(tokens, done, k, v)


class PrefixFill:
    """Extends a prefix cache with a token sequence, a grid chunk per `step`, from what the cache holds.

    The batcher runs one for each finished request's prompt + answer (the start of its conversation's
    next turn) while no request waits, so that the next turn finds its earlier turns prefilled: an
    answer's K/V from decoding are not a prefill's bits, so they cannot be reused as they are. The
    chunks are the grid's, fed as a lone prompt's prefill feeds them (`feed_chunk`): the same bits.

    Args:
        model: the MoT model (eval mode).
        prefix_cache: the cache to extend.
        tokens: the sequence.
        ends: the chunk grid's boundaries up to its length, ascending (`loop.grid_ends(len(tokens),
            inclusive=True)`); the sequence is filled up to the last.
    """

    def __init__(
        self, model: YueForCausalLM, prefix_cache: PrefixCache, tokens: list[int], ends: list[int]
    ) -> None:
        self.model, self.prefix_cache, self.ends = model, prefix_cache, ends
        self.tokens = tokens[: ends[-1]] if ends else []
        self.cache: KVCache | None = None
        self.done = 0

    @property
    def finished(self) -> bool:
        return self.done == len(self.tokens)

    @torch.inference_mode()
    def step(self) -> int:
        """Feed the next chunk the prefix cache lacks (after taking in the ones it holds, which requests
        may have stored meanwhile); returns the tokens fed, 0 when nothing was left to feed."""
        if self.finished:
            return 0
        if self.cache is None:
            self.cache = self.model.new_cache(1, len(self.tokens))
        hit = self.prefix_cache.lookup(self.tokens, self.ends, count=False)
        if hit.length > self.done:
            write_hit(self.cache, 0, hit, self.done)
            self.cache.advance(hit.length - self.done)
            self.done = hit.length
        if self.finished:
            return 0
        end = next(e for e in self.ends if e > self.done)
        device = self.model.device
        prompt = torch.tensor([self.tokens[:end]], device=device)  # (1, end)
        offsets = torch.arange(end - self.done, device=device)
        feed_chunk(self.model, self.cache, prompt, self.done, end, offsets, self.prefix_cache)
        fed, self.done = end - self.done, end
        self.prefix_cache.stats.filled_tokens += fed
        return fed
