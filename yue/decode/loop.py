"""The one decode loop: propose -> forward -> accept -> advance, for every policy, over a batch whose
rows may join and leave between steps (continuous batching).

Design decisions:
- Token level only: a step reports the tokens each row committed and who wrote them. Text
  (detokenizing, stop strings) is the engine's business; it removes a row, or stops iterating.
- `DecodeBatch` is the loop as a small stateful object: `add` queues a prompt (a row), `step` runs one
  step of every running row, then prefills the queued rows and merges them in; `remove` drops a row
  (its cache row is gathered away at once, so it stops costing compute). `decode()` is the thin
  generator over it that the engine, the trainers and the tests use for a fixed list of prompts.
- One forward per step over `fed` (+ a fused block of mask slots), and, with separate drafting (the
  default), a second, NAR-only forward over a block anchored at each row's last kept token. After the
  forward, `cache.commit(keep)` commits each row's kept positions (per-row acceptance: rows keep
  different counts; the shorter leave holes the mask hides, see `model/cache.py`), and everything past
  them (rejected drafts, slots) is scratch that the next write overwrites: rollback is a pointer move.
- Per-step work outside the forward is kept small: positions are the rows' lengths plus an arange, the
  mask is built from two aranges (or skipped for a single row without holes: batch 1 runs as before),
  and tracing is opt-in.
- Rows of one batch share what shapes a step (their `batch_key`: mode, K, drafting, threshold, and the
  sampling warp); each keeps its own seed (a `torch.Generator` per row, so its samples do not depend on
  its batch-mates), budget, EOS rule and, in the engine, stop strings.
- Joining: queued rows are prefilled in buckets of one prompt length (no padding), in chunks
  (`chunk_end`), at most `max_prefill_tokens` of prefill work a step (at least one chunk), between the
  running rows' steps; a bucket's last chunk is its first decode step, after which its rows
  are appended to the running batch: their cache rows left-aligned, the columns up to the shared
  pointer holes (`KVCache.join`). So a long prompt stalls the running rows a chunk at a time, not for
  its whole prefill, and a request cancelled mid-prefill leaves at the next chunk. A chunk's attention
  costs its length times the keys before it, so chunks shrink along the prompt: each holds about the
  same work, and a long prompt stalls the running rows no longer at its end than at its start.
  The chunks are fixed by the prompt's positions (and, on a `prefix.split_exact` model, its length:
  no forward past position 0 of fewer than `prefix.MIN_ROWS` rows), never by what else is queued or by
  the budget, so a prompt's bits are the same however it is scheduled, alone or in a server's batch.
- With a prefix cache (`decode/prefix.py`), each chunk fed is stored (as 16-token blocks on a
  `split_exact` model, whose prompt tails are stored after their first step too), and a queued row
  whose prompt starts with stored ones starts its prefill after them (bucketed with rows of the same
  prompt length and cached length), in the state a prefill without the cache reaches: the same bits.
  Its policy state (`_group`: n-gram contexts, seen tokens) is built from its whole prompt, as without
  the cache.
- `phases` (`PhaseTimes`) records each step's prefill and decode time and tokens apart, for the
  server's metrics and `yue bench-serve`; with a profile being taken (`decode/profile.py`, `yue
  profile`), `_step` books each of its phases by name.
- The prefill's chunk rules are `decode/chunks.py`'s; what a step emits, `decode/emission.py`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import torch

from yue.config import DecodeConfig
from yue.decode import profile
from yue.decode.chunks import Prefill, chunk_end, lookup_ends
from yue.decode.corpus import CorpusNgrams
from yue.decode.costs import StepCosts
from yue.decode.emission import StepEmission, logprobs, truncate
from yue.decode.lookup import NgramIndex
from yue.decode.modes import get_policy
from yue.decode.policies import rows_at
from yue.decode.prefix import BLOCK, PrefixCache, PrefixHit, feed_chunk, split_exact, store, write_hit
from yue.decode.rows import Group, Row, merge, select, without_finished
from yue.decode.sources import DraftSources, draft_rates, free_sources
from yue.decode.state import Advance, LoopState
from yue.decode.types import Step
from yue.model.cache import KVCache
from yue.model.masks import decode_mask
from yue.model.mot import YueForCausalLM
from yue.model.prepared import PreparedModel, as_decoded
from yue.model.router import entropy


@dataclass
class PhaseTimes:
    """What a `DecodeBatch.step` spent on each phase: prefill (chunks fed, and each bucket's first step,
    which feeds its prompts' last chunk and writes their first tokens) and decode (the running rows'
    step). Tokens: prompt tokens fed, and tokens the running rows wrote. Seconds: wall time on the
    stepping thread."""

    prefill_s: float = 0.0
    prefill_tokens: int = 0
    decode_s: float = 0.0
    decode_tokens: int = 0


def slot_capacity(cfg: DecodeConfig) -> int:
    """Cache positions a request may need beyond prompt + max_new_tokens (drafts and slots)."""
    k = cfg.block_size or 1
    return (k + 1) * (k + 1) + 1 if cfg.drafting == "fused" else 2 * k + 2


def batch_key(cfg: DecodeConfig) -> DecodeConfig:
    """What rows of one batch must share: the config without the per-row fields (seed, budget, stop
    strings, EOS rule, log-probs). Requests whose keys differ decode in different batches."""
    return replace(cfg, seed=None, max_new_tokens=1, stop=(), ignore_eos=False, logprobs=None)


class DecodeBatch:
    """A running batch that rows join and leave between steps.

    Args:
        model: the model as it decodes (a `PreparedModel`; a trained YueForCausalLM decodes as trained,
            `as_decoded`), in eval mode.
        cfg: a config already `resolved()`; its `batch_key` is what every row must share.
        costs: step costs for the router's draft lengths (`decode.costs.measured_costs`); None = defaults.
        max_prefill_tokens: prefill work per step, in prompt tokens at a prompt's start (`chunk_work`:
            later tokens weigh more), at least one chunk; None = every queued prompt, whole, at the
            next step.
        corpus: the model's n-gram table of its own answers, for `verified`'s and `hybrid`'s corpus
            drafts (`decode/corpus.py`); None = none.
        prefix_cache: chunks of earlier prompts to resume prefills after, and to store this batch's
            chunks in (`decode/prefix.py`); None = none.
    """

    def __init__(
        self,
        model: PreparedModel | YueForCausalLM,
        cfg: DecodeConfig,
        costs: StepCosts | None = None,
        max_prefill_tokens: int | None = None,
        corpus: CorpusNgrams | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        model = as_decoded(model)
        self.model, self.key, self.costs = model, batch_key(cfg), costs
        self.prefix_cache = prefix_cache
        # Whether any cut of a prefill keeps its bits (`prefix.split_exact`): it then resumes at blocks.
        self.exact = split_exact(model)
        self.corpus = corpus if self.key.corpus_drafts else None
        self.policy = get_policy(cfg.mode)
        self.argmax_only = self.policy.argmax_only(self.key, model.config)
        self.asks_router = self.policy.asks_router(self.key, model.config)
        self.max_prefill_tokens = max_prefill_tokens
        self.running: Group | None = None
        self.queued: list[Row] = []
        self.prefilling: list[Prefill] = []  # buckets part-way through their prompts, oldest first
        self._ids = 0
        self.phases = PhaseTimes()  # the last `step`'s
        self._offsets = torch.arange(64, device=model.device)  # `_arange`'s table
        eos = model.config.eos_token_id
        self._eos = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])

    def __len__(self) -> int:
        """Rows running, being prefilled or queued."""
        prefilling = sum(len(p.rows) for p in self.prefilling)
        return len(self.queued) + prefilling + (len(self.running.rows) if self.running else 0)

    def add(self, prompt: list[int], cfg: DecodeConfig) -> int:
        """Queue a non-empty tokenized prompt; it is prefilled at the next `step`. Returns its row id."""
        if batch_key(cfg) != self.key:
            raise ValueError("a row's config must share the batch's mode, K, drafting, threshold and warp")
        generator = None
        if not cfg.greedy:
            generator = torch.Generator(device=self.model.device)
            generator.manual_seed(cfg.seed if cfg.seed is not None else int(torch.randint(2**62, ()).item()))
        eos_ids = frozenset() if cfg.ignore_eos else self._eos
        row = Row(self._ids, list(prompt), cfg, generator, cfg.max_new_tokens, eos_ids)
        self._ids += 1
        self.queued.append(row)
        return row.id

    def remove(self, *row_ids: int) -> None:
        """Drop rows (finished elsewhere, or cancelled): from the queue, or from the running batch (one
        gather of its cache for all of them)."""
        gone = set(row_ids)
        self.queued = [r for r in self.queued if r.id not in gone]
        for p in self.prefilling:
            if any(r.id in gone for r in p.rows):
                keep = [i for i, r in enumerate(p.rows) if r.id not in gone]
                if keep:
                    p.cache.select(keep)
                p.rows, p.prompt = [p.rows[i] for i in keep], p.prompt[keep]
        self.prefilling = [p for p in self.prefilling if p.rows]
        g = self.running
        if g is not None and any(r.id in gone for r in g.rows):
            self.running = select(g, [i for i, r in enumerate(g.rows) if r.id not in gone])

    @torch.inference_mode()
    def step(self) -> list[StepEmission]:
        """One step of every running row, then prefill chunks within the budget: the buckets part-way
        through first, then queued rows (first come first served); a bucket's last chunk is its first
        step, and its rows join the running batch. Finished rows leave. Returns one emission per forward
        group that wrote tokens (the running rows, then each bucket that finished its prompt)."""
        emissions, phases, t0 = [], PhaseTimes(), time.perf_counter()
        self.phases = phases
        if self.running is not None:
            emissions.append(self._step(self.running))
            phases.decode_tokens = sum(len(t) for t in emissions[0].tokens)
            self.running = without_finished(self.running)
        t1 = time.perf_counter()
        phases.decode_s = t1 - t0
        try:
            self._prefill(emissions)
        finally:
            phases.prefill_s = time.perf_counter() - t1
        return emissions

    def _prefill(self, emissions: list[StepEmission]) -> None:
        """`step`'s prefill phase: chunks within the budget; a bucket's last chunk is its first step."""
        fed, budget = 0, self.max_prefill_tokens
        while True:
            if not self.prefilling:
                self.prefilling = [self._start(*b) for b in self._buckets(self._admit(fed))]
                if not self.prefilling:
                    break
            p = self.prefilling[0]
            n = p.next_work()
            if fed and budget is not None and fed + n > budget:
                break
            fed += n
            self.phases.prefill_tokens += len(p.rows) * (p.next_end() - p.done)
            if p.next_end() < p.prompt.shape[1]:
                self._feed(p)
                continue
            self.prefilling.pop(0)
            group = self._group(p)
            emissions.append(self._step(group))
            self._store_tail(p)
            group = without_finished(group)
            if group is not None:
                vocab = self.model.config.vocab_size
                self.running = group if self.running is None else merge(self.running, group, vocab)

    def _arange(self, n: int) -> torch.Tensor:
        """torch.arange(n) on the model's device, as a view of a table grown on demand (no per-step op)."""
        if self._offsets.numel() < n:
            self._offsets = torch.arange(max(n, 2 * self._offsets.numel()), device=self.model.device)
        return self._offsets[:n]

    def _admit(self, fed: int) -> list[Row]:
        """Queued rows to start prefilling this step, first come first served, while their first chunks
        fit the budget beside the `fed` tokens already fed this step (at least one chunk a step)."""
        taken, tokens = [], fed
        while self.queued:
            n = chunk_end(0, len(self.queued[0].prompt), self.exact)
            if tokens and self.max_prefill_tokens is not None and tokens + n > self.max_prefill_tokens:
                break
            taken.append(self.queued.pop(0))
            tokens += n
        return taken

    def _buckets(self, rows: list[Row]) -> list[tuple[list[Row], list[PrefixHit]]]:
        """Rows grouped by prompt length and cached prefix length (`prefix_cache`), with their cache hits:
        no left padding, so each row's prefill is the forward it would be alone, bit for bit (a padded
        row's attention in torch's prefill SDPA got other bits, ~1e-5 in SmolLM2's float32 hidden states,
        which the int4 precision's rounded activations grew into other tokens). On a CPU this costs
        nothing: the row kernel takes a prefill's rows 9 at a time however they are batched, and padding
        was compute."""
        cache = self.prefix_cache
        hits = [
            cache.lookup(r.prompt, lookup_ends(len(r.prompt), self.exact))
            if cache is not None
            else PrefixHit()
            for r in rows
        ]
        buckets: list[tuple[list[Row], list[PrefixHit]]] = []
        shape = lambda i: (len(rows[i].prompt), hits[i].length)  # noqa: E731
        for i in sorted(range(len(rows)), key=shape):
            if buckets and shape(i) == (len(buckets[-1][0][0].prompt), buckets[-1][1][0].length):
                buckets[-1][0].append(rows[i])
                buckets[-1][1].append(hits[i])
            else:
                buckets.append(([rows[i]], [hits[i]]))
        return buckets

    def _start(self, rows: list[Row], hits: list[PrefixHit]) -> Prefill:
        """A bucket's prefill (one prompt length, one cached length): its cache, sized for the prompt, the
        answer and slots, holding each row's cached chunks (`hits`), if any."""
        model = self.model
        T = len(rows[0].prompt)
        capacity = T + max(r.cfg.max_new_tokens for r in rows) + slot_capacity(self.key)
        prompt = torch.tensor([r.prompt for r in rows], device=model.device)
        cache = model.new_cache(len(rows), capacity)
        for b, hit in enumerate(hits):
            write_hit(cache, b, hit, 0)
        cache.advance(hits[0].length)
        return Prefill(rows, cache, prompt, hits[0].length, self.exact)

    def _feed(self, p: Prefill) -> None:
        """Feed a bucket's next chunk (not its last) into its cache; no logits."""
        end = p.next_end()
        block = BLOCK if self.exact else None
        offsets = self._arange(end - p.done)
        feed_chunk(self.model, p.cache, p.prompt, p.done, end, offsets, self.prefix_cache, block)
        p.done = end

    def _store_tail(self, p: Prefill) -> None:
        """After a bucket's first step (which fed its prompts' last chunk, at least MIN_ROWS rows past
        position 0 where `exact`), store the whole blocks of that chunk in the prefix cache: on the exact
        rule they are the bits any prefill of these tokens writes. Its cache has no holes yet."""
        if self.prefix_cache is None or not self.exact or p.done == 0:
            return
        end = p.prompt.shape[1] // BLOCK * BLOCK
        if end > p.done:
            store(self.prefix_cache, p.cache, p.prompt[:, :end].tolist(), p.done, end, BLOCK)

    def _group(self, p: Prefill) -> Group:
        """The group of a bucket whose prompts are fed but for the last chunk, which its first step feeds."""
        model, rows, B = self.model, p.rows, len(p.rows)
        st = LoopState(self.key, [r.generator for r in rows], p.prompt[:, p.done :], costs=self.costs)
        if self.key.mode in ("verified", "hybrid") and self.key.drafting == "separate":
            rates = draft_rates(model.config, self.key.temperature)
            free = free_sources(self.key.prompt_lookup, self.corpus, rates)
            if free:  # copies and corpus drafts read each row's context
                st.drafts = DraftSources(free=free, contexts=[NgramIndex(r.prompt) for r in rows])
        if self.key.repetition_penalty != 1.0:
            st.seen = torch.zeros(B, model.config.vocab_size, dtype=torch.bool, device=model.device)
            st.seen.scatter_(1, p.prompt, True)
        if self.key.presence_penalty != 0.0 or self.key.frequency_penalty != 0.0:  # generated tokens only
            st.counts = torch.zeros(B, model.config.vocab_size, dtype=torch.int32, device=model.device)
        return Group(rows, p.cache, st)

    def _step(self, g: Group) -> StepEmission:
        """One step of a group, in four phases: propose, forward, accept (+ drafting pass), advance. With
        a profile being taken (`decode/profile.py`), each phase's wall time is booked by name."""
        st, cache = g.st, g.cache
        t0 = time.perf_counter()
        prof = profile.ACTIVE
        if prof:
            prof.start(prefill=g.index == 0)
        # 1. Propose: committed tokens to feed, then the policy's block(s) of mask slots.
        tokens, positions, mask, n_c = self._propose(st, cache)
        if prof:
            prof.mark("propose")
        # 2. Forward: AR logits for the fed tokens, NAR logits for the slots.
        top1 = self.argmax_only and all(r.cfg.logprobs is None for r in g.rows)
        out = self.model.step(
            tokens, positions, n_c, mask, cache, st.max_drafts + 1, top1=top1, ar_entropy=self.asks_router
        )
        if prof:
            prof.mark(f"forward:{tokens.shape[1]}")
        # 3. Accept: the policy verifies / commits and says what each row keeps and feeds next.
        adv = self.policy.advance(self.model, st, out)
        if prof:
            prof.mark("accept")
        cache.commit(adv.keep)
        if prof:
            prof.mark("cache")
        forwards = 1
        if adv.draft_pass:
            adv = self._draft_pass(st, cache, adv, out, prof)
            forwards = 2
        # 4. Advance: bookkeeping for the next step.
        em = self._advance(g, adv, out, forwards, t0)
        if prof:
            prof.mark("bookkeeping")
        return em

    def _propose(self, st: LoopState, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor, object, int]:
        """The step's inputs: (tokens (B, n_c + n_s), positions, mask, n_c): the fed committed tokens,
        then the policy's fused block(s) of mask slots, if any; the cache has room for them and for a
        drafting pass."""
        cfg, device = self.key, self.model.device
        B, n_c = st.fed.shape
        size, anchors = self.policy.n_slots(st), self.policy.anchors(st)
        n_s = size * (len(anchors) if anchors else 1)
        cache.make_room(n_c + n_s + ((cfg.block_size or 1) if cfg.drafting == "separate" else 0))
        mask_id = self.model.config.mask_token_id
        tokens = st.fed if n_s == 0 else torch.cat([st.fed, st.fed.new_full((B, n_s), mask_id)], dim=1)
        if not anchors:  # one block at the last fed token: positions run on contiguously
            offsets = self._arange(n_c + n_s)
        else:  # block m's slots sit at its anchor's position + 1 .. + size
            blocks = torch.tensor(anchors)[:, None] + torch.arange(1, size + 1)  # (blocks, size)
            offsets = torch.cat([torch.arange(n_c), blocks.flatten()]).to(device)
        mask = decode_mask(cache.length, n_c, n_s, cache.key_valid, device, anchors)
        return tokens, cache.positions(offsets), mask, n_c

    def _advance(self, g: Group, adv: Advance, out, forwards: int, t0: float) -> StepEmission:
        """What a step leaves for the next (fed tokens, drafts, penalties' counts) and what it emits."""
        st, device = g.st, self.model.device
        st.fed, st.draft_logprobs = adv.next_fed, adv.next_draft_logprobs
        st.n_drafts = adv.next_drafts or [0] * st.fed.shape[0]
        toks, srcs, writers = truncate(adv, g.rows)
        lp = logprobs(g.rows, adv, toks, out.ar_logits)
        if st.seen is not None:
            for b, t in enumerate(toks):
                st.seen[b, t] = True
        if st.counts is not None:
            for b, t in enumerate(toks):
                st.counts[b].index_add_(
                    0,
                    torch.tensor(t, dtype=torch.long, device=device),
                    torch.ones(len(t), dtype=torch.int32, device=device),
                )
        step = None
        if self.key.trace:
            h = float(entropy(out.ar_logits[0, -1]))
            dt = (time.perf_counter() - t0) * 1e3
            step = Step(g.index, adv.mode, adv.drafted[0], adv.accepted[0], adv.p_ar, h, dt)
        g.index += 1
        finished, ids = [r.finish for r in g.rows], [r.id for r in g.rows]
        return StepEmission(
            toks,
            srcs,
            writers,
            finished,
            step,
            adv.drafted,
            adv.accepted,
            adv.mode,
            forwards,
            adv.routed,
            ids,
            lp,
        )

    def _draft_pass(self, st: LoopState, cache: KVCache, adv: Advance, out, prof) -> Advance:
        """Drafting pass: K = `Advance.pass_slots` (else `drafting_slots`) slots anchored at each row's last kept token, NAR set only;
        they see the cache up to that token and each other, and sit in scratch space past it. Slot 1's
        token is known by now (the AR path's, next_fed[:, 0]), so it goes in revealed, as training's
        mask-predict reveals do, and slots 2.. are drafted knowing it. `prof`: the active profile, or None."""
        model, K = self.model, adv.pass_slots or self.key.draft_block
        B, L = st.fed.shape[0], cache.length
        slots = st.fed.new_full((B, K), model.config.mask_token_id)
        slots[:, 0] = adv.next_fed[:, 0]
        mask = self.policy.draft_mask(model, st, decode_mask(L, 0, K, cache.key_valid, model.device), L, K)
        # A top-layer NAR set's slots enter from the anchor's hidden state at their first layer.
        entry = None if out.entry is None else rows_at(out.entry, [k - 1 for k in adv.keep])[:, None]
        positions = cache.positions(self._arange(K))
        draft = model.step(slots, positions, 0, mask, cache, 0, entry)
        if prof:
            prof.mark("draft:nar")
        adv = self.policy.draft(model, st, adv, out, draft.slot_logits)
        if prof:
            prof.mark("draft:nar choose")
        return adv


@torch.inference_mode()
def decode(
    model: PreparedModel | YueForCausalLM,
    prompts: list[list[int]],
    cfg: DecodeConfig,
    cancel: Callable[[], bool] | None = None,
    costs: StepCosts | None = None,
    corpus: CorpusNgrams | None = None,
) -> Iterator[StepEmission]:
    """Decode a fixed batch of tokenized prompts; yield what each step commits.

    Row b is seeded with cfg.seed + b (when seeded), so row 0 samples as a single request would.

    Args:
        model: the model as it decodes (as `DecodeBatch` takes it), in eval mode.
        prompts: B non-empty token lists.
        cfg: a config already `resolved()` against the model's config.
        cancel: checked before every step; when it returns True the loop stops (rows finish "cancelled").
        costs: step costs for the router's draft lengths (`decode.costs.measured_costs`); None = defaults.
        corpus: the model's n-gram table for `verified`'s and `hybrid`'s corpus drafts; None = none.
    Yields:
        One StepEmission per forward group, with B-long lists indexed by prompt (the prefill included).
    """
    batch = DecodeBatch(model, cfg, costs, corpus=corpus)
    for b, p in enumerate(prompts):
        seed = None if cfg.seed is None else (cfg.seed + b) % 2**64
        batch.add(p, replace(cfg, seed=seed))
    B = len(prompts)
    finished: list[str | None] = [None] * B
    while len(batch):
        if cancel is not None and cancel():
            finished = [f or "cancelled" for f in finished]
            empty = [[] for _ in range(B)]
            yield StepEmission(empty, empty, empty, finished, None, [0] * B, [0] * B, "cancelled", 0)
            return
        for em in batch.step():
            tokens, sources, writers = [[] for _ in range(B)], [[] for _ in range(B)], [[] for _ in range(B)]
            drafted, accepted = [0] * B, [0] * B
            row_logprobs = None if em.logprobs is None else [None] * B
            for i, row in enumerate(em.rows):
                tokens[row], sources[row], finished[row] = em.tokens[i], em.sources[i], em.finished[i]
                writers[row] = em.writers[i]
                drafted[row], accepted[row] = em.drafted[i], em.accepted[i]
                if row_logprobs is not None:
                    row_logprobs[row] = em.logprobs[i]
            yield StepEmission(
                tokens,
                sources,
                writers,
                list(finished),
                em.step,
                drafted,
                accepted,
                em.mode,
                em.forwards,
                em.routed,
                list(range(B)),
                row_logprobs,
            )
