"""The model card of a trained model, written from the run's own reports (never typed by hand).

    python -m recipes.card MODEL_DIR --stage1 RUN/stage1.json [--bench BENCH.json] [--calibration CAL.json]

Reads `stage1.json` (recipes.summary), `selfdistill_report.json` and `router_report.json` from
MODEL_DIR when present, generates three greedy completions with the model itself, and writes
MODEL_DIR/README.md. Every number in the card comes from one of those files or from that generation.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

COMPLETION_PROMPTS = ["def fibonacci(n):", "import os\n\n\ndef list_python_files(root):\n", "class Stack:\n"]


def _load(path: Path | None) -> dict | None:
    return json.loads(path.read_text()) if path is not None and path.is_file() else None


def _pct(xs: list[float]) -> str:
    return " ".join(f"{x:.3f}" for x in xs)


def _params(stage1: dict) -> str:
    p = stage1.get("params", {})
    return ", ".join(f"{k}: {v:,}" for k, v in p.items())


def _completions(model_dir: Path) -> list[tuple[str, str]]:
    import yue

    engine = yue.load(model_dir)
    return [(p, engine.generate(p, mode="ar", max_new_tokens=64).text) for p in COMPLETION_PROMPTS]


def _router_section(router: dict | None) -> list[str]:
    if router is None:
        return ["(no router report)"]
    held = router["held_out"]
    f3 = lambda v: "-" if v != v else f"{v:.3f}"  # noqa: E731 (NaN: a slot whose label never varies)
    lines = [
        f"Features: {router.get('features', 'fused blocks (slot 1 a mask), float drafts')}. "
        f"Held-out blocks: {router['held_out_blocks']}; mean accepted prefix {held['mean_accepted_prefix']:.3f}.",
        "",
        "| slot | positive rate | router AUC | router ECE | raw-confidence AUC | raw-confidence ECE |",
        "|---|---|---|---|---|---|",
    ]
    for r in held["per_slot"]:
        lines.append(
            f"| {r['slot']} | {r['positive_rate']:.3f} | {f3(r['router_auc'])} | {f3(r['router_ece'])} | "
            f"{f3(r['conf_auc'])} | {f3(r['conf_ece'])} |"
        )
    lines.append(
        f"| all | | {held['router_auc']:.3f} | {held['router_ece']:.3f} | {held['conf_auc']:.3f} | "
        f"{held['conf_ece']:.3f} |"
    )
    return lines


def write_card(
    model_dir: Path, stage1: dict, bench: dict | None = None, calibration: dict | None = None
) -> Path:
    """Write MODEL_DIR/README.md from the reports; returns its path."""
    sd = _load(model_dir / "selfdistill_report.json")
    router = _load(model_dir / "router_report.json")
    config = json.loads((model_dir / "config.json").read_text())
    rounds = [*sd.get("previous", []), sd] if sd else []
    out = [
        "# yue-code-mini",
        "",
        "The default model of [yue](../../../README.md): an AR–NAR Mixture-of-Transformers trained by the",
        "project's own recipe on the Python standard library, on 2 CPU cores. Small, for speed on a laptop;",
        "it writes plausible-looking Python, not correct programs.",
        "",
        *_recipe_section(stage1, config, rounds, router),
        "",
        "## Size",
        f"{_params(stage1)}. Hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, "
        f"{config['num_attention_heads']} heads ({config['num_key_value_heads']} KV), MLP "
        f"{config['intermediate_size']}, K = {config['block_size']} slots per NAR block. Sized so the joint "
        "stage fits about an hour of 2 shared CPU cores (~1.5k tokens/s) and the decoder's forward stays a "
        "few milliseconds on one core; float32 weights stay under the 40 MiB package budget.",
        "",
        *_quality_section(stage1["final_eval"], rounds),
        "",
        "### Router calibration",
        "",
        *_router_section(router),
    ]
    if calibration:
        out += ["", "### Default router threshold", "", calibration["text"]]
    if bench:
        out += _speed_section(bench)
    out += [
        "",
        "## Greedy completions (verbatim, `mode=ar`, 64 new tokens)",
        "",
        "A prompt that ends in a newline splits a token the tokenizer would have merged with the next",
        "line's indentation (`\\n` + spaces), so the model reads it as the end of a top-level block.",
        "",
    ]
    for prompt, text in _completions(model_dir):
        out += ["```python", prompt + text, "```", ""]
    path = model_dir / "README.md"
    path.write_text("\n".join(out) + "\n")
    return path


def _recipe_section(stage1: dict, config: dict, rounds: list[dict], router: dict) -> list[str]:
    """The card's data and recipe: each stage's command, steps, tokens and time."""
    hw = stage1["hardware"]
    out = [
        "## Data",
        f"The running interpreter's standard library (`Lib/**/*.py`, test folders excluded): "
        f"{stage1['data']['train_files']} training files ({stage1['data']['train_tokens']:,} tokens), "
        f"{stage1['data']['val_files']} validation files ({stage1['data']['val_tokens']:,} tokens), split by "
        "a hash of the file path. Byte-level BPE, vocabulary "
        f"{config['vocab_size']}. The bench's development set (`yue/assets/devset.jsonl`) is cut from "
        "`Lib/test`, never trained on.",
        "",
        "## Recipe and cost",
        f"Hardware: {hw['cpus']} CPU cores ({hw['machine']}), torch {hw['torch']}, "
        f"{hw['torch_threads']} training thread(s), shared with other work.",
        "",
        f"1. Joint training (α, β, γ = {config['loss_weights']['ar']}, {config['loss_weights']['nar']}, "
        f"{config['loss_weights']['kl']}), {stage1['steps']} steps, {stage1['tokens_seen']:,} tokens, "
        f"{stage1['wall_s'] / 60:.1f} min:",
        f"   `{stage1['command']}`",
    ]
    for i, r in enumerate(rounds, start=1):
        command = r.get("command") or (
            f"yue self-distill --model <stage-1 model> --out <stage-2 model> --sequences {r['sequences']} "
            f"--steps {r['config']['steps']} --lr {r['config']['lr']} --threads 2"
        )
        gen = "reused" if r["generation_s"] is None else f"{r['generation_s'] / 60:.1f} min"
        out += [
            f"2.{i}. Self-distillation round {i} of the NAR set: {r['config']['steps']} steps on "
            f"{r.get('train_sequences', r['sequences'])} AR-greedy continuations (its sequence file: "
            f"{r['sequences']}; generation {gen}, training {r['train_s'] / 60:.1f} min):",
            f"   `{command}`",
        ]
        if r.get("note"):
            out.append(f"   ({r['note']})")
    if router:
        out += [
            f"3. Router on acceptance labels of the final towers ({router['train_blocks']} blocks, "
            f"{(router['collect_s'] + router['train_s']) / 60:.1f} min):",
            "   `yue train-router --model <stage-2 model> --data <round-3 model>/data/router_sequences.safetensors`",
        ]
    return out


def _quality_section(ev: dict, rounds: list[dict]) -> list[str]:
    """The card's losses and NAR accuracies: stage 1's validation, each round's held-out sequences."""
    out = [
        "## Quality",
        f"Validation after stage 1: AR loss {ev['ar_loss']:.3f} (perplexity {2.718281828 ** ev['ar_loss']:.1f}), "
        f"NAR loss {ev['nar_loss']:.3f}.",
        "",
        f"NAR accuracy per slot against the true text (stage 1, validation): {_pct(ev['nar_acc_per_slot'])}",
    ]
    if rounds:
        out += [
            "",
            "NAR accuracy per slot against the AR path's own greedy tokens, on each round's held-out new "
            "sequences (never trained on), before → after the round:",
        ]
    for i, r in enumerate(rounds, start=1):
        out += [
            f"- round {i} before: {_pct(r['held_out_nar_acc_before'])}",
            f"- round {i} after:  {_pct(r['held_out_nar_acc_after'])}",
        ]
        revealed = r.get("held_out_nar_acc_slot1_revealed_after")
        if revealed:  # slot 1 is never predicted when revealed: its entry is null
            before = r["held_out_nar_acc_slot1_revealed_before"]
            out.append(
                f"- round {i}, slot 1 revealed as decoding's drafting pass shows it, slots 2..K: "
                f"{_pct(before[1:])} → {_pct(revealed[1:])}"
            )
    return out


def _speed_section(bench: dict) -> list[str]:
    """The card's `yue bench` table on the development set."""
    from yue.bench.report import markdown_table

    return [
        "",
        "### Speed and fidelity (yue bench, development set)",
        "",
        f"`yue bench` on the {bench['prompts']}-prompt development set, {bench['max_new_tokens']} new "
        "tokens, one thread, the transformers peers on the same weights (command and reading in the "
        "project README):",
        "",
        markdown_table(bench),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description="Write a model card from a run's reports.")
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--stage1", type=Path, required=True)
    parser.add_argument("--bench", type=Path, default=None, help="`yue bench --json` output to tabulate")
    parser.add_argument("--calibration", type=Path, default=None, help="JSON {'text': markdown} to include")
    args = parser.parse_args()
    path = write_card(args.model_dir, _load(args.stage1), _load(args.bench), _load(args.calibration))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
