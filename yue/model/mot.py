"""The AR-NAR Mixture-of-Transformers stack and its Hugging Face model class.

Design decisions:
- `MoTModel.forward(tokens, positions, n_committed, mask, cache, start) -> hidden` is the one stack
  forward. Training (no cache, many blocks) and decoding (cache, at most one block) both call it;
  they differ only in the mask (`masks.py`) and whether K/V are written to a cache.
- `YueForCausalLM.step()` is what the decode loop calls: one forward returning AR logits for the new
  committed positions and NAR logits for the slots, as a dataclass.
- `YueForCausalLM.forward(input_ids, attention_mask, labels)` is the plain AR path with Hugging
  Face's calling convention (uncached), so `Trainer`-style code and `generate(use_cache=False)` work.
- Embedding, final norm and LM head (tied to the embedding) are shared by both sets; slot inputs are
  ordinary token ids (`<|mask|>`, or a draft token during refinement), embedded by the same table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from yue.config import YueConfig
from yue.model.cache import KVCache
from yue.model.inference import prepare_for_decoding
from yue.model.layers import MoTLayer, RMSNorm, RotaryTable
from yue.model.router import Router


class MoTModel(nn.Module):
    """Embedding, N MoT layers, final norm. Parameter names match `LlamaModel`'s for the AR set."""

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(MoTLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Slots and drafts may sit up to 2K + 2 positions past the context's last committed token.
        rope_len = config.max_position_embeddings + 2 * config.block_size + 2
        self.rope = RotaryTable(config.head_dim, config.rope_theta, rope_len)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        n_committed: int,
        mask: torch.Tensor | None,
        cache: KVCache | None = None,
        start: int = 0,
    ) -> torch.Tensor:
        """Run the stack.

        Args:
            tokens: (B, T) ids; committed tokens first, then slot inputs (`<|mask|>` or drafts).
            positions: (T,) or (B, T) RoPE positions.
            n_committed: how many of the T positions use the AR set.
            mask: (1|B, 1, T, S) bool attention mask from `masks.py`, or None (see MoTLayer).
            cache: KV cache to read and write, or None (training: attend within `tokens` only).
            start: cache index of tokens[:, 0].
        Returns:
            (B, T, D) hidden states after the final norm.
        """
        h = self.embed_tokens(tokens)
        cos, sin = self.rope.lookup(positions, h.dtype)
        h_c, h_s = h[:, :n_committed], h[:, n_committed:]  # AR-set and NAR-set positions
        for i, layer in enumerate(self.layers):
            kv = cache.layer(i) if cache is not None else None
            h_c, h_s = layer(h_c, h_s, cos, sin, mask, kv, start)
        if not h_s.shape[1] or not h_c.shape[1]:
            return self.norm(h_s if h_s.shape[1] else h_c)
        return self.norm(torch.cat([h_c, h_s], dim=1))


@dataclass
class StepOutput:
    """One decode forward. ar_logits: (B, n_committed, V); slot_logits: (B, n_slots, V); hidden: (B, T, D)."""

    ar_logits: torch.Tensor
    slot_logits: torch.Tensor
    hidden: torch.Tensor


class YuePreTrainedModel(PreTrainedModel):
    config_class = YueConfig
    base_model_prefix = "model"
    _no_split_modules = ["MoTLayer"]
    _supports_sdpa = True


class YueForCausalLM(YuePreTrainedModel, GenerationMixin):
    """The AR-NAR MoT language model with its router."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: YueConfig) -> None:
        super().__init__(config)
        self.model = MoTModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.router = Router(config)
        # Decode-time heads (`prepare_for_decoding`): for AR rows, the LM head with a kernel per row
        # count; for slot rows when drafting is lowered. None = the LM head.
        self.ar_head: nn.Module | None = None
        self.draft_head: nn.Module | None = None
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def prepare_for_decoding(self, drafting_dtype: torch.dtype | None = None) -> YueForCausalLM:
        """Ready the model for fast decoding, in place: matmul weights input-major, fused Q/K/V and
        gate/up, and optionally drafting in a lower precision (`drafting_dtype`: torch.qint8 on a CPU,
        or torch.bfloat16) for the NAR set and a copy of the LM head for slot rows.

        The AR set's values are untouched, so `ar` and `verified` output stays what it was; only drafts
        (and what `hybrid`/`nar` commit of them) can change. See `inference.py` for why and the measured
        gains. Inference only: a prepared model cannot be saved; save it before preparing it.
        """
        prepare_for_decoding(self, drafting_dtype)
        return self

    @property
    def prepared_for_decoding(self) -> bool:
        """Whether `prepare_for_decoding` has run (the layers then hold their `DecodeSet`s)."""
        return self.model.layers[0].decode_sets is not None

    def save_pretrained(self, *args, **kwargs):
        if self.prepared_for_decoding:
            raise ValueError(
                "this model was prepared for decoding (prepare_for_decoding: fused, maybe lowered "
                "weights) and cannot be saved; save the model as loaded (yue.model.load_model) instead"
            )
        return super().save_pretrained(*args, **kwargs)

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        """A KV cache for this model, on its device and dtype."""
        c = self.config
        return KVCache(
            c.num_hidden_layers,
            batch_size,
            c.num_key_value_heads,
            c.head_dim,
            capacity,
            self.device,
            self.dtype,
        )

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        n_committed: int,
        mask: torch.Tensor | None,
        cache: KVCache,
        n_logits: int | None = None,
    ) -> StepOutput:
        """One decode forward at cache index `cache.length`; the cache pointer is not moved.

        Args:
            tokens: (B, T) committed tokens to append, then slot inputs.
            positions: (T,) or (B, T) RoPE positions.
            n_committed: number of committed tokens at the front; 0 = a drafting pass (slots only).
            mask: from `masks.decode_mask(cache.length, n_committed, T - n_committed, ...)`.
            cache: the request's KV cache.
            n_logits: AR logits only for the last n_logits committed positions (None = all). The head
                is a large matmul per row: a prefill needs just its last row.
        Returns:
            StepOutput with ar_logits (B, n_logits, V), slot_logits (B, T - n_committed, V), hidden (B, T, D).
        """
        hidden = self.model(tokens, positions, n_committed, mask, cache, cache.length)
        first = 0 if n_logits is None else n_committed - n_logits
        n_ar = n_committed - first
        head = self.ar_head or self.lm_head
        if self.draft_head is None:
            logits = head(hidden[:, first:])  # (B, T - first, V): one matmul for all rows
            return StepOutput(logits[:, :n_ar], logits[:, n_ar:], hidden)
        # Lowered drafting: AR rows through the LM head as loaded, slot rows through the draft head.
        ar_logits = head(hidden[:, first:n_committed])  # (B, n_ar, V)
        if hidden.shape[1] == n_committed:  # no slots: an empty (B, 0, V), without a head call
            return StepOutput(ar_logits, ar_logits[:, :0], hidden)
        return StepOutput(ar_logits, self.draft_head(hidden[:, n_committed:]), hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Plain AR forward in Hugging Face's convention (no cache; every position committed).

        Args:
            input_ids: (B, T).
            attention_mask: (B, T) 1 for real tokens, 0 for (left) padding.
            labels: (B, T) next-token targets as in `LlamaForCausalLM` (shifted inside; -100 ignored).
        """
        B, T = input_ids.shape
        causal = torch.ones(T, T, dtype=torch.bool, device=input_ids.device).tril()
        if attention_mask is None:
            positions = torch.arange(T, device=input_ids.device)
            mask = causal[None, None]
        else:
            valid = attention_mask.bool()
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
            mask = causal[None, None] & valid[:, None, None, :]
            # A fully padded query row would make SDPA return NaN; let it see itself.
            mask = mask | torch.eye(T, dtype=torch.bool, device=input_ids.device)[None, None]
        hidden = self.model(input_ids, positions, T, mask)
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        """`generate()` support for the plain AR path: recompute the whole prefix every step."""
        return {"input_ids": input_ids, "attention_mask": attention_mask}
