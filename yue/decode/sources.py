"""Draft sources: where `verified`'s drafts come from, each with its own acceptance records.

A step of `verified` or `hybrid` verifies drafts from one of three sources (docs/design.md §2): the NAR
set's block, tokens copied from the context (prompt lookup, `decode/lookup.py`), or tokens chained from
the model's n-gram table of its own answers (`decode/corpus.py`). Each source is one class here, shaped
as transformers' candidate generators are (`get_candidates` proposes, `update_candidate_strategy` learns
how they fared): `FreeSource.propose` gives each row's drafts and the key of the record they are judged
by, and that `AcceptanceRecord` is folded in when the next step has verified them
(`DraftSources.observe`). Which source drafts, and how many tokens, is the policy's choice
(`policies.VerifiedPolicy`): by these records and the step costs measured on the machine (§7).

Design decisions:
- A record per source and per key (the length of the context the source matched): a 4-token match is a
  surer copy than a 2-token one, so one record per source mixed drafts worth a whole block with drafts
  not worth one verifying row. A new record starts from the model's measured rates for its kind
  (`YueConfig.free_draft_rates`, "copy:2" -> c_1, c_2, ...; a sampled request's from
  `sampled_draft_rates`, `draft_rates`), else from certainty (draft, and learn).
- Free sources cost no forward, so they propose before the step's drafting pass is decided; the NAR
  block's drafts come out of a forward (the loop's drafting pass), so `NarBlock` holds what decides
  whether that pass runs: its record and its back-off after futile looks.
- One `DraftSources` per batch (`LoopState.drafts`): records are the batch's (a lone request's own);
  the contexts are per row and follow rows that leave or join (`select`, `join`).
- A new source that proposes from a row's context is one `FreeSource` subclass (its `match`), listed
  in `free_sources`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from yue.decode.corpus import CorpusNgrams
from yue.decode.lookup import NgramIndex

# verified: after futile probes the AR stretch doubles, up to reeval_every * 2**3 steps.
MAX_BACKOFF_DOUBLINGS = 3


@dataclass
class AcceptanceRecord:
    """How drafts fare on the text at hand, learnt as a request decodes (`verified`).

    Drafting pays only where enough drafts are accepted to cover the verifying rows and the drafting
    pass; how many are depends on the text. yue-smol's drafts, trained on model-written answers,
    accept several times more per step on its calibration split than on hand-written held-out chat,
    where drafting every block made `verified` slower than `ar` (docs/results-log.md). So each verifying step is recorded:
    - per draft position j, how often draft j held where it was judged (verified, with drafts
      1..j-1 held) (`survival`: this request's own estimate, used when the router is not asked,
      threshold 1);
    - what the router expected of the drafts it chose against what was accepted (`ratio`: scales
      the router's predictions, which the drafting data's distribution calibrated, to this text).
    Both start from priors worth `PRIOR` steps (survival 1, ratio 1: draft), so a few bad steps are
    needed to stop drafting, and AR stretches end with a probe that refreshes the record.

    Survival is a chain of per-position rates: c_j, the chance that draft j holds where drafts 1..j-1
    did, is estimated from the steps that judged it, with a prior worth `PRIOR` steps whose mean is
    c_{j-1} (1 for draft 1); P(drafts 1..j) = c_1 ... c_j. A position no step has judged yet so
    inherits its predecessor's rate, and the estimate decays geometrically past the data: after one
    step whose 8 drafts all failed at the first, P(1..8) reads 0.67^8 = 0.04, not 0.67, which on a
    CPU whose verifying rows cost much (AVX2's, docs/results-log.md) would keep drafting whole blocks.

    A record may start from measured rates instead (`prior`: the c_j the model's calibration answers
    gave its kind of drafts, `YueConfig.free_draft_rates`): then c_j's prior mean is prior[j - 1].

    Attributes:
        reached / held: per draft position (index j - 1), steps that verified >= j drafts and accepted
            >= j - 1 (so judged draft j), and of those the steps that accepted >= j (batch mean);
            sampled, every step that verified >= j drafts, each held by draft j's chance.
        predicted / accepted: the router's expected accepted drafts and the accepted ones, summed.
        pending: the router's expectation for the drafts now in flight (None: not the router's).
        prior: per draft position, the prior mean of c_j where measured (past its end, c_{j-1}).
        source: the name of the source whose drafts it judges (`DraftSource.name`), which the tokens
            they write are counted by (`GenerationStats.token_sources`); "" for a record made by hand.
    """

    prior: tuple[float, ...] = ()
    source: str = ""
    reached: list[int] = field(default_factory=list)
    held: list[float] = field(default_factory=list)
    predicted: float = 0.0
    accepted: float = 0.0
    pending: float | None = None

    PRIOR = 2.0

    @property
    def ratio(self) -> float:
        return (self.accepted + self.PRIOR) / (self.predicted + self.PRIOR)

    def survival(self, n: int) -> list[float]:
        """Estimated P(drafts 1..j all accepted) for j = 1..n, non-increasing."""
        out, rate, last = [], 1.0, 1.0
        for j in range(n):
            reached, held = (self.reached[j], self.held[j]) if j < len(self.reached) else (0, 0)
            mean = self.prior[j] if j < len(self.prior) else rate
            rate = (held + self.PRIOR * mean) / (reached + self.PRIOR)
            last *= rate
            out.append(last)
        return out

    def observe(self, drafted: int, accepted: int, judged: Sequence[float] | None = None) -> None:
        """Fold in a verifying step that verified `drafted` drafts and accepted `accepted` of them.

        `judged` (sampling): per draft position, the chance the rule accepted it given the drafts before
        it (`sampling.judged_rates`); then every drafted position counts, each held by that chance (an
        unbiased c_j with less noise than the draw, and positions past the first rejection learnt too).
        """
        while len(self.reached) < drafted:
            self.reached.append(0), self.held.append(0)
        if judged is not None:
            for j, rate in enumerate(judged[:drafted]):
                self.reached[j] += 1
                self.held[j] += rate
        else:
            for j in range(min(drafted, accepted + 1)):  # drafts 1..accepted + 1 were judged
                self.reached[j] += 1
                self.held[j] += accepted > j
        if self.pending is not None:
            self.predicted += self.pending
            self.accepted += accepted
            self.pending = None


class DraftSource:
    """A source of drafts and its acceptance records, one per key (the match length; 0 for a source
    whose drafts all fare alike).

    Args:
        rates: the records' priors by kind, `"{name}:{key}"` -> c_1, c_2, ... (`YueConfig.free_draft_rates`);
            a kind not listed starts from certainty.
    """

    name = ""

    def __init__(self, rates: Mapping[str, Sequence[float]] | None = None) -> None:
        self.rates = rates or {}
        self.records: dict[int, AcceptanceRecord] = {}

    def record(self, key: int = 0) -> AcceptanceRecord:
        """The record of this source's drafts proposed under `key`, started from its prior when new."""
        if key not in self.records:
            prior = tuple(self.rates.get(f"{self.name}:{key}", ()))
            self.records[key] = AcceptanceRecord(prior, source=self.name)
        return self.records[key]


@dataclass
class Proposal:
    """A free source's drafts for every row of a batch.

    Attributes:
        source: who proposed them; key: the record they are judged by (`source.record(key)`).
        drafts: per row, the same number m >= 1 of draft tokens.
    """

    source: FreeSource
    key: int
    drafts: list[list[int]]

    @property
    def record(self) -> AcceptanceRecord:
        return self.source.record(self.key)


class FreeSource(DraftSource):
    """A source whose drafts cost no forward: it proposes from each row's context alone."""

    def match(self, context: NgramIndex, n: int) -> tuple[int, list[int]]:
        """(key, drafts): up to n drafts after a row's context and the key of their record (the
        length of the context they matched); (0, []) where the source has none."""
        raise NotImplementedError

    def propose(self, contexts: list[NgramIndex], n: int) -> Proposal | None:
        """Every row's drafts, cut to the shortest row's (one draft length per batch step), judged by
        the record of the shortest match among the rows; None unless every row has some."""
        found = [self.match(ctx, n) for ctx in contexts]
        m = min(len(d) for _, d in found)
        if not m:
            return None
        return Proposal(self, min(key for key, _ in found), [d[:m] for _, d in found])


class ContextCopies(FreeSource):
    """Tokens copied from the context after the latest earlier occurrence of its last 2-4 tokens
    (prompt lookup, `lookup.NgramIndex.match`); key: that n-gram's length."""

    name = "copy"

    def match(self, context: NgramIndex, n: int) -> tuple[int, list[int]]:
        return context.match(n)


class CorpusDrafts(FreeSource):
    """Tokens chained from the model's n-gram table of its own answers (`corpus.CorpusNgrams.match`);
    key: the length of the context that gave the first draft."""

    name = "corpus"

    def __init__(self, table: CorpusNgrams, rates: Mapping[str, Sequence[float]] | None = None) -> None:
        super().__init__(rates)
        self.table = table

    def match(self, context: NgramIndex, n: int) -> tuple[int, list[int]]:
        return self.table.match(context.tokens, n)


class NarBlock(DraftSource):
    """The NAR set's block: drafts that cost a drafting pass (or ride in the step's forward, fused),
    one record for all of them (the router's predictions are scaled by its `ratio`, and at threshold
    1 its `survival` picks the draft length).

    A block that does not pay starts an AR stretch: `ar_stretch` steps without the block, doubling
    after each futile look (capped), since a look costs a whole NAR pass.

    Attributes:
        ar_stretch: steps left before the block is drafted (and the router asked) again.
        futile_probes: consecutive looks whose block was not worth drafting.
        probe: at threshold 1, the next block is a probe, drafted as far as a probe may cost
            (`policies.probe_length`) whatever the record says (set when an AR stretch starts).
    """

    name = "nar"

    def __init__(self) -> None:
        super().__init__()
        self.ar_stretch, self.futile_probes, self.probe = 0, 0, False

    def rest(self) -> None:
        """A step went by without the block (an AR step, or free drafts): one step of the stretch."""
        self.ar_stretch = max(self.ar_stretch - 1, 0)

    def look(self) -> bool:
        """A block is being weighed: whether it is a probe (then the next one is not)."""
        probing, self.probe = self.probe, False
        return probing

    def drafted(self, probing: bool) -> None:
        """The block paid and is drafted. A probe's drafts are judged by the next look, so only a look
        that was no probe ends the back-off."""
        if not probing:
            self.futile_probes = 0

    def back_off(self, reeval_every: int, probe: bool) -> None:
        """The block did not pay: write `reeval_every` plain steps (doubled per futile look before) and
        look again, as a `probe` when the record decides the draft length."""
        self.ar_stretch = reeval_every * 2 ** min(self.futile_probes, MAX_BACKOFF_DOUBLINGS)
        self.futile_probes += 1
        self.probe = probe


@dataclass
class DraftSources:
    """A batch's draft sources (`LoopState.drafts`): the NAR block, the free sources and the rows'
    contexts they read, and which record the drafts in flight are judged by.

    Attributes:
        block: the NAR set's block (every `verified` / `hybrid` batch has one).
        free: the free sources, in the order they are weighed (a tie goes to the first).
        contexts: per row, its context so far, indexed for lookups; None when there is no free source.
        in_flight: the record of the free drafts fed to the next step; None when those drafts, if any,
            are the NAR block's.
    """

    block: NarBlock = field(default_factory=NarBlock)
    free: list[FreeSource] = field(default_factory=list)
    contexts: list[NgramIndex] | None = None
    in_flight: AcceptanceRecord | None = None

    @property
    def verifying(self) -> AcceptanceRecord:
        """The record of the drafts fed to the step now verifying them (free drafts, else the block's)."""
        return self.block.record() if self.in_flight is None else self.in_flight

    def observe(self, drafted: int, accepted: int, judged: Sequence[float] | None = None) -> None:
        """Fold a verifying step into the record of the drafts it verified (the batch's mean counts;
        `judged`: each draft's chance, sampling, `AcceptanceRecord.observe`)."""
        self.verifying.observe(drafted, accepted, judged)

    def extend(self, emitted: list[list[int]]) -> None:
        """Append each row's committed tokens to its context."""
        for ctx, tokens in zip(self.contexts, emitted, strict=True):
            ctx.extend(tokens)

    def select(self, keep: list[int]) -> None:
        """Keep rows `keep` (indices) only."""
        if self.contexts is not None:
            self.contexts = [self.contexts[i] for i in keep]

    def join(self, other: DraftSources) -> None:
        """Append `other`'s rows (a batch's records stay the batch's: `other`'s are dropped)."""
        if self.contexts is not None:
            self.contexts = self.contexts + other.contexts


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share: drafts against the answer from their position on, how
    many hold (an answer that ends before the drafts do ends the run: a miss there)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def draft_rates(model_config, temperature: float) -> Mapping[str, Sequence[float]]:
    """The priors of a request's free-draft records, measured where its drafts will be judged: a greedy
    request's drafts hold where they are the AR path's choice (`free_draft_rates`, from greedy answers);
    a sampled one's are accepted with the target's probability of each (speculative sampling, a draft
    proposed with certainty), which answers sampled at a temperature measure (`sampled_draft_rates`,
    those of the temperature nearest the request's). A model without sampled rates: the greedy ones."""
    sampled = getattr(model_config, "sampled_draft_rates", None)
    if temperature == 0.0 or not sampled:
        return model_config.free_draft_rates or {}
    return sampled[min(sampled, key=lambda t: abs(float(t) - temperature))]


def free_sources(
    prompt_lookup: bool, corpus: CorpusNgrams | None, rates: Mapping[str, Sequence[float]]
) -> list[FreeSource]:
    """The free sources a request drafts from, in the order they are weighed: context copies (where
    `prompt_lookup`), then the corpus's n-grams (where the model has a table)."""
    out: list[FreeSource] = [ContextCopies(rates)] if prompt_lookup else []
    return out + ([CorpusDrafts(corpus, rates)] if corpus is not None else [])
