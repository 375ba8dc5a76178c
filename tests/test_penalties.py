"""OpenAI's presence / frequency penalties and logit bias: their arithmetic, `verified` == `ar` under
them, batched rows == lone ones, and the config's checks."""

from __future__ import annotations

import pytest
import torch

import yue
from tests.test_loop import FLAT
from yue.config import DecodeConfig, YueConfig
from yue.decode.policies import adjusted_ar_logits
from yue.decode.sampling import apply_openai_penalties
from yue.decode.sampling import warp as sample_warp
from yue.decode.state import LoopState
from yue.model.mot import StepOutput

PROMPTS = ["def alpha_1(x):\n", "class ", "    return gamma(x) + 4\n\ndef "]
PENALTIES = [
    {"frequency_penalty": 1.5},
    {"presence_penalty": 2.0},
    {"presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.2},
]


@pytest.fixture(scope="module")
def trained(trained_model_dir):
    engine = yue.load(trained_model_dir)
    engine.costs = FLAT  # drafting free: every block drafted whole, so verifying rows see many drafts
    return engine


def test_penalties_follow_openais_formula():
    logits = torch.tensor([[1.0, 2.0, 3.0, -1.0]])
    counts = torch.tensor([[0, 1, 3, 2]])
    out = apply_openai_penalties(logits, counts, presence=0.5, frequency=0.25)
    assert out.tolist() == [[1.0, 2.0 - 0.25 - 0.5, 3.0 - 0.75 - 0.5, -1.0 - 0.5 - 0.5]]


def test_config_checks_ranges_types_and_the_vocabulary():
    cfg = DecodeConfig(logit_bias={7: 5, 3: -100.0})
    assert cfg.logit_bias == ((3, -100.0), (7, 5.0))  # sorted pairs: hashable, part of a batch's key
    assert hash(cfg) == hash(DecodeConfig(logit_bias=[(7, 5.0), (3, -100)]))
    assert cfg.adjusts_logits and not DecodeConfig().adjusts_logits
    for kw, field in [
        ({"presence_penalty": 2.5}, "presence_penalty"),
        ({"frequency_penalty": -3}, "frequency_penalty"),
        ({"frequency_penalty": "1"}, "frequency_penalty"),
        ({"logit_bias": {1: 101}}, "logit_bias"),
        ({"logit_bias": {"1": 1.0}}, "logit_bias"),
        ({"logit_bias": 5}, "logit_bias"),
        ({"temperature": 2.01}, "temperature"),
        ({"repetition_penalty": 1e-38}, "repetition_penalty"),
        ({"repetition_penalty": 101.0}, "repetition_penalty"),
    ]:
        with pytest.raises(ValueError, match=field):
            DecodeConfig(**kw)
    with pytest.raises(ValueError, match="logit_bias: token id 99 is not in this model's vocabulary"):
        DecodeConfig(mode="ar", logit_bias={99: 1.0}).resolved(YueConfig(vocab_size=64))


@pytest.mark.parametrize("kw", PENALTIES)
def test_ar_with_penalties_writes_the_argmax_of_the_penalised_logits(trained, kw):
    """Teacher-forced reference: at each position, the full forward's logits penalised by the counts of
    the tokens generated before it (and the repetition penalty over the whole context)."""
    checked = 0
    for prompt in PROMPTS:
        out = trained.generate(prompt, mode="ar", max_new_tokens=30, ignore_eos=True, **kw)
        ids = trained.encode(prompt)
        with torch.no_grad():
            logits = trained.model(torch.tensor([ids + out.token_ids])).logits[0].float()
        counts = torch.zeros(logits.shape[-1])
        seen = torch.zeros(logits.shape[-1], dtype=torch.bool)
        seen[ids] = True
        for i, token in enumerate(out.token_ids):
            row = logits[len(ids) - 1 + i]
            rp = kw.get("repetition_penalty", 1.0)
            row = torch.where(seen, torch.where(row > 0, row / rp, row * rp), row)
            row = apply_openai_penalties(
                row, counts, kw.get("presence_penalty", 0.0), kw.get("frequency_penalty", 0.0)
            )
            top2 = row.topk(2).values
            if top2[0] - top2[1] > 1e-3:  # a near-tie may fall either way between two forward shapes
                assert token == int(row.argmax()), (prompt, i)
                checked += 1
            counts[token] += 1
            seen[token] = True
    assert checked > 60


def test_each_verifying_row_counts_the_drafts_before_it():
    """fed = [p0, d1, d2, d3] (two rows of a batch): row i's penalties count the generated tokens and
    drafts d1..di; the repetition penalty also the prompt; the logit bias is added to every row."""
    V = 6
    cfg = DecodeConfig(
        mode="verified",
        frequency_penalty=0.5,
        presence_penalty=0.25,
        repetition_penalty=2.0,
        logit_bias={4: 1.5},
    )
    fed = torch.tensor([[1, 3, 2, 3], [0, 2, 2, 2]])
    st = LoopState(cfg, [None, None], fed)
    st.counts = torch.tensor([[0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 2]], dtype=torch.int32)
    st.seen = torch.tensor([[0, 1, 0, 0, 0, 1], [1, 0, 0, 0, 0, 1]], dtype=torch.bool)
    ar_logits = torch.full((2, 4, V), 2.0)
    out = StepOutput(ar_logits, torch.zeros(2, 0, V), torch.zeros(2, 4, 1))
    got = adjusted_ar_logits(st, out, rows=4)
    for b in range(2):
        for i in range(4):
            drafts = fed[b, 1 : i + 1].tolist()
            for t in range(V):
                count = int(st.counts[b, t]) + drafts.count(t)
                seen = bool(st.seen[b, t]) or t in drafts
                want = (1.0 if seen else 2.0) - 0.5 * count - 0.25 * (count > 0) + (1.5 if t == 4 else 0.0)
                assert float(got[b, i, t]) == pytest.approx(want), (b, i, t)


@pytest.mark.parametrize("kw", PENALTIES)
def test_verified_with_penalties_equals_ar_and_the_penalties_bite(trained, kw):
    plain = [trained.generate(p, mode="ar", max_new_tokens=40).token_ids for p in PROMPTS]
    ar = [trained.generate(p, mode="ar", max_new_tokens=40, **kw).token_ids for p in PROMPTS]
    for prompt, expected in zip(PROMPTS, ar, strict=True):
        ver = trained.generate(prompt, mode="verified", max_new_tokens=40, router_threshold=1.0, **kw)
        assert ver.token_ids == expected
    assert ar != plain  # the penalties changed the answers: the equality above is not vacuous


def test_logit_bias_bans_and_forces_tokens_in_every_mode(trained):
    plain = trained.generate(PROMPTS[0], mode="ar", max_new_tokens=20).token_ids
    banned = {t: -100.0 for t in set(plain)}
    for mode in ("ar", "verified"):
        out = trained.generate(PROMPTS[0], mode=mode, max_new_tokens=20, logit_bias=banned)
        assert out.token_ids and not set(out.token_ids) & set(banned)
    forced = trained.generate(PROMPTS[0], mode="verified", max_new_tokens=10, logit_bias={plain[0] + 1: 100})
    assert forced.token_ids == [plain[0] + 1] * 10


def test_batched_rows_with_penalties_equal_lone_rows(trained):
    kw = {"frequency_penalty": 1.0, "logit_bias": {5: 3.0}}
    batch = trained.generate(PROMPTS, mode="verified", max_new_tokens=30, router_threshold=1.0, **kw)
    for prompt, r in zip(PROMPTS, batch, strict=True):
        assert r.token_ids == trained.generate(prompt, mode="ar", max_new_tokens=30, **kw).token_ids


@pytest.mark.parametrize("penalty", [0.01, 100.0])
def test_sampling_at_the_edges_of_every_accepted_range_draws_a_token(trained, penalty):
    """The widest accepted penalties, bias and temperature never give sampling an inf or a NaN."""
    cfg = dict(mode="ar", max_new_tokens=12, temperature=2.0, repetition_penalty=penalty,
               presence_penalty=-2.0, frequency_penalty=-2.0, logit_bias={5: 100.0, 6: -100.0}, seed=1, ignore_eos=True)
    out = trained.generate(PROMPTS[0], **cfg)
    assert len(out.token_ids) == 12


def test_warp_guards_overflowed_scores():
    """Scores that overflowed upstream: NaN never wins, +inf is the largest finite score; a distribution."""
    logits = torch.tensor([[float("inf"), 1.0, float("nan"), float("-inf")], [1e38, -1e38, 0.0, 2.0]])
    logprobs = sample_warp(logits, DecodeConfig(temperature=1e-3))
    assert torch.isfinite(logprobs.exp().sum(-1)).all() and torch.allclose(logprobs.exp().sum(-1), torch.ones(2))
    assert logprobs[0].argmax() == 0 and logprobs[0, 2] == float("-inf")
