"""What one decode step hands back (`StepEmission`): each row's tokens, who wrote them, why it stopped,
and, where asked, their log-probs; cut at EOS and at each row's budget (`truncate`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from yue.decode.rows import Row
from yue.decode.state import Advance
from yue.decode.types import Step, TokenLogprob


@dataclass
class StepEmission:
    """Tokens committed by one step of a set of rows (one forward, plus its drafting pass).

    Attributes:
        tokens/sources: per row (empty for rows that had already finished).
        writers: per row, per token, the draft source that wrote it or "ar" (`types.Writer`).
        finished: per row, why it stopped, or None while it runs.
        step: the trace record (row 0's counts) when `cfg.trace`.
        drafted/accepted: per row, draft tokens verified (or committed unverified) and kept.
        mode: the policy's "AR"/"NAR" for the step, or "cancelled".
        forwards: 2 when a drafting pass followed the step's forward.
        routed: the step's block positions by the path chosen, (to AR, to NAR), shared by its rows.
        rows: the row ids the lists refer to (`DecodeBatch.add`'s ids; `decode`: prompt indices).
        logprobs: per row, a TokenLogprob per token, for rows whose config asks (`logprobs`); else None.
    """

    tokens: list[list[int]]
    sources: list[list[str]]
    writers: list[list[str]]
    finished: list[str | None]
    step: Step | None
    drafted: list[int]
    accepted: list[int]
    mode: str
    forwards: int = 1
    routed: tuple[int, int] = (0, 0)
    rows: list[int] = field(default_factory=list)
    logprobs: list[list[TokenLogprob] | None] | None = None


def logprobs(rows: list[Row], adv: Advance, toks: list[list[int]], ar_logits: torch.Tensor) -> list | None:
    """Per row that asks, the AR log-prob (and top alternatives) of each token it emits (`toks`: the
    step's tokens as `truncate` cut them, a prefix of `adv.emitted`): token j < ar_count was predicted
    by verifying row ar_first + j; the rest were committed unverified (None)."""
    if all(r.cfg.logprobs is None for r in rows):
        return None
    logp = ar_logits.float().log_softmax(-1)  # (B, k + 1, V)
    out: list[list[TokenLogprob] | None] = []
    for b, row in enumerate(rows):
        if row.cfg.logprobs is None:
            out.append(None)
            continue
        entries = []
        for j, token in enumerate(toks[b]):
            if j >= adv.ar_count[b]:
                entries.append(TokenLogprob(token, None))
                continue
            dist = logp[b, adv.ar_first[b] + j]  # (V,)
            top = torch.topk(dist, row.cfg.logprobs) if row.cfg.logprobs else None
            alts = {} if top is None else dict(zip(top.indices.tolist(), top.values.tolist(), strict=True))
            entries.append(TokenLogprob(token, float(dist[token]), alts))
        out.append(entries)
    return out


def truncate(adv: Advance, rows: list[Row]) -> tuple[list[list[int]], list[list[str]], list[list[str]]]:
    """Cut each row's emitted tokens (with their sources and writers) at EOS and at its max_new_tokens
    budget; mark finished rows."""
    toks, srcs, writers = [], [], []
    for row, t, s, w in zip(rows, adv.emitted, adv.sources, adv.writers, strict=True):
        end = next((i for i, x in enumerate(t) if x in row.eos_ids), None)
        if end is not None:
            row.finish = "eos"
        else:
            end = len(t)
        if end >= row.budget:
            end = row.budget
            row.finish = row.finish or "length"
        row.budget -= end
        toks.append(t[:end]), srcs.append(s[:end]), writers.append(w[:end])
    return toks, srcs, writers
