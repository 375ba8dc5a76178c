"""The drafts of an adapted model: how many are accepted on the user's data, and refreshing them.

Design decisions:
- Acceptance is measured as a user meets it: a copy prepared for decoding (`yue.load`'s drafting
  precision) in greedy `verified` mode, as it runs by default (threshold 1: the router unasked, draft
  lengths by the request's acceptance record) and router-gated at ROUTER_GATE (the router decides how
  many are drafted).
  Greedy `verified` output equals `ar` output, so these are speed figures only.
- The refresh is stages 2 and 3 of docs/design.md §3 on the adapted model: AR-greedy continuations of prompts
  cut from the user's data, NAR self-distillation on them (`selfdistill.finetune_nar`, AR frozen), and
  the router fine-tuned (not re-initialised: the data is small) on the new acceptance labels.
"""

from __future__ import annotations

import copy

import torch

from yue.config import DecodeConfig
from yue.decode.loop import decode
from yue.kernels import prepare_for_decoding
from yue.kernels.prepare import resolve_drafting_dtype
from yue.model.mot import YueForCausalLM
from yue.train.config import FinetuneConfig
from yue.train.finetune_data import TokenStream

# `verified`'s router gate for the "router" figure: a mid value (the model's `router_threshold` is
# `hybrid`'s acceptance tolerance, another dial).
ROUTER_GATE = 0.5


def prompt_length(stream: TokenStream, wanted: int) -> int:
    """`wanted`, or less when no document is twice that long (prompts must leave room in a document)."""
    return min(wanted, max(len(d) for d in stream.documents) // 2) or 1


def measuring_prompts(stream: TokenStream, cfg: FinetuneConfig, eos_id: int) -> list[list[int]]:
    """`measure_prompts` prompts from the data, each `<|eos|>` + a window (as `Engine.encode` prompts)."""
    from yue.train.selfdistill import sample_prompts

    n = prompt_length(stream, cfg.prompt_len)
    return [[eos_id, *p] for p in sample_prompts(stream.documents, cfg.measure_prompts, n, cfg.seed + 7)]


@torch.no_grad()
def accepted_drafts(model: YueForCausalLM, prompts: list[list[int]], new_tokens: int) -> dict:
    """Mean accepted drafts per verifying step in greedy `verified` mode: as it runs by default (threshold 1,
    the router unasked) and with the router choosing how many (gated at ROUTER_GATE).

    A verifying step is one that drafted at least one slot; "per forward" counts every forward,
    drafting passes included.
    """
    drafter = prepare_for_decoding(copy.deepcopy(model), resolve_drafting_dtype("auto", model.device))
    out = {}
    for label, threshold in (("every_slot", None), ("router", ROUTER_GATE)):
        cfg = DecodeConfig(mode="verified", max_new_tokens=new_tokens, router_threshold=threshold)
        cfg = cfg.resolved(model.config)
        steps = accepted = tokens = forwards = 0
        for p in prompts:
            for em in decode(drafter, [p], cfg):
                steps += em.drafted[0] > 0
                accepted += em.accepted[0]
                tokens += len(em.tokens[0])
                forwards += em.forwards
        out[label] = {
            "mean_accepted": round(accepted / max(steps, 1), 4),
            "verifying_steps": steps,
            "tokens_per_forward": round(tokens / max(forwards, 1), 4),
        }
    return out


def refresh_drafts(
    model: YueForCausalLM, stream: TokenStream, cfg: FinetuneConfig, progress: bool = True
) -> dict:
    """Self-distil the NAR set and fine-tune the router on the adapted model's greedy outputs, in place."""
    from yue.train.router import RouterTrainConfig, greedy_examples, train_router
    from yue.train.router_eval import evaluate_router
    from yue.train.selfdistill import NARFinetuneConfig, build_greedy_sequences, finetune_nar, nar_accuracy

    n = prompt_length(stream, cfg.prompt_len)
    seqs = build_greedy_sequences(
        model, stream.documents, cfg.refresh_sequences, n, cfg.new_tokens, seed=cfg.seed, progress=progress
    )
    if model.config.nar_start > 0:
        return refresh_top_nar(model, seqs, cfg, progress)
    train, held = seqs.split(0.1)
    acc_before = nar_accuracy(model, held, reveal_first=True)
    nar_cfg = NARFinetuneConfig(
        steps=cfg.refresh_steps,
        batch_size=8,
        anchors=16,
        warmup_steps=min(10, cfg.refresh_steps),
        seed=cfg.seed,
    )
    finetune_nar(model, train, nar_cfg, progress=progress)
    acc_after = nar_accuracy(model, held, reveal_first=True)
    # Router: labels from the refreshed drafts, drafted as decoding drafts them (prepared copy).
    for p in model.parameters():
        p.requires_grad_(False)
    drafter = prepare_for_decoding(copy.deepcopy(model), resolve_drafting_dtype("auto", model.device))
    examples = greedy_examples(drafter, seqs.tokens, seqs.prompt_len, anchors_per_seq=32, seed=cfg.seed)
    r_train, r_held = examples.split_by_group(0.2, seed=cfg.seed)
    r_before = evaluate_router(model.router, r_held)
    train_router(
        model.router, r_train, RouterTrainConfig(epochs=cfg.router_epochs, reinit=False, seed=cfg.seed)
    )
    r_after = evaluate_router(model.router, r_held)
    for p in model.parameters():
        p.requires_grad_(True)
    model.eval()

    def nan_free(values: list[float]) -> list[float | None]:
        return [None if v != v else round(v, 4) for v in values]

    return {
        "sequences": len(seqs.tokens),
        "nar_acc_slot1_revealed_before": nan_free(acc_before),
        "nar_acc_slot1_revealed_after": nan_free(acc_after),
        "router_held_out_before": r_before,
        "router_held_out_after": r_after,
    }


def refresh_top_nar(model: YueForCausalLM, seqs, cfg: FinetuneConfig, progress: bool = True) -> dict:
    """`refresh_drafts` for a NAR set on the top layers only (yue-smol): the same data, trained the way
    `topnar.py` trains it (cached entry features of the adapted AR path), and the router after it."""
    from yue.train.router import RouterTrainConfig, train_router
    from yue.train.router_eval import evaluate_router
    from yue.train.topnar import (
        ChatSequences,
        TopNARConfig,
        entry_features,
        held_out_tau,
        router_examples,
        train_top_nar,
    )

    for p in model.parameters():
        p.requires_grad_(False)
    rows = [row.tolist() for row in seqs.tokens]
    train, held = ChatSequences(rows, [seqs.prompt_len] * len(rows)).split(max(2, len(rows) // 10))
    f_train, f_held = (
        entry_features(model, train, progress=progress),
        entry_features(model, held, progress=progress),
    )
    before = held_out_tau(model, held, f_held)
    steps = max(cfg.refresh_steps, 1)
    top_cfg = TopNARConfig(
        steps=steps,
        batch_size=8,
        anchors=16,
        lr=3e-4,
        warmup_steps=min(10, steps),
        eval_every=steps,
        seed=cfg.seed,
    )
    history = train_top_nar(model, train, f_train, held, f_held, top_cfg, progress=progress)
    examples = router_examples(model, held, f_held)
    r_train, r_held = examples.split_by_group(0.2, seed=cfg.seed)
    r_before = evaluate_router(model.router, r_held if len(r_held) else r_train)
    train_router(
        model.router, r_train, RouterTrainConfig(epochs=cfg.router_epochs, reinit=False, seed=cfg.seed)
    )
    r_after = evaluate_router(model.router, r_held if len(r_held) else r_train)
    for p in model.parameters():
        p.requires_grad_(True)
    model.eval()
    return {
        "sequences": len(rows),
        "held_out_tau_before": before,
        "held_out_tau_after": history[-1],
        "router_held_out_before": r_before,
        "router_held_out_after": r_after,
    }
