"""`TrainConfig` (a training run) and `FinetuneConfig` (a LoRA fine-tune): every knob typed, validated
once, saved as JSON beside the run.

Bad values raise `ValueError` naming the field (the CLI turns that into a one-line error, exit 2).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal, get_args

from yue.config import LayerRouting, YueConfig
from yue.model.adapters import AR_PROJECTIONS, ar_target_regex
from yue.train.losses import LossWeights

TrainSet = Literal["all", "nar"]
Objective = Literal["joint", "anchor"]


@dataclass(frozen=True)
class TrainConfig:
    """One training run (`yue train`'s options). Shapes of the model are only used when no `init` model is given.

    Attributes:
        corpus: 'stdlib', a .jsonl / text file, or a folder of source files.
        out: run folder: checkpoints, log.jsonl, token cache, final model in OUT/model.
        tokenizer: tokenizer.json (default: trained on the corpus's train split).
        vocab_size: vocabulary size when the tokenizer is trained here.
        init: start from this model folder (stage 2); default: a random init.
        train_set: 'all' = stage 1, joint; 'nar' = stage 2, the NAR set only, the AR set frozen.
        steps: optimizer steps.
        seq_len: tokens per training sequence.
        batch_size: sequences per step, over all processes (each takes an equal share).
        lr: peak learning rate (warm-up, then cosine).
        min_lr_ratio: the cosine decays to lr * min_lr_ratio.
        warmup_steps: linear warm-up steps.
        weight_decay: AdamW's weight decay.
        grad_clip: gradients clipped to this global norm.
        betas: AdamW's (beta1, beta2).
        block_size: K: slots per NAR block.
        anchors: M: NAR blocks per sequence.
        alpha: weight of the AR cross-entropy (docs/design.md §3).
        beta: weight of the NAR cross-entropy.
        gamma: weight of KL(sg(p_AR) || p_NAR).
        reveal_prob: chance a slot sees its true token (mask-predict).
        objective: 'joint', or 'anchor' (experiment of issue 47: the NAR blocks fill the gap after an
            anchor span, everything else masked, plus the anchor-count head, `train/anchor.py`).
        anchor_bias: objective 'anchor': the fill's attention pull toward the anchors per unit of confidence.
        layer_routing: 'type', or 'four-expert' (experiment of issue 47: a per-layer top-2 router over AR,
            NAR, fused and fallback MLP experts, `model/experts.py`; random init only).
        expert_stick: four-expert: logit bonus for the expert taken at the layer below.
        hidden_size: model width (random init only, as the shapes below).
        layers: transformer layers.
        heads: attention heads.
        kv_heads: key/value heads (grouped-query attention).
        intermediate_size: MLP width.
        max_position_embeddings: longest sequence the model takes.
        val_fraction: share of files held out, split by hash of the file name.
        eval_every: evaluate every N steps.
        eval_batches: validation batches per evaluation.
        save_every: checkpoint every N steps.
        log_every: log every N steps.
        keep_checkpoints: checkpoints kept in OUT (the latest ones).
        seed: seed for init, data order, anchors.
        threads: torch intra-op threads (default: torch's choice).
    """

    corpus: str = "stdlib"
    out: str = "runs/yue"
    tokenizer: str | None = None
    vocab_size: int = 8192
    init: str | None = None
    train_set: TrainSet = "all"
    # Optimisation.
    steps: int = 1000
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    betas: tuple[float, float] = (0.9, 0.95)
    # Joint loss (docs/design.md §3).
    block_size: int = 8
    anchors: int = 8
    alpha: float = 1.0
    beta: float = 0.8
    gamma: float = 0.2
    reveal_prob: float = 0.1
    # Experiments of issue 47.
    objective: Objective = "joint"
    anchor_bias: float = 1.0
    layer_routing: LayerRouting = "type"
    expert_stick: float = 0.0
    # Model shape (random init only).
    hidden_size: int = 256
    layers: int = 4
    heads: int = 8
    kv_heads: int = 4
    intermediate_size: int = 688
    max_position_embeddings: int = 1024
    # Bookkeeping.
    val_fraction: float = 0.02
    eval_every: int = 200
    eval_batches: int = 8
    save_every: int = 200
    log_every: int = 10
    keep_checkpoints: int = 2
    seed: int = 0
    threads: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):
            object.__setattr__(self, "betas", tuple(self.betas))
        positive = [
            "steps",
            "seq_len",
            "batch_size",
            "block_size",
            "anchors",
            "hidden_size",
            "layers",
            "heads",
            "kv_heads",
            "intermediate_size",
            "max_position_embeddings",
            "eval_every",
            "eval_batches",
            "save_every",
            "log_every",
            "keep_checkpoints",
            "vocab_size",
        ]
        for name in positive:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.train_set not in get_args(TrainSet):
            raise ValueError(f"train_set must be one of {get_args(TrainSet)}, got {self.train_set!r}")
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        if not (self.lr > 0 and self.lr < 1):
            raise ValueError(f"lr must be in (0, 1), got {self.lr!r}")
        for name in ("min_lr_ratio", "reveal_prob"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not self.grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0, got {self.grad_clip!r}")
        if not all(0.0 <= b < 1.0 for b in self.betas) or len(self.betas) != 2:
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        for name, v in (("alpha", self.alpha), ("beta", self.beta), ("gamma", self.gamma)):
            if not v >= 0:
                raise ValueError(f"{name} must be >= 0, got {v!r}")
        if self.alpha == self.beta == self.gamma == 0:
            raise ValueError("alpha, beta and gamma cannot all be 0")
        if self.train_set == "nar" and self.init is None:
            raise ValueError("init must name a model folder when train_set is 'nar' (the AR set to keep)")
        if self.seq_len <= self.block_size:
            raise ValueError(f"seq_len must exceed block_size ({self.block_size}), got {self.seq_len}")
        if self.seq_len > self.max_position_embeddings:
            raise ValueError(f"seq_len must be <= max_position_embeddings {self.max_position_embeddings}")
        if self.hidden_size % self.heads:
            raise ValueError(f"heads must divide hidden_size {self.hidden_size}, got {self.heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"kv_heads must divide heads {self.heads}, got {self.kv_heads}")
        if self.objective not in get_args(Objective):
            raise ValueError(f"objective must be one of {get_args(Objective)}, got {self.objective!r}")
        if self.layer_routing not in get_args(LayerRouting):
            raise ValueError(
                f"layer_routing must be one of {get_args(LayerRouting)}, got {self.layer_routing!r}"
            )
        if self.layer_routing != "type" and self.init is not None:
            raise ValueError("layer_routing 'four-expert' trains from a random init (init must be None)")
        if not (self.anchor_bias >= 0 and self.expert_stick >= 0):
            raise ValueError("anchor_bias and expert_stick must be >= 0")
        if self.objective == "anchor" and self.seq_len < 96:
            raise ValueError(
                f"objective 'anchor' needs seq_len >= 96 (its count head's window), got {self.seq_len}"
            )
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads!r}")

    @property
    def loss_weights(self) -> LossWeights:
        return LossWeights(ar=self.alpha, nar=self.beta, kl=self.gamma)

    def model_config(self, vocab_size: int) -> YueConfig:
        """The `YueConfig` of a freshly initialised model with this run's shapes."""
        return YueConfig(
            vocab_size=vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.layers,
            num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads,
            max_position_embeddings=self.max_position_embeddings,
            block_size=self.block_size,
            loss_weights=self.loss_weights.as_dict(),
            layer_routing=self.layer_routing,
            expert_stick=self.expert_stick,
            anchor_head=self.objective == "anchor",
            anchor_bias=self.anchor_bias if self.objective == "anchor" else 0.0,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, path: str | Path) -> TrainConfig:
        data = json.loads(Path(path).read_text())
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class FinetuneConfig:
    """One `yue finetune` run (its options). Defaults: a few minutes on one CPU core for yue-code-mini.

    Attributes:
        steps: LoRA optimizer steps.
        lr: peak LoRA learning rate (warm-up, then cosine); LoRA's B starts at 0, so the adapted model
            starts as the base.
        batch_size: windows per step.
        seq_len: tokens per window (shorter data: the whole stream).
        warmup_steps: linear warm-up steps.
        min_lr_ratio: the cosine decays to lr * min_lr_ratio.
        weight_decay: AdamW's weight decay.
        grad_clip: gradients clipped to this global norm.
        lora_r: LoRA rank.
        lora_alpha: LoRA scale numerator (scale = alpha / r).
        target_modules: AR-set projections to adapt (Llama names; repeatable on the command line): q_proj
            k_proj v_proj o_proj gate_proj up_proj down_proj (default: all seven). The NAR set's `nar_`
            modules are never targeted.
        refresh_steps: NAR self-distillation steps on the adapted model's outputs (0: keep the old drafts).
        refresh_sequences: AR-greedy sequences the refresh trains on.
        prompt_len: prompt tokens of those sequences and of the measuring prompts.
        new_tokens: greedy tokens per refresh sequence.
        router_epochs: router fine-tuning epochs on the refreshed drafts' labels.
        measure_prompts: prompts for the accepted-drafts figures.
        measure_tokens: tokens generated per measuring prompt.
        save_every: checkpoint every N LoRA steps.
        seed: seed for LoRA init, windows, prompts and the refresh.
        threads: torch intra-op threads (default: torch's choice).
    """

    steps: int = 150
    lr: float = 2e-3
    batch_size: int = 8
    seq_len: int = 256
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    lora_r: int = 8
    lora_alpha: float = 16.0
    target_modules: tuple[str, ...] = AR_PROJECTIONS
    refresh_steps: int = 100
    refresh_sequences: int = 48
    prompt_len: int = 32
    new_tokens: int = 96
    router_epochs: int = 10
    measure_prompts: int = 8
    measure_tokens: int = 64
    save_every: int = 50
    seed: int = 0
    threads: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_modules", tuple(self.target_modules))
        ar_target_regex(self.target_modules)  # unknown names: ValueError naming them
        for name in ("steps", "batch_size", "seq_len", "lora_r", "refresh_sequences", "prompt_len"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("new_tokens", "measure_prompts", "measure_tokens", "save_every", "router_epochs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        for name in ("warmup_steps", "refresh_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr!r}")
        if not self.lora_alpha > 0:
            raise ValueError(f"lora_alpha must be > 0, got {self.lora_alpha!r}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio!r}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads!r}")
