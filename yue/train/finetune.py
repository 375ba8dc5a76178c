"""`yue finetune`: LoRA on the AR set (peft), then drafts refreshed for the adapted model (docs/design.md §3).

Stages, each measured on the user's own data:
  1. Base: masked AR loss, and mean accepted drafts per verifying step on prompts cut from the data.
  2. LoRA on the AR set's projections (`adapters.ar_target_regex`: never the `nar_` modules), AR
     cross-entropy on the tokens that carry loss (`finetune_data`). Seeded, warm-up + cosine
     (`trainer.lr_at`), atomic checkpoints of the LoRA tensors and optimizer (`trainer.py`), `--resume`,
     on one process or under `accelerate launch`.
  3. The adapter is saved (peft's files + the base's identity), merged into the AR set, and measured
     with the old drafts ("adapter, no refresh").
  4. Refresh: the adapted model writes AR-greedy continuations of prompts from the data; the NAR set
     is self-distilled on them (`selfdistill.finetune_nar`, AR frozen) and the router fine-tuned on the
     new acceptance labels (`router.train_router`). Saved as `drafts.safetensors`, which
     `adapters.apply_adapter` loads after merging, and measured again ("adapter, refreshed").

Design decisions:
- The drafts are refreshed on the merged model, computed exactly as `apply_adapter` will compute it,
  so the drafts trained are the drafts decoding meets.
- Measuring and refreshing the drafts live in `finetune_drafts.py`.
- A resumed run recomputes the base measurements (deterministic) and replays the remaining LoRA steps;
  the refresh keeps no checkpoints (minutes, seeded: a rerun gives the same weights).
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import PartialState
from safetensors.torch import save_file
from torch import nn
from tqdm.auto import tqdm

from yue.model.adapters import (
    DRAFTS_FILE,
    IDENTITY_FILE,
    apply_adapter,
    ar_target_regex,
    base_identity,
    draft_state,
)
from yue.model.mot import YueForCausalLM
from yue.tokenizer import YueTokenizer
from yue.train.checkpoint import latest_checkpoint
from yue.train.config import FinetuneConfig
from yue.train.finetune_data import TokenStream, read_finetune_data
from yue.train.finetune_drafts import accepted_drafts, measuring_prompts, refresh_drafts
from yue.train.trainer import (
    StageTimer,
    Trainer,
    append_jsonl,
    check_resume_settings,
    lr_at,
    make_accelerator,
)

log = logging.getLogger(__name__)

RESUME_FREE_FIELDS = frozenset({"threads", "save_every", "measure_prompts", "measure_tokens"})


# --------------------------------------------------------------------------------------------------
# Loss and acceptance


def masked_nll(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed next-token cross-entropy over the tokens that carry loss, and how many there were (tensor).

    Args:
        x: (B, T) tokens; target: (B, T) bool, True where token j is a target (predicted from x[:, :j]).
    """
    logits = model(x).logits[:, :-1]  # (B, T-1, V): position j predicts token j+1
    on = target[:, 1:]
    total = (
        F.cross_entropy(logits[on].float(), x[:, 1:][on], reduction="sum") if on.any() else logits.sum() * 0.0
    )
    return total, on.sum()


def masked_loss(model: nn.Module, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Mean next-token cross-entropy over the tokens that carry loss, and how many there were."""
    total, n = masked_nll(model, x, target)
    return total / n.clamp(min=1), int(n)


@torch.no_grad()
def eval_loss(model: nn.Module, stream: TokenStream, seq_len: int) -> float:
    """Masked AR loss over fixed windows of the stream (comparable before and after)."""
    was = model.training
    model.eval()
    x, target = stream.eval_windows(seq_len)
    total = count = 0.0
    for b in range(len(x)):
        loss, n = masked_loss(model, x[b : b + 1], target[b : b + 1])
        total, count = total + float(loss) * n, count + n
    model.train(was)
    return total / max(count, 1)


# --------------------------------------------------------------------------------------------------
# LoRA


class LoraTensors(nn.Module):
    """The LoRA parameters alone, as one module, so `checkpoint.py` saves them (not the whole model)."""

    def __init__(self, peft_model: nn.Module) -> None:
        super().__init__()
        for name, p in peft_model.named_parameters():
            if p.requires_grad:
                self.register_parameter(name.replace(".", "__"), p)


def wrap_lora(model: YueForCausalLM, cfg: FinetuneConfig):
    """A peft `PeftModel` with fresh LoRA on the AR set's projections (seeded: A is random, B zero)."""
    from peft import LoraConfig, get_peft_model

    for p in model.parameters():
        p.requires_grad_(False)
    torch.manual_seed(cfg.seed)
    config = LoraConfig(
        r=cfg.lora_r,
        lora_alpha=cfg.lora_alpha,
        lora_dropout=0.0,  # deterministic steps; the data is small and the run short
        target_modules=ar_target_regex(cfg.target_modules),
        bias="none",
    )
    return get_peft_model(model, config)


def check_resume_config(run_dir: Path, cfg: FinetuneConfig) -> None:
    """A resumed run must train with the same settings, or it would not reach the same adapter."""
    now = json.loads(json.dumps(asdict(cfg)))
    check_resume_settings(run_dir / "finetune_config.json", now, RESUME_FREE_FIELDS)


class LoraObjective(nn.Module):
    """The LoRA training forward as one module (what accelerate wraps): (x, target) -> masked_nll."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return masked_nll(self.net, x, target)


def train_lora(
    peft_model, stream: TokenStream, cfg: FinetuneConfig, run_dir: Path, resume: bool, progress: bool = True
) -> list[dict]:
    """LoRA steps [start, cfg.steps), checkpointed every `save_every`; returns the per-step log.

    Runs on one process or under `accelerate launch` (`cfg.batch_size` is the global batch)."""
    lora = LoraTensors(peft_model)
    net = peft_model.get_base_model()  # LoRA layers are injected in place: this forward runs them
    accelerator = make_accelerator(cpu=net.device.type == "cpu")
    if accelerator.is_main_process:
        run_dir.mkdir(parents=True, exist_ok=True)
        if resume and latest_checkpoint(run_dir) is not None:
            check_resume_config(run_dir, cfg)
        elif not resume and (run_dir / "checkpoints").exists():
            shutil.rmtree(run_dir / "checkpoints")  # a fresh run: an older run's steps must not be resumed
        (run_dir / "finetune_config.json").write_text(json.dumps(asdict(cfg), indent=2))
    accelerator.wait_for_everyone()
    trainer = Trainer(
        LoraObjective(net),
        list(lora.parameters()),
        cfg,
        cfg.batch_size,
        saved=lora,
        run_dir=run_dir,
        accelerator=accelerator,
    )
    start = trainer.resume()["step"] if resume else 0
    net.train()
    history = []
    bar = tqdm(total=cfg.steps, initial=start, desc="LoRA", disable=not (progress and trainer.is_main))
    t0 = time.perf_counter()
    for step in range(start, cfg.steps):
        x, target = stream.batch(step, cfg.batch_size, cfg.seq_len, cfg.seed)  # the global batch
        mine = trainer.rows()
        total, n = trainer.net(x[mine].to(net.device), target[mine].to(net.device))
        loss, value = trainer.global_mean(total, n)
        trainer.update(loss, step)
        done = step + 1
        rec = {
            "step": done,
            "loss": round(value, 5),
            "lr": lr_at(step, cfg),
            "targets": int(target[:, 1:].sum()),
        }
        history.append(rec)
        tok_s = (done - start) * x.numel() / max(time.perf_counter() - t0, 1e-9)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{tok_s:.0f}", refresh=False)
        bar.update(1)
        if trainer.is_main:
            append_jsonl(run_dir / "log.jsonl", rec)
        if done % cfg.save_every == 0 or done == cfg.steps:
            trainer.save(done, {"seed": cfg.seed})
    bar.close()
    net.eval()
    return history


def save_adapter(peft_model, out_dir: Path, identity: dict) -> None:
    """peft's adapter files plus the base's identity, each replaced atomically (temp folder, rename)."""
    tmp = out_dir / ".tmp-adapter"
    shutil.rmtree(tmp, ignore_errors=True)
    peft_model.save_pretrained(str(tmp))
    (tmp / IDENTITY_FILE).write_text(json.dumps(identity, indent=1))
    for file in sorted(tmp.iterdir()):
        file.replace(out_dir / file.name)
    tmp.rmdir()
    (out_dir / DRAFTS_FILE).unlink(missing_ok=True)  # drafts of an earlier adapter no longer apply


# --------------------------------------------------------------------------------------------------
# End to end


def load_base(model: str | Path | None) -> tuple[YueForCausalLM, YueTokenizer, Path]:
    """The base model as loaded (trainable, not prepared for decoding), its tokenizer and the folder
    holding its chat template (a name, folder or GGUF, as `yue.load` takes it)."""
    from yue.engine import load_unprepared

    net, tokenizer, files = load_unprepared(model)
    return net, tokenizer, files.yue_dir or files.tokenizer_dir


def save_drafts(model: YueForCausalLM, out_dir: Path, base_digest: str) -> None:
    """The refreshed drafts (NAR set and router, `adapters.draft_state`) as `drafts.safetensors`,
    tagged with the digest of the base they were trained for, replaced atomically (temp file, rename)."""
    tmp = out_dir / f".tmp-{DRAFTS_FILE}"
    save_file(draft_state(model), str(tmp), metadata={"base": base_digest})
    tmp.replace(out_dir / DRAFTS_FILE)


def refreshed_over_base(accepted: dict) -> dict[str, float | None]:
    """Mean accepted drafts with the refreshed drafts over the base's, drafting every slot and as the
    router chooses (None where either was not measured or the base accepted none)."""
    base, refreshed = accepted["base"], accepted["adapter_refreshed"]

    def ratio(label: str) -> float | None:
        if refreshed is None or base is None or not base[label]["mean_accepted"]:
            return None
        return round(refreshed[label]["mean_accepted"] / base[label]["mean_accepted"], 4)

    return {label: ratio(label) for label in ("every_slot", "router")}


def finetune(
    model: str | Path | None,
    data: str | Path,
    out_dir: str | Path,
    cfg: FinetuneConfig = FinetuneConfig(),
    resume: bool = False,
    command: str = "",
    progress: bool = True,
) -> dict:
    """Run `yue finetune` end to end; returns the report (also `out_dir/finetune_report.json`)."""
    from yue.chat import ChatTemplate, find_chat_template

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    timer = StageTimer()
    base, tokenizer, folder = load_base(model)
    stream = TokenStream.build(read_finetune_data(data, ChatTemplate(find_chat_template(folder))), tokenizer)
    prompts = measuring_prompts(stream, cfg, tokenizer.eos_id)
    identity = base_identity(base, name=folder.name)
    # A model without a NAR set (`nar_layers` 0: a plain Llama as the AR set) has no drafts to measure
    # or refresh: it gets the LoRA alone.
    has_drafts = getattr(base.config, "nar_layers", None) != 0

    def measure(model: YueForCausalLM) -> dict | None:
        return accepted_drafts(model, prompts, cfg.measure_tokens) if has_drafts else None

    # 1. The base, on the user's data.
    loss_before = eval_loss(base, stream, cfg.seq_len)
    accepted = {"base": measure(base)}
    timer.mark("measure_base_s")
    # 2-3. LoRA, saved, merged, measured with the old drafts.
    peft_model = wrap_lora(base, cfg)
    history = train_lora(peft_model, stream, cfg, out_dir / "run", resume, progress)
    timer.mark("lora_s")
    # Under `accelerate launch` every process holds the same weights from here on; one writes them.
    main = PartialState().is_main_process
    loss_after = eval_loss(peft_model.get_base_model(), stream, cfg.seq_len)
    if main:
        save_adapter(peft_model, out_dir, identity)
    adapted = peft_model.merge_and_unload().eval()
    accepted["adapter_no_refresh"] = measure(adapted)
    timer.mark("measure_adapter_s")
    # 4. Refresh the drafts for the adapted model.
    refresh = accepted["adapter_refreshed"] = None
    if cfg.refresh_steps > 0 and has_drafts:
        refresh = refresh_drafts(adapted, stream, cfg, progress)
        if main:
            save_drafts(adapted, out_dir, identity["digest"])
        timer.mark("refresh_s")
        accepted["adapter_refreshed"] = measure(adapted)
        timer.mark("measure_refreshed_s")
    report = {
        "model": str(folder),
        "base_digest": identity["digest"],
        "data": str(data),
        "command": command,
        "config": asdict(cfg),
        "data_tokens": len(stream),
        "target_tokens": int(stream.target.sum()),
        "loss_before": round(loss_before, 4),
        "loss_after": round(loss_after, 4),
        "first_step_loss": history[0]["loss"] if history else None,
        "last_step_loss": history[-1]["loss"] if history else None,
        "measure": {"prompts": len(prompts), "new_tokens": cfg.measure_tokens, "mode": "verified, greedy"},
        "accepted_drafts": accepted,
        "refreshed_over_base": refreshed_over_base(accepted),
        "refresh": refresh,
        "timings": timer.marks,
    }
    if main:
        (out_dir / "finetune_report.json").write_text(json.dumps(report, indent=2))
    return report


def merge_to_folder(model: str | Path | None, adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """`yue merge`: the base model (a name, folder or GGUF) with the adapter folded in, as a
    standalone model folder. Non-weight files of the base (chat template, generation config, model
    card) are copied."""
    from yue.engine import load_unprepared  # the engine layer's loader: merging is a user command
    from yue.train.selfdistill import save_model_folder

    base, tokenizer, files = load_unprepared(model)
    src = files.yue_dir or files.tokenizer_dir
    out_dir = Path(out_dir)
    if out_dir.resolve() == Path(src).resolve():
        raise ValueError(f"out must differ from the base model folder ({src})")
    merged = apply_adapter(base, adapter_dir)
    save_model_folder(merged, tokenizer.tokenizer, out_dir, src_dir=src)
    for folder in {Path(src), Path(files.tokenizer_dir)}:
        for file in ("chat_template.jinja", "tokenizer_config.json", "generation_config.json"):
            if (folder / file).is_file() and not (out_dir / file).exists():
                shutil.copy(folder / file, out_dir / file)
    (out_dir / "merged_from.json").write_text(
        json.dumps({"base": str(model), "adapter": str(adapter_dir)}, indent=2)
    )
    return out_dir
