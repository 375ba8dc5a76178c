"""Router training: labels, stable BCE, standardisation folding, metrics, user spans, greedy corpus."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from scipy.stats import rankdata

from tests.conftest import pattern_corpus, tiny_config
from yue.model import load_model
from yue.model.masks import decode_mask
from yue.model.router import Router, revealed_slot1
from yue.train.router import (
    RouterExamples,
    RouterTrainConfig,
    acceptance_labels,
    block_examples,
    greedy_examples,
    load_user_labels,
    must_ar_tokens,
    router_bce,
    run_train_router,
    standardise_inputs,
    train_router,
    unstandardise_inputs,
    user_label_examples,
)
from yue.train.router_eval import auc, ece, evaluate_router
from yue.train.selfdistill import GreedySequences, build_greedy_sequences, generate_ar_greedy


def test_acceptance_labels_are_the_matching_prefix():
    targets = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    slots = torch.tensor([[5, 6, 7, 8], [5, 6, 0, 8], [0, 6, 7, 8], [5, 6, 7, 0]])
    labels = acceptance_labels(slots, targets)
    expected = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]]).float()
    assert torch.equal(labels, expected)


def test_must_ar_target_zeroes_its_slot_and_all_after():
    targets = torch.arange(6)[None].repeat(3, 1)
    must_ar = torch.zeros(3, 6, dtype=torch.bool)
    must_ar[1, 2] = True  # slot 3 of row 1 must be AR
    must_ar[2, 0] = True  # slot 1 of row 2
    labels = acceptance_labels(targets.clone(), targets, must_ar)  # every slot matches
    assert labels[0].tolist() == [1] * 6
    assert labels[1].tolist() == [1, 1, 0, 0, 0, 0]
    assert labels[2].tolist() == [0] * 6


def test_must_ar_tokens_maps_character_spans_to_overlapping_tokens():
    offsets = [(0, 3), (3, 4), (4, 9), (9, 10), (10, 14)]
    assert must_ar_tokens(offsets, [(4, 6)]).tolist() == [False, False, True, False, False]
    assert must_ar_tokens(offsets, [(2, 4)]).tolist() == [True, True, False, False, False]
    assert must_ar_tokens(offsets, [(9, 10), (13, 14)]).tolist() == [False, False, False, True, True]
    assert must_ar_tokens(offsets, []).tolist() == [False] * 5


@pytest.fixture(scope="module")
def trained(trained_model_dir):
    return load_model(trained_model_dir)


def test_training_forward_features_and_labels_equal_the_decode_path(trained):
    """A block anchored at t in the training forward sees what a decode step anchored at t sees: the
    AR rows up to t, then a drafting pass whose slot 1 is revealed (x[t+1])."""
    model = trained
    K, mask_id = model.config.block_size, model.config.mask_token_id
    torch.manual_seed(0)
    x = torch.randint(4, model.config.vocab_size, (2, 24))
    anchors = torch.tensor([[3, 10, 15], [0, 7, 15]])
    ex = block_examples(model, x, anchors)
    with torch.no_grad():
        for b in range(2):
            for m, t in enumerate(anchors[b].tolist()):
                n_c = t + 1
                cache = model.new_cache(1, n_c + K)
                out = model.step(x[b : b + 1, :n_c], torch.arange(n_c), n_c, decode_mask(0, n_c, 0), cache)
                cache.advance(n_c)
                slots = torch.full((1, K), mask_id)
                slots[0, 0] = x[b, t + 1]
                draft = model.step(slots, torch.arange(n_c, n_c + K), 0, decode_mask(n_c, 0, K), cache, 0)
                logits = revealed_slot1(draft.slot_logits, slots[:, :1])
                feats = model.router.features(out.hidden[:, n_c - 1], out.ar_logits[:, -1], logits, True)
                row = b * anchors.shape[1] + m
                torch.testing.assert_close(ex.features[row], feats[0], atol=2e-4, rtol=1e-4)
                labels = acceptance_labels(logits.argmax(-1), x[b : b + 1, t + 1 : t + 1 + K])
                assert torch.equal(ex.labels[row], labels[0])
                assert bool(labels[0, 0])  # a revealed slot 1 is its true token


def test_a_revealed_slot1_reads_as_certain_without_its_logits(tokenizer):
    """slot1_revealed gives the features of `revealed_slot1`'s logits (max probability 1, entropy ~0)
    whatever slot 1's own logits are, and leaves the other slots and the AR entropy as they were."""
    config = tiny_config(tokenizer)
    router = Router(config)
    B, K, V = 3, config.block_size, config.vocab_size
    h, ar, slots = torch.randn(B, config.hidden_size), torch.randn(B, V) * 3, torch.randn(B, K, V) * 3
    token = torch.randint(0, V, (B, 1))
    shown = router.features(h, ar, revealed_slot1(slots, token))
    flagged = router.features(h, ar, slots, slot1_revealed=True)
    torch.testing.assert_close(flagged, shown, atol=1e-6, rtol=0)
    plain = router.features(h, ar, slots)
    assert not torch.allclose(plain, flagged)  # slot 1's own (random) logits do count without the flag
    short = router.features(h, ar, slots[:, :3], slot1_revealed=True).view(B, -1)[:, -3 * K :]
    assert torch.equal(short.view(B, 3, K)[:, :, 3:], torch.zeros(B, 3, K - 3))  # slots past the block: zero


def test_greedy_labels_are_monotone_and_slot1_matches_the_ar_token(trained, tokenizer):
    model = trained
    docs = [tokenizer.encode("".join(pattern_corpus(6, seed=s))) for s in range(3)]
    seqs = build_greedy_sequences(model, docs, 6, prompt_len=8, new_tokens=24, progress=False)
    ex = greedy_examples(model, seqs.tokens, seqs.prompt_len, anchors_per_seq=8)
    assert len(ex) == 6 * 8
    assert bool((ex.labels[:, 1:] <= ex.labels[:, :-1]).all())  # monotone non-increasing
    # Slot 1 of a block at t predicts x[t+1], the AR path's own greedy token: the trained model mostly agrees.
    assert ex.labels[:, 0].mean() > 0.5


def test_generate_ar_greedy_equals_uncached_argmax_for_mixed_lengths(trained):
    model = trained
    prompts = [[5, 9, 11], [7, 8], [5, 9, 12], [13]]
    out = generate_ar_greedy(model, prompts, max_new_tokens=6, batch_size=2)
    for p, cont in zip(prompts, out, strict=True):
        ids = list(p)
        with torch.no_grad():
            for _ in range(6):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        assert cont == ids[len(p) :]


def test_greedy_sequences_round_trip_through_safetensors(tmp_path):
    seqs = GreedySequences(torch.arange(40).view(4, 10), prompt_len=3)
    path = seqs.save(tmp_path / "s.safetensors", corpus="x")
    back = GreedySequences.load(path)
    assert back.prompt_len == 3 and torch.equal(back.tokens, seqs.tokens)


def test_router_bce_is_finite_with_finite_gradients_at_extremes():
    z = torch.tensor([[60.0, 60.0, -60.0], [-60.0, 60.0, 60.0], [0.0, 0.0, 0.0]], requires_grad=True)
    for labels in (torch.ones(3, 3), torch.zeros(3, 3)):
        loss = router_bce(z, labels)
        (g,) = torch.autograd.grad(loss, z)
        assert torch.isfinite(loss) and bool(torch.isfinite(g).all())
    # Confidently right is cheap, confidently wrong is expensive.
    assert router_bce(torch.full((1, 2), 30.0), torch.ones(1, 2)) < 1e-6
    assert router_bce(torch.full((1, 2), 30.0), torch.zeros(1, 2)) > 10


def test_standardisation_folds_exactly_into_the_first_layer(tokenizer):
    router = Router(tiny_config(tokenizer))
    f = torch.randn(5, router.fc1.in_features) * 7 + 3
    mean, std = f.mean(0), f.std(0)
    before = router(f)
    standardise_inputs(router, mean, std)
    torch.testing.assert_close(router((f - mean) / std), before, atol=1e-4, rtol=1e-4)
    unstandardise_inputs(router, mean, std)
    torch.testing.assert_close(router(f), before, atol=1e-4, rtol=1e-4)


def synthetic_examples(n: int, n_features: int, K: int, seed: int) -> RouterExamples:
    """Slot i matches iff feature i > 0 (after some scale/offset noise); labels are the prefix product."""
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(n, n_features, generator=g) * 5 + 2
    hit = (f[:, :K] - 2) > 0
    labels = hit.long().cumprod(-1).float()
    conf = torch.rand(n, K, generator=g)
    return RouterExamples(f, labels, conf, torch.arange(n))


def test_router_bce_training_learns_a_learnable_signal(tokenizer):
    torch.manual_seed(0)
    router = Router(tiny_config(tokenizer))
    K = router.block_size
    train = synthetic_examples(4000, router.fc1.in_features, K, seed=0)
    test = synthetic_examples(1000, router.fc1.in_features, K, seed=1)
    history = train_router(router, train, RouterTrainConfig(epochs=15, batch_size=256, lr=1e-2))
    assert history[-1] < 0.5 * history[0]
    report = evaluate_router(router, test)
    assert report["router_auc"] > 0.95
    assert report["router_ece"] < 0.05
    assert abs(report["conf_auc"] - 0.5) < 0.1  # the random "confidence" carries no signal


def test_auc_matches_rank_formula_with_ties_and_ece_of_calibrated_scores_is_small():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, 300).astype(float)  # many ties
    y = (rng.random(300) < s / 5).astype(float)
    r = rankdata(s)
    n1, n0 = y.sum(), (1 - y).sum()
    assert auc(s, y) == pytest.approx((r[y == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))
    assert auc([0.1, 0.2, 0.8, 0.9], [0, 0, 1, 1]) == 1.0 and auc([0.9, 0.1], [0, 1]) == 0.0
    p = rng.random(200_000)
    assert ece(p, rng.random(200_000) < p) < 0.01
    assert ece(np.full(1000, 0.9), np.zeros(1000)) == pytest.approx(0.9)


def test_user_label_examples_zero_every_slot_at_or_after_a_must_ar_token(trained, tokenizer, tmp_path):
    model = trained
    K = model.config.block_size
    text = "def alpha_1(x):\n    return beta(x) + 1\n\ndef gamma_2(x):\n    return delta(x) + 2\n"
    start = text.index("beta")
    path = tmp_path / "labels.jsonl"
    path.write_text(json.dumps({"text": text, "ar_spans": [[start, start + 4]]}) + "\n")
    records = load_user_labels(path)
    enc = tokenizer.tokenizer.encode(text, add_special_tokens=False)
    forced = must_ar_tokens(enc.offsets, records[0][1])
    assert forced.any()
    assert "beta" in tokenizer.decode([i for i, f in zip(enc.ids, forced.tolist(), strict=True) if f])
    ex = user_label_examples(model, tokenizer.tokenizer, records)
    T = len(enc.ids)
    assert len(ex) == T - K
    without = user_label_examples(model, tokenizer.tokenizer, [(text, [])])
    n_covering = 0
    for t in range(T - K):
        covered = forced[t + 1 : t + 1 + K]
        n_covering += int(covered.any())
        # Exactly the unforced labels, cut at the first must-AR slot.
        expected = without.labels[t] * (covered.long().cumsum(0) == 0)
        assert torch.equal(ex.labels[t], expected)
    assert n_covering >= K


def test_load_user_labels_rejects_spans_outside_the_text(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"text": "abc", "ar_spans": [[1, 9]]}) + "\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        load_user_labels(path)


def test_train_router_end_to_end_saves_a_router_and_leaves_the_towers_alone(
    trained_model_dir, tokenizer, tmp_path
):
    torch.manual_seed(0)
    model = load_model(trained_model_dir)
    seqs = build_greedy_sequences(
        model, [list(range(5, 60))] * 4, 12, prompt_len=8, new_tokens=32, progress=False
    )
    data = seqs.save(tmp_path / "seqs.safetensors")
    out = tmp_path / "out"
    report = run_train_router(
        trained_model_dir, out, data=data, anchors_per_seq=16, cfg=RouterTrainConfig(epochs=3)
    )
    assert report["held_out_blocks"] > 0 and "router_auc" in report["held_out"]
    new = load_model(out)
    old_sd, new_sd = model.state_dict(), new.state_dict()
    for name in old_sd:
        same = torch.equal(old_sd[name], new_sd[name])
        assert same != name.startswith("router."), name
    assert json.loads((out / "router_report.json").read_text())["train_blocks"] == report["train_blocks"]


def test_user_label_finetune_raises_p_ar_on_marked_spans(trained_model_dir, tokenizer, tmp_path):
    # "return" is easy for the NAR set (it always follows "):\n    "), so marking it must-AR turns
    # blocks the towers accept into negatives: after fine-tuning, the router must lower a_i there.
    text = "".join(pattern_corpus(12, seed=3))
    spans, pos = [], 0
    while (i := text.find("return", pos)) >= 0:
        spans.append([i, i + len("return")])
        pos = i + 1
    unmarked, marked = tmp_path / "unmarked.jsonl", tmp_path / "marked.jsonl"
    unmarked.write_text(json.dumps({"text": text, "ar_spans": []}) + "\n")
    marked.write_text(json.dumps({"text": text, "ar_spans": spans}) + "\n")
    # 1. A router fitted to the towers' own acceptance on this text (nothing marked).
    fitted, tuned = tmp_path / "fitted", tmp_path / "tuned"
    run_train_router(
        trained_model_dir, fitted, user_labels=unmarked, held_out=0.0, cfg=RouterTrainConfig(epochs=40)
    )
    # 2. Fine-tuned on the marked spans.
    report = run_train_router(
        fitted, tuned, user_labels=marked, held_out=0.0, cfg=RouterTrainConfig(epochs=40, reinit=False)
    )
    assert report["held_out"]["router_bce"] < report["before"]["router_bce"]
    model = load_model(fitted)
    forced = user_label_examples(model, tokenizer.tokenizer, load_user_labels(marked))
    free = user_label_examples(model, tokenizer.tokenizer, load_user_labels(unmarked))
    flipped = (free.labels == 1) & (forced.labels == 0)
    assert flipped.sum() >= 5
    with torch.no_grad():
        a_fitted = Router.log_acceptance(model.router(forced.features)).exp()
        a_tuned = Router.log_acceptance(load_model(tuned).router(forced.features)).exp()
    assert float(a_tuned[flipped].mean()) < float(a_fitted[flipped].mean()) - 0.3
