"""`yue distill`: a NAR set for an existing model."""

from __future__ import annotations

from pathlib import Path

import typer

from yue.cli.common import app, user_errors


@app.command("distill")
@user_errors
def distill_cmd(
    base: str = typer.Option(
        ...,
        help="The AR set: a Llama-family Hugging Face folder (safetensors + tokenizer.json); with "
        "--nar-layers also a .gguf file or a model name (its AR source).",
    ),
    out: Path = typer.Option(..., help="Output yue model folder."),
    nar_layers: int | None = typer.Option(
        None,
        help="Put the NAR set on the top N layers only (slots enter there from the anchor's hidden "
        "state), trained on cached features: the recipe for a large pretrained model (yue-smol: 4).",
    ),
    prompts: str = typer.Option(
        "stdlib:8448",
        help="--nar-layers: chat prompts to self-distill on: a JSONL of {'messages'} / {'prompt'}, "
        "'stdlib:N' (standard-library questions, train split), 'model:N' (written by the model itself) or "
        "'everyday:N' (everyday requests from templates).",
    ),
    draft_vocab: int = typer.Option(8192, help="--nar-layers: drafting vocabulary size (FR-Spec)."),
    held_out: int = typer.Option(256, help="--nar-layers: answers held out for tau and the router."),
    anchors: int = typer.Option(32, help="--nar-layers: blocks per sequence per step."),
    init_from: Path | None = typer.Option(
        None, help="--nar-layers: continue from this yue folder's NAR set (a further round)."
    ),
    extra_sequences: list[Path] = typer.Option(
        [], help="--nar-layers: an earlier round's work/sequences.json to train on too (repeatable)."
    ),
    device: str = typer.Option("cpu", help="--nar-layers: cpu or cuda."),
    corpus: str = typer.Option(
        "stdlib", help="'stdlib', a .jsonl / text file, or a folder: where prompts come from."
    ),
    steps: int = typer.Option(300, help="NAR self-distillation steps."),
    sequences: int = typer.Option(256, help="AR-greedy sequences for NAR self-distillation."),
    router_sequences: int = typer.Option(
        96, help="AR-greedy sequences (held-out prompts) for router labels."
    ),
    block_size: int = typer.Option(8, help="K: slots per NAR block."),
    prompt_len: int = typer.Option(64, help="Prompt tokens per sequence."),
    new_tokens: int = typer.Option(192, help="Greedy tokens per sequence (--nar-layers: at most)."),
    batch_size: int = typer.Option(8, help="Sequences per NAR training step."),
    lr: float = typer.Option(1e-3, help="Peak NAR learning rate."),
    seed: int = typer.Option(0, help="Seed for prompts, anchors and init."),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
) -> None:
    """Add a self-distilled NAR set and a router to a Llama checkpoint (its AR logits stay unchanged).

    A rerun of the same command resumes: greedy answers and training checkpoints stay in OUT/work.
    """
    import json

    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    if nar_layers is not None:
        from yue.train.topnar import TopNARConfig
        from yue.train.topnar_run import TopNARRecipe, distill_top_nar, top_nar_base

        base_dir, source = top_nar_base(base)
        recipe = TopNARRecipe(
            nar_layers=nar_layers,
            block_size=block_size,
            draft_vocab_size=draft_vocab,
            max_new_tokens=new_tokens,
            held_out=held_out,
            train=TopNARConfig(steps=steps, batch_size=batch_size, anchors=anchors, lr=lr, seed=seed),
        )
        chats = _chat_prompts(prompts, base, seed)
        report = distill_top_nar(
            base_dir, chats, out, recipe, source, device, init_from=init_from, extra_sequences=extra_sequences
        )
        typer.echo(json.dumps({k: report[k] for k in ("history", "times_s", "wall_s")}))
        return
    from yue.train.distill import DistillConfig, distill
    from yue.train.selfdistill import NARFinetuneConfig

    cfg = DistillConfig(
        corpus=corpus,
        block_size=block_size,
        sequences=sequences,
        router_sequences=router_sequences,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        seed=seed,
        nar=NARFinetuneConfig(steps=steps, batch_size=batch_size, lr=lr, seed=seed),
    )
    report = distill(Path(base), out, cfg)
    typer.echo(json.dumps(report))


def _chat_prompts(spec: str, base: str, seed: int) -> list[list[dict]]:
    """`--prompts`: a JSONL file, 'stdlib:N', 'model:N' or 'everyday:N' (see `distill`)."""
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
