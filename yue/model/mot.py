"""The AR-NAR Mixture-of-Transformers stack and its Hugging Face model class.

Design decisions:
- `MoTModel.forward(tokens, positions, n_committed, mask, cache, start) -> hidden` is the one stack
  forward. Training (no cache, many blocks) and decoding (cache, at most one block) both call it;
  they differ only in the mask (`masks.py`) and whether K/V are written to a cache.
- `YueForCausalLM.step()` is what the decode loop calls: one forward returning AR logits for the new
  committed positions and NAR logits for the slots, as a dataclass.
- Decode-time paths are arguments, not state: `step`, `forward`, `new_cache` and the stack take `paths`
  (`decode_paths.DecodePaths`, None = as trained), which a `PreparedModel` (`prepared.py`) passes.
- `YueForCausalLM.forward(input_ids, attention_mask, labels, cache)` is the plain AR path with Hugging
  Face's calling convention, so `Trainer`-style code works; with `use_cache` or a `cache` it runs on
  yue's own KVCache (returned as `cache`), so transformers' generate is not quadratic.
- `YueForCausalLM.generate` is yue's decode loop where the engine layer installed it
  (`decode_generate`, `decode/hf_generate.py`; this layer may not import the loop), else transformers'.
- Embedding, final norm and LM head (tied to the embedding) are shared by both sets; slot inputs are
  ordinary token ids (`<|mask|>`, or a draft token during refinement), embedded by the same table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from yue.config import YueConfig
from yue.model.anchors import AnchorHead
from yue.model.cache import KVCache
from yue.model.decode_paths import DecodePaths, SlotEntryPath
from yue.model.experts import ExpertRoute
from yue.model.layers import MoTLayer, RMSNorm, RotaryTable
from yue.model.masks import decode_mask
from yue.model.router import Router

# Why a model consumed by `prepare_for_decoding` may not run, be saved, trained or adapted.
CONSUMED = (
    "this model was consumed by prepare_for_decoding (its weights now serve the PreparedModel it returned: "
    "fused, maybe lowered or released); decode with that PreparedModel, and save, train or adapt a model "
    "as loaded (yue.model.load_model, yue.engine.load_unprepared)"
)

# Logit of tokens outside a reduced drafting vocabulary: finite (entropies stay defined), never drafted.
DRAFT_FILL = -1e9


def expand_draft_logits(sub: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits over a drafting vocabulary (..., Vd) -> over the whole vocabulary (..., V), DRAFT_FILL elsewhere."""
    full = sub.new_full((*sub.shape[:-1], vocab_size), DRAFT_FILL)
    # scatter_, not index_copy_ along the last dimension: faster at a drafting pass's shapes (measured).
    return full.scatter_(-1, ids.expand(*sub.shape[:-1], -1), sub)


class SlotEntry(nn.Module):
    """Slot hidden states where slots enter a stack whose NAR set covers only its top layers.

    A slot of the block anchored at committed position t enters layer `nar_start` as the anchor's hidden
    state there, plus a learned function of the slot's own input token (`<|mask|>`, or slot 1's revealed
    token) and its index in the block: h_s(i) = h_t + W [norm(h_t); e(x_i)] + p_i. W and p start at zero,
    so an untrained slot reads as a copy of its anchor (docs/design.md §8; EAGLE and PARD feed drafts the
    target's features likewise).
    """

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.block_size = config.block_size
        self.norm = RMSNorm(d, config.rms_norm_eps)
        self.proj = nn.Linear(2 * d, d, bias=False)
        self.slot_embed = nn.Parameter(torch.zeros(config.block_size, d))

    def forward(
        self, anchor: torch.Tensor, token_emb: torch.Tensor, lowered: SlotEntryPath | None = None
    ) -> torch.Tensor:
        """anchor: (B, 1|n, D) hidden state entering the first NAR layer at each slot's anchor;
        token_emb: (B, n, D) the slots' input embeddings, n a multiple of K (whole blocks). -> (B, n, D).
        lowered: a prepared model's W halves and norm for drafting passes (`DecodePaths.slot_entry`)."""
        n, d = token_emb.shape[1:]
        index = torch.arange(n, device=token_emb.device) % self.block_size  # (n,) slot index in its block
        # W [norm(h_t); e(x_i)] as two matmuls, the anchor's half once per anchor row, not once per slot
        # (a drafting pass's 8 slots share one, so the pass does an eighth of that matmul's rows).
        if lowered is not None:
            normed = (lowered.norm or self.norm)(anchor)
            return (
                anchor + lowered.from_anchor(normed) + lowered.from_token(token_emb) + self.slot_embed[index]
            )
        w = self.proj.weight  # (D, 2D)
        from_anchor = F.linear(self.norm(anchor), w[:, :d])  # (B, 1|n, D)
        return anchor + from_anchor + F.linear(token_emb, w[:, d:]) + self.slot_embed[index]


class MoTModel(nn.Module):
    """Embedding, N MoT layers, final norm. Parameter names match `LlamaModel`'s for the AR set.

    With `config.nar_layers = N` only the top N layers hold a NAR set: committed positions run every
    layer; slots enter at layer `nar_start` through `slot_entry`, from their anchor's hidden state there.
    """

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        feats = config.layer_features
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        # Gemma scales embeddings by sqrt(hidden) (a float32 scalar, as transformers' embedding holds it).
        self.embed_scale = math.sqrt(config.hidden_size) if feats.embed_scale else None
        self.nar_start = config.nar_start if config.has_nar else config.num_hidden_layers
        self.layers = nn.ModuleList(
            MoTLayer(config, has_nar=i >= self.nar_start, layer=i) for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps, feats.norm_offset)
        top = config.has_nar and config.nar_start > 0
        self.slot_entry = SlotEntry(config) if top else None
        # Slots and drafts may sit up to 2K + 2 positions past the context's last committed token.
        rope_len = config.max_position_embeddings + 2 * config.block_size + 2
        self.rope = RotaryTable(config.head_dim, config.rope_theta, rope_len, feats.llama3_rope)
        # Sliding-window layers (`Features.sliding_window`): their window, and their own RoPE base if any.
        self.window = feats.sliding_window if any(layer.sliding for layer in self.layers) else None
        local_theta = feats.local_rope_theta
        self.local_rope = None if local_theta is None else RotaryTable(config.head_dim, local_theta, rope_len)
        # The last forward's `ExpertRoute` (four-expert routing only, else None): its choices and gate
        # probabilities, read by training's usage log and the tests.
        self.last_route: ExpertRoute | None = None

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """Token embeddings (B, T) -> (B, T, D), scaled where the family scales them (Gemma)."""
        h = self.embed_tokens(tokens)
        if self.embed_scale is None:
            return h
        return h * torch.tensor(self.embed_scale, dtype=torch.float32).to(h.dtype)

    def _local(self, positions, dtype, mask, start, cache: KVCache | None = None) -> tuple | None:
        """For sliding-window layers (None where the stack has none): (cos, sin, mask), RoPE rows from
        their own table (else the global one's) and the step's mask with each query's window applied.

        The window is over positions: a query at position p sees keys at positions > p - W (transformers'
        `sliding_window_overlay`). Keys [0, start) in the cache are committed ones, at each row's
        position for the column (`KVCache.key_positions`: holes and padding counted out); this step's
        keys are at `positions`. mask None (every key) becomes the window alone.
        positions: (T,) or (B, T); mask: (1|B, 1, T, S) bool or None."""
        if self.window is None:
            return None
        cos, sin = (self.local_rope or self.rope).lookup(positions, dtype)
        q = positions if positions.dim() == 2 else positions[None]  # (1|B, T)
        cached = torch.arange(start, device=q.device)[None] if cache is None else cache.key_positions(start)
        B = max(q.shape[0], cached.shape[0])
        keys = torch.cat([cached.expand(B, start), q.expand(B, q.shape[1])], dim=1)  # (1|B, S)
        band = (keys[:, None, :] > q[:, :, None] - self.window)[:, None]  # (1|B, 1, T, S)
        if mask is not None:
            band = band & mask
        return cos, sin, band

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        n_committed: int,
        mask: torch.Tensor | None,
        cache: KVCache | None = None,
        start: int = 0,
        paths: DecodePaths | None = None,
    ) -> torch.Tensor:
        """Run the stack; see `run`. Returns (B, T, D) hidden states after the final norm."""
        return self.run(tokens, positions, n_committed, mask, cache, start, paths=paths)[0]

    def run(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        n_committed: int,
        mask: torch.Tensor | None,
        cache: KVCache | None = None,
        start: int = 0,
        anchor_entry: torch.Tensor | None = None,
        paths: DecodePaths | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Run the stack.

        Args:
            tokens: (B, T) ids; committed tokens first, then slot inputs (`<|mask|>` or drafts).
            positions: (T,) or (B, T) RoPE positions.
            n_committed: how many of the T positions use the AR set.
            mask: (1|B, 1, T, S) bool attention mask from `masks.py`, or None (see MoTLayer).
            cache: KV cache to read and write, or None (training: attend within `tokens` only).
            start: cache index of tokens[:, 0].
            anchor_entry: top-layer NAR sets only, when there are slots: (B, 1|T - n_committed, D), the
                hidden state of each slot's anchor entering layer `nar_start` (`entry` of the step that
                fed the anchor).
            paths: a prepared model's decode paths (`decode_paths.DecodePaths`), each layer handed its
                own; None = as trained.
        Returns:
            hidden: (B, T, D) after the final norm.
            entry: (B, n_committed, D) the committed positions' hidden states entering layer `nar_start`
                (the slots' anchors of a later drafting pass), or None when slots enter at the embedding.
        """
        cos, sin = self.rope.lookup(positions, self.norm.weight.dtype)
        local = self._local(positions, self.norm.weight.dtype, mask, start, cache)
        if self.slot_entry is None:
            h = self.embed(tokens)
            h_c, h_s = h[:, :n_committed], h[:, n_committed:]  # AR-set and NAR-set positions
            h_c, h_s = self._layers(h_c, h_s, cos, sin, mask, cache, start, 0, local=local, paths=paths)
            return self._final(h_c, h_s, paths), None
        # Top-layer NAR set: committed positions run from the embedding; slots join at nar_start.
        h_c = self.embed(tokens[:, :n_committed])
        h_s = h_c[:, :0]
        first = 0 if n_committed else self.nar_start  # a drafting pass has no committed rows below
        h_c, h_s = self._layers(h_c, h_s, cos, sin, mask, cache, start, first, self.nar_start, local, paths)
        entry = h_c
        if tokens.shape[1] > n_committed:
            lowered = None if paths is None else paths.slot_entry
            h_s = self.slot_entry(anchor_entry, self.embed(tokens[:, n_committed:]), lowered)
        h_c, h_s = self._layers(
            h_c, h_s, cos, sin, mask, cache, start, self.nar_start, local=local, paths=paths
        )
        return self._final(h_c, h_s, paths), entry

    def run_to_entry(self, tokens: torch.Tensor, paths: DecodePaths | None = None) -> torch.Tensor:
        """The AR path's hidden states entering layer nar_start (the features a top-layer NAR set is
        trained on), uncached, causal; through `paths` where given. tokens: (B, T) -> (B, T, D)."""
        T = tokens.shape[1]
        positions = torch.arange(T, device=tokens.device)
        cos, sin = self.rope.lookup(positions, self.norm.weight.dtype)
        mask = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()[None, None]
        local = self._local(positions, self.norm.weight.dtype, mask, 0)
        h = self.embed(tokens)
        return self._layers(h, h[:, :0], cos, sin, mask, None, 0, 0, self.nar_start, local, paths)[0]

    def run_from_entry(
        self,
        entry: torch.Tensor,
        slot_tokens: torch.Tensor,
        slot_anchor: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        paths: DecodePaths | None = None,
    ) -> torch.Tensor:
        """Training forward of a top-layer NAR set from cached features: only layers nar_start.. run.

        Args:
            entry: (B, T, D) committed hidden states entering layer nar_start (cached by the AR path).
            slot_tokens: (B, n) slot inputs, whole blocks of K.
            slot_anchor: (B, n, D) each slot's anchor's row of `entry`.
            positions: (B|1, T + n) RoPE positions, committed then slots.
            mask: (B, 1, T + n, T + n) from `masks.training_mask`.
            paths: a prepared model's decode paths (its committed rows through them), else None.
        Returns:
            (B, T + n, D) hidden states after the final norm, committed rows then slots.
        """
        cos, sin = self.rope.lookup(positions, entry.dtype)
        local = self._local(positions, entry.dtype, mask, 0)
        h_s = self.slot_entry(slot_anchor, self.embed(slot_tokens))
        h_c, h_s = self._layers(entry, h_s, cos, sin, mask, None, 0, self.nar_start, local=local, paths=paths)
        return self._final(h_c, h_s, paths)

    def _layers(self, h_c, h_s, cos, sin, mask, cache, start, first, last=None, local=None, paths=None):
        """Layers [first, last) over committed rows h_c (B, Tc, D) and slots h_s (B, Ts, D); sliding-window
        layers take `local`'s (cos, sin, mask) (`_local`); each layer its own entry of `paths`, if any."""
        last = len(self.layers) if last is None else last
        stacked = self._stacked(h_c, h_s, (cos, sin, mask, cache, start, first, last, local), paths)
        if stacked is not None:
            return stacked
        # Four-expert routing: one route per forward, carrying each layer's choices to the next.
        route = ExpertRoute() if self.layers[first:last] and self.layers[first].experts is not None else None
        for i in range(first, last):
            kv = cache.layer(i) if cache is not None else None
            rows = local if self.layers[i].sliding else (cos, sin, mask)
            path = None if paths is None else paths.layers[i]
            h_c, h_s = self.layers[i](h_c, h_s, *rows, kv, start, route, path)
        self.last_route = route
        return h_c, h_s

    def _stacked(self, h_c, h_s, step: tuple, paths):
        """`_layers` in one call where the prepared model has its set's layers as one stack
        (`DecodePaths.stacks`: a decode step's rows all of one parameter set); None where it does not apply.
        step: `_layers`' (cos, sin, mask, cache, start, first, last, local)."""
        stack = None if paths is None else paths.stacks.get(h_s.shape[1] > 0)
        cache = step[3]  # a stack writes a decode step's K/V: none without a cache
        return None if stack is None or cache is None else stack(h_c, h_s, *step)

    def _final(self, h_c: torch.Tensor, h_s: torch.Tensor, paths: DecodePaths | None = None) -> torch.Tensor:
        if not h_c.shape[1]:
            slot_norm = None if paths is None else paths.slot_norm
            return (slot_norm or self.norm)(h_s)
        norm = (None if paths is None else paths.final_norm) or self.norm
        if not h_s.shape[1]:
            return norm(h_c)
        return norm(torch.cat([h_c, h_s], dim=1))


@dataclass
class StepOutput:
    """One decode forward. ar_logits: (B, n_logits, V) of the last committed rows; slot_logits: (B, n_slots,
    V); hidden: (B, T, D); entry: (B, n_committed, D) hidden states entering the first NAR layer
    (top-layer NAR sets), else None. `screened`: the AR logits hold only where each row's largest may be
    (`step`'s top1); ar_entropy: (B, n_logits) each screened AR row's softmax entropy
    (`ScreenedHead.top1_entropy`), where asked."""

    ar_logits: torch.Tensor
    slot_logits: torch.Tensor
    hidden: torch.Tensor
    entry: torch.Tensor | None = None
    screened: bool = False
    ar_entropy: torch.Tensor | None = None


class YuePreTrainedModel(PreTrainedModel):
    config_class = YueConfig
    base_model_prefix = "model"
    _no_split_modules = ["MoTLayer"]
    _supports_sdpa = True


class YueForCausalLM(YuePreTrainedModel, GenerationMixin):
    """The AR-NAR MoT language model with its router."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}
    # `generate()` through yue's decode loop, installed by the engine layer (`engine/core.py`): called as
    # hook(model, inputs, generation_config, streamer, mode, kwargs); NotImplemented (or no hook) leaves
    # transformers' generate. See `decode/hf_generate.py`.
    decode_generate: ClassVar[Callable | None] = None

    def __init__(self, config: YueConfig) -> None:
        super().__init__(config)
        self.model = MoTModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.router = Router(config)
        # The anchor-count head of `anchor` decoding, where the checkpoint was trained with one.
        self.anchor_head = AnchorHead(config) if config.anchor_head else None
        # FR-Spec drafting vocabulary: ids of the tokens slot rows may draft (most frequent first).
        if config.draft_vocab_size is not None:
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size), persistent=True)
        else:
            self.draft_vocab = None
        # Set by `yue.kernels.prepare_for_decoding`, which transforms the weights in place for the
        # `PreparedModel` it returns (`model/prepared.py`): this model may then no longer run on its own,
        # be saved, trained or adapted (`CONSUMED`).
        self.consumed = False
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.model.embed_tokens = value

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def save_pretrained(self, *args, **kwargs):
        if self.consumed:
            raise ValueError(f"cannot be saved: {CONSUMED}")
        return super().save_pretrained(*args, **kwargs)

    def train(self, mode: bool = True):
        if mode and self.consumed:
            raise ValueError(f"cannot be trained: {CONSUMED}")
        return super().train(mode)

    def check_runs(self, paths: DecodePaths | None) -> None:
        """Raise where a consumed model is run without the paths it was prepared with."""
        if paths is None and self.consumed:
            raise ValueError(CONSUMED)

    def new_cache(self, batch_size: int, capacity: int, paths: DecodePaths | None = None) -> KVCache:
        """A KV cache for this model, on its device, in the paths' cache precision (else its dtype)."""
        c = self.config
        return KVCache(
            c.num_hidden_layers,
            batch_size,
            c.num_key_value_heads,
            c.head_dim,
            capacity,
            self.device,
            (None if paths is None else paths.cache_dtype) or self.dtype,
        )

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        n_committed: int,
        mask: torch.Tensor | None,
        cache: KVCache,
        n_logits: int | None = None,
        anchor_entry: torch.Tensor | None = None,
        top1: bool = False,
        ar_entropy: bool = False,
        paths: DecodePaths | None = None,
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
            anchor_entry: top-layer NAR sets, a drafting pass: (B, 1, D) the anchor's `entry` row.
            top1: the AR logits serve only their argmax (`Policy.argmax_only`): where the head has an
                int8 screen (`screen.ScreenedHead`), each AR row holds its float32 logits only where
                they may be its largest, -inf elsewhere (the same argmax, a quarter of the head's bytes).
            ar_entropy: with a screened head, also each AR row's entropy over its screened logits
                (`StepOutput.ar_entropy`): the router's AR feature, where a request asks the router.
            paths: a prepared model's decode paths (`PreparedModel.step` passes its own); None = as trained.
        Returns:
            StepOutput with ar_logits (B, n_logits, V), slot_logits (B, T - n_committed, V), hidden
            (B, T, D), entry (B, n_committed, D) or None.
        """
        self.check_runs(paths)
        hidden, entry = self.model.run(
            tokens, positions, n_committed, mask, cache, cache.length, anchor_entry, paths
        )
        first = 0 if n_logits is None else n_committed - n_logits
        n_ar = n_committed - first
        head = self._ar_head(paths)
        screened = top1 and hasattr(head, "top1_entropy")  # an int8 screen (`ScreenedHead`)
        # Logits leave in float32 whatever the precision: the choice is the same, and torch's CPU argmax
        # and softmax over bfloat16 are several times slower (measured: docs/results-log.md).
        draft_head = None if paths is None else paths.draft_head
        if draft_head is None and self.draft_vocab is None and not screened:
            logits = head(hidden[:, first:]).float()  # (B, T - first, V): one matmul for all rows
            return StepOutput(logits[:, :n_ar], logits[:, n_ar:], hidden, entry)
        # Screened, lowered or reduced drafting: AR rows through the LM head as loaded (or its screen),
        # slot rows their own way. A drafting pass has no AR rows: no head call (a padded packed head
        # would cost a whole step's).
        B, V = hidden.shape[0], self.config.vocab_size
        entropy = None
        if not n_ar:
            ar_logits = hidden.new_empty(B, 0, V, dtype=torch.float32)
        elif screened:
            ar_logits, entropy = head.top1_entropy(hidden[:, first:n_committed], ar_entropy)
        else:
            ar_logits = head(hidden[:, first:n_committed]).float()
        slot_logits = (
            ar_logits[:, :0]  # no slots: an empty (B, 0, V), without a head call
            if hidden.shape[1] == n_committed
            else self.slot_logits(hidden[:, n_committed:], paths)
        )
        return StepOutput(ar_logits, slot_logits, hidden, entry, screened, entropy)

    def _ar_head(self, paths: DecodePaths | None) -> nn.Module:
        """The head AR rows go through: the paths' decode head (`DecodePaths.ar_head`), else the LM head."""
        return (None if paths is None else paths.ar_head) or self.lm_head

    def slot_logits(self, hidden: torch.Tensor, paths: DecodePaths | None = None) -> torch.Tensor:
        """Slot rows' logits over the whole vocabulary, (B, n, D) -> (B, n, V): the paths' draft head
        where prepared, else the LM head (restricted to `draft_vocab`, if any: tokens outside it read
        DRAFT_FILL, never drafted)."""
        if paths is not None and paths.draft_head is not None:
            return paths.draft_head(hidden)
        if self.draft_vocab is None:
            return self.lm_head(hidden)
        sub = F.linear(hidden, self.lm_head.weight[self.draft_vocab])  # (B, n, Vd)
        return expand_draft_logits(sub, self.draft_vocab, self.config.vocab_size)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        cache: KVCache | None = None,
        use_cache: bool | None = None,
        paths: DecodePaths | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Plain AR forward in Hugging Face's convention (every position committed).

        Args:
            input_ids: (B, T): the whole sequence, or with a `cache` the tokens after its `length`.
            attention_mask: (B, T) or, with a cache, (B, cache.length + T): 1 for real tokens, 0 for
                (left) padding, which only the first call (the prefill) may hold.
            labels: (B, T) next-token targets as in `LlamaForCausalLM` (shifted inside; -100 ignored).
            cache: yue's KVCache from an earlier call's output; `use_cache` without one starts one.
            paths: a prepared model's decode paths (`PreparedModel.__call__`); None = as trained.
        Returns:
            logits (B, T, V), the loss with labels, and the cache (advanced by T) when one is used.
        """
        self.check_runs(paths)
        if cache is None and not use_cache:
            return self._forward_uncached(input_ids, attention_mask, labels, paths)
        B, T = input_ids.shape
        if cache is None:
            cache = self.new_cache(B, T, paths)
            if attention_mask is not None:
                cache.set_padding((attention_mask.shape[1] - attention_mask.long().sum(-1)).tolist())
        cache.make_room(T)
        start = cache.length
        offsets = torch.arange(T, device=input_ids.device)
        positions = cache.positions(offsets, padded=cache.key_valid is not None and start == 0)
        mask = decode_mask(start, T, 0, cache.key_valid, input_ids.device)
        hidden = self.model(input_ids, positions, T, mask, cache, start, paths)
        cache.advance(T)
        logits = self._ar_head(paths)(hidden)
        return CausalLMOutputWithPast(loss=self._loss(logits, labels), logits=logits, cache=cache)

    def _forward_uncached(self, input_ids, attention_mask, labels, paths) -> CausalLMOutputWithPast:
        """The whole sequence at once, no cache (training)."""
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
        hidden = self.model(input_ids, positions, T, mask, paths=paths)
        logits = self._ar_head(paths)(hidden)
        return CausalLMOutputWithPast(loss=self._loss(logits, labels), logits=logits)

    @staticmethod
    def _loss(logits: torch.Tensor, labels: torch.Tensor | None) -> torch.Tensor | None:
        if labels is None:
            return None
        return F.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100
        )

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        """transformers' DynamicCache does not fit the MoT layers: `forward` starts yue's KVCache itself."""
        return False

    @staticmethod
    def _reorder_cache(cache: KVCache, beam_idx: torch.Tensor) -> KVCache:
        """transformers' beam search: each beam's row continues from the row `beam_idx` names."""
        cache.select(beam_idx.tolist())
        return cache

    def prepare_inputs_for_generation(
        self, input_ids, attention_mask=None, cache=None, use_cache=None, paths=None, **kwargs
    ):
        """transformers' generate, step by step: the tokens the cache has not seen (all of them at first);
        `paths` where a `PreparedModel` runs it."""
        if cache is not None:
            input_ids = input_ids[:, cache.length :]
        return {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "cache": cache,
            "use_cache": use_cache,
            "paths": paths,
        }

    def generate(self, inputs=None, generation_config=None, streamer=None, mode: str | None = None, **kwargs):
        """transformers' `generate`, run by yue's decode loop where the engine installed it (`import yue`
        does): greedy or sampling, `max_new_tokens`, `eos_token_id`, streamers, and `mode` (default: the
        model's `default_mode`); see `decode/hf_generate.py`. Otherwise transformers' own, mode "ar" only."""
        hook = YueForCausalLM.decode_generate
        if hook is not None:
            out = hook(self, inputs, generation_config, streamer, mode, kwargs)
            if out is not NotImplemented:
                return out
        self.check_mode_without_loop(mode)
        return super().generate(inputs, generation_config, streamer=streamer, **kwargs)

    @staticmethod
    def check_mode_without_loop(mode: str | None) -> None:
        """Raise where transformers' generate (the plain AR path) is asked for a mode only yue's loop runs."""
        if mode not in (None, "ar"):
            raise ValueError(
                f"mode {mode!r} needs yue's decode loop, which `import yue` installs; here only 'ar'"
            )
