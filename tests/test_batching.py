"""Continuous batching: rows join and leave a running batch, each accepting its own drafts, and every
request's output is what it would have been alone."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import yue
from tests.stubs import MarkovStub
from yue.batcher import Batcher
from yue.config import DecodeConfig
from yue.decode import chunks
from yue.decode.costs import StepCosts
from yue.decode.loop import DecodeBatch, decode
from yue.kernels import probe
from yue.model.cache import KVCache

PROMPTS = ["def alpha_1(x):\n", "x", "class Point:\n    def ", "    return gamma(x) + 4\n\ndef ", "def beta"]


@pytest.fixture(scope="module")
def trained(trained_model_dir):
    return yue.load(trained_model_dir)


def _alone(engine, prompt: str, **kw) -> list[int]:
    return engine.generate(prompt, **kw).token_ids


def _staggered(engine, prompts: list[str], configs: list[DecodeConfig], every: int = 2, size: int = 8):
    """Run prompts through a Batcher, one joining every `every` steps; returns each one's token ids."""
    batcher = Batcher(engine, max_batch_size=size)
    out: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    done: set[int] = set()

    def sink(i):
        def take(event):
            out[i].extend(event.token_ids)
            if event.finish_reason is not None:
                done.add(i)

        return take

    step = peak = 0
    while len(done) < len(prompts):
        if step % every == 0 and step // every < len(prompts):
            i = step // every
            batcher.submit(prompts[i], configs[i], sink(i))
        peak = max(peak, batcher.step().rows)
        step += 1
    assert peak > 1 or len(prompts) == 1 or size == 1  # the rows really shared steps
    return [out[i] for i in range(len(prompts))]


@pytest.mark.parametrize(
    "kw",
    [
        dict(mode="ar"),
        dict(mode="verified", router_threshold=1.0),
        dict(mode="verified", router_threshold=1.0, drafting="fused"),
        dict(mode="verified"),  # the router picks draft lengths for the whole batch
    ],
)
def test_outputs_under_concurrency_equal_single_request_outputs_greedy(trained, kw):
    cfg = DecodeConfig(max_new_tokens=30, **kw)
    together = _staggered(trained, PROMPTS, [cfg] * len(PROMPTS))
    ar = [_alone(trained, p, mode="ar", max_new_tokens=30) for p in PROMPTS]
    assert together == ar


def test_seeded_sampling_under_concurrency_equals_the_request_alone(trained):
    """Each row samples from its own generator: batch-mates, and when they join, change nothing."""
    cfgs = [DecodeConfig(mode="ar", max_new_tokens=25, temperature=1.0, top_p=0.9, seed=s) for s in range(5)]
    together = _staggered(trained, PROMPTS, cfgs, every=3)
    alone = [_alone(trained, p, config=c) for p, c in zip(PROMPTS, cfgs, strict=True)]
    assert together == alone
    assert len({tuple(t) for t in together}) > 1


def test_a_row_joining_mid_stream_does_not_change_the_others(trained):
    cfg = DecodeConfig(mode="verified", max_new_tokens=40, router_threshold=1.0)
    first = _staggered(trained, PROMPTS[:1], [cfg])[0]
    with_joiners = _staggered(trained, PROMPTS, [cfg] * len(PROMPTS), every=1)
    assert with_joiners[0] == first


def _two_cycles(K: int = 4) -> MarkovStub:
    """Tokens 0..4 cycle t -> t+1 with slots that always match; tokens 5..9 cycle likewise with slots
    that never match. A row's acceptance then depends only on which cycle its prompt starts in."""
    V = 11  # 10 is the mask id
    ar = torch.full((V, V), -10.0)
    slots = torch.full((K, V, V), -10.0)
    for t in range(10):
        base, off = (0, t) if t < 5 else (5, t - 5)
        ar[t, base + (off + 1) % 5] = 10.0
        for i in range(K):
            right = base + (off + i + 1) % 5
            slots[i, t, right if t < 5 else base + (off + i + 2) % 5] = 10.0
    return MarkovStub(ar, slots)


def test_each_row_accepts_its_own_drafts_and_stays_exact():
    """Lockstep would hold the always-matching row to the never-matching row's 0 drafts a step."""
    N, K = 40, 4
    # NAR drafts only (the cycles repeat, so copied drafts would match in both rows), drafted whatever
    # the batch's acceptance record says (free drafting: every block drafted whole).
    cfg = DecodeConfig(
        mode="verified", max_new_tokens=N, router_threshold=1.0, block_size=K, prompt_lookup=False
    )
    ar = DecodeConfig(mode="ar", max_new_tokens=N)
    accepted, tokens = [0, 0], [[], []]
    for em in decode(_two_cycles(K), [[1], [6]], cfg, costs=StepCosts((1.0,) * 16, (0.0,))):
        for b in range(2):
            accepted[b] += em.accepted[b]
            tokens[b] += em.tokens[b]
    for b, prompt in enumerate([[1], [6]]):
        assert tokens[b] == [t for em in decode(_two_cycles(K), [prompt], ar) for t in em.tokens[0]]
    assert accepted[0] >= N * (K - 1) // K - K  # the matching row accepted nearly every draft
    assert accepted[1] == 0


def test_engine_generate_of_a_list_accepts_at_least_the_lockstep_minimum(trained, monkeypatch):
    # Every block drafted whole (free drafting), NAR drafts only: the acceptance is the drafts', not
    # the acceptance record's or the context's (a batch's record and copies are shared by its rows).
    monkeypatch.setattr(trained, "costs", StepCosts((1.0,) * 16, (0.0,)))
    kw = dict(mode="verified", max_new_tokens=40, router_threshold=1.0, prompt_lookup=False)
    batch = trained.generate(PROMPTS, **kw)
    alone = [trained.generate(p, **kw) for p in PROMPTS]
    assert [r.token_ids for r in batch] == [_alone(trained, p, mode="ar", max_new_tokens=40) for p in PROMPTS]
    # Per-row acceptance: each row accepts what it would alone, give or take the shared draft length.
    assert sum(r.stats.accepted for r in batch) >= 0.8 * sum(r.stats.accepted for r in alone)
    assert max(r.stats.accepted for r in batch) > min(r.stats.accepted for r in batch)


def test_cancel_frees_its_row_within_one_step(trained):
    batcher = Batcher(trained, max_batch_size=4)
    events: dict[str, list] = {"a": [], "b": []}
    cfg = DecodeConfig(mode="verified", max_new_tokens=60, router_threshold=1.0, ignore_eos=True)
    a = batcher.submit(PROMPTS[0], cfg, events["a"].append)
    batcher.submit(PROMPTS[1], cfg, events["b"].append)
    for _ in range(3):
        batcher.step()
    (batch,) = batcher.batches.values()
    assert len(batch) == 2 and batch.running.cache.batch_size == 2
    batcher.cancel(a)
    assert events["a"][-1].finish_reason == "cancelled"
    assert len(batch) == 1 and batch.running.cache.batch_size == 1  # its cache row is gone already
    report = batcher.step()
    assert report.rows == 1
    assert batcher.running == 1


def test_rows_over_max_batch_size_wait_and_join_as_others_leave(trained):
    cfgs = [DecodeConfig(mode="ar", max_new_tokens=8 + 4 * i, ignore_eos=True) for i in range(5)]
    together = _staggered(trained, PROMPTS, cfgs, every=1, size=2)
    assert together == [_alone(trained, p, config=c) for p, c in zip(PROMPTS, cfgs, strict=True)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_hybrid_rows_of_different_shapes_merge_and_respect_their_budgets(trained, temperature):
    """Hybrid groups commit different numbers of unverified slots, so a joining group's fed block can
    be narrower than the running one's; it is padded with filler drafts, which verification handles."""
    cfgs = [
        DecodeConfig(
            mode="hybrid", max_new_tokens=20 + i, router_threshold=0.9, temperature=temperature, seed=i
        )
        for i in range(5)
    ]
    together = _staggered(trained, PROMPTS, cfgs, every=1)
    for toks, c in zip(together, cfgs, strict=True):
        assert len(toks) <= c.max_new_tokens  # (a sampled row may draw EOS first)
    assert any(together)


def test_a_decode_batch_refuses_a_row_of_another_shape(trained):
    batch = DecodeBatch(trained.model, DecodeConfig(mode="ar").resolved(trained.model.config))
    with pytest.raises(ValueError, match="share"):
        batch.add([1, 2], DecodeConfig(mode="verified").resolved(trained.model.config))


def test_compaction_gathers_each_rows_valid_columns_in_order():
    cache = KVCache(1, 2, 1, 1, 8, "cpu", torch.float32)
    cache.k[0, :, 0, :6, 0] = torch.arange(6.0)
    cache.length = 6
    cache.key_valid = torch.ones(2, 8, dtype=torch.bool)
    cache.key_valid[0, [1, 4]] = False  # row 0 keeps columns 0 2 3 5
    cache.key_valid[1, :3] = False  # row 1 keeps 3 4 5
    cache.compact()
    assert cache.length == 4
    assert cache.k[0, 0, 0, :4, 0].tolist() == [0, 2, 3, 5]
    assert cache.k[0, 1, 0, :3, 0].tolist() == [3, 4, 5]
    assert cache.key_valid[:, :4].tolist() == [[True] * 4, [True, True, True, False]]
    assert cache.key_valid[:, 4:].all()  # past the pointer: written by later steps


def test_rows_leave_and_join_in_place_keeping_each_rows_keys_and_values():
    """Leaves close up in place and joins fill spare rows (the buffers are allocated only when a join
    needs more rows, then with spares); every row keeps its committed columns, and a reordering (beam
    search's) still gathers."""

    def cache_of(rows: list[float], length: int) -> KVCache:
        c = KVCache(2, len(rows), 1, 1, 8, "cpu", torch.float32)
        for b, value in enumerate(rows):
            c.k[:, b, 0, :length, 0], c.v[:, b, 0, :length, 0] = value, -value
        c.advance(length)
        return c

    def rows_of(c: KVCache) -> list[list[float]]:
        return [c.k[1, b, 0, : c.length, 0].tolist() for b in range(c.batch_size)]

    cache = cache_of([1.0, 2.0], 3)
    cache.join(cache_of([3.0], 2))  # 3 rows: new buffers, with a spare row
    buffer = cache.k.untyped_storage().data_ptr()
    assert cache.length == 3 and rows_of(cache) == [[1, 1, 1], [2, 2, 2], [3, 3, 0]]
    assert cache.key_valid[:, :3].tolist() == [[True] * 3, [True] * 3, [True, True, False]]
    cache.join(cache_of([4.0], 3))  # into the spare row: no new buffer
    assert cache.k.untyped_storage().data_ptr() == buffer and cache.batch_size == 4
    cache.select([1, 3])  # rows 0 and 2 leave: 1 and 3 close up, in place
    assert cache.k.untyped_storage().data_ptr() == buffer
    assert rows_of(cache) == [[2, 2, 2], [4, 4, 4]] and cache.v[1, 1, 0, :3, 0].tolist() == [-4] * 3
    assert cache.seq_lens.tolist() == [3, 3] and cache.key_valid is None
    cache.select([1, 0, 0])  # a reordering: a gathered copy
    assert rows_of(cache) == [[4, 4, 4], [2, 2, 2], [2, 2, 2]]


def test_a_sampled_group_without_drafts_merges_with_one_drafting():
    """A group whose acceptance record stopped drafting carries no draft log-probs; merged with a
    group that drafts, its rows get unused (zero) entries, aligned to the tail like every row's."""
    from yue.decode.rows import Group, Row, merge
    from yue.decode.state import LoopState

    V, cfg = 7, DecodeConfig(mode="verified", temperature=1.0, block_size=4)

    def group(n_drafts: int) -> Group:
        st = LoopState(cfg, [torch.Generator()], torch.tensor([[1] + [2] * n_drafts]))
        st.n_drafts = [n_drafts]
        st.draft_logprobs = torch.randn(1, n_drafts, V).log_softmax(-1) if n_drafts else None
        cache = KVCache(1, 1, 1, 1, 16, "cpu", torch.float32)
        cache.commit([3])
        return Group([Row(n_drafts, [1, 2, 3], cfg, None, 8, frozenset())], cache, st)

    drafting, idle = group(2), group(0)
    merged = merge(drafting, idle, V)
    # One width for both: the drafting row's trailing drafts are dropped (proposals only), and the
    # log-probs stay row-aligned (the idle group's entries made up), not an error.
    assert merged.st.n_drafts == [0, 0] and merged.st.fed.shape == (2, 1)
    assert merged.st.draft_logprobs is not None and merged.st.draft_logprobs.shape == (2, 0, V)


def test_requests_of_different_shapes_run_in_batches_taken_in_turn(trained):
    """A verified and an ar request cannot share a forward (different batch keys): each gets its own
    batch, the batcher steps them in turn, and both answers are what they are alone."""
    cfgs = [DecodeConfig(mode="ar", max_new_tokens=20), DecodeConfig(mode="verified", max_new_tokens=20)]
    cfgs = cfgs * 2
    together = _staggered(trained, PROMPTS[:4], cfgs, every=1)
    assert together == [_alone(trained, p, config=c) for p, c in zip(PROMPTS[:4], cfgs, strict=True)]


def test_the_prefill_budget_spreads_a_burst_of_joiners_over_steps(trained):
    cfg = DecodeConfig(mode="ar", max_new_tokens=10).resolved(trained.model.config)
    prompts = [trained.encode(p) for p in PROMPTS[:3]]
    batch = DecodeBatch(trained.model, cfg, max_prefill_tokens=1)  # one prompt a step, at least
    for p in prompts:
        batch.add(p, cfg)
    batch.step()
    assert len(batch.queued) == 2 and len(batch.running.rows) == 1
    batch.step()
    assert len(batch.queued) == 1 and len(batch.running.rows) == 2


def exact_batch_model(precision: str):
    """A random model of a precision whose batches are exact on the CPU (float32 or int4, row kernel)."""
    from tests.test_int4 import int4_model
    from tests.test_precision import row_stream_model

    if precision == "float32":
        return row_stream_model(1)
    if not probe.choice().ok("rows-int4"):
        pytest.skip(f"the row kernel's int4 does not run here: {probe.describe()}")
    return int4_model(seed=1)


def head_rows(model, monkeypatch) -> list[torch.Tensor]:
    """The hidden rows the screened AR head reads for its greedy choice, (rows, D) per call, appended
    as decoding runs."""
    seen: list[torch.Tensor] = []
    top1 = model.paths.ar_head.top1_entropy
    monkeypatch.setattr(
        model.paths.ar_head,
        "top1_entropy",
        lambda x, entropy: seen.append(x.reshape(-1, x.shape[-1])) or top1(x, entropy),
    )
    return seen


@pytest.mark.parametrize("lengths", [(5, 9, 14), (5, 9, 14, 5, 6, 7, 8, 9, 10, 11, 12)])
@pytest.mark.parametrize("precision", ["float32", "int4"])
def test_a_batch_rows_hidden_states_are_their_solo_bits(precision, lengths, monkeypatch):
    """Prompts of several lengths decoded together: every hidden row the head reads alone is, bit for
    bit, one it reads in the batch (each prompt prefilled without padding, `DecodeBatch._buckets`; decode
    steps attending past the batch's holes as alone, `rows_attention`; a step of more rows than one
    row-kernel pass takes, 11 here, in one `rowkernel.stack` call whose matmuls take them in passes,
    4-bit codes rebuilt once for all of them, `rows_matmul_q4`). Tokens
    alone would not show it: float32's differences were ~1e-5, which the int4 precision's rounded
    activations grew into other tokens on SmolLM2. (bfloat16's batches are not exact: docs/serve.md.)"""
    model = exact_batch_model(precision)
    seen = head_rows(model, monkeypatch)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 96, (n,), generator=g).tolist() for n in lengths]
    cfg = DecodeConfig(mode="ar", max_new_tokens=12, ignore_eos=True).resolved(model.config)

    def hidden(rows: list[list[int]]) -> list[torch.Tensor]:
        seen.clear()
        for _ in decode(model, rows, cfg):
            pass
        return [r for x in seen for r in x]

    together = hidden(prompts)
    for p in prompts:
        for row in hidden([p]):
            assert any(torch.equal(row, other) for other in together)


def _long_prompts(engine, lengths: list[int], seed: int = 0) -> list[list[int]]:
    """Token-id prompts of these lengths (random text of the tiny model's vocabulary, no specials)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, engine.model.config.vocab_size - 4, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("mode", ["ar", "verified"])
def test_long_prompts_are_prefilled_a_chunk_a_step_while_running_rows_keep_writing(
    trained, mode, monkeypatch
):
    """Chunks of 16 tokens, a budget of 16 a step: a 64-token prompt joins after 4 steps, during which
    the running row writes a token every step; every answer is what its prompt gets alone."""
    monkeypatch.setattr(chunks, "PREFILL_CHUNK", 16)
    cfg = DecodeConfig(mode=mode, max_new_tokens=12, ignore_eos=True).resolved(trained.model.config)
    short, long_, odd = _long_prompts(trained, [5, 64, 37])
    batch = DecodeBatch(trained.model, cfg, max_prefill_tokens=16)
    rows = {batch.add(short, cfg): short}
    (first,) = batch.step()  # the short prompt's prefill is its first step
    rows[batch.add(long_, cfg)] = long_
    rows[batch.add(odd, cfg)] = odd
    got: dict[int, list[int]] = {r: [] for r in rows}
    got[0] += first.tokens[0]
    writers_per_step = []
    while len(batch):
        ems = batch.step()
        writers = set()
        for em in ems:
            for r, t, f in zip(em.rows, em.tokens, em.finished, strict=True):
                got[r] += t
                writers.add(r) if t else None
                if f is not None:
                    batch.remove(r)
        writers_per_step.append(writers)
    long_id = 1
    joined = next(i for i, w in enumerate(writers_per_step) if long_id in w)
    assert joined == 3  # chunks 1-3 fed in steps 0-2, the 4th is its first step (step 3)
    assert all(0 in w for w in writers_per_step[:joined])  # the running row wrote every step meanwhile
    for r, p in rows.items():
        alone = [t for em in decode(trained.model, [p], cfg) for t in em.tokens[0]]
        assert got[r] == alone, r


def test_a_request_cancelled_mid_prefill_leaves_at_the_next_chunk(trained, monkeypatch):
    monkeypatch.setattr(chunks, "PREFILL_CHUNK", 16)
    cfg = DecodeConfig(mode="ar", max_new_tokens=8, ignore_eos=True).resolved(trained.model.config)
    a, b = _long_prompts(trained, [48, 48], seed=1)
    batch = DecodeBatch(trained.model, cfg, max_prefill_tokens=32)
    ida, idb = batch.add(a, cfg), batch.add(b, cfg)
    batch.step()  # one 16-token chunk of the bucket of both (32 tokens)
    assert len(batch.prefilling) == 1 and batch.prefilling[0].done == 16 and len(batch) == 2
    batch.remove(ida)
    assert len(batch) == 1 and batch.prefilling[0].prompt.shape[0] == 1
    got = []
    while len(batch):
        for em in batch.step():
            got += em.tokens[0]
            if em.finished[0]:
                batch.remove(idb)
    assert got == [t for em in decode(trained.model, [b], cfg) for t in em.tokens[0]]


@pytest.mark.parametrize("precision", ["float32", "int4"])
def test_chunked_prefill_rows_are_the_same_bits_alone_or_in_a_batch(precision, monkeypatch):
    """Chunks are fixed by the prompt's length: a prompt fed in 3 chunks beside other prompts (and under
    another budget) reads, bit for bit, the hidden rows it reads alone."""
    model = exact_batch_model(precision)
    monkeypatch.setattr(chunks, "PREFILL_CHUNK", 16)
    seen = head_rows(model, monkeypatch)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 96, (n,), generator=g).tolist() for n in (40, 40, 23, 9)]
    cfg = DecodeConfig(mode="ar", max_new_tokens=6, ignore_eos=True).resolved(model.config)

    def hidden(rows: list[list[int]], budget: int | None) -> list[torch.Tensor]:
        seen.clear()
        batch = DecodeBatch(model, cfg, max_prefill_tokens=budget)
        ids = [batch.add(p, cfg) for p in rows]
        while len(batch):
            for em in batch.step():
                batch.remove(*[r for r, f in zip(em.rows, em.finished, strict=True) if f is not None])
        assert len(ids) == len(rows)
        return [r for x in seen for r in x]

    together = hidden(prompts, 16)
    for p in prompts:
        for row in hidden([p], None):
            assert any(torch.equal(row, other) for other in together)


@pytest.mark.parametrize(
    "cfg",
    [
        DecodeConfig(mode="verified", max_new_tokens=24),
        DecodeConfig(mode="ar", max_new_tokens=24, temperature=0.9, seed=7),
        DecodeConfig(mode="verified", max_new_tokens=24, temperature=0.9),  # continues, not re-made
    ],
    ids=["greedy-verified", "seeded-ar", "sampled-verified"],
)
def test_a_failing_row_fails_its_request_alone_and_the_others_finish_as_alone(trained, cfg, monkeypatch):
    """A step that raises mid-batch (one row poisoned from the batch's 3rd step on) fails that row's request
    only; the other rows are retried alone and their answers are complete and, where exact, equal to
    alone. The poisoned row ignores EOS, so it is still running then whatever the tiny model writes (its
    bits, and so its tokens, differ by CPU: on an AVX2 build it ended at its 3rd token)."""
    real_step, calls, poison = DecodeBatch.step, {"n": 0}, []

    def step(self):
        calls["n"] += 1
        rows = [*(self.running.rows if self.running else []), *self.queued]
        rows += [r for p in self.prefilling for r in p.rows]
        if calls["n"] > 2 and any(r.prompt[: len(poison)] == poison for r in rows):
            raise RuntimeError("injected failure")
        return real_step(self)

    monkeypatch.setattr(DecodeBatch, "step", step)
    prompts = ["# poisoned\n" + PROMPTS[0], *PROMPTS[1:]]
    batcher = Batcher(trained, max_batch_size=8)
    out = {i: [] for i in range(len(prompts))}
    finish, errors = {}, {}
    for i, p in enumerate(prompts):

        def sink(event, i=i):
            out[i].extend(event.token_ids)
            if event.finish_reason is not None:
                finish[i] = event.finish_reason

        row_cfg = replace(cfg, ignore_eos=True) if i == 0 else cfg
        request = batcher.submit(p, row_cfg, sink, on_error=lambda e, i=i: errors.__setitem__(i, e))
        poison[:] = poison or request.ids
    for _ in range(500):
        if len(finish) + len(errors) == len(prompts):
            break
        batcher.step()
    assert list(errors) == [0] and isinstance(errors[0], RuntimeError)
    assert set(finish) == set(range(1, len(prompts))) and not batcher.rows and not batcher.batches
    monkeypatch.setattr(DecodeBatch, "step", real_step)
    for i in range(1, len(prompts)):
        assert finish[i] in ("length", "eos", "stop")
        if cfg.greedy or cfg.mode == "ar":
            assert out[i] == _alone(trained, prompts[i], config=cfg), i
        else:  # sampled verified continues from the tokens it had: complete, in budget
            assert 0 < len(out[i]) <= cfg.max_new_tokens


def test_a_step_raising_in_a_lone_batch_fails_only_that_batch(trained, monkeypatch):
    """Batches of other keys (here a sampled one beside greedy ones) keep running when one fails."""
    real_step = DecodeBatch.step

    def step(self):
        if not self.key.greedy:
            raise RuntimeError("injected failure")
        return real_step(self)

    monkeypatch.setattr(DecodeBatch, "step", step)
    batcher = Batcher(trained, max_batch_size=8)
    got, errors = {}, []
    greedy = DecodeConfig(mode="ar", max_new_tokens=12)
    batcher.submit(
        PROMPTS[1],
        DecodeConfig(mode="ar", max_new_tokens=12, temperature=1.0),
        lambda e: None,
        on_error=errors.append,
    )
    for i in (0, 2):
        batcher.submit(PROMPTS[i], greedy, lambda e, i=i: got.setdefault(i, []).extend(e.token_ids))
    for _ in range(100):
        batcher.step()
        if not batcher.rows and not batcher.waiting:
            break
    assert len(errors) == 1
    monkeypatch.setattr(DecodeBatch, "step", real_step)
    assert got == {i: _alone(trained, PROMPTS[i], config=greedy) for i in (0, 2)}
