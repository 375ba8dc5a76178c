"""Reporting a bench run: per prompt set a table, the accept-length histograms and who wrote the output
tokens (held-out set first, a dev set labelled as such), the verify cost curve, what was skipped and
why, a speed/fidelity plot, one JSON line.

Design decisions:
- The table shows more than the JSON (p10/p90, warm-up, base RSS, histograms); the JSON carries
  exactly the issue's keys per mode, so scripts can rely on its shape. `None` prints as "-" and is
  `null`.
- The JSON document is the LAST line on stdout, always: the table goes first, through rich.
- The plot puts fidelity (chrF ratio vs ar) on x and speed (x hf-greedy) on y; the hybrid threshold
  sweep is drawn as one curve, every other entry as a labelled point. Matplotlib's Agg backend, so no
  display is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from yue.bench.harness import PEERS, BenchResult, SetResult
from yue.bench.prompts import SPLIT_LABELS
from yue.decode.types import WRITERS
from yue.errors import require


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _set_title(s: SetResult) -> str:
    label = SPLIT_LABELS.get(s.split, s.split)
    return f"{label}: {s.name} ({s.prompts} prompts)"


def table(result: BenchResult, s: SetResult | None = None) -> Table:
    """The per-entry comparison table of one prompt set (default: the first, held-out one)."""
    s = s or result.sets[0]
    t = Table(
        title=f"yue bench: {result.model}, {_set_title(s)}, {result.max_new_tokens} new tokens "
        f"({', '.join(f'{k}={v}' for k, v in result.settings.items())})",
        title_justify="left",
    )
    for col in (
        "entry",
        "tok/s med [p10-p90]",
        "x hf-greedy",
        "x llama.cpp",
        "TTFT ms",
        "fwd/tok",
        "mean acc",
        "exact vs ar",
        "NLL (ratio)",
        "chrF (ratio)",
        "rep 4g",
        "peak RSS MB (base)",
        "warm-up s",
    ):
        t.add_column(col, justify="left" if col == "entry" else "right")
    for name, m in s.summaries.items():
        v = m.values
        t.add_row(
            name,
            f"{_f(v['tokens_per_s'], '.1f')} [{_f(m.tokens_per_s_p10, '.1f')}-{_f(m.tokens_per_s_p90, '.1f')}]",
            _f(v["speedup_vs_hf_greedy"], ".2f"),
            _f(v["speedup_vs_llamacpp_greedy"], ".2f"),
            _f(v["ttft_ms"], ".1f"),
            _f(v["forwards_per_token"], ".3f"),
            _f(v["mean_accepted"], ".2f"),
            _f(v["exact_match_vs_ar"], ".2f"),
            f"{_f(m.nll, '.3f')} ({_f(v['nll_ratio_vs_ar'], '.3f')})",
            f"{_f(v['chrf'], '.1f')} ({_f(v['chrf_ratio_vs_ar'], '.3f')})",
            _f(v["repetition"], ".3f"),
            f"{_f(v['peak_rss_mb'], '.0f')} ({_f(m.base_rss_mb, '.0f')})",
            _f(m.warmup_s, ".2f"),
        )
    return t


def markdown_table(doc: dict, modes: dict | None = None) -> str:
    """The bench's JSON document (its last line) as a Markdown table, for the README and model card.

    Args:
        doc: the document; its "modes" (the first, held-out set) are tabulated unless `modes` is given
            (e.g. `doc["prompt_sets"][1]["modes"]`). A "× llama.cpp" column appears when llama.cpp ran.
    """
    modes = doc["modes"] if modes is None else modes
    lc = any(v.get("speedup_vs_llamacpp_greedy") is not None for v in modes.values())
    cols = "entry | tok/s | × hf-greedy" + (" | × llama.cpp" if lc else "")
    cols += " | TTFT ms | tokens/forward | mean accepted | exact vs ar | NLL ratio"
    cols += " | chrF ratio | repetition | peak RSS MB"
    lines = [f"| {cols} |", "|" + "---|" * (cols.count("|") + 1)]
    for name, v in modes.items():
        fpt = v["forwards_per_token"]
        cells = [
            name,
            _f(v["tokens_per_s"], ".0f"),
            _f(v["speedup_vs_hf_greedy"], ".2f"),
            *([_f(v.get("speedup_vs_llamacpp_greedy"), ".2f")] if lc else []),
            _f(v["ttft_ms"], ".1f"),
            _f(1.0 / fpt if fpt else None, ".2f"),
            _f(v["mean_accepted"], ".2f"),
            _f(v["exact_match_vs_ar"], ".2f"),
            _f(v["nll_ratio_vs_ar"], ".3f"),
            _f(v["chrf_ratio_vs_ar"], ".3f"),
            _f(v["repetition"], ".3f"),
            _f(v["peak_rss_mb"], ".0f"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def histogram_table(result: BenchResult, s: SetResult | None = None) -> Table | None:
    """Accepted draft tokens per drafting step, per entry that drafts (None when none did)."""
    s = s or result.sets[0]
    rows = {n: m.accept_hist for n, m in s.summaries.items() if m.accept_hist}
    if not rows:
        return None
    top = max(max(h) for h in rows.values())
    t = Table(
        title=f"accepted draft tokens per drafting step (count of steps): {s.name} ({s.split})",
        title_justify="left",
    )
    t.add_column("entry")
    for a in range(top + 1):
        t.add_column(str(a), justify="right")
    for name, h in rows.items():
        t.add_row(name, *[str(h.get(a, 0)) for a in range(top + 1)])
    return t


def sources_table(result: BenchResult, s: SetResult | None = None) -> Table | None:
    """Each entry of ours by who wrote its output tokens (`summary.token_shares`): the NAR set, context
    copies, the corpus table, the AR path, as shares (None when no entry is ours)."""
    s = s or result.sets[0]
    rows = {n: m.values["token_sources"] for n, m in s.summaries.items() if m.values["token_sources"]}
    if not rows:
        return None
    t = Table(title=f"share of output tokens by writer: {s.name} ({s.split})", title_justify="left")
    t.add_column("entry")
    for w in WRITERS:
        t.add_column(w, justify="right")
    for name, shares in rows.items():
        t.add_row(name, *[f"{shares.get(w, 0.0):.3f}" for w in WRITERS])
    return t


def _in_sweep(e) -> bool:
    """The hybrid threshold sweep, drawn as one curve; every other entry is a point."""
    return e.mode == "hybrid" and e.threshold is not None


def plot(result: BenchResult, out: str | Path) -> Path:
    """Write the speed (x hf-greedy) vs fidelity (chrF ratio vs ar) plot as PNG."""
    matplotlib = require("matplotlib", "bench", "the bench plot")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Fidelity: chrF ratio vs ar where the prompts have references (code); else (chat) the AR-NLL ratio.
    key, label = "chrf_ratio_vs_ar", "fidelity: chrF ratio vs ar"
    if not any(result.summaries[e.name].values.get(key) is not None for e in result.entries):
        key, label = "nll_ratio_vs_ar", "fidelity: AR-NLL ratio vs ar (lower is more faithful)"

    def xy(name: str) -> tuple[float, float] | None:
        v = result.summaries[name].values
        x, y = v[key], v["speedup_vs_hf_greedy"]
        return (x, y) if x is not None and y is not None else None

    fig, ax = plt.subplots(figsize=(7, 5), dpi=120)
    sweep = sorted((e.threshold, xy(e.name)) for e in result.entries if _in_sweep(e) and xy(e.name))
    if sweep:
        ax.plot(
            [p[0] for _, p in sweep], [p[1] for _, p in sweep], "o-", color="tab:orange", label="hybrid sweep"
        )
        for thr, (x, y) in sweep:
            ax.annotate(f"{thr:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    points = sorted(
        (xy(e.name)[1], xy(e.name)[0], e)
        for e in result.entries
        if not _in_sweep(e) and e.batch == 1 and xy(e.name) is not None
    )
    ys = [y for y, _, _ in points] + [1.0]
    gap = 0.045 * (max(ys) - min(ys) or 1.0)  # least vertical distance between labels at one x
    placed: list[tuple[float, float]] = []  # (x, label y) of the labels written so far
    for y, x, e in points:
        peer = e.mode in PEERS
        ax.scatter([x], [y], marker="s" if peer else "o", color="tab:gray" if peer else "tab:blue", zorder=3)
        # Lossless entries share x = 1.0: lift a label above the ones already placed near it.
        label_y = y - gap / 2
        for px, py in placed:
            if abs(px - x) < 0.02 and label_y < py + gap:
                label_y = py + gap
        placed.append((x, label_y))
        lift = label_y - (y - gap / 2) > 1e-9
        ax.annotate(
            e.name,
            (x, y),
            xytext=(x + 0.004, label_y),
            textcoords="data",
            fontsize=8,
            va="center",
            arrowprops={"arrowstyle": "-", "color": "lightgray", "lw": 0.6} if lift else None,
        )
    if not any(xy(e.name) for e in result.entries):
        ax.text(
            0.5,
            0.5,
            "no fidelity ratio: needs `ar` and `hf-greedy`",
            ha="center",
            transform=ax.transAxes,
        )
    ax.axhline(1.0, color="lightgray", lw=0.8, zorder=0)
    ax.set_xlabel(label)
    ax.set_ylabel("speed: tokens/s x hf-greedy")
    ax.set_title(
        f"{result.model}: {_set_title(result.sets[0])}, {result.max_new_tokens} new tokens",
        fontsize=10,
    )
    if sweep:
        ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out)
    plt.close(fig)
    return out


def cost_table(result: BenchResult) -> Table | None:
    """A verifying forward's cost against its rows, and the drafting pass's, as ratios to a 1-row step."""
    c = result.costs
    if c is None:
        return None
    t = Table(
        title=f"cost of one forward by fed rows (median, context {c.context} tokens; "
        f"1 row = an AR step = {c.step_s[0] * 1e3:.2f} ms)",
        title_justify="left",
    )
    t.add_column("")
    for n in c.rows:
        t.add_column(f"{n} row{'s' if n > 1 else ''}", justify="right")
    if c.draft_s is not None:
        t.add_column(f"drafting pass ({c.draft_slots} slots)", justify="right")
    draft = [f"{c.draft_s / c.step_s[0]:.2f}"] if c.draft_s is not None else []
    t.add_row("x 1-row step", *[f"{r:.2f}" for r in c.ratios], *draft)
    draft_ms = [f"{c.draft_s * 1e3:.2f}"] if c.draft_s is not None else []
    t.add_row("ms", *[f"{s * 1e3:.2f}" for s in c.step_s], *draft_ms)
    return t


def print_report(result: BenchResult, console: Console | None = None) -> str:
    """Print the tables (per prompt set, held-out first), the cost curve and what was skipped, then the
    JSON document as the last stdout line; return that line."""
    console = console or Console(highlight=False, width=200, soft_wrap=False)
    for s in result.sets:
        console.print(table(result, s))
        for extra in (histogram_table(result, s), sources_table(result, s)):
            if extra is not None:
                console.print(extra)
    costs = cost_table(result)
    if costs is not None:
        console.print(costs)
    for name, why in result.skipped.items():
        console.print(f"{name} skipped: {why}", markup=False)
    console.file.flush()
    line = json.dumps(result.document())
    print(line, flush=True)
    return line
