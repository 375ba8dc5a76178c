"""A model prepared for decoding: the trained model and its decode paths, as one object the decode loop,
the engine and the tools call (`yue.kernels.prepare_for_decoding` returns one; `yue.load`'s engine holds
one as `engine.model`).

Design decisions:
- Explicit forwarding, not `__getattr__`: what a prepared model offers is listed here, and every call that
  runs the model hands it `paths` (`decode_paths.DecodePaths`), so the trained modules hold no decode
  state.
- Preparing transforms the trained model's weights in place (input-major storage, fused views, lowered
  or released copies: memory counts more than keeping the trained one intact), so the model passed to
  `prepare_for_decoding` is consumed (`YueForCausalLM.consumed`): saving, training or adapting it raises,
  and so does running it without its paths. Save, train or adapt a model as loaded.
- `as_decoded(model)` is the decode loop's view of any model: a `PreparedModel` as is, a trained one
  wrapped with paths that run it as trained (nothing transformed, nothing consumed), so a model loaded by
  `AutoModelForCausalLM` decodes through the same interface.
"""

from __future__ import annotations

import torch
from transformers import GenerationMixin

from yue.model.cache import KVCache
from yue.model.decode_paths import DecodePaths
from yue.model.mot import CONSUMED, StepOutput, YueForCausalLM


class PreparedModel:
    """A `YueForCausalLM` (`trained`, consumed where prepared) with its `DecodePaths` (`paths`)."""

    def __init__(self, trained: YueForCausalLM, paths: DecodePaths) -> None:
        self.trained, self.paths = trained, paths

    # What the loop, the engine and the tools read of the model.
    @property
    def config(self):
        return self.trained.config

    @property
    def generation_config(self):
        return self.trained.generation_config

    @property
    def device(self) -> torch.device:
        return self.trained.device

    @property
    def dtype(self) -> torch.dtype:
        return self.trained.dtype

    @property
    def router(self):
        """The router's module (its features through `router_features`, which use the paths' kernel)."""
        return self.trained.router

    @property
    def anchor_head(self):
        return self.trained.anchor_head

    @property
    def lm_head(self):
        """The LM head as trained (input-major storage once prepared: the same values)."""
        return self.trained.lm_head

    @property
    def draft_vocab(self) -> torch.Tensor | None:
        return self.trained.draft_vocab

    def eval(self) -> PreparedModel:
        self.trained.eval()
        return self

    # What runs the model, each call with the paths.
    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        return self.trained.new_cache(batch_size, capacity, self.paths)

    def step(
        self,
        tokens,
        positions,
        n_committed,
        mask,
        cache,
        n_logits=None,
        anchor_entry=None,
        top1: bool = False,
        ar_entropy: bool = False,
    ) -> StepOutput:
        """`YueForCausalLM.step` on the decode paths (same arguments)."""
        return self.trained.step(
            tokens, positions, n_committed, mask, cache, n_logits, anchor_entry, top1, ar_entropy, self.paths
        )

    def hidden_states(self, tokens, positions, n_committed: int, mask) -> torch.Tensor:
        """An uncached forward's hidden states after the final norm (`MoTModel.forward`): (B, T, D)."""
        return self.trained.model(tokens, positions, n_committed, mask, paths=self.paths)

    def ar_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """AR rows' logits through the decode head: (B, n, D) -> (B, n, V)."""
        return (self.paths.ar_head or self.trained.lm_head)(hidden)

    def slot_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.trained.slot_logits(hidden, self.paths)

    def router_features(
        self, hidden_last, ar_logits_last, slot_logits, slot1_revealed=False, ar_entropy=None
    ):
        """`Router.features` with the paths' softmax statistics."""
        return self.trained.router.features(
            hidden_last, ar_logits_last, slot_logits, slot1_revealed, ar_entropy, self.paths.softmax_stats
        )

    def __call__(self, input_ids, attention_mask=None, labels=None, cache=None, use_cache=None):
        """The plain AR forward (`YueForCausalLM.forward`) on the decode paths."""
        return self.trained(input_ids, attention_mask, labels, cache, use_cache, paths=self.paths)

    def generate(self, inputs=None, generation_config=None, streamer=None, mode: str | None = None, **kwargs):
        """`YueForCausalLM.generate` on the decode paths: yue's decode loop where the engine installed it,
        else (beams, several sequences, ...) transformers' generate over the plain AR forward."""
        hook = YueForCausalLM.decode_generate
        if hook is not None:
            out = hook(self, inputs, generation_config, streamer, mode, kwargs)
            if out is not NotImplemented:
                return out
        self.trained.check_mode_without_loop(mode)
        return GenerationMixin.generate(
            self.trained, inputs, generation_config, streamer=streamer, paths=self.paths, **kwargs
        )

    def _prepare_generation_config(self, generation_config, **kwargs):
        """transformers' resolution of generate's settings (call > the model's > defaults)."""
        return self.trained._prepare_generation_config(generation_config, **kwargs)

    def save_pretrained(self, *args, **kwargs):
        self.trained.save_pretrained(*args, **kwargs)  # raises: a consumed model is not saved


def as_decoded(model):
    """The decode loop's view of `model`: a PreparedModel as is; a trained YueForCausalLM with paths
    that run it as trained (not consumed); anything else (a test's stub) as is."""
    if isinstance(model, YueForCausalLM):
        if model.consumed:
            raise ValueError(CONSUMED)
        return PreparedModel(model, DecodePaths.as_trained(model.config.num_hidden_layers))
    return model
