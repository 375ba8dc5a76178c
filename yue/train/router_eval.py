"""Router evaluation: AUC and calibration of acceptance probabilities, and the threshold -> speed table.

Design decisions:
- AUC is the rank (Mann-Whitney) statistic with tied scores given average ranks, so no sklearn is
  needed; ECE uses 15 equal-width bins. Both take any array-like of scores and 0/1 labels.
- The raw-confidence baselines (a slot's own max probability, and the product over slots 1..i) are
  evaluated beside the router, since docs/design.md §7 found raw confidence badly calibrated.
- The threshold table decodes through the public engine (`yue.load(...).generate`), so it measures
  exactly what users get: tokens per forward and fidelity to `ar` per (mode, threshold).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from yue.errors import require
from yue.model.router import Router


@dataclass
class RouterExamples:
    """One row per block. features (N, D+1+3K); labels, confidence (N, K); group (N,): source sequence id."""

    features: torch.Tensor
    labels: torch.Tensor
    confidence: torch.Tensor
    group: torch.Tensor

    def __len__(self) -> int:
        return self.features.shape[0]

    @staticmethod
    def cat(parts: Sequence[RouterExamples]) -> RouterExamples:
        return RouterExamples(
            *(
                torch.cat([getattr(p, f) for p in parts])
                for f in ("features", "labels", "confidence", "group")
            )
        )

    def select(self, rows: torch.Tensor) -> RouterExamples:
        return RouterExamples(self.features[rows], self.labels[rows], self.confidence[rows], self.group[rows])

    def split_by_group(self, held_out: float, seed: int = 0) -> tuple[RouterExamples, RouterExamples]:
        """(train, held-out), splitting whole source sequences so no text is on both sides."""
        groups = torch.unique(self.group)
        perm = groups[torch.randperm(len(groups), generator=torch.Generator().manual_seed(seed))]
        n_out = max(1, round(len(groups) * held_out)) if len(groups) > 1 and held_out > 0 else 0
        out = torch.isin(self.group, perm[:n_out])
        return self.select(torch.nonzero(~out).squeeze(1)), self.select(torch.nonzero(out).squeeze(1))


# --------------------------------------------------------------------------------------------------
# Metrics


def auc(scores: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray) -> float:
    """ROC AUC via the Mann-Whitney U statistic, ties given average ranks; NaN when only one class occurs."""
    s = np.asarray(scores, dtype=np.float64).ravel()
    y = np.asarray(labels).ravel() > 0.5
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0  # 1-based average rank of each distinct score
    ranks = avg_rank[inverse]
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def ece(probs: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, n_bins: int = 15) -> float:
    """Expected calibration error: sum over equal-width bins of (bin share) * |mean p - mean y|."""
    p = np.asarray(probs, dtype=np.float64).ravel()
    y = np.asarray(labels, dtype=np.float64).ravel()
    if len(p) == 0:
        return float("nan")
    bins = np.minimum((p * n_bins).astype(int), n_bins - 1)
    total = 0.0
    for b in range(n_bins):
        sel = bins == b
        if sel.any():
            total += sel.mean() * abs(p[sel].mean() - y[sel].mean())
    return float(total)


@torch.no_grad()
def evaluate_router(router: Router, ex: RouterExamples) -> dict:
    """Per-slot and pooled AUC / ECE / BCE of the router's a_i and of the raw-confidence baselines.

    Baselines: `conf` = slot i's own max probability; `conf_prod` = prod_{j<=i} of them (the
    "all match" probability if slots were independent and calibrated).
    """
    a = Router.log_acceptance(router(ex.features.to(router.fc1.weight))).exp().cpu().double()  # (N, K)
    y = ex.labels.double()
    conf = ex.confidence.double()
    conf_prod = conf.cumprod(-1)
    K = y.shape[1]
    per_slot = []
    for i in range(K):
        per_slot.append(
            {
                "slot": i + 1,
                "positive_rate": round(float(y[:, i].mean()), 4),
                "router_auc": round(auc(a[:, i], y[:, i]), 4),
                "router_ece": round(ece(a[:, i], y[:, i]), 4),
                "router_mean_a": round(float(a[:, i].mean()), 4),
                "conf_auc": round(auc(conf[:, i], y[:, i]), 4),
                "conf_ece": round(ece(conf[:, i], y[:, i]), 4),
                "conf_prod_auc": round(auc(conf_prod[:, i], y[:, i]), 4),
                "conf_prod_ece": round(ece(conf_prod[:, i], y[:, i]), 4),
            }
        )
    bce = float(-(y * a.clamp_min(1e-12).log() + (1 - y) * (1 - a).clamp_min(1e-12).log()).mean())
    return {
        "blocks": len(ex),
        "mean_accepted_prefix": round(float(y.sum(1).mean()), 4),  # E[number of leading slots that match]
        "router_bce": round(bce, 4),
        "router_auc": round(auc(a, y), 4),
        "router_ece": round(ece(a, y), 4),
        "conf_auc": round(auc(conf, y), 4),
        "conf_ece": round(ece(conf, y), 4),
        "conf_prod_auc": round(auc(conf_prod, y), 4),
        "conf_prod_ece": round(ece(conf_prod, y), 4),
        "per_slot": per_slot,
    }


def format_report(report: dict) -> str:
    """A per-slot table: router vs raw confidence, AUC and ECE."""
    cols = ["router_auc", "router_ece", "conf_auc", "conf_ece", "conf_prod_auc", "conf_prod_ece"]
    lines = [
        f"blocks={report['blocks']}  mean accepted prefix={report['mean_accepted_prefix']:.3f}  "
        f"router BCE={report['router_bce']:.4f}",
        f"{'slot':>4} {'pos_rate':>9} " + " ".join(f"{c:>13}" for c in cols),
    ]
    for r in report["per_slot"]:
        lines.append(f"{r['slot']:>4} {r['positive_rate']:>9.3f} " + " ".join(f"{r[c]:>13.3f}" for c in cols))
    lines.append(f"{'all':>4} {'':>9} " + " ".join(f"{report[c]:>13.3f}" for c in cols))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# Threshold -> speed / fidelity (needs the decode engine)


def threshold_table(
    model_dir: str | Path,
    prompts: Sequence[str],
    thresholds: Sequence[float] = (0.1, 0.3, 0.5, 0.65, 0.8, 0.9),
    modes: Sequence[str] = ("hybrid", "verified"),
    max_new_tokens: int = 128,
) -> list[dict]:
    """Greedy decoding of `prompts` at each router threshold: tokens per forward and fidelity to `ar`.

    Fidelity columns: `exact` = share of prompts whose output equals `ar`'s token for token;
    `prefix` = mean share of `ar`'s tokens reproduced before the first difference; `chrf_vs_ar` =
    corpus chrF of the outputs against `ar`'s (100 = identical). `verified` must read exact = 1.
    """
    import yue
    from yue.decode.sources import common_prefix

    CHRF = require("sacrebleu.metrics", "bench", "the threshold table's chrF").CHRF

    engine = yue.load(model_dir)
    chrf = CHRF()

    def run(mode: str, threshold: float | None) -> tuple[list, float]:
        t0 = time.perf_counter()
        outs = [
            engine.generate(p, mode=mode, router_threshold=threshold, max_new_tokens=max_new_tokens)
            for p in prompts
        ]
        return outs, time.perf_counter() - t0

    ar, ar_s = run("ar", None)

    def row(mode: str, threshold: float | None, outs: list, wall: float) -> dict:
        tokens = sum(o.stats.new_tokens for o in outs)
        return {
            "mode": mode,
            "threshold": threshold,
            "tokens_per_forward": round(tokens / max(1, sum(o.stats.forwards for o in outs)), 3),
            "nar_share": round(sum(o.stats.nar_tokens for o in outs) / max(1, tokens), 3),
            "exact": round(
                sum(o.token_ids == a.token_ids for o, a in zip(outs, ar, strict=True)) / len(ar), 3
            ),
            "prefix": round(
                sum(
                    common_prefix(o.token_ids, a.token_ids) / max(1, len(a.token_ids))
                    for o, a in zip(outs, ar, strict=True)
                )
                / len(ar),
                3,
            ),
            "chrf_vs_ar": round(chrf.corpus_score([o.text for o in outs], [[a.text for a in ar]]).score, 2),
            "tokens_per_s": round(tokens / max(wall, 1e-9), 1),
        }

    rows = [row("ar", None, ar, ar_s)]
    for mode in modes:
        for th in thresholds:
            outs, wall = run(mode, th)
            rows.append(row(mode, th, outs, wall))
    return rows


def format_threshold_table(rows: list[dict]) -> str:
    cols = ["tokens_per_forward", "nar_share", "exact", "prefix", "chrf_vs_ar", "tokens_per_s"]
    lines = [f"{'mode':>8} {'thresh':>6} " + " ".join(f"{c:>18}" for c in cols)]
    for r in rows:
        th = "-" if r["threshold"] is None else f"{r['threshold']:.2f}"
        lines.append(f"{r['mode']:>8} {th:>6} " + " ".join(f"{r[c]:>18}" for c in cols))
    return "\n".join(lines)
