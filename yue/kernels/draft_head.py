"""The slot rows' head (`DecodePaths.draft_head`), built by `prepare_for_decoding`: the LM head's rows
over the drafting vocabulary (FR-Spec) and/or lowered to the drafting precision."""

from __future__ import annotations

import functools

import torch
from torch import nn

from yue.kernels import rowkernel
from yue.kernels.matmuls import lower_linear, row_adaptive
from yue.model.mot import DRAFT_FILL, expand_draft_logits


class DraftVocabHead(nn.Module):
    """Slot rows' head over a reduced drafting vocabulary (FR-Spec), returning whole-vocabulary logits.

    `inner` maps (B, n, D) -> (B, n, Vd) over the rows `ids` of the LM head; the result is spread into
    (B, n, V) with `DRAFT_FILL` elsewhere (`expand_draft_logits`; on yue's row kernel where `row_kernel`,
    float32 on the CPU: one pass, `rowkernel.spread`), so the policies and the router see the shapes they
    always do. On SmolLM2 the head over the 8,192 most frequent output tokens is a sixth of the full one
    (docs/design.md §8).
    """

    def __init__(
        self, inner: nn.Module, ids: torch.Tensor, vocab_size: int, row_kernel: bool = False
    ) -> None:
        super().__init__()
        self.inner, self.ids, self.vocab_size, self.row_kernel = inner, (ids,), vocab_size, row_kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sub = self.inner(x)
        if self.row_kernel and sub.dtype == torch.float32:
            return rowkernel.spread(sub, self.ids[0], self.vocab_size, DRAFT_FILL)
        return expand_draft_logits(sub, self.ids[0], self.vocab_size)


def draft_head(model, drafting_dtype: torch.dtype | None, row_kernel: bool = False) -> nn.Module | None:
    """The head for slot rows: the LM head's rows over `model.draft_vocab` (if any), lowered to
    `drafting_dtype` (if any; int8 on yue's row kernel where `row_kernel`, as the NAR layers: faster
    than torch's dynamic int8 at a drafting pass's row counts, docs/results-log.md); None where the LM head itself serves."""
    vocab = None if model.draft_vocab is None else model.draft_vocab.long()
    lower = functools.partial(lower_linear, dtype=drafting_dtype, row_kernel=row_kernel)
    if vocab is None:
        return None if drafting_dtype is None else lower(model.lm_head)
    sub = nn.Linear(model.config.hidden_size, len(vocab), bias=False, device=vocab.device)
    sub.weight = nn.Parameter(model.lm_head.weight.detach()[vocab].clone(), requires_grad=False)
    inner = row_adaptive(sub) if drafting_dtype is None else lower(sub)
    return DraftVocabHead(inner, vocab, model.config.vocab_size, row_kernel)
