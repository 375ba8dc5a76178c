"""`yue distill-recipe`: the two explicit recipes behind `yue distill`, every setting by hand.

Design decisions:
- One flat, typed settings object (`RecipeConfig`, the command's options) serves both recipes: a NAR
  set on every layer (`distill.py`, how yue-code-mini was made), or with `nar_layers` one on the top N
  layers only, trained on cached features (`topnar_run.py`, how yue-smol was made). Each recipe reads
  the fields it uses; the docstring says which.
- Its defaults are the command's, and the recipes' own configs (`DistillConfig`, `TopNARRecipe`) are
  built from it in one place each, so a bad value fails at once, naming the field, before any model
  or GGUF file is read.
- A rerun of the same settings resumes: greedy answers and training checkpoints stay in OUT/work.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from yue.train.distill import DistillConfig
from yue.train.selfdistill import NARFinetuneConfig
from yue.train.topnar import TopNARConfig
from yue.train.topnar_run import TopNARRecipe


@dataclass(frozen=True)
class RecipeConfig:
    """`yue distill-recipe`'s settings. Validated once, by the recipe's own config; bad values name the field.

    Attributes:
        nar_layers: put the NAR set on the top N layers only (slots enter there from the anchor's hidden
            state), trained on cached features: the recipe for a large pretrained model (yue-smol: 4);
            default: a NAR set on every layer.
        prompts: nar_layers only: chat prompts to self-distill on: a JSONL of {'messages'} / {'prompt'},
            'stdlib:N' (standard-library questions, train split), 'model:N' (written by the model itself) or
            'everyday:N' (everyday requests from templates).
        draft_vocab: nar_layers only: drafting vocabulary size (FR-Spec).
        held_out: nar_layers only: answers held out for tau and the router.
        anchors: nar_layers only: blocks per sequence per step.
        init_from: nar_layers only: continue from this yue folder's NAR set (a further round).
        extra_sequences: nar_layers only: an earlier round's work/sequences.json to train on too.
        device: nar_layers only: cpu or cuda.
        corpus: 'stdlib', a .jsonl / text file, or a folder: where prompts come from.
        steps: NAR self-distillation steps.
        sequences: AR-greedy sequences for NAR self-distillation.
        router_sequences: AR-greedy sequences (held-out prompts) for router labels.
        block_size: K: slots per NAR block.
        prompt_len: prompt tokens per sequence.
        new_tokens: greedy tokens per sequence (nar_layers: at most).
        batch_size: sequences per NAR training step.
        lr: peak NAR learning rate.
        seed: seed for prompts, anchors and init.
        threads: torch threads (default: torch's choice).
    """

    nar_layers: int | None = None
    prompts: str = "stdlib:8448"
    draft_vocab: int = 8192
    held_out: int = 256
    anchors: int = 32
    init_from: str | None = None
    extra_sequences: tuple[str, ...] = ()
    device: str = "cpu"
    corpus: str = "stdlib"
    steps: int = 300
    sequences: int = 256
    router_sequences: int = 96
    block_size: int = 8
    prompt_len: int = 64
    new_tokens: int = 192
    batch_size: int = 8
    lr: float = 1e-3
    seed: int = 0
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.nar_layers is not None:  # the recipe's own config checks the values
            self.top_nar()
        else:
            self.every_layer()

    def top_nar(self) -> TopNARRecipe:
        """The top-layer recipe's config (`nar_layers` given)."""
        return TopNARRecipe(
            nar_layers=self.nar_layers,
            block_size=self.block_size,
            draft_vocab_size=self.draft_vocab,
            max_new_tokens=self.new_tokens,
            held_out=self.held_out,
            train=TopNARConfig(
                steps=self.steps, batch_size=self.batch_size, anchors=self.anchors, lr=self.lr, seed=self.seed
            ),
        )

    def every_layer(self) -> DistillConfig:
        """The every-layer recipe's config (no `nar_layers`)."""
        return DistillConfig(
            corpus=self.corpus,
            block_size=self.block_size,
            sequences=self.sequences,
            router_sequences=self.router_sequences,
            prompt_len=self.prompt_len,
            new_tokens=self.new_tokens,
            seed=self.seed,
            nar=NARFinetuneConfig(steps=self.steps, batch_size=self.batch_size, lr=self.lr, seed=self.seed),
        )


def distill_recipe(base: str, out: str | Path, cfg: RecipeConfig) -> dict:
    """Run the recipe `cfg` names on `base` (module docstring), writing the model folder `out`; returns
    the recipe's report."""
    import torch

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    if cfg.nar_layers is None:
        from yue.train.distill import distill

        return distill(Path(base), out, cfg.every_layer())
    from yue.train.topnar_run import distill_top_nar, top_nar_base

    base_dir, source = top_nar_base(base)
    chats = chat_prompts(cfg.prompts, base, cfg.seed)
    return distill_top_nar(
        base_dir,
        chats,
        out,
        cfg.top_nar(),
        source,
        cfg.device,
        init_from=cfg.init_from,
        extra_sequences=cfg.extra_sequences,
    )


def chat_prompts(spec: str, base: str, seed: int) -> list[list[dict]]:
    """`RecipeConfig.prompts`: a JSONL file, 'stdlib:N', 'model:N' or 'everyday:N'."""
    kind, _, n = spec.partition(":")
    if kind in ("stdlib", "model", "everyday") and n.isdigit():
        if kind == "stdlib":
            from yue.train.prompts import stdlib_chat_prompts

            return stdlib_chat_prompts(int(n), seed=seed, split="train")
        from yue.bench.devset import CHAT_SETS
        from yue.train.selfinstruct import shipped_set_hashes

        exclude = shipped_set_hashes([str(p) for p in CHAT_SETS.values()])
        if kind == "everyday":
            from yue.train.everyday import everyday_prompts

            return everyday_prompts(int(n), seed=seed, exclude=exclude)
        import yue
        from yue.train.selfinstruct import model_written_prompts

        return model_written_prompts(yue.load(base), int(n), seed=seed, exclude=exclude)
    from yue.train.topnar_run import read_chat_prompts

    return read_chat_prompts(spec)
