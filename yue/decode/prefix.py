"""The prefix cache: K/V columns of sequences prefilled before, so that a later prompt starting with the
same tokens (a conversation's earlier turns and answers, a shared system prompt) is not prefilled again,
and its output does not change by a bit.

Design decisions:
- A position's K/V bits depend on how the forward that wrote it was cut, so stored columns are reused
  only where a prefill without the cache would have written the same bits. Which cuts keep the bits is
  the model's decode paths' business, and there are two cases (`split_exact`, measured on yue-smol and
  yue-code-mini: docs/serve.md):
  - **Blocks** (`split_exact`: every AR matmul of every layer takes its rows on yue's row kernel for any
    row count, as 4-bit or 8-bit codes, and attention is row-exact): a committed row's bits do not depend
    on how many rows share its forward, once that forward starts past position 0 and takes more than
    `rowkernel.MAX_ROWS` rows (the parts path; 1-9 rows run the layer as one row-kernel call, whose
    bits are its own). The prefill then cuts a prompt so that every forward does
    (`chunks.chunk_end(exact=True)`: position 0's chunk is [0, BLOCK), every later one at least
    `MIN_ROWS` rows), and any cut on that rule gives the same bits: the cache stores and finds
    `BLOCK`-token blocks, a prompt resumes at the last block boundary it shares that leaves it at least
    `MIN_ROWS` tokens, and a prompt's tail, fed by its first decode step, is stored too.
  - **Grid** (any other path: float32 weights through torch's GEMM past 9 rows, a GPU, bfloat16): a
    prefill's chunks are fixed by positions alone (`chunks.chunk_end` from position 0), the cache keeps
    whole grid chunks, and a prompt resumes only at a grid boundary, in the very state a prefill
    without the cache reaches there.
- An entry is one block's (or chunk's) columns, every layer's K and V ((L, Hkv, n, Dh) each, copies),
  keyed by a digest of all the tokens up to its end (blake2b, 128 bits, fed incrementally: `prefix_keys`):
  a key names the whole prefix, whatever follows it. A lookup tries the boundaries from the start and
  stops at the first miss.
- Prefill chunks compute no slots and no logits, so their K/V do not depend on the decode config: one
  cache serves every mode and batch of a model.
- Bounded in bytes, evicted least recently used. A hit touches its chain deepest first, so a prefix is
  more recent than its extensions (an extension left without its prefix is unreachable; it is next in
  line anyway). A hit copies the columns into the request's own cache, so eviction never touches a
  running request.
- Decoded tokens' K/V are not a prefill's bits (a one-row step runs the layer as one row-kernel call, a
  verifying step other rows), so an answer is reused once `PrefixFill` has prefilled it, on the same
  rule, while the server idles (`batcher.py`).
- Counters follow vLLM's prefix-cache metrics (queries and hits counted in tokens), plus lookups by
  result; `serve.metrics` exposes them.
"""

from __future__ import annotations

import hashlib
import weakref
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from yue.model.cache import KVCache
from yue.model.decode_paths import exact_rows
from yue.model.masks import decode_mask
from yue.model.mot import YueForCausalLM

# One MiB, the unit of `--prefix-cache-mb`.
MIB = 1 << 20
# Tokens a stored block holds where any cut keeps the bits (`split_exact`).
BLOCK = 16
# The fewest rows a prefill forward past position 0 takes where any cut keeps the bits: more than the
# row kernel's one-call rows (`rowkernel.MAX_ROWS`), whose layer, one call in C, has bits of its own.
MIN_ROWS = 9 + 1  # `rowkernel.MAX_ROWS` + 1 (the decode floor imports no kernel; a test pins it)


def prefix_keys(tokens: list[int], ends: list[int]) -> list[bytes]:
    """The entry keys of the prefixes tokens[:e] for each e of `ends` (ascending): a 128-bit blake2b
    digest of the token ids (int64), one hash fed along the sequence (O(len), not O(len * ends))."""
    h, keys, done = hashlib.blake2b(digest_size=16), [], 0
    for end in ends:
        h.update(array("q", tokens[done:end]).tobytes())
        keys.append(h.copy().digest())
        done = end
    return keys


def prefix_key(tokens: list[int]) -> bytes:
    """The entry key of a token prefix (`prefix_keys`' for its whole length)."""
    return prefix_keys(tokens, [len(tokens)])[0]


_split_verdicts: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def split_exact(model) -> bool:
    """Whether a prefill's committed rows keep their bits however it is cut, as long as every forward past
    position 0 takes at least `MIN_ROWS` rows (see the module's notes): each layer's AR set row-exact
    (`decode_paths.exact_rows`, attention included) with its four matmuls on yue's row kernel for every
    row count (`matmuls.StreamedLinear` holding codes, `matmuls.RowInt4Linear`). Float32 weights are not:
    past 9 rows torch's GEMM takes them, whose bits depend on the row count (measured on yue-code-mini:
    a 107-row chunk's rows differed from a 124-row chunk's at 7 of 124 positions). Cached per model."""
    paths = getattr(model, "paths", None)
    if paths is None or model.device.type != "cpu":
        return False
    verdict = _split_verdicts.get(model)
    if verdict is None:
        verdict = bool(paths.layers) and all(_layer_split_exact(sets) for sets in paths.layers)
        _split_verdicts[model] = verdict
    return verdict


def _layer_split_exact(sets) -> bool:
    if not exact_rows(sets):
        return False
    ar = sets[0]
    matmuls = (ar.qkv, ar.shared[1], ar.gate_up, ar.shared[3])
    # Codes are uint8: the row kernel's 4-bit / 8-bit / int4 records, or a GGUF's blocks read in place
    # (a matmul of parts, `file_codes.GGMLParts`, each part's); not float32 or int8 weights.
    weights = []
    for m in matmuls:
        parts = getattr(m, "parts", None)
        weights += (
            [getattr(p, "blocked", (None,))[0] for p in parts]
            if parts is not None
            else [getattr(m, "blocked", (None,))[0]]
        )
    return all(w is not None and w.dtype == torch.uint8 for w in weights)


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
    """Blocks (or grid chunks) of prefilled K/V by prefix key, at most `max_bytes` of them, least recently
    used first out.

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
        """The longest run of cached blocks or chunks at the start of `tokens`, trying their ends `ends`
        (the boundaries the caller may resume at, ascending: `chunks.lookup_ends`). `count`: book it in `stats` (a request's lookup;
        the cache's own, by an idle fill, is not)."""
        hit, keys = PrefixHit(), []
        for end, key in zip(ends, prefix_keys(tokens, ends), strict=True):
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

    def put(
        self, tokens: list[int], start: int, k: torch.Tensor, v: torch.Tensor, key: bytes | None = None
    ) -> None:
        """Store the chunk [start, len(tokens)) of prefix `tokens`: its K and V (L, Hkv, n, Dh), which the
        cache then owns (pass copies). A key already there is only touched; a chunk larger than the
        whole bound is not stored. `key`: the prefix's `prefix_key`, where the caller has it."""
        key = prefix_key(tokens) if key is None else key
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


def store(
    prefix_cache: PrefixCache, cache: KVCache, rows: list[list[int]], done: int, end: int, block: int | None
) -> None:
    """Store columns [done, end) of each row of `cache` (its tokens `rows`, each at least `end` long, its
    columns its positions: no holes) in `prefix_cache`: as `block`-token blocks (`end` - done a multiple),
    or as one chunk (None)."""
    step = block or end - done
    ends = list(range(done + step, end + 1, step))
    for b, tokens in enumerate(rows):
        keys = prefix_keys(tokens, [done, *ends])[1:]
        for e, key in zip(ends, keys, strict=True):
            k, v = (
                cache.k[:, b, :, e - step : e].clone(),
                cache.v[:, b, :, e - step : e].clone(),
            )  # (L, Hkv, n, Dh)
            prefix_cache.put(tokens[:e], e - step, k, v, key)


def feed_chunk(
    model: YueForCausalLM,
    cache: KVCache,
    prompt: torch.Tensor,
    done: int,
    end: int,
    offsets: torch.Tensor,
    prefix_cache: PrefixCache | None,
    block: int | None = None,
) -> None:
    """Feed prompt columns [done, end) of rows `prompt` (B, T) into `cache` (which holds [0, done)), no
    logits; with `prefix_cache`, store each row's new columns there (`store`: as `block`-token blocks, or
    as one chunk, `end` then on the chunk grid). offsets: arange(end - done) on the model's device."""
    n = end - done
    mask = decode_mask(cache.length, n, 0, cache.key_valid, model.device)
    model.step(prompt[:, done:end], cache.positions(offsets), n, mask, cache, 0)
    cache.advance(n)
    if prefix_cache is not None:
        store(prefix_cache, cache, prompt[:, :end].tolist(), done, end, block)


class PrefixFill:
    """Extends a prefix cache with a token sequence, a chunk per `step`, from what the cache holds.

    The batcher runs one for each finished request's prompt + answer (the start of its conversation's
    next turn) while no request waits, so that the next turn finds its earlier turns prefilled: an
    answer's K/V from decoding are not a prefill's bits, so they cannot be reused as they are. The
    chunks are fed as a lone prompt's prefill feeds them (`feed_chunk`): the same bits.

    Args:
        model: the MoT model (eval mode).
        prefix_cache: the cache to extend.
        tokens: the sequence.
        ends: the boundaries a lookup may resume at, up to its length, ascending (`chunks.fill_plan`); the
            sequence is filled up to the last.
        chunks: where the chunks fed end, ascending, ending at ends[-1] (grid: `ends` itself).
        block: store as `block`-token blocks (`split_exact` models), or each chunk as one (None).
    """

    def __init__(
        self,
        model: YueForCausalLM,
        prefix_cache: PrefixCache,
        tokens: list[int],
        ends: list[int],
        chunks: list[int] | None = None,
        block: int | None = None,
    ) -> None:
        self.model, self.prefix_cache, self.ends = model, prefix_cache, ends
        self.chunks, self.block = ends if chunks is None else chunks, block
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
        end = next(e for e in self.chunks if e > self.done)
        device = self.model.device
        prompt = torch.tensor([self.tokens[:end]], device=device)  # (1, end)
        offsets = torch.arange(end - self.done, device=device)
        feed_chunk(self.model, self.cache, prompt, self.done, end, offsets, self.prefix_cache, self.block)
        fed, self.done = end - self.done, end
        self.prefix_cache.stats.filled_tokens += fed
        return fed
