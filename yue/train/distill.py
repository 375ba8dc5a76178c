"""`yue distill`: put a NAR set and a router onto an existing Llama-family checkpoint (docs/design.md §3).

Design decisions:
- The base is read from a local folder, safetensors only (`check_checkpoint` refuses pickle), and
  must be plain Llama: same module names, no attention/MLP biases, default RoPE. Anything else fails
  up front with the reason, rather than importing silently wrong weights.
- The base's `tokenizer.json` is the tokenizer. If it lacks `<|mask|>`, the token is added and the
  embedding (and an untied head) grow by one row: existing rows are untouched, so the AR logits of
  every real token are unchanged (tested).
- The AR set, embedding, final norm and head stay frozen; only the NAR set (initialised as a copy of
  the AR set by `from_llama`) trains, by self-distillation on the base's own greedy outputs
  (`selfdistill.py`); then the router trains on acceptance labels (`router.py`), on greedy
  continuations of held-out (validation-split) prompts.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from accelerate import PartialState
from tokenizers import AddedToken, Tokenizer
from transformers import AutoConfig, LlamaForCausalLM

from yue.model.hf import CheckpointError, check_checkpoint, check_llama, from_llama
from yue.model.mot import YueForCausalLM
from yue.tokenizer import MASK
from yue.train.router import RouterTrainConfig, greedy_examples, train_router
from yue.train.router_eval import evaluate_router, format_report
from yue.train.selfdistill import (
    NARFinetuneConfig,
    build_greedy_sequences,
    corpus_documents,
    finetune_nar,
    nar_accuracy,
    save_model_folder,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistillConfig:
    """Settings of `yue distill`. The NAR and router sub-configs keep their own defaults."""

    corpus: str = "stdlib"  # prompts are cut from this corpus ('stdlib', a file or a folder)
    block_size: int = 8  # K of the new NAR set
    sequences: int = 256  # AR-greedy sequences for NAR self-distillation (train split)
    router_sequences: int = 96  # AR-greedy sequences for router labels (validation split)
    prompt_len: int = 64
    new_tokens: int = 192
    gen_batch_size: int = 16
    anchors_per_seq: int = 48  # router-label blocks per sequence
    val_fraction: float = 0.02
    seed: int = 0
    nar: NARFinetuneConfig = field(default_factory=NARFinetuneConfig)
    router: RouterTrainConfig = field(default_factory=RouterTrainConfig)

    def __post_init__(self) -> None:
        for name in (
            "block_size",
            "sequences",
            "router_sequences",
            "prompt_len",
            "new_tokens",
            "gen_batch_size",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.new_tokens <= self.block_size:
            raise ValueError(f"new_tokens must exceed block_size {self.block_size}, got {self.new_tokens}")


def load_llama(base_dir: str | Path) -> LlamaForCausalLM:
    """Load a plain Llama checkpoint (safetensors only) in float32, or raise naming what is unsupported."""
    base = check_checkpoint(base_dir)
    check_llama(AutoConfig.from_pretrained(str(base)), base)
    try:
        llama = LlamaForCausalLM.from_pretrained(str(base), use_safetensors=True, dtype=torch.float32)
    except (OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"could not load the Llama checkpoint in {base}: {e}") from e
    return llama.eval()


def tokenizer_with_mask(base_dir: str | Path) -> tuple[Tokenizer, int]:
    """The base's tokenizer.json, with `<|mask|>` added as a special token if missing. Returns (tokenizer, mask id)."""
    file = Path(base_dir) / "tokenizer.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found: distill needs the base's tokenizer to cut prompts")
    tok = Tokenizer.from_file(str(file))
    if tok.token_to_id(MASK) is None:
        tok.add_special_tokens([AddedToken(MASK, special=True, normalized=False)])
    return tok, tok.token_to_id(MASK)


def make_yue(llama: LlamaForCausalLM, mask_id: int, block_size: int) -> YueForCausalLM:
    """The yue model over `llama`: grow the vocabulary to hold `mask_id` if needed, then `from_llama`."""
    vocab = llama.get_input_embeddings().weight.shape[0]
    if mask_id >= vocab:
        # New rows only: the logits of the existing tokens are untouched.
        llama.resize_token_embeddings(mask_id + 1, mean_resizing=False)
        with torch.no_grad():  # a mask embedding at the mean of the vocabulary's; NAR training adapts to it
            emb = llama.get_input_embeddings().weight
            emb[vocab:] = emb[:vocab].mean(0)
            head = llama.get_output_embeddings().weight
            if head.data_ptr() != emb.data_ptr():
                head[vocab:] = 0.0
    return from_llama(llama, block_size=block_size, mask_token_id=mask_id).eval()


def distill(base_dir: str | Path, out_dir: str | Path, cfg: DistillConfig = DistillConfig()) -> dict:
    """Llama checkpoint -> yue model with a self-distilled NAR set and a trained router, saved to `out_dir`.

    Returns the report (also written to `out_dir/distill_report.json`).
    """
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    tok, mask_id = tokenizer_with_mask(base_dir)
    model = make_yue(load_llama(base_dir), mask_id, cfg.block_size)
    for p in model.parameters():
        p.requires_grad_(False)
    report: dict = {"base": str(base_dir), "config": asdict(cfg), "mask_token_id": mask_id}

    # 1. AR-greedy corpus from the base (train split) and NAR-only self-distillation.
    train_docs = corpus_documents(cfg.corpus, tok, "train", cfg.val_fraction)
    seqs = build_greedy_sequences(
        model, train_docs, cfg.sequences, cfg.prompt_len, cfg.new_tokens, cfg.gen_batch_size, cfg.seed
    )
    report["nar_acc_before"] = nar_accuracy(model, seqs)
    history = finetune_nar(model, seqs, cfg.nar)
    report["nar_acc_after_train_seqs"] = nar_accuracy(model, seqs)
    report["nar_final_loss"] = history[-1]["loss"]

    # 2. Router on acceptance labels of greedy continuations of held-out prompts.
    val_docs = corpus_documents(cfg.corpus, tok, "validation", cfg.val_fraction) or train_docs
    router_seqs = build_greedy_sequences(
        model,
        val_docs,
        cfg.router_sequences,
        cfg.prompt_len,
        cfg.new_tokens,
        cfg.gen_batch_size,
        cfg.seed + 1,
    )
    report["nar_acc_held_out"] = nar_accuracy(model, router_seqs)
    examples = greedy_examples(
        model, router_seqs.tokens, router_seqs.prompt_len, cfg.anchors_per_seq, seed=cfg.seed
    )
    train, held = examples.split_by_group(0.2, seed=cfg.seed)
    train_router(model.router, train, cfg.router)
    report["router"] = evaluate_router(model.router, held if len(held) else train)
    log.info("router on held-out blocks:\n%s", format_report(report["router"]))

    for p in model.parameters():
        p.requires_grad_(True)
    if not PartialState().is_main_process:  # under `accelerate launch`: the main process writes
        return report
    save_model_folder(model, tok, out_dir)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    (Path(out_dir) / "distill_report.json").write_text(json.dumps(report, indent=2))
    return report
