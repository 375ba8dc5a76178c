"""What a model decodes through once prepared (`yue.kernels.prepare_for_decoding` builds it): the decode
paths, held apart from the trained modules and handed to the forward entry points that decoding uses.

Design decisions:
- The trained modules carry no decode-time state. `YueForCausalLM.step` / `forward` / `new_cache`,
  `MoTModel.run` and `MoTLayer.forward` take `paths` (None: as trained) and hand each layer its own entry,
  so a trained model and a prepared one are two objects (`prepared.PreparedModel`), not one with hidden
  state.
- This module is an interface of the model floor: it names what the kernels' paths must offer
  (`SetPath`) and imports nothing from `yue.kernels`, whose classes fill it.
- Every field's default is the trained model's own path, so `DecodePaths.as_trained(n)` decodes a model
  as it was trained (the four-expert experiment, or a model decoded unprepared through `generate()`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
from torch import nn


class SetPath(Protocol):
    """One parameter set's decode path in one layer (`yue.kernels.decode_set.DecodeSet`), as
    `MoTLayer._decode` and the uncached AR forward call it."""

    # Row-exact: a committed row's bits do not depend on the step's row count (matmuls and `attend`).
    exact: bool

    def one_call(self, h, cos, sin, mask, kv, start, row0) -> torch.Tensor | None:
        """The whole layer over h (B, T, D) in one call, or None where it does not apply."""

    def qkv_rope(self, h, cos, sin) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Norm, Q/K/V and RoPE: h (B, T, D) -> q (B, H, T, Dh), k and v (B, Hkv, T, Dh)."""

    def attend(self, q, kv, mask, start) -> torch.Tensor:
        """Row-exact attention of committed rows q (B, H, T, Dh) over the cache: (B, H, T, Dh)."""

    def finish(self, h, o) -> torch.Tensor:
        """Output projection, residual, norm, MLP, residual: h (B, T, D), o (B, H, T, Dh) -> (B, T, D)."""


# One layer's decode paths, indexed by parameter set as `MoTLayer._sets` is (False / 0: the AR set,
# True / 1: the NAR set, present only where the layer holds one).
LayerPaths = tuple[SetPath, ...]


class SlotEntryPath(NamedTuple):
    """A top-layer NAR set's slot entry for drafting passes (`SlotEntry.forward`): W's anchor half and
    token half as matmul modules (D -> D each, lowered to the drafting precision), and the norm as a
    function of (B, n, D) rows (None: the module's own)."""

    from_anchor: nn.Module
    from_token: nn.Module
    norm: Callable[[torch.Tensor], torch.Tensor] | None


@dataclass
class DecodePaths:
    """A prepared model's decode paths; each None / empty where the trained module's own path runs.

    Fields:
        layers: per layer, its `LayerPaths` (fused matmuls, row-exact attention), or None (as trained).
        stacks: per parameter set (False: AR, True: NAR), its layers as one row-kernel call, called as
            stack(h_c, h_s, cos, sin, mask, cache, start, first, last, local) -> (h_c, h_s) or None where the
            step does not fit (`yue.kernels.decode_set.LayerStack`); no entry where not every layer
            holding the set is one call.
        slot_norm: a drafting pass's final norm (B, n, D) -> (B, n, D) on yue's row kernel: torch's
            per-call overhead dominates there.
        final_norm: the final norm of a forward's committed rows (with any slots), the same function
            where set (a float32 model on yue's row kernel: each row's bits its own, whatever the rows);
            None: the model's norm module.
        slot_entry: a top-layer NAR set's slot entry lowered for drafting (`SlotEntryPath`).
        softmax_stats: the router's per-row (max probability, entropy) of logits (..., V) -> (...), (...):
            yue's row kernel's on a CPU in float32 (over SmolLM2's 49,152 logits a row torch's costs a
            sizeable share of a drafting step; docs/results-log.md); None: `router.softmax_stats`.
        ar_head: the head for AR rows (B, n, D) -> (B, n, V) on a decode kernel (maybe screened:
            `top1_entropy`); None: the LM head itself.
        draft_head: the head for slot rows, lowered and/or over the drafting vocabulary, returning
            whole-vocabulary logits; None: the LM head (restricted to `draft_vocab`, if any).
        layout: the kernels the rows run, named (`yue.kernels.prepare.kernels_named`; "" as trained):
            step costs measured for one layout are not another's (`decode.costs.cost_cache_key`).
        cache_dtype: the KV cache's and attention's precision; None: the model's dtype.
    """

    layers: list[LayerPaths | None]
    stacks: dict[bool, Callable] = field(default_factory=dict)
    slot_norm: Callable[[torch.Tensor], torch.Tensor] | None = None
    final_norm: Callable[[torch.Tensor], torch.Tensor] | None = None
    slot_entry: SlotEntryPath | None = None
    softmax_stats: Callable | None = None
    ar_head: nn.Module | None = None
    draft_head: nn.Module | None = None
    layout: str = ""
    cache_dtype: torch.dtype | None = None

    @classmethod
    def as_trained(cls, n_layers: int) -> DecodePaths:
        """Paths that decode a model of `n_layers` layers as it was trained."""
        return cls([None] * n_layers)


def exact_rows(paths: LayerPaths | None) -> bool:
    """Whether a layer's verifying rows compute, bit for bit, what one-row AR steps would (its AR set's
    path is row-exact: `SetPath.exact`)."""
    return paths is not None and paths[0].exact
