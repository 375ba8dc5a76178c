"""The prefix cache: a prompt that starts with chunks prefilled before resumes after them, and its output
is, bit for bit, what it is without the cache; the cache counts its hits and misses and stays within its
byte bound, least recently used out first."""

from __future__ import annotations

import time

import pytest
import torch

import yue
from tests.test_batching import exact_batch_model, head_rows
from yue.batcher import Batcher
from yue.config import DecodeConfig
from yue.decode import chunks
from yue.decode.chunks import chunk_end, fill_plan, grid_ends, lookup_ends
from yue.decode.loop import DecodeBatch
from yue.decode.prefix import (
    BLOCK,
    MIN_ROWS,
    PrefixCache,
    PrefixFill,
    feed_chunk,
    prefix_key,
    prefix_keys,
    split_exact,
)


@pytest.fixture(scope="module")
def trained(trained_model_dir):
    return yue.load(trained_model_dir)


def _chunk(n: int, value: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """A chunk's (k, v) of n columns, each (L, Hkv, n, Dh) = (2, 1, n, 4): 64 bytes a column, both."""
    return torch.full((2, 1, n, 4), value), torch.full((2, 1, n, 4), value)


def test_lookups_count_hits_and_misses_and_queried_and_hit_tokens():
    cache = PrefixCache(1 << 20)
    tokens = list(range(40))
    cache.put(tokens[:16], 0, *_chunk(16))
    cache.put(tokens[:32], 16, *_chunk(16, 1.0))
    hit = cache.lookup(tokens, [16, 32])
    assert hit.length == 32 and [start for start, _, _ in hit.chunks] == [0, 16]
    assert torch.equal(hit.chunks[1][1], _chunk(16, 1.0)[0])
    # Another token inside the second chunk: only the first is the same prefix.
    assert cache.lookup([*tokens[:20], 99, *tokens[21:]], [16, 32]).length == 16
    assert cache.lookup([7, *tokens[1:]], [16, 32]).length == 0  # the first token differs
    assert cache.lookup(tokens, [16, 32], count=False).length == 32  # not booked
    s = cache.stats
    assert (s.hits, s.misses, s.queried_tokens, s.hit_tokens) == (2, 1, 120, 48)


def test_eviction_drops_the_least_recently_used_chunks_within_the_byte_bound():
    cache = PrefixCache(3 * 16 * 64)  # room for three 16-column chunks (1 KiB each, k and v)
    prompts = [[p] * 16 for p in range(4)]
    for p in prompts[:3]:
        cache.put(p, 0, *_chunk(16))
    assert len(cache) == 3 and cache.bytes == cache.max_bytes
    assert cache.lookup(prompts[0], [16]).length == 16  # prompt 0 used again: prompt 1 is now the oldest
    cache.put(prompts[3], 0, *_chunk(16))
    assert prompts[1] not in cache and all(p in cache for p in (prompts[0], prompts[2], prompts[3]))
    assert cache.stats.evictions == 1 and cache.bytes <= cache.max_bytes
    cache.put([9] * 64, 0, *_chunk(64))  # larger than the whole bound: not stored, nothing evicted
    assert len(cache) == 3 and cache.stats.evictions == 1


def test_a_lookup_keeps_a_prefix_more_recent_than_its_extensions():
    """A hit touches its chain deepest first, so eviction takes the extension before the prefix it needs."""
    cache = PrefixCache(3 * 16 * 64)
    tokens = list(range(32))
    cache.put(tokens[:16], 0, *_chunk(16))
    cache.put(tokens[:32], 16, *_chunk(16))
    cache.put([50] * 16, 0, *_chunk(16))
    cache.lookup(tokens, [16, 32])
    cache.put([60] * 16, 0, *_chunk(16))  # evicts the other prompt's chunk, the oldest
    cache.put([70] * 16, 0, *_chunk(16))  # then the extension, before its prefix
    assert tokens[:16] in cache and tokens[:32] not in cache


def test_grid_ends_are_the_chunk_ends_of_a_prefill(monkeypatch):
    monkeypatch.setattr(chunks, "PREFILL_CHUNK", 16)
    assert (
        grid_ends(40) == [16, 32]
        and grid_ends(48) == [16, 32]
        and grid_ends(48, inclusive=True) == [16, 32, 48]
    )
    assert grid_ends(16) == [] and grid_ends(17) == [16]
    ends = grid_ends(5000)
    assert all(chunks.chunk_end(a, 10**9) == b for a, b in zip([0, *ends], ends, strict=False))


def test_prefix_keys_fed_along_a_sequence_are_the_whole_prefixes_keys():
    tokens = list(range(100, 150))
    assert prefix_keys(tokens, [3, 16, 50]) == [prefix_key(tokens[:n]) for n in (3, 16, 50)]


def test_the_exact_cut_starts_with_a_block_and_leaves_no_forward_fewer_than_min_rows():
    """`chunk_end(exact=True)`: [0, BLOCK) first (or all of a prompt too short for MIN_ROWS after it),
    then chunks of whole blocks, the last forward (the first decode step's) at least MIN_ROWS rows; a
    lookup stops where MIN_ROWS are left; a fill's chunks end on blocks."""
    for length in range(1, 400):
        ends, done = [], 0
        while done < length:
            done = chunk_end(done, length, exact=True)
            ends.append(done)
        if length < BLOCK + MIN_ROWS:
            assert ends == [length]
            continue
        assert ends[0] == BLOCK and all(e % BLOCK == 0 for e in ends[:-1])
        assert all(b - a >= MIN_ROWS for a, b in zip(ends, ends[1:], strict=False))
        found = lookup_ends(length, exact=True)
        assert found == list(range(BLOCK, found[-1] + 1, BLOCK)) and length - found[-1] >= MIN_ROWS
        assert length - found[-1] - BLOCK < MIN_ROWS
    blocks, chunks, block = fill_plan(200, exact=True)
    assert blocks == list(range(16, 193, 16)) and chunks[0] == 16 and chunks[-1] == 192 and block == BLOCK
    assert fill_plan(200, exact=False) == (grid_ends(200, inclusive=True),) * 2 + (None,)


@pytest.mark.parametrize("precision", ["float32 4-bit codes", "int4", "file codes"])
def test_on_blocks_any_cut_past_the_first_block_writes_the_same_kv_bits(precision, tmp_path_factory):
    """The measurement the block rule stands on (`split_exact`): a 120-token prompt fed as [0, 16) then
    one chunk, or in cuts of 10-40 rows (each more than the row kernel's one-call rows), writes the same
    K/V bits, every layer, every position; a cut of fewer rows (one row-kernel call a layer) may not."""
    model = block_model(precision, tmp_path_factory)
    assert split_exact(model)
    g = torch.Generator().manual_seed(11)
    T = 120
    prompt = torch.randint(4, 96, (1, T), generator=g)

    def kv(cuts: list[int]) -> torch.Tensor:
        cache, done = model.new_cache(1, T + 8), 0
        for end in [*cuts, T]:
            feed_chunk(model, cache, prompt, done, end, torch.arange(end - done), None)
            done = end
        return torch.cat([cache.k[:, 0, :, :T], cache.v[:, 0, :, :T]])

    with torch.inference_mode():
        whole = kv([16])
        for cuts in ([16, 32, 48, 64, 80, 96], [16, 26, 53, 93], [16, 50], [16, 27, 67, 110]):
            assert torch.equal(kv(cuts), whole), cuts


def _same_rows(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """The same hidden rows, bit for bit, in any order (rows that join at other steps are read in
    other calls)."""
    key = lambda r: r.numpy().tobytes()  # noqa: E731
    return sorted(map(key, a)) == sorted(map(key, b))


def _decode_rows(
    model, prompts: list[list[int]], cfg: DecodeConfig, cache: PrefixCache | None
) -> list[list[int]]:
    """Each prompt's tokens, decoded in one DecodeBatch (joining together) with this prefix cache."""
    batch = DecodeBatch(model, cfg, max_prefill_tokens=16, prefix_cache=cache)
    ids = [batch.add(p, cfg) for p in prompts]
    got: dict[int, list[int]] = {i: [] for i in ids}
    while len(batch):
        for em in batch.step():
            for r, t, f in zip(em.rows, em.tokens, em.finished, strict=True):
                got[r] += t
                if f is not None:
                    batch.remove(r)
    return [got[i] for i in ids]


def block_model(precision: str, tmp_path_factory=None):
    """A random model whose prefill keeps its bits however it is cut (`split_exact`): the int4 precision,
    float32 weights the row kernel holds as 4-bit codes, or a Q4_K_M-like GGUF in its own codes ("file
    codes"); "float32" is a grid model."""
    from tests.test_precision import row_stream_model

    if precision == "float32 4-bit codes":
        return row_stream_model(1, q4=True)
    if precision == "file codes":
        from tests.gguf_utils import write_tiny_llama_gguf

        path = tmp_path_factory.mktemp("blocks") / "q4km.gguf"
        kw = dict(hidden=256, heads=4, kv_heads=2, intermediate=512)
        return yue.load(write_tiny_llama_gguf(path, quant="Q4_K_M", **kw).path).model
    return exact_batch_model(precision)


@pytest.mark.parametrize("mode", ["ar", "verified"])
@pytest.mark.parametrize("precision", ["float32", "int4", "float32 4-bit codes"])
def test_a_prompt_resumed_from_the_cache_reads_the_bits_it_reads_without_it(precision, mode, monkeypatch):
    """Chunks of 16: a prompt sharing 37 tokens with one prefilled before resumes at 32 (the last grid
    boundary, or block, inside the shared part), and every hidden row the head reads, and every token, is
    the same as without the cache; then again (now at 64, its own chunks stored; on blocks at 48, the last
    that leaves MIN_ROWS to feed), beside a prompt that shares only the first chunk (another bucket),
    where the tokens are the same and, in `ar`, the rows."""
    model = block_model(precision)
    assert split_exact(model) == (precision != "float32")
    monkeypatch.setattr(chunks, "PREFILL_CHUNK", 16)
    seen = head_rows(model, monkeypatch)
    g = torch.Generator().manual_seed(3)
    first = torch.randint(4, 96, (40,), generator=g).tolist()
    second = first[:37] + torch.randint(4, 96, (30,), generator=g).tolist()
    third = first[:20] + torch.randint(4, 96, (25,), generator=g).tolist()
    cfg = DecodeConfig(mode=mode, max_new_tokens=10, ignore_eos=True).resolved(model.config)

    def run(
        prompts: list[list[int]], cache: PrefixCache | None
    ) -> tuple[list[list[int]], list[torch.Tensor]]:
        seen.clear()
        tokens = _decode_rows(model, prompts, cfg, cache)
        return tokens, [r for x in seen for r in x]

    cache = PrefixCache(1 << 26)
    run([first], cache)
    assert cache.stats.misses == 1 and len(cache) == 2  # chunks [0, 16) and [16, 32)
    for prompts in ([second], [second, third]):
        got, rows = run(prompts, cache)
        want, reference = run(prompts, None)
        assert got == want
        # (verified rows that join at other steps verify other drafts: their tokens are the invariant)
        assert _same_rows(rows, reference) or (mode == "verified" and len(prompts) > 1)
    assert cache.stats.hit_tokens == 32 + (48 if split_exact(model) else 64) + 16


def _serve(engine, prompts: list[list[int]], cfg: DecodeConfig, batcher: Batcher) -> list[list[int]]:
    """Submit prompts together to a batcher and step it until they finish; returns each one's tokens."""
    out: list[list[int]] = [[] for _ in prompts]
    requests = [
        batcher.submit(p, cfg, lambda e, i=i: out[i].extend(e.token_ids)) for i, p in enumerate(prompts)
    ]
    while not all(r.done for r in requests):
        batcher.step()
    return out


@pytest.mark.parametrize("mode", ["ar", "verified"])
def test_a_conversations_next_turn_resumes_after_its_earlier_turns_with_the_same_answer(
    trained, mode, monkeypatch
):
    """Turn 1 ends; the idle batcher fills the cache with its prompt and answer; turn 2 (turn 1, its
    answer and a new message) and a second conversation sharing turn 1's start, sent together, both
    resume from the cache, past turn 1's prompt, and answer as a batcher without the cache does (the
    verified rows' drafting state, n-gram contexts and first draft, built from their whole prompts)."""
    monkeypatch.setattr(chunks, "PREFILL_CHUNK", 16)
    g = torch.Generator().manual_seed(5)
    vocab = trained.model.config.vocab_size
    turn1 = torch.randint(4, vocab - 4, (50,), generator=g).tolist()
    cfg = DecodeConfig(mode=mode, max_new_tokens=24, ignore_eos=True)
    cache = PrefixCache(1 << 26)
    cached = Batcher(trained, max_batch_size=4, max_batch_tokens=32, prefix_cache=cache, fill_after_s=0)
    (answer,) = _serve(trained, [turn1], cfg, cached)
    assert cached.filling
    while cached.filling:
        assert cached.step().rows == 0
    assert cache.stats.filled_tokens == 64 - 48  # turn 1's prompt stored [0, 48); the fill [48, 64)
    more = torch.randint(4, vocab - 4, (9,), generator=g).tolist()
    turn2 = turn1 + answer + more
    other = turn1[:40] + more
    got = _serve(trained, [turn2, other], cfg, cached)
    want = _serve(trained, [turn2, other], cfg, Batcher(trained, max_batch_size=4, max_batch_tokens=32))
    assert got == want
    assert (cache.stats.hits, cache.stats.misses) == (2, 1)
    assert cache.stats.hit_tokens == grid_ends(len(turn1 + answer), inclusive=True)[-1] + 32


def test_a_fill_waits_until_no_request_has_run_for_the_idle_time_and_none_without_a_cache(
    trained, monkeypatch
):
    monkeypatch.setattr(chunks, "PREFILL_CHUNK", 16)
    cfg = DecodeConfig(mode="ar", max_new_tokens=20, ignore_eos=True)
    cache = PrefixCache(1 << 26)
    batcher = Batcher(trained, max_batch_size=2, prefix_cache=cache, fill_after_s=3600)
    _serve(trained, [[5] * 20], cfg, batcher)
    assert batcher.filling and batcher.fill_wait() > 3000
    batcher.step()
    assert cache.stats.filled_tokens == 0
    batcher.fill_after_s = 0
    assert batcher.fill_wait() == 0
    batcher.step()
    assert cache.stats.filled_tokens == 32 - 16 and not batcher.filling  # [16, 32) of the 40 tokens
    plain = Batcher(trained, max_batch_size=2)
    _serve(trained, [[5] * 20], cfg, plain)
    assert not plain.filling and plain.fill_wait() is None


def test_the_server_answers_a_chats_next_turn_from_the_cache_as_without_it_and_counts_it(
    tiny_engine, monkeypatch
):
    """Two turns of a chat through `/v1/chat/completions`, on a server with the prefix cache (64 MiB) and
    one without (0): the same answers; the cached server's metrics show turn 2's hit (at least turn 1's
    prompt up to its last chunk), in tokens as vLLM counts them."""
    from fastapi.testclient import TestClient

    from tests.test_serve import _wait_ready, metric
    from yue.serve import ServeConfig, create_app

    monkeypatch.setattr(chunks, "PREFILL_CHUNK", 16)
    first = [{"role": "user", "content": "def alpha(x):\n    return beta(x) + gamma(x) * 2\n" * 3}]

    def chat(c, messages: list[dict]) -> dict:
        body = {"messages": messages, "max_tokens": 16, "temperature": 0, "mode": "verified"}
        return c.post("/v1/chat/completions", json=body).json()

    def conversation(mb: int) -> tuple[list[str], str, int]:
        app = create_app(tiny_engine, ServeConfig(prefix_cache_mb=mb))
        with TestClient(app) as c:
            _wait_ready(c)
            one = chat(c, first)
            answer = one["choices"][0]["message"]["content"]
            scheduler = app.state.yue.scheduler
            while scheduler.batcher.filling:  # the idle fill of turn 1's answer, between the turns
                time.sleep(0.01)
            second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "again"}]
            two = chat(c, second)
            answers = [answer, two["choices"][0]["message"]["content"]]
            return answers, c.get("/metrics").text, [one["usage"], two["usage"]]

    (cached, text, (usage1, usage)), (plain, plain_text, _) = conversation(64), conversation(0)
    assert cached == plain
    assert metric(text, "yue_prefix_cache_lookups_total", result="miss") == 1
    assert metric(text, "yue_prefix_cache_lookups_total", result="hit") == 1
    hit = metric(text, "yue_prefix_cache_hits_total")
    assert usage1["prompt_tokens"] - 16 <= hit < usage["prompt_tokens"] and hit % 16 == 0
    assert metric(text, "yue_prefix_cache_queries_total") > usage["prompt_tokens"]  # both turns' prompts
    assert 0 < metric(text, "yue_prefix_cache_usage_bytes") <= 64 * 2**20
    assert "yue_prefix_cache_hits" not in plain_text  # off: no prefix-cache metrics at all


def test_a_negative_bound_is_refused_naming_the_field():
    from yue.serve import ServeConfig

    with pytest.raises(ValueError, match="prefix_cache_mb"):
        ServeConfig(prefix_cache_mb=-1)
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(0)


@pytest.mark.parametrize("mode", ["ar", "verified"])
@pytest.mark.parametrize("precision", ["float32 4-bit codes", "int4"])
def test_a_short_chats_next_turn_resumes_at_a_block_past_its_prompt_and_answer_with_the_same_bits(
    precision, mode, monkeypatch
):
    """The prefill's own chunk sizes (a first grid chunk of 128 would hold this whole chat): turn 1's
    45 tokens store [0, 16) and, from its first decode step, [16, 32); the fill of its prompt + answer
    (57 tokens) adds [32, 48); turn 2 (77 tokens) resumes at 48, and its tokens and every hidden row the
    head reads are those without the cache."""
    model = block_model(precision)
    seen = head_rows(model, monkeypatch)
    g = torch.Generator().manual_seed(7)
    turn1 = torch.randint(4, 96, (45,), generator=g).tolist()
    cfg = DecodeConfig(mode=mode, max_new_tokens=12, ignore_eos=True).resolved(model.config)
    cache = PrefixCache(1 << 26)
    (answer,) = _decode_rows(model, [turn1], cfg, cache)
    assert len(cache) == 2 and turn1[:32] in cache
    fill = PrefixFill(model, cache, turn1 + answer, *fill_plan(len(turn1 + answer), exact=True))
    while not fill.finished:
        fill.step()
    assert cache.stats.filled_tokens == 16 and len(cache) == 3
    turn2 = turn1 + answer + torch.randint(4, 96, (20,), generator=g).tolist()
    seen.clear()
    got = _decode_rows(model, [turn2], cfg, cache)
    rows = [r for x in seen for r in x]
    seen.clear()
    want = _decode_rows(model, [turn2], cfg, None)
    assert got == want and _same_rows(rows, [r for x in seen for r in x])
    assert cache.stats.hit_tokens == 48 and cache.stats.hits == 1


def test_the_server_answers_a_short_chats_next_turn_from_blocks_as_without_the_cache(tiny_gguf):
    """A two-turn chat on a tiny Q4_1 GGUF (its rows on the row kernel's 4-bit codes: blocks), the prompts
    far shorter than a grid chunk: turn 2 finds turn 1's prompt and answer (filled while idle) in the
    cache, and both answers equal a server's without it."""
    from fastapi.testclient import TestClient

    from tests.test_serve import _wait_ready, metric
    from yue.serve import ServeConfig, create_app

    engine = yue.load(
        tiny_gguf.path, dtype="float32"
    )  # float32 on 4-bit codes; the file precision is not measured for blocks yet
    assert split_exact(engine.model)
    first = [
        {"role": "system", "content": "You answer questions about the sea, briefly and kindly. " * 2},
        {"role": "user", "content": "Hello there, who are you?"},
    ]

    def chat(c, messages: list[dict]) -> dict:
        body = {"messages": messages, "max_tokens": 12, "temperature": 0, "mode": "ar"}
        return c.post("/v1/chat/completions", json=body).json()

    def conversation(mb: int):
        app = create_app(engine, ServeConfig(prefix_cache_mb=mb))
        with TestClient(app) as c:
            _wait_ready(c)
            one = chat(c, first)
            answer = one["choices"][0]["message"]["content"]
            while app.state.yue.scheduler.batcher.filling:
                time.sleep(0.01)
            second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "Why?"}]
            two = chat(c, second)
            return [answer, two["choices"][0]["message"]["content"]], c.get("/metrics").text, one["usage"]

    (cached, text, usage), (plain, _, _) = conversation(64), conversation(0)
    assert cached == plain
    hit = metric(text, "yue_prefix_cache_hits_total")
    total = usage["prompt_tokens"] + usage["completion_tokens"]
    assert usage["prompt_tokens"] < 128 and hit % BLOCK == 0
    assert hit >= (total - 1) // BLOCK * BLOCK - BLOCK  # turn 1's prompt and answer, up to a block
    assert metric(text, "yue_prefix_cache_lookups_total", result="hit") == 1
    assert metric(text, "yue_prefix_cache_usage_bytes") > 0
    assert metric(text, "yue_prefill_tokens_total") > 0 and metric(text, "yue_decode_seconds_total") > 0
