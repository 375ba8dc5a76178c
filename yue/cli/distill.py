"""`yue distill`: a NAR set for an existing model in one command (`train/distill_run.py`), and
`yue distill-recipe`: the explicit recipes behind it, every setting by hand."""

from __future__ import annotations

from pathlib import Path

import typer

from yue.cli.common import app, user_errors


@app.command("distill")
@user_errors
def distill_cmd(
    model: str = typer.Argument(
        ...,
        help="Your model: a .gguf file, a Hugging Face folder (Llama, Qwen2/3, Gemma 3, Mistral) or a name.",
    ),
    hours: float = typer.Option(..., help="Wall-time budget in hours (data, training, calibration, report)."),
    out: Path | None = typer.Option(
        None, help="Output model folder (default: ./<model>-yue). Rerun to resume."
    ),
    device: str = typer.Option("auto", help="cpu, cuda or auto (CUDA when available)."),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
    stop_after: str | None = typer.Option(
        None, help="Stop after this stage (plan, heldout, data, train, calibrate); rerun to continue."
    ),
) -> None:
    """Give MODEL a NAR set within a time budget: one command that chooses its shape from the model and
    this machine's costs, writes the model's own answers, trains, calibrates on a held-out split and
    writes a model folder every command takes, ending with a report (OUT/distill_report.json, .png).

    Interrupted (Ctrl-C, a kill), the same command resumes where it stopped (state in OUT/work).
    """
    import logging

    import torch

    from yue.registry import model_name
    from yue.train.distill_report import format_report
    from yue.train.distill_run import DistillStopped, distill

    if threads is not None:
        torch.set_num_threads(threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = out if out is not None else Path(f"{model_name(model)}-yue")
    try:
        report = distill(model, out, hours, device=device, stop_after=stop_after)
    except DistillStopped as e:
        typer.echo(str(e), err=True)
        return
    except KeyboardInterrupt:
        typer.echo(f"\ninterrupted: run the same command again to resume from {out / 'work'}", err=True)
        raise typer.Exit(130) from None
    typer.echo(format_report(report))


@app.command("distill-recipe")
@user_errors
def distill_recipe_cmd(
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
    """`yue distill`'s explicit recipes, every setting by hand (--nar-layers: on the top layers only).

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
    """`--prompts`: a JSONL file, 'stdlib:N', 'model:N' or 'everyday:N' (see `distill-recipe`)."""
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
