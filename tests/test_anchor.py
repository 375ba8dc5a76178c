"""Anchor planning (issue 47, an experiment): `anchor-verified` writes exactly `ar`'s text, `anchor`
commits anchor spans and fills and tags them apart, and the anchor objective trains."""

from __future__ import annotations

import json

import pytest
import torch

import yue
from tests.test_train import tiny_train_config
from yue.model.anchors import ANCHOR_SPAN, AnchorHead, fill_bias, gap_for
from yue.model.hf import load_model
from yue.train.anchor import ar_pass
from yue.train.loop import train

PROMPTS = ["def alpha_3(x):\n", "class gamma", "    return beta(x) + 7\n\n", "中文 def "]


@pytest.fixture(scope="module")
def planned(trained_model_dir, tmp_path_factory):
    """The trained tiny model with a (random, seeded) count head and a strong anchor bias: the biased
    fill pass and the plan both run."""
    model = load_model(trained_model_dir)
    model.config.anchor_head, model.config.anchor_bias = True, 2.0
    torch.manual_seed(3)
    model.anchor_head = AnchorHead(model.config)
    path = tmp_path_factory.mktemp("anchored")
    model.save_pretrained(path)
    yue.load(trained_model_dir).tokenizer.save(path)
    return yue.load(str(path))


@pytest.mark.parametrize("which", ["plain", "planned"])
def test_anchor_verified_writes_exactly_ar_greedy(which, trained_model_dir, planned):
    engine = planned if which == "planned" else yue.load(trained_model_dir)
    for prompt in PROMPTS:
        ref = engine.generate(prompt, mode="ar", max_new_tokens=40, ignore_eos=True)
        out = engine.generate(prompt, mode="anchor-verified", max_new_tokens=40, ignore_eos=True)
        assert out.token_ids == ref.token_ids, prompt
        assert out.stats.drafted > 0  # fills were proposed and judged, not skipped


def test_anchor_commits_spans_then_fills_and_tags_them(planned):
    stream = list(planned.stream(PROMPTS[0], mode="anchor", max_new_tokens=40, ignore_eos=True))
    sources = [s for ev in stream for s in ev.sources]
    assert len(sources) == 40 and set(sources) == {"anchor", "fill"}
    gap = sources.index("fill", ANCHOR_SPAN)  # the first span's anchors, then its fill
    n_fill = next(i for i, s in enumerate(sources[gap:]) if s == "anchor")
    # The gap is the count head's plan on the prompt's last hidden state.
    ids = torch.tensor([planned.tokenizer.encode(PROMPTS[0])])
    with torch.no_grad():
        hidden = ar_pass(planned.model, ids)[1]
    assert n_fill == gap_for(planned.model.anchor_head.count(hidden[:, -1])[0], 8)
    # The cycle repeats: span of 2 anchors, then the planned gap of fill.
    assert sources[: ANCHOR_SPAN + n_fill] == ["anchor"] * ANCHOR_SPAN + ["fill"] * n_fill
    assert sources[ANCHOR_SPAN + n_fill : 2 * ANCHOR_SPAN + n_fill] == ["anchor"] * ANCHOR_SPAN
    result = planned.generate(PROMPTS[0], mode="anchor", max_new_tokens=40, ignore_eos=True, trace=True)
    assert {s.mode for s in result.trace} == {"ANCHOR", "FILL"}
    assert result.stats.ar_tokens + result.stats.nar_tokens == 40 and result.stats.nar_tokens > 0
    assert result.stats.forwards < 40  # fills write several tokens a pass


def test_fill_bias_adds_confidence_on_anchor_keys_only():
    base = torch.ones(1, 1, 3, 7, dtype=torch.bool)
    base[..., 0] = False
    conf = torch.tensor([[0.5, 0.25]])
    m = fill_bias(base, 7, 3, [3, 4], conf, 2.0)
    assert m.shape == (1, 1, 3, 7)
    assert torch.isinf(m[..., 0]).all()
    assert torch.equal(m[0, 0, :, 3], torch.full((3,), 1.0)) and torch.equal(
        m[0, 0, :, 4], torch.full((3,), 0.5)
    )
    assert (m[0, 0, :, [1, 2, 5, 6]] == 0).all()


def test_gap_plans_within_one_block():
    assert [gap_for(n, 8) for n in (2, 9, 12)] == [7, 6, 4]  # ceil(64 / n) - 2, at most K - 1
    assert gap_for(12, 2) == 1


def test_anchor_objective_trains_the_fill_and_count_head(tmp_path):
    base = train(tiny_train_config(tmp_path, steps=2, seq_len=128))
    cfg = tiny_train_config(
        tmp_path,
        steps=3,
        seq_len=128,
        init=str(base),
        train_set="nar",
        objective="anchor",
        alpha=0.0,
        out=str(tmp_path / "anchor"),
        tokenizer=str(base / "tokenizer.json"),
    )
    before = load_model(str(base))
    final = train(cfg)
    after = load_model(str(final))
    assert after.anchor_head is not None and after.config.anchor_bias == 1.0
    log = [json.loads(line) for line in (tmp_path / "anchor" / "log.jsonl").read_text().splitlines()]
    assert all(r["count"] > 0 for r in log if r["kind"] == "train")
    ar_before, ar_after = before.state_dict(), after.state_dict()
    assert torch.equal(
        ar_before["model.layers.0.mlp.down_proj.weight"], ar_after["model.layers.0.mlp.down_proj.weight"]
    )
    assert not torch.equal(
        ar_before["model.layers.0.nar_mlp.down_proj.weight"],
        ar_after["model.layers.0.nar_mlp.down_proj.weight"],
    )
