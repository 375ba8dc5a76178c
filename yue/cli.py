"""The `yue` command: thin subcommands over library functions.

User mistakes (ValueError, including CheckpointError) print one line and exit with code 2, no
traceback. Each subcommand imports what it needs inside its body, so `yue --help` stays fast.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Fast text generation with an AR-NAR Mixture-of-Transformers.",
)


def _version() -> str:
    """The installed distribution's version, read from its metadata without importing torch; a source
    tree run without installing falls back to the package's own `__version__`."""
    from importlib.metadata import PackageNotFoundError, version

    from yue.errors import DISTRIBUTION

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        import yue

        return yue.__version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"yue {_version()}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Fast text generation with an AR-NAR Mixture-of-Transformers."""


def _on_terminal(stream) -> bool:
    """Whether a standard stream is a terminal (a seam for tests, whose runner swaps the streams)."""
    return stream.isatty()


def user_errors(fn):
    """Turn ValueError / FileNotFoundError into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, FileNotFoundError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(code=2) from None

    return wrapper


MODEL_HELP = (
    "A model's name (yue-smol, yue-code-mini), a model folder or a .gguf file (default: the default model)."
)
DTYPE_HELP = (
    "float32 (the GGUF's values) | bfloat16: a named precision, ~1.5x faster on a CPU with AVX512-BF16 "
    "or AMX | int4 (CPU): the AR layers in 4 bits (a Q4_1 GGUF's own codes) on int8 activations, "
    "as llama.cpp runs them, the fastest; ar and verified stay exact against each other in each."
)
LOW_MEMORY_HELP = (
    "float32 on a CPU: each weight held once. With yue's row kernel the layers hold one copy anyway "
    "and this drops the head's (yue-smol: ~0.1 GB less, slower verifying rows); without it, ~0.4 GB "
    "less, slower verifying rows (AVX2) or one-row steps (AVX512)."
)


def _sampling(
    mode: str | None,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    repetition_penalty: float,
    seed: int | None,
    stop: list[str],
    **more,
):
    """`generate`'s and `chat`'s decoding options as a DecodeConfig, checked before the model loads (a
    bad value fails at once, not after a load); mode "hybrid" stands in until the model's default is
    known."""
    from yue.config import DecodeConfig

    return DecodeConfig(
        mode=mode or "hybrid",
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        seed=seed,
        stop=tuple(stop),
        **more,
    )


@app.command()
@user_errors
def generate(
    prompt: str = typer.Argument(
        ..., help="Text to continue, or an instruct model's user message; - reads it from standard input."
    ),
    model: str | None = typer.Option(None, help=MODEL_HELP),
    system: str | None = typer.Option(
        None, help="A system message before PROMPT (an instruct model's chat template; not with --raw)."
    ),
    adapter: Path | None = typer.Option(None, help="A `yue finetune` adapter folder for this model."),
    mode: str | None = typer.Option(
        None,
        help="ar | verified | hybrid | nar (default: the model's default_mode: verified for yue-smol, hybrid for yue-code-mini; ar without a NAR set).",
    ),
    raw: bool = typer.Option(
        False, "--raw", help="An instruct model continues PROMPT as written, not as a chat message."
    ),
    router_threshold: float | None = typer.Option(
        None,
        help="The mode's dial (default: the model's). hybrid: tolerance t, a draft is kept when "
        "p_AR(draft) >= (1 - t) * max p_AR (0 = exact, as verified). verified: slots are drafted where "
        "the router's p_ar <= this (speed only).",
    ),
    drafting: str = typer.Option(
        "separate",
        help="separate (a NAR-only drafting pass, slot 1 revealed) | fused (the block in the step's forward).",
    ),
    draft_dtype: str = typer.Option(
        "auto",
        help="Drafting weights: auto (int8 on CPU) | int8 | bfloat16 | float32. ar/verified output is the same.",
    ),
    max_new_tokens: int = typer.Option(128, help="Maximum tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_k: int = typer.Option(0, help="Keep the k most likely tokens (0 = off)."),
    top_p: float = typer.Option(1.0, help="Nucleus mass in (0, 1]."),
    repetition_penalty: float = typer.Option(1.0, help="> 1 discourages repeats."),
    seed: int | None = typer.Option(None, help="Random seed for sampling."),
    stop: list[str] = typer.Option([], help="Stop string (repeatable)."),
    device: str = typer.Option("cpu", help="cpu | cuda | auto"),
    dtype: str = typer.Option("float32", help=DTYPE_HELP),
    low_memory: bool = typer.Option(False, help=LOW_MEMORY_HELP),
    stream: bool | None = typer.Option(
        None,
        "--stream/--no-stream",
        help="Print text as it is generated (default: on when standard output is a terminal).",
    ),
    trace: bool = typer.Option(False, help="Print the router's per-step trace to stderr."),
    trace_json: Path | None = typer.Option(None, help="Write the per-step trace as JSON to this file."),
) -> None:
    """Continue PROMPT and print the completion (an instruct model answers it through its chat template).

    `echo "Say hello" | yue generate -` reads the prompt from standard input."""
    import json
    from dataclasses import asdict, replace

    import yue

    if prompt == "-":
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise ValueError("the prompt read from standard input is empty")
    if system is not None and raw:
        raise ValueError("--system needs the chat template, which --raw leaves out")
    if stream is None:
        stream = _on_terminal(sys.stdout)
    cfg = _sampling(
        mode,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        repetition_penalty,
        seed,
        stop,
        router_threshold=router_threshold,
        drafting=drafting,
        trace=trace or trace_json is not None,
    )
    engine = yue.load(
        model, device=device, dtype=dtype, nar_dtype=draft_dtype, adapter=adapter, low_memory=low_memory
    )
    if mode is None:
        cfg = replace(cfg, mode=engine.default_mode)
    if engine.instruct and not raw:
        system_message = [{"role": "system", "content": system}] if system is not None else []
        prompt = engine.chat_prompt([*system_message, {"role": "user", "content": prompt}])
    elif system is not None:
        raise ValueError(f"--system needs an instruct model's chat template, which {engine.name} has not")
    steps, stats = [], None
    if stream:
        for ev in engine.stream(prompt, cfg):
            sys.stdout.write(ev.delta)
            sys.stdout.flush()
            steps.extend(ev.trace)
            if trace:
                for s in ev.trace:
                    typer.echo(s.format(), err=True)
            stats = ev.stats or stats
        sys.stdout.write("\n")
    else:
        result = engine.generate(prompt, cfg)
        steps, stats = result.trace, result.stats
        if trace:
            for s in steps:
                typer.echo(s.format(), err=True)
        typer.echo(result.text)
    if trace and stats is not None:
        typer.echo(
            f"[stats] {stats.new_tokens} tokens in {stats.forwards} forwards "
            f"({stats.draft_passes} of them drafting passes; {stats.tokens_per_forward:.2f}/forward, "
            f"{stats.tokens_per_step:.2f}/step), ar={stats.ar_tokens} nar={stats.nar_tokens}, "
            f"{stats.new_tokens / max(stats.total_s, 1e-9):.1f} tok/s",
            err=True,
        )
    if trace_json is not None:
        trace_json.write_text(
            json.dumps({"steps": [asdict(s) for s in steps], "stats": stats.to_dict()}, indent=1)
        )


CHAT_HISTORY = "chat_history"  # file under the yue cache folder ($YUE_CACHE_DIR or ~/.cache/yue)
CHAT_HISTORY_LINES = 1000


@contextmanager
def _line_editing() -> Iterator[Path | None]:
    """Line editing and a kept history for `input()` on a terminal, within the block: stdlib readline
    (absent on Windows' Python, where `input()` stays plain), its history read from CHAT_HISTORY on
    entry and written back on exit. Yields the history file, or None (no readline or no terminal)."""
    try:
        import readline
    except ImportError:
        readline = None
    if readline is None or not _on_terminal(sys.stdin):
        yield None
        return
    from yue.model.gguf import cache_root

    history = cache_root() / CHAT_HISTORY
    readline.clear_history()
    try:
        readline.read_history_file(history)
    except OSError:  # none yet (or unreadable): start a new one
        pass
    readline.set_history_length(CHAT_HISTORY_LINES)
    try:
        yield history
    finally:
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)
        except OSError as e:  # a read-only cache loses the history, not the conversation
            typer.echo(f"warning: chat history not saved to {history}: {e}", err=True)


@app.command()
@user_errors
def chat(
    model: str | None = typer.Option(None, help=MODEL_HELP),
    mode: str | None = typer.Option(
        None,
        help="ar | verified | hybrid | nar (default: the model's default_mode: verified for yue-smol, hybrid for yue-code-mini; ar without a NAR set).",
    ),
    system: str | None = typer.Option(None, help="A system message opening the conversation."),
    max_new_tokens: int = typer.Option(512, help="Longest reply, in tokens."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_k: int = typer.Option(0, help="Keep the k most likely tokens (0 = off)."),
    top_p: float = typer.Option(1.0, help="Nucleus mass in (0, 1]."),
    repetition_penalty: float = typer.Option(1.0, help="> 1 discourages repeats."),
    seed: int | None = typer.Option(None, help="Random seed for sampling."),
    stop: list[str] = typer.Option([], help="Stop string ending a reply (repeatable)."),
    draft_dtype: str = typer.Option("auto", help="Drafting weights: auto | int8 | bfloat16 | float32."),
    device: str = typer.Option("cpu", help="cpu | cuda | auto"),
    dtype: str = typer.Option("float32", help=DTYPE_HELP),
    low_memory: bool = typer.Option(False, help=LOW_MEMORY_HELP),
    adapter: Path | None = typer.Option(None, help="A `yue finetune` adapter folder for this model."),
) -> None:
    """Chat in the terminal: replies stream as they are written, the conversation is kept; /exit or EOF
    ends. Ctrl-C stops a reply (kept as far as it got) and ends the session at the prompt."""
    from dataclasses import replace

    import yue

    cfg = _sampling(mode, max_new_tokens, temperature, top_k, top_p, repetition_penalty, seed, stop)
    engine = yue.load(
        model, device=device, dtype=dtype, nar_dtype=draft_dtype, adapter=adapter, low_memory=low_memory
    )
    cfg = replace(cfg, mode=mode or engine.default_mode)
    messages = [{"role": "system", "content": system}] if system else []
    typer.echo(f"{engine.name} ({cfg.mode}); /exit or Ctrl-D ends, Ctrl-C stops a reply.", err=True)
    with _line_editing():
        _converse(engine, cfg, messages)


def _converse(engine, cfg, messages: list[dict]) -> None:
    """`chat`'s loop: read a line, stream the reply, keep both in `messages`, until /exit or EOF."""
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            typer.echo("", err=True)
            return
        if line.strip() in ("/exit", "/quit"):
            return
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        try:
            reply = []
            for ev in engine.stream(engine.chat_prompt(messages), cfg):
                sys.stdout.write(ev.delta)
                sys.stdout.flush()
                reply.append(ev.delta)
        except ValueError as e:  # the conversation outgrew the context: say so, keep the session
            messages.pop()
            typer.echo(f"error: {e}", err=True)
            continue
        except KeyboardInterrupt:  # stop this reply, keep the session (and the reply as far as it got)
            typer.echo("\n[stopped]", err=True)
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})


@app.command("models")
def models_cmd(
    as_json: bool = typer.Option(False, "--json", help="One JSON object per model, one a line."),
) -> None:
    """The shipped models: each one's size on disk and whether its weights are present (and, where not,
    the command that installs them). Any model folder or .gguf file also works as --model."""
    import json
    from dataclasses import asdict

    from yue.registry import SHIPPED, model_status

    for status in map(model_status, SHIPPED):
        if as_json:
            typer.echo(json.dumps(asdict(status)))
            continue
        weights = "present" if status.present else f"missing: {status.missing}"
        default = " (default)" if status.default else ""
        typer.echo(f"{status.name + default:<24} {status.size_bytes / 1e6:8.1f} MB  weights {weights}")


@app.command("export-ar")
@user_errors
def export_ar_cmd(
    model_dir: Path = typer.Argument(..., help="yue model folder."),
    out: Path = typer.Argument(..., help="Output folder for the LlamaForCausalLM checkpoint."),
) -> None:
    """Write the AR set of a yue model as a plain Hugging Face LlamaForCausalLM checkpoint."""
    from yue.model.hf import export_ar, load_model

    model = load_model(model_dir)
    export_ar(model, out, tokenizer_file=model_dir / "tokenizer.json")
    typer.echo(f"wrote LlamaForCausalLM to {out}")


@app.command("build-ngrams")
@user_errors
def build_ngrams_cmd(
    model_dir: Path = typer.Argument(..., help="yue model folder: ngrams.safetensors is written into it."),
    sequences: list[Path] = typer.Option(
        ...,
        "--sequences",
        help="The model's own greedy answers: a `yue distill --nar-layers` run's work/sequences.json "
        "(or .json.gz); repeatable. Prompts repeated across files count once.",
    ),
    min_count: int = typer.Option(2, help="Keep a continuation seen at least this many times."),
    min_share: float = typer.Option(0.3, help="... and in at least this share of its context's occurrences."),
    max_order: int = typer.Option(4, help="Longest context looked up (tokens)."),
    extend: bool = typer.Option(
        False, help="Keep the folder's table and add only the contexts it lacks (new answers, old ones gone)."
    ),
) -> None:
    """Build the n-gram table of a model's own answers, from which `verified` drafts where the context
    has no copy (decode/corpus.py). The output stays `ar`'s; only speed changes."""
    from yue.config import YueConfig
    from yue.decode.corpus import CorpusNgrams, load_ngrams
    from yue.model.hf import NGRAMS_FILE
    from yue.train.topnar import ChatSequences

    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"not a model folder (no config.json): {model_dir}")
    vocab = YueConfig.from_pretrained(str(model_dir)).vocab_size
    old = load_ngrams(model_dir, vocab) if extend else None  # read (and checked) before the build
    if extend and old is None:
        raise FileNotFoundError(f"--extend: {model_dir} has no {NGRAMS_FILE} to extend")
    pairs, seen = [], set()
    for file in sequences:
        for ids, p in ChatSequences.load(file).pairs():
            if (prompt := tuple(ids[:p])) not in seen:
                seen.add(prompt)
                pairs.append((ids, p))
    table = CorpusNgrams.build(pairs, vocab, max_order=max_order, min_count=min_count, min_share=min_share)
    source = f"{len(pairs)} answers from " + ", ".join(str(f) for f in sequences)
    if old is not None:
        source = f"{old.source}; extended with {source}"
        table = old.extended(table)
    table.save(model_dir / NGRAMS_FILE, source=source)
    typer.echo(f"wrote {model_dir / NGRAMS_FILE}: {len(table):,} contexts from {len(pairs):,} answers")


@app.command("train-tokenizer")
@user_errors
def train_tokenizer_cmd(
    corpus: str = typer.Option("stdlib", help="'stdlib', a .jsonl / text file, or a folder of source files."),
    vocab_size: int = typer.Option(8192, help="BPE vocabulary size, special tokens included."),
    out: Path = typer.Option(..., help="Folder (or .json path) for tokenizer.json."),
    val_fraction: float = typer.Option(0.02, help="Share of files held out (never seen by the tokenizer)."),
) -> None:
    """Train a byte-level BPE tokenizer on a corpus's training split."""
    from yue.train.data import train_tokenizer

    if vocab_size < 260:
        raise ValueError(f"vocab_size must be >= 260, got {vocab_size}")
    typer.echo(f"wrote {train_tokenizer(corpus, vocab_size, out, val_fraction)}")


@app.command("train")
@user_errors
def train_cmd(
    corpus: str = typer.Option("stdlib", help="'stdlib', a .jsonl / text file, or a folder of source files."),
    out: Path = typer.Option(..., help="Run folder: checkpoints, log.jsonl, final model in OUT/model."),
    tokenizer: Path | None = typer.Option(None, help="tokenizer.json (default: trained on the corpus)."),
    vocab_size: int = typer.Option(8192, help="Vocabulary size when the tokenizer is trained here."),
    steps: int = typer.Option(1000, help="Optimizer steps."),
    seq_len: int = typer.Option(256, help="Tokens per training sequence."),
    batch_size: int = typer.Option(16, help="Sequences per step (per process)."),
    lr: float = typer.Option(3e-3, help="Peak learning rate (warm-up, then cosine)."),
    warmup_steps: int = typer.Option(100, help="Linear warm-up steps."),
    block_size: int = typer.Option(8, help="K: slots per NAR block."),
    anchors: int = typer.Option(8, help="M: NAR blocks per sequence."),
    alpha: float = typer.Option(1.0, help="Weight of the AR cross-entropy."),
    beta: float = typer.Option(0.8, help="Weight of the NAR cross-entropy."),
    gamma: float = typer.Option(0.2, help="Weight of KL(sg(p_AR) || p_NAR)."),
    reveal_prob: float = typer.Option(0.1, help="Chance a slot sees its true token (mask-predict)."),
    hidden_size: int = typer.Option(256, help="Model width."),
    layers: int = typer.Option(4, help="Transformer layers."),
    heads: int = typer.Option(8, help="Attention heads."),
    kv_heads: int = typer.Option(4, help="Key/value heads (grouped-query attention)."),
    intermediate_size: int = typer.Option(688, help="MLP width."),
    eval_every: int = typer.Option(200, help="Evaluate every N steps."),
    save_every: int = typer.Option(200, help="Checkpoint every N steps."),
    seed: int = typer.Option(0, help="Seed for init, data order, anchors."),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
    resume: bool = typer.Option(False, help="Continue from the last checkpoint in OUT."),
    nar_only: bool = typer.Option(False, help="Stage 2: train the NAR set only (AR frozen); needs --init."),
    init: Path | None = typer.Option(None, help="Start from this model folder."),
    data: str | None = typer.Option(None, help="Training data for --nar-only (overrides --corpus)."),
    objective: str = typer.Option(
        "joint", help="'joint', or 'anchor' (experiment: NAR fills after anchor spans, + the count head)."
    ),
    anchor_bias: float = typer.Option(
        1.0, help="--objective anchor: fill attention bias per unit of confidence."
    ),
    layer_routing: str = typer.Option(
        "type", help="'type', or 'four-expert' (experiment: per-layer top-2 router over 4 MLP experts)."
    ),
    expert_stick: float = typer.Option(
        0.0, help="four-expert: logit bonus for the expert taken at the layer below."
    ),
) -> None:
    """Train a yue model with the joint AR + NAR loss (runs under `accelerate launch` unchanged)."""
    from yue.train.config import TrainConfig
    from yue.train.loop import train

    cfg = TrainConfig(
        corpus=data if data is not None else corpus,
        out=str(out),
        tokenizer=str(tokenizer) if tokenizer else None,
        vocab_size=vocab_size,
        init=str(init) if init else None,
        train_set="nar" if nar_only else "all",
        steps=steps,
        seq_len=seq_len,
        batch_size=batch_size,
        lr=lr,
        warmup_steps=warmup_steps,
        block_size=block_size,
        anchors=anchors,
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        reveal_prob=reveal_prob,
        hidden_size=hidden_size,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate_size=intermediate_size,
        eval_every=eval_every,
        save_every=save_every,
        seed=seed,
        threads=threads,
        objective=objective,
        anchor_bias=anchor_bias,
        layer_routing=layer_routing,
        expert_stick=expert_stick,
    )
    typer.echo(f"model: {train(cfg, resume=resume)}")


def _command_line(ctx: typer.Context) -> str:
    """The command as the user gave it (options set on the command line only), for reports."""
    import shlex

    parts = ["yue", ctx.info_name or ""]
    for name, value in ctx.params.items():
        source = ctx.get_parameter_source(name)  # typer's own click enum, so compare by name
        if source is None or source.name != "COMMANDLINE":
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            parts += [f"--{name.replace('_', '-')}", shlex.quote(str(v))]
    return " ".join(parts)


@app.command("self-distill")
@user_errors
def self_distill_cmd(
    ctx: typer.Context,
    model: Path = typer.Option(..., help="Stage-1 model folder (its AR set stays frozen)."),
    out: Path = typer.Option(..., help="Output model folder (may equal --model to update it in place)."),
    corpus: str = typer.Option("stdlib", help="Prompts are cut from this corpus's training split."),
    sequences: int = typer.Option(576, help="AR-greedy sequences to generate (576 x 256 = 147k tokens)."),
    sequences_file: Path | None = typer.Option(None, help="Reuse / write the sequences here (safetensors)."),
    extra_sequences: list[Path] = typer.Option(
        [], help="A further round: an earlier round's sequences file whose training rows join (repeatable)."
    ),
    prompt_len: int = typer.Option(64, help="Prompt tokens per sequence."),
    new_tokens: int = typer.Option(192, help="Greedy tokens per sequence."),
    steps: int = typer.Option(300, help="NAR fine-tuning steps."),
    batch_size: int = typer.Option(8, help="Sequences per step."),
    anchors: int = typer.Option(16, help="NAR blocks per sequence (anchored in the continuation)."),
    lr: float = typer.Option(1e-3, help="Peak learning rate."),
    warmup_steps: int = typer.Option(20, help="Linear warm-up steps."),
    beta: float = typer.Option(0.8, help="Weight of the NAR cross-entropy."),
    gamma: float = typer.Option(0.2, help="Weight of KL(sg(p_AR) || p_NAR)."),
    reveal_first: float | None = typer.Option(
        None,
        help="Chance slot 1 shows its true token, as the drafting pass shows it (default: 0.1, as any slot).",
    ),
    seed: int = typer.Option(0, help="Seed for prompts, anchors and reveals."),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
) -> None:
    """Stage 2: fine-tune the NAR set on the AR path's own greedy outputs (self-distillation)."""
    import json

    import torch

    from yue.train.selfdistill import NARFinetuneConfig, self_distill

    if threads is not None:
        torch.set_num_threads(threads)
    cfg = NARFinetuneConfig(
        steps=steps,
        batch_size=batch_size,
        anchors=anchors,
        lr=lr,
        warmup_steps=warmup_steps,
        beta=beta,
        gamma=gamma,
        reveal_first=reveal_first,
        seed=seed,
    )
    report = self_distill(
        model,
        out,
        corpus,
        sequences,
        prompt_len,
        new_tokens,
        sequences_file=sequences_file,
        cfg=cfg,
        extra_sequences=extra_sequences,
        command=_command_line(ctx),
    )
    typer.echo(json.dumps(report))


@app.command("train-router")
@user_errors
def train_router_cmd(
    model: Path = typer.Option(..., help="Model folder; its towers stay frozen."),
    out: Path | None = typer.Option(
        None, help="Where to save the model with its new router (default: --model)."
    ),
    data: Path | None = typer.Option(None, help="AR-greedy sequences (safetensors); default: generate them."),
    corpus: str = typer.Option("stdlib", help="Without --data: prompts from this corpus's validation split."),
    sequences: int = typer.Option(256, help="Without --data: AR-greedy sequences to generate."),
    prompt_len: int = typer.Option(64, help="Prompt tokens per generated sequence."),
    new_tokens: int = typer.Option(192, help="Greedy tokens per generated sequence."),
    anchors: int = typer.Option(48, help="Labelled blocks per sequence."),
    user_labels: Path | None = typer.Option(
        None, help='JSONL {"text", "ar_spans"}: fine-tune on must-AR spans.'
    ),
    epochs: int = typer.Option(30, help="Router training epochs."),
    lr: float = typer.Option(3e-3, help="Router learning rate."),
    seed: int = typer.Option(0, help="Seed for prompts, anchors, init and the held-out split."),
    table: bool = typer.Option(True, help="Decode the dev set at several thresholds and print the table."),
    table_prompts: int = typer.Option(20, help="Dev-set prompts for the threshold table."),
    thresholds: str = typer.Option(
        "0.1,0.3,0.5,0.65,0.8,0.9", help="Comma-separated thresholds for the table."
    ),
    draft_dtype: str = typer.Option(
        "auto", help="Draft in this precision when collecting features, as decoding will (auto: int8 on CPU)."
    ),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
) -> None:
    """Stage 3: train the router on acceptance labels (or fine-tune it on user must-AR spans)."""
    import json

    import torch

    from yue.bench.devset import load_devset
    from yue.train.router import RouterTrainConfig, run_train_router
    from yue.train.router_eval import format_report, format_threshold_table, threshold_table

    if threads is not None:
        torch.set_num_threads(threads)
    ths = [float(t) for t in thresholds.split(",") if t.strip()]
    if any(not 0.0 <= t <= 1.0 for t in ths):
        raise ValueError(f"thresholds must be in [0, 1], got {thresholds}")
    cfg = RouterTrainConfig(epochs=epochs, lr=lr, reinit=user_labels is None, seed=seed)
    report = run_train_router(
        model,
        out,
        data=data,
        corpus=corpus,
        n_sequences=sequences,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        anchors_per_seq=anchors,
        user_labels=user_labels,
        cfg=cfg,
        seed=seed,
        drafting_dtype=draft_dtype,
    )
    typer.echo("router on held-out blocks (a_i vs acceptance label; conf = raw slot max-probability):")
    typer.echo(format_report(report["held_out"]))
    folder = out if out is not None else model
    if table:
        prompts = [r["prompt"] for r in load_devset()[:table_prompts]]
        report["threshold_table"] = threshold_table(folder, prompts, ths)
        typer.echo(format_threshold_table(report["threshold_table"]))
        (Path(folder) / "router_report.json").write_text(json.dumps(report, indent=2))
    typer.echo(json.dumps({k: v for k, v in report.items() if k not in ("before", "epoch_losses")}))


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


@app.command("bench")
@user_errors
def bench_cmd(
    model: str | None = typer.Option(None, help=MODEL_HELP),
    adapter: Path | None = typer.Option(
        None, help="A `yue finetune` adapter folder: the bench runs the merged model (peers too)."
    ),
    prompts: Path | None = typer.Option(
        None,
        help='Held-out prompts, reported first: JSONL of {"prompt": ...} or {"messages": [{"role", "content"}]} '
        '(+ "reference"?); messages go through the model\'s chat template for every entry alike. '
        "Default (neither --prompts nor --dev-prompts): a chat model's shipped chat_test + chat_calibration "
        "sets, else the held-out code_test set (third-party packages) + the code development set.",
    ),
    dev_prompts: Path | None = typer.Option(
        None, help="A development (calibration) prompt set, reported after the held-out one and labelled dev."
    ),
    max_new_tokens: int = typer.Option(128, help="Tokens generated per prompt, by every mode."),
    modes: str = typer.Option(
        "hf-greedy,hf-prompt-lookup,llamacpp-greedy,ar,verified,hybrid,nar",
        help="Comma-separated entries to compare. llamacpp-greedy needs a model with a GGUF source and "
        "llama-cpp-python (in the repository: pip install '.\\[llamacpp]'); else it is skipped, saying why.",
    ),
    thresholds: str = typer.Option(
        "0.05,0.1,0.2,0.4", help="hybrid sweep (tolerances): adds hybrid@T entries."
    ),
    verified_thresholds: str = typer.Option(
        "1", help="Adds verified@T entries (1 = the router unasked); empty for none."
    ),
    fused_drafts: bool = typer.Option(
        True, help="Add verified+fused entries (drafts in the verifying forward, a block per draft position)."
    ),
    batch_sizes: str = typer.Option("1", help="Sizes > 1 add ar/verified throughput entries (ar@bN)."),
    repeats: int = typer.Option(1, help="Timed passes over the prompts."),
    limit: int | None = typer.Option(None, help="Use only the first N prompts."),
    threads: int = typer.Option(1, help="torch threads, the same for every mode."),
    memory: bool = typer.Option(True, help="Measure peak RSS per mode, each in its own process."),
    device: str = typer.Option("cpu", help="cpu | cuda (ours and the transformers peers; llama.cpp: cpu)."),
    cost_curve: bool = typer.Option(
        True, help="Time a verifying forward over 1..9 rows and a drafting pass (ratios to a 1-row step)."
    ),
    dtype: str = typer.Option(
        "float32",
        help=DTYPE_HELP + " Ours and the transformers peers alike (int4: ours only, the peers float32).",
    ),
    low_memory: bool = typer.Option(False, help=LOW_MEMORY_HELP + " Ours only."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the JSON document here."),
    plot: Path | None = typer.Option(None, help="Write the speed vs fidelity plot (PNG) here."),
) -> None:
    """Compare the decode modes with transformers and llama.cpp on the same weights; JSON on the last line."""
    from rich.console import Console

    from yue.bench.harness import BenchConfig, run_bench
    from yue.bench.report import plot as write_plot
    from yue.bench.report import print_report

    def csv(text: str, kind: type, name: str) -> tuple:
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"{name}: expected comma-separated {kind.__name__}s, got {text!r}") from None

    if adapter is not None:  # every entry, the peers included, runs the adapted weights
        model = _merged_for_bench(model, adapter)
    cfg = BenchConfig(
        model=model,
        prompts=str(prompts) if prompts is not None else None,
        dev_prompts=str(dev_prompts) if dev_prompts is not None else None,
        max_new_tokens=max_new_tokens,
        modes=csv(modes, str, "modes"),
        thresholds=csv(thresholds, float, "thresholds"),
        verified_thresholds=csv(verified_thresholds, float, "verified_thresholds"),
        fused_drafts=fused_drafts,
        batch_sizes=csv(batch_sizes, int, "batch_sizes"),
        repeats=repeats,
        limit=limit,
        threads=threads,
        memory=memory,
        device=device,
        cost_curve=cost_curve,
        dtype=dtype,
        low_memory=low_memory,
    )
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    result = run_bench(cfg, log=lambda s: err.print(f"[bench] {s}", markup=False))
    if plot is not None:
        err.print(f"[bench] plot written to {write_plot(result, plot)}", markup=False)
    line = print_report(result)
    if json_out is not None:
        json_out.write_text(line + "\n")


@app.command("bench-serve")
@user_errors
def bench_serve_cmd(
    model: str | None = typer.Option("yue-code-mini", help=MODEL_HELP),
    batch_sizes: str = typer.Option(
        "1,16", help="--max-batch-size values to compare (the first is the base)."
    ),
    clients: str = typer.Option("1,4,16,32", help="Concurrent client counts."),
    max_tokens: int = typer.Option(64, help="Tokens per completion."),
    mode: str = typer.Option(
        "verified", help="Decode mode of every request (exact modes allow the output check)."
    ),
    requests_per_client: int = typer.Option(2, help="Requests each client sends (at least 8 per level)."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the JSON document here."),
) -> None:
    """Tokens/s and time to first token of `yue serve` under concurrent streamed clients; JSON last."""
    import yue
    from yue.bench.serving import bench_serve, report

    sizes = tuple(int(x) for x in batch_sizes.split(",") if x.strip())
    levels = tuple(int(x) for x in clients.split(",") if x.strip())
    engine = yue.load(model)
    result = bench_serve(
        engine,
        batch_sizes=sizes,
        clients=levels,
        max_tokens=max_tokens,
        mode=mode,
        requests_per_client=requests_per_client,
        log=lambda s: typer.echo(f"[bench-serve] {s}", err=True),
    )
    text = report(result, sizes[0], sizes[-1])
    typer.echo(text)
    if json_out is not None:
        json_out.write_text(text.splitlines()[-1] + "\n")


def _merged_for_bench(model: str | None, adapter: Path) -> Path:
    """The model with `adapter` merged, in a temporary folder removed at exit."""
    import atexit
    import shutil
    import tempfile

    from yue.registry import model_name
    from yue.train.finetune import merge_to_folder

    tmp = Path(tempfile.mkdtemp(prefix="yue-bench-merged-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    name = f"{model_name(model)}+{adapter.name}"  # the report's model name
    return str(merge_to_folder(model, adapter, tmp / name))


@app.command("finetune")
@user_errors
def finetune_cmd(
    ctx: typer.Context,
    model: str | None = typer.Option(None, help=MODEL_HELP),
    data: Path = typer.Option(..., help='Text file, folder, JSONL {"text"} or chat JSONL {"messages"}.'),
    out: Path = typer.Option(
        ..., help="Adapter folder: peft files, drafts.safetensors, finetune_report.json."
    ),
    steps: int = typer.Option(150, help="LoRA optimizer steps."),
    lr: float = typer.Option(2e-3, help="Peak LoRA learning rate (warm-up, then cosine)."),
    batch_size: int = typer.Option(8, help="Windows per step."),
    seq_len: int = typer.Option(256, help="Tokens per window."),
    lora_r: int = typer.Option(8, help="LoRA rank."),
    lora_alpha: float = typer.Option(16.0, help="LoRA scale numerator (scale = alpha / r)."),
    target_modules: list[str] = typer.Option(
        [],
        help="AR-set projection to adapt (repeatable): q_proj k_proj v_proj o_proj gate_proj up_proj "
        "down_proj (default: all seven). The NAR set's `nar_` modules are never targeted.",
    ),
    refresh_steps: int = typer.Option(
        100, help="NAR self-distillation steps on the adapted model's outputs (0: keep the old drafts)."
    ),
    refresh_sequences: int = typer.Option(48, help="AR-greedy sequences the refresh trains on."),
    save_every: int = typer.Option(50, help="Checkpoint every N LoRA steps."),
    seed: int = typer.Option(0, help="Seed for LoRA init, windows, prompts and the refresh."),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
    resume: bool = typer.Option(False, help="Continue the LoRA steps from the last checkpoint in OUT/run."),
) -> None:
    """LoRA-fine-tune the AR set on your text, then refresh the drafts for it (report: JSON)."""
    import json

    from yue.train.finetune import FinetuneConfig, finetune

    cfg = FinetuneConfig(
        steps=steps,
        lr=lr,
        batch_size=batch_size,
        seq_len=seq_len,
        lora_r=lora_r,
        lora_alpha=lora_alpha,
        refresh_steps=refresh_steps,
        refresh_sequences=refresh_sequences,
        save_every=save_every,
        seed=seed,
        threads=threads,
        **({"target_modules": tuple(target_modules)} if target_modules else {}),
    )
    report = finetune(model, data, out, cfg, resume=resume, command=_command_line(ctx))
    typer.echo(json.dumps({k: v for k, v in report.items() if k not in ("config", "refresh")}))


@app.command("merge")
@user_errors
def merge_cmd(
    model: str | None = typer.Option(None, help=MODEL_HELP),
    adapter: Path = typer.Option(..., help="The `yue finetune` adapter folder."),
    out: Path = typer.Option(..., help="Output: a standalone model folder with the adapter folded in."),
) -> None:
    """Fold an adapter (LoRA and refreshed drafts) into a standalone model folder."""
    from yue.train.finetune import merge_to_folder

    typer.echo(f"wrote {merge_to_folder(model, adapter, out)}")


@app.command("serve")
@user_errors
def serve_cmd(
    model: str | None = typer.Option(None, help=MODEL_HELP),
    adapter: Path | None = typer.Option(None, help="A `yue finetune` adapter folder for this model."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; localhost unless told otherwise."),
    port: int = typer.Option(8000, help="TCP port."),
    api_key: str | None = typer.Option(
        None, envvar="YUE_API_KEY", help="Require 'Authorization: Bearer KEY'."
    ),
    max_batch_size: int = typer.Option(
        16, help="Generations running at once, stepped together (continuous batching); 1 = one at a time."
    ),
    max_batch_tokens: int = typer.Option(
        128,
        help="Prefill work per decode step, in prompt tokens at a prompt's start (later ones weigh more), "
        "at least one chunk, so a long prompt stalls the running requests a chunk at a time; 0 = no bound.",
    ),
    max_queue: int = typer.Option(32, help="Requests waiting beyond those; more get 503 + Retry-After."),
    max_prompt_tokens: int = typer.Option(
        8192, help="Longest prompt accepted, in tokens (at most the context); 0 = the context."
    ),
    default_max_tokens: int = typer.Option(
        2048, help="What a chat request without max_tokens may generate at most."
    ),
    max_body_bytes: int = typer.Option(1 << 20, help="Largest request body, chunked bodies included."),
    drain_timeout: float = typer.Option(
        30.0,
        help="Seconds in-flight requests may run after SIGTERM; then they end with a 503 (streams: an "
        "error chunk and [DONE]) and the server exits 0.",
    ),
    device: str = typer.Option("cpu", help="cpu | cuda | auto"),
    dtype: str = typer.Option("float32", help=DTYPE_HELP),
    low_memory: bool = typer.Option(False, help=LOW_MEMORY_HELP),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    threads: int | None = typer.Option(
        None, help="torch threads (per replica with --replicas; default: the cores divided among them)."
    ),
    replicas: int | None = typer.Option(
        None, help="Run N replicas on Ray Serve, each its own model copy and batch (needs the ray extra)."
    ),
    autoscale: str | None = typer.Option(
        None, help="MIN:MAX replicas on Ray Serve, scaled on ongoing requests per replica."
    ),
    address: str | None = typer.Option(
        None,
        help="Join this Ray cluster (e.g. auto) with --replicas/--autoscale; default: start a local one.",
    ),
) -> None:
    """Serve over HTTP: OpenAI-compatible /v1 API, /generate, /health, /metrics and a demo page at /."""
    import yue
    from yue.model.adapters import check_adapter_folder
    from yue.model.inference import resolve_dtype
    from yue.registry import ar_source, resolve
    from yue.serve import ServeConfig, serve

    config = ServeConfig(
        host=host,
        port=port,
        api_key=api_key,
        max_batch_size=max_batch_size,
        max_batch_tokens=max_batch_tokens or None,
        max_queue=max_queue,
        max_prompt_tokens=max_prompt_tokens or None,
        default_max_tokens=default_max_tokens,
        max_body_bytes=max_body_bytes,
        drain_timeout_s=drain_timeout,
    )
    resolve_dtype(dtype)  # a bad name fails here, before the server starts
    folder = resolve(model)  # an unknown name or a missing package fails here, before the server starts
    if folder.is_dir():
        ar_source(folder)
    # The model loads in the background while /health answers 503; a load failure exits with status 1.
    if adapter is not None:
        check_adapter_folder(adapter)  # missing files fail here, not in the background load

    # Chat requests use the model's own template (`Engine.chat_prompt`). Picklable: Ray replicas run it.
    load = functools.partial(
        yue.load, model, device=device, dtype=dtype, adapter=adapter, low_memory=low_memory
    )
    if replicas is None and autoscale is None and address is None:
        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be >= 1, got {threads}")
            import torch

            torch.set_num_threads(threads)
        raise typer.Exit(code=serve(load, config, log_level=log_level))
    try:
        from yue.serve import replicas as ray_replicas
    except ImportError as e:
        raise ValueError(
            f"--replicas, --autoscale and --address need Ray: pip install 'yue[ray]' ({e})"
        ) from e
    plan = ray_replicas.ReplicaConfig(
        replicas=1 if replicas is None else replicas,
        autoscale=ray_replicas.parse_autoscale(autoscale) if autoscale else None,
        threads=threads,
        address=address,
    )
    code = ray_replicas.serve_replicas(load, config, plan)
    raise typer.Exit(code=code)


@app.command("eval")
@user_errors
def eval_cmd(
    model: str | None = typer.Option(None, help=MODEL_HELP),
    corpus: str = typer.Option("stdlib", help="'stdlib', a .txt/.jsonl file or a folder of sources."),
    batches: int = typer.Option(8, help="Validation batches to score."),
    batch_size: int = typer.Option(8, help="Sequences per batch."),
    seq_len: int = typer.Option(256, help="Tokens per sequence."),
) -> None:
    """Validation AR loss, NAR loss and NAR accuracy per slot of a model on a corpus (JSON); for a
    top-layer NAR set (yue-smol) or a plain Llama/GGUF, the AR loss."""
    import json

    from yue.registry import resolve
    from yue.train.evaluate import evaluate_model

    result = evaluate_model(resolve(model), corpus, batches, batch_size, seq_len)
    typer.echo(json.dumps(result))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
