"""Step traces of `verified` and `hybrid` on stub models, pinned: which source drafted, how many drafts
each step verified and kept, which tokens came out.

The draft sources (context copies, corpus n-grams, the NAR block; `decode/sources.py`) and the choice
among them by their records and the step costs decide every step's shape. These scenarios cover each
source, priors from `free_draft_rates`, the router's gate, back-off and probes, a batch of prompts of
three lengths (groups merged mid-run), fused drafting and sampling. `tests/draft_traces.json` holds
what the code wrote before the sources were split out of `VerifiedPolicy` (commit 9d49c75): a change
to any draft choice shows here. Where a change is meant, rewrite the file with
`python -m tests.test_draft_traces` and say why in the commit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.stubs import MarkovStub
from yue.config import DecodeConfig
from yue.decode.corpus import CorpusNgrams
from yue.decode.costs import StepCosts
from yue.decode.loop import decode
from yue.model.router import Router

GOLDEN = Path(__file__).with_name("draft_traces.json")
V, K = 12, 6
# Each verifying row costs 0.3 of a plain step and a drafting pass 0.5: drafts must earn their rows.
COSTS = StepCosts(tuple(1.0 + 0.3 * k for k in range(K + 1)), (0.5,))
PROMPTS = [[1, 2, 3, 4, 1, 2], [5, 6, 7], [8, 9, 10, 3, 4, 5, 6, 9, 10]]


class ConfidenceRouter:
    """Router stand-in whose acceptances follow each slot's top probability (so some blocks are cut)."""

    def features(self, hidden, ar_logits, slot_logits, slot1_revealed=False, ar_entropy=None):
        return slot_logits.float().softmax(-1).amax(-1)  # (B, n)

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        return 8.0 * (features - 0.4)  # logits of each slot's acceptance given the ones before

    log_acceptance = staticmethod(Router.log_acceptance)


def _stub(router: bool = False, rates: dict | None = None) -> MarkovStub:
    """A Markov chain over V - 1 tokens (V - 1 is the mask) whose slots guess its walk with noise: some
    drafts hold, some fail, and the walk repeats itself, so copies and n-grams match."""
    g = torch.Generator().manual_seed(7)
    n = V - 1
    ar = torch.randn(V, V, generator=g)
    for t in range(V):
        ar[t, (t + 4) % n] += 4.0  # greedy walks one cycle through the V - 1 tokens
    ar[:, V - 1] = -1e9  # never the mask id
    greedy = ar.argmax(-1)  # (V,) the AR path's next token after each token
    slots = torch.randn(K, V, V, generator=g)
    walk = torch.arange(V)
    for i in range(K):
        walk = greedy[walk]  # slot i + 1 guesses i + 1 tokens past the anchor
        slots[i, torch.arange(V), walk] += 3.0 - 0.4 * i  # later slots guess worse
    slots[:, :, V - 1] = -1e9
    stub = MarkovStub(ar, slots)
    stub.config.free_draft_rates = rates
    if router:
        stub.router = ConfidenceRouter()
        stub.config.draft_gate = 0.6
    return stub


def _corpus() -> CorpusNgrams:
    """An n-gram table of sequences that agree with the walk in places and not in others."""
    seqs = [([1, 4, 2, 7, 0, 1, 4, 2], 1), ([5, 5, 6, 8, 3, 10, 9, 6], 2), ([9, 6, 8, 3, 10, 9, 6, 8], 1)]
    return CorpusNgrams.build(seqs, V, min_count=1, min_share=0.0)


SCENARIOS = {
    "verified, copies + corpus + block": (dict(mode="verified", router_threshold=1.0), {}, True, 1),
    "verified, priors": (
        dict(mode="verified", router_threshold=1.0),
        dict(rates={"copy:2": [0.4, 0.5], "copy:3": [0.9], "corpus:2": [0.2]}),
        True,
        1,
    ),
    "verified, batch of three": (dict(mode="verified", router_threshold=1.0), {}, True, 3),
    "hybrid, batch of three": (dict(mode="hybrid", router_threshold=0.3), {}, True, 3),
    "verified, router gate": (dict(mode="verified", router_threshold=0.6), dict(router=True), False, 1),
    "hybrid, router gate": (dict(mode="hybrid", router_threshold=0.2), dict(router=True), True, 1),
    "verified, no copies": (dict(mode="verified", router_threshold=1.0, prompt_lookup=False), {}, True, 1),
    "verified, fused": (dict(mode="verified", router_threshold=1.0, drafting="fused"), {}, False, 1),
    "verified, sampled": (dict(mode="verified", router_threshold=1.0, temperature=1.0, seed=5), {}, True, 3),
    "hybrid, sampled": (dict(mode="hybrid", router_threshold=0.3, temperature=1.0, seed=5), {}, True, 1),
}


def trace(name: str) -> list[dict]:
    """Every step of a scenario: per row, tokens, who wrote them, drafts verified and kept; the step's
    forwards and its block's split (to AR, to NAR)."""
    kw, stub_kw, corpus, n_prompts = SCENARIOS[name]
    cfg = DecodeConfig(max_new_tokens=40, block_size=K, reeval_every=2, **kw)
    stub = _stub(**stub_kw)
    out = []
    for em in decode(stub, PROMPTS[:n_prompts], cfg, costs=COSTS, corpus=_corpus() if corpus else None):
        step = dict(tokens=em.tokens, sources=em.sources, drafted=em.drafted, accepted=em.accepted)
        out.append(step | dict(forwards=em.forwards, routed=list(em.routed)))
    return out


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_draft_choices_are_the_ones_pinned_step_for_step(name):
    assert trace(name) == json.loads(GOLDEN.read_text())[name]


def test_the_pinned_scenarios_use_every_source():
    """Guard against pins that exercise nothing: `verified` keeps free drafts (as the AR path's tokens)
    and NAR drafts, rejects drafts, writes plain AR steps, runs drafting passes and skips them, and the
    router cuts blocks short."""
    golden = json.loads(GOLDEN.read_text())
    steps = [s for name in golden if name.startswith("verified") for s in golden[name]]
    rows = [
        (a, d, src)
        for s in steps
        for a, d, src in zip(s["accepted"], s["drafted"], s["sources"], strict=True)
    ]
    assert any(a > 0 and set(src) == {"ar"} for a, _, src in rows)  # free drafts kept
    assert any("nar" in src for _, _, src in rows)  # NAR drafts kept
    assert any(a < d for a, d, _ in rows) and any(d == 0 for _, d, _ in rows)
    assert {s["forwards"] for s in steps} == {1, 2}
    assert any(s["routed"][0] > 0 for s in golden["verified, router gate"])
    # a block the record declines at threshold 1, without a pass
    assert any(s["routed"][0] > 0 and s["forwards"] == 1 for s in golden["verified, batch of three"])


@pytest.mark.parametrize(
    "name", [n for n, (kw, *_) in SCENARIOS.items() if kw.get("router_threshold") == 1.0]
)
def test_where_the_record_decides_no_drafting_pass_is_paid_for_a_block_it_declines(name):
    """At threshold 1 (no router, no trace) a block's length comes from the acceptance record, which the
    drafting pass does not change, so a pass runs only for a block that is drafted (a probe drafts at
    least one): a declined block costs no pass (`VerifiedPolicy.worth_a_pass`)."""
    steps = trace(name)
    if SCENARIOS[name][0].get("drafting") == "fused":
        assert {s["forwards"] for s in steps} == {1}  # the block rides in the step
        return
    passes = [s for s in steps if s["forwards"] == 2]
    assert passes and all(s["routed"][1] >= 1 for s in passes), passes


def test_where_the_record_decides_a_pass_runs_just_the_slots_its_drafts_need():
    """At threshold 1 the record sizes the block before the pass (`VerifiedPolicy.worth_a_pass`), and a
    pass's cost falls with its slots (`StepCosts.passes`, 2..K): each pass runs slot 1 (revealed) plus
    the drafts the next step verifies, not the whole block, and some passes are shorter than the block."""
    costs = StepCosts(COSTS.step, tuple(0.2 + 0.1 * n for n in range(2, K + 1)))
    stub = _stub()
    widths, drafted = [], []
    step = stub.step

    def recording(tokens, positions, n_committed, *args, **kw):
        if n_committed == 0:  # a drafting pass: slots only
            widths.append(tokens.shape[1])
        return step(tokens, positions, n_committed, *args, **kw)

    stub.step = recording
    cfg = DecodeConfig(
        max_new_tokens=40,
        block_size=K,
        reeval_every=2,
        mode="verified",
        router_threshold=1.0,
        prompt_lookup=False,
    )
    for em in decode(stub, PROMPTS[:1], cfg, costs=costs):
        if em.forwards == 2:
            drafted.append(em.routed[1])
    assert widths and len(widths) == len(drafted)
    assert widths == [k + 1 for k in drafted]  # slot 1 and the k drafts, each pass
    assert min(widths) < K


if __name__ == "__main__":
    GOLDEN.write_text(json.dumps({name: trace(name) for name in SCENARIOS}, separators=(",", ":")) + "\n")
