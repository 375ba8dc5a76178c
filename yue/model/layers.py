"""Building blocks of the AR-NAR Mixture-of-Transformers layer.

Design decisions:
- A layer holds two parameter sets, AR and NAR, for everything position-wise (input norm, Q/K/V/O,
  post-attention norm, SwiGLU MLP) and ONE attention: committed positions (AR set) and mask slots
  (NAR set) are projected separately, then attend together through a single SDPA call under the
  committed/slot mask of `masks.py` (YuE2's "AR-NAR MoT"; Liang et al. 2024's Mixture-of-Transformers).
- The AR set's module names are exactly Hugging Face Llama's (`self_attn.q_proj`, `mlp.gate_proj`,
  `input_layernorm`, ...), so its weights export to / import from `LlamaForCausalLM` by name. The NAR
  set uses the same names behind a `nar_` prefix.
- Each forward sees committed positions first, then slots: `h[:, :n_committed]` and
  `h[:, n_committed:]`. Splitting by a count (not a per-token flag) keeps the projections two dense
  matmuls with no gather/scatter.
- RoPE tables are computed on first use per device (not registered buffers), so loading a checkpoint
  onto the meta device never leaves stale tables behind.
- Model families (Qwen, Gemma, Mistral, Llama 3) are the same layer with the named differences of
  `config.Features` applied here (biases, Q/K norms, Gemma's norms and GeGLU, sliding windows, the
  attention scale), each where transformers' implementation of the family applies it, in its order,
  so the float32 logits are transformers' bit for bit.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from yue.config import YueConfig
from yue.model.decode_paths import LayerPaths, exact_rows
from yue.model.experts import ExpertRoute, ExpertRouter

# Row-exact attention (`yue.kernels.decode_set`, `DecodeSet.attend`): queries padded to a multiple of EXACT_QUERY_PAD rows and
# keys to a multiple of EXACT_KEY_PAD columns (the KV cache's capacity is one, `cache.KVCache`).
EXACT_QUERY_PAD, EXACT_KEY_PAD = 4, 64


def round_up(n: int, multiple: int) -> int:
    """The least multiple of `multiple` at or above n."""
    return -(-n // multiple) * multiple


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Root-mean-square norm over the last dim, computed in float32 as Llama does."""
    if x.dtype == torch.float32:  # one fused op; the same numbers as the three-step form below
        return F.rms_norm(x, weight.shape, weight, eps)
    # Below float32: normalise in float32 (the fused op, as above), scale in the input's precision.
    return weight * F.rms_norm(x.float(), weight.shape, None, eps).to(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), `rms_norm` with a learned weight; with `offset` 1 the
    weight applies as (1 + w), Gemma's form (`Features.norm_offset`), computed in float32 as Gemma does."""

    def __init__(self, dim: int, eps: float = 1e-5, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((dim,), 1.0 - offset))  # an identity norm either way
        self.eps, self.offset = eps, offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset:
            scale = self.offset + self.weight.float()
            return F.rms_norm(x.float(), scale.shape, scale, self.eps).to(x.dtype)
        return rms_norm(x, self.weight, self.eps)


def inv_frequencies(head_dim: int, theta: float, llama3: tuple | None = None) -> torch.Tensor:
    """RoPE's inverse frequencies (Dh/2,) float32; with `llama3` = (factor, low_freq_factor,
    high_freq_factor, original_max_position_embeddings), Llama 3's scaling, written as transformers'
    `_compute_llama3_parameters` writes it (same ops in the same order: the same bits)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if llama3 is None:
        return inv_freq
    factor, low_freq_factor, high_freq_factor, old_context_len = llama3
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    # Long wavelengths divided by the factor, short ones kept, the band between interpolated.
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


class RotaryTable:
    """cos/sin tables for rotary position embeddings (Su et al. 2021), in Llama's half-split layout."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, llama3: tuple | None = None) -> None:
        self.head_dim, self.theta, self.max_positions = head_dim, theta, max_positions
        self.llama3 = llama3  # Llama 3's RoPE scaling (`inv_frequencies`), or None
        self._tables: dict[tuple[torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def lookup(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of the tables for `positions`.

        Args:
            positions: (T,) shared by the batch, or (B, T) per row; absolute RoPE positions.
        Returns:
            cos, sin: (1, 1, T, Dh) or (B, 1, T, Dh), ready to broadcast over heads.
        """
        key = (positions.device, dtype)
        if key not in self._tables:
            inv_freq = inv_frequencies(self.head_dim, self.theta, self.llama3)
            t = torch.arange(self.max_positions, dtype=torch.float32)
            freqs = torch.outer(t, inv_freq)  # (P, Dh/2)
            emb = torch.cat([freqs, freqs], dim=-1)  # (P, Dh)
            self._tables[key] = (emb.cos().to(positions.device, dtype), emb.sin().to(positions.device, dtype))
        cos, sin = self._tables[key]
        cos, sin = cos[positions], sin[positions]  # (T, Dh) or (B, T, Dh)
        if positions.dim() == 1:
            return cos[None, None], sin[None, None]
        return cos[:, None], sin[:, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (B, H, T, Dh); cos/sin broadcastable to it."""
    return x * cos + rotate_half(x) * sin


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU, tanh approximation: transformers' `gelu_pytorch_tanh` (Gemma's GeGLU)."""
    return F.gelu(x, approximate="tanh")


# `Features.activation` -> the gated MLP's activation.
ACTIVATIONS = {"silu": F.silu, "gelu_tanh": gelu_tanh}


class MLP(nn.Module):
    """Gated feed-forward, Llama's names: SwiGLU (Shazeer 2020), or GeGLU where the family says
    (`Features.activation`)."""

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)
        self.act = ACTIVATIONS[config.layer_features.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class AttentionProjections(nn.Module):
    """Q/K/V/O projections of one parameter set (AR or NAR). Grouped-query: fewer K/V heads than Q.
    With the family's features: biases on Q/K/V (`qkv_bias`), an RMSNorm over each Q and K head
    (`qk_norm`: `q_norm`, `k_norm`, transformers' names)."""

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        feats = config.layer_features
        self.q_proj = nn.Linear(d, config.num_attention_heads * hd, bias=feats.qkv_bias)
        self.k_proj = nn.Linear(d, config.num_key_value_heads * hd, bias=feats.qkv_bias)
        self.v_proj = nn.Linear(d, config.num_key_value_heads * hd, bias=feats.qkv_bias)
        self.o_proj = nn.Linear(config.num_attention_heads * hd, d, bias=False)
        if feats.qk_norm:
            self.q_norm = RMSNorm(hd, config.rms_norm_eps, feats.norm_offset)
            self.k_norm = RMSNorm(hd, config.rms_norm_eps, feats.norm_offset)


class MoTLayer(nn.Module):
    """One transformer layer with an AR and a NAR parameter set sharing one attention."""

    def __init__(self, config: YueConfig, has_nar: bool = True, layer: int = 0) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        feats = config.layer_features
        # The family's attention differences (`Features`): softmax scale (None: SDPA's 1/sqrt(Dh)),
        # and whether this layer attends through a sliding window (`MoTModel` passes it that mask).
        self.attn_scale, self.sliding = feats.attn_scale, feats.sliding(layer)
        self.sandwich = feats.sandwich_norms
        d, eps, offset = config.hidden_size, config.rms_norm_eps, feats.norm_offset
        # AR set: Hugging Face names (Llama's; Gemma's two more norms), so `export-ar` is a rename-free copy.
        self.input_layernorm = RMSNorm(d, eps, offset)
        self.self_attn = AttentionProjections(config)
        self.post_attention_layernorm = RMSNorm(d, eps, offset)
        self.mlp = MLP(config)
        if self.sandwich:
            self.pre_feedforward_layernorm = RMSNorm(d, eps, offset)
            self.post_feedforward_layernorm = RMSNorm(d, eps, offset)
        # NAR set: same shapes, parallel names. Below `config.nar_start` a layer has none (slots enter
        # the stack above it), and only committed positions pass through it.
        self.has_nar = has_nar
        if has_nar:
            self.nar_input_layernorm = RMSNorm(d, eps, offset)
            self.nar_self_attn = AttentionProjections(config)
            self.nar_post_attention_layernorm = RMSNorm(d, eps, offset)
            self.nar_mlp = MLP(config)
            if self.sandwich:
                self.nar_pre_feedforward_layernorm = RMSNorm(d, eps, offset)
                self.nar_post_feedforward_layernorm = RMSNorm(d, eps, offset)
        # Four-expert routing of the MLP (`model/experts.py`, an experiment); None = by position type.
        self.experts = ExpertRouter(config) if config.layer_routing == "four-expert" else None

    def _sets(self, nar: bool) -> tuple[RMSNorm, AttentionProjections, RMSNorm, MLP]:
        """One parameter set's modules: input norm, attention projections, post-attention norm, MLP."""
        if nar:
            assert self.has_nar, "slots reached a layer without a NAR set"
            return (
                self.nar_input_layernorm,
                self.nar_self_attn,
                self.nar_post_attention_layernorm,
                self.nar_mlp,
            )
        return self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp

    def _qkv(self, h: torch.Tensor, nar: bool, cos: torch.Tensor, sin: torch.Tensor):
        """Pre-attention norm, Q/K/V and RoPE of one parameter set.

        h: (B, T, D) -> q (B, H, T, Dh), k and v (B, Hkv, T, Dh). The NAR set's projections may be
        lowered (`yue.kernels.prepare`); they still take and return h's dtype.
        """
        norm, proj, _, _ = self._sets(nar)
        x = norm(h)
        B, T, _ = x.shape
        H, Hkv, Dh = self.n_heads, self.n_kv, self.head_dim
        q = proj.q_proj(x).view(B, T, H, Dh).transpose(1, 2)
        k = proj.k_proj(x).view(B, T, Hkv, Dh).transpose(1, 2)
        v = proj.v_proj(x).view(B, T, Hkv, Dh).transpose(1, 2)
        if hasattr(proj, "q_norm"):  # Qwen3, Gemma 3: each head normed before RoPE
            q, k = proj.q_norm(q), proj.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _finish(
        self, h: torch.Tensor, o: torch.Tensor, nar: bool, route: ExpertRoute | None = None
    ) -> torch.Tensor:
        """Output projection of the attention result o (B, H, T, Dh), residual, norm, MLP, residual.
        With four-expert routing the MLP is the routed mix (`ExpertRouter`; `route` carries choices up)."""
        _, proj, norm, mlp = self._sets(nar)
        B, _, T, _ = o.shape
        o = proj.o_proj(o.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))
        if self.experts is not None:
            h = h + o
            return h + self.experts(norm(h), self.mlp, self.nar_mlp, nar, route)
        if not self.sandwich:
            h = h + o
            return h + mlp(norm(h))
        # Gemma: the attention output normed before its residual add, the MLP between two norms of its own.
        prefix = "nar_" if nar else ""
        h = h + norm(o)
        x = getattr(self, prefix + "pre_feedforward_layernorm")(h)
        return h + getattr(self, prefix + "post_feedforward_layernorm")(mlp(x))

    def _decode(self, h, nar, cos, sin, mask, kv, start, row0, route=None, path=None) -> torch.Tensor:
        """One parameter set's positions in a cached forward: their K/V land at cache indices
        [start, start + T) and they attend over the cache up to there, under the step's `mask` rows
        [row0, row0 + T) (the step's mask itself is passed, so that row-exact layers can pad it once a
        step, `DecodeSet.attend`), or None (every key). A parameter set wholly on yue's row kernel
        (float32 activations; an AR set's exact rows, or a NAR set's int8 drafting layers) takes its rows
        of a step (a prefill, start 0, is torch's) in one call (`DecodeSet.one_call`). `path`: the layer's
        decode paths (`decode_paths.LayerPaths`), None = as trained."""
        fused = None if path is None else path[nar]
        whole = None if fused is None else fused.one_call(h, cos, sin, mask, kv, start, row0)
        if whole is not None:
            return whole
        q, k, v = self._qkv(h, nar, cos, sin) if fused is None else fused.qkv_rope(h, cos, sin)
        k_buf, v_buf = kv
        cast = k_buf.dtype != q.dtype  # attention in the cache's precision (`DecodePaths.cache_dtype`)
        if cast:
            q = q.to(k_buf.dtype)
        S = start + h.shape[1]
        k_buf[:, :, start:S], v_buf[:, :, start:S] = k, v  # the write casts k and v
        # Row-exact layers attend in a form whose rows' bits do not depend on the step's rows (one padded
        # call, or one query per call), one-row steps and verifying rows alike; a prefill (start 0) is
        # the same call in every mode, so it need not.
        if fused is not None and fused.exact and start:  # committed rows only: row0 == 0
            o = fused.attend(q, kv, mask, start)
        else:
            m = None if mask is None else mask[..., row0 : row0 + h.shape[1], :S]
            o = F.scaled_dot_product_attention(
                q,
                k_buf[:, :, :S],
                v_buf[:, :, :S],
                m,
                scale=self.attn_scale,
                enable_gqa=self.n_kv != self.n_heads,
            )
        if cast:
            o = o.to(h.dtype)
        return self._finish(h, o, nar, route) if fused is None else fused.finish(h, o)

    def forward(
        self,
        h_c: torch.Tensor,
        h_s: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        start: int = 0,
        route: ExpertRoute | None = None,
        path: LayerPaths | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer over committed positions (AR set) and slots (NAR set), kept as separate tensors so
        the two sets' matmuls run on dense inputs with no gather, split or concatenation.

        Args:
            h_c: (B, Tc, D) committed hidden states, Tc >= 0 (0: a drafting pass, slots only).
            h_s: (B, Ts, D) slot hidden states, Ts >= 0, positioned after the committed ones.
            cos, sin: RoPE rows for the T = Tc + Ts positions, (1|B, 1, T, Dh).
            mask: (1|B, 1, T, S) bool, True = may attend; S = start + T with a cache, T without.
                None means every query may see every key (a single committed token).
            kv: this layer's cache buffers (k, v), each (B, Hkv, T_max, Dh), or None (training).
            start: absolute cache index of h_c's first position; new K/V go to [start, start + T).
            route: four-expert routing only: the forward's `ExpertRoute` (sticky term, inspection).
            path: this layer's decode paths where the model is prepared (`DecodePaths.layers`), else None.
        Returns:
            (h_c, h_s), same shapes.
        """
        Tc, Ts = h_c.shape[1], h_s.shape[1]
        if kv is not None:
            # Decoding. Committed positions go first, attending over committed keys only, in calls of
            # their own: their numbers do not depend on the slots (same shapes, same kernels). They can
            # differ in the last bits from a one-row AR step (a matrix-matrix kernel over k + 1 rows
            # instead of matrix-vector), which could only matter at an exact tie of the top two
            # logits. Slots follow, in scratch space past the committed length that the next
            # committed write overwrites.
            if Tc:
                h_c = self._decode(
                    h_c, False, cos[..., :Tc, :], sin[..., :Tc, :], mask, kv, start, 0, route, path
                )
            if Ts:
                h_s = self._decode(
                    h_s, True, cos[..., Tc:, :], sin[..., Tc:, :], mask, kv, start + Tc, Tc, route, path
                )
            return h_c, h_s
        # Training: committed positions and all blocks in one attention call, under the training mask.
        gqa = self.n_kv != self.n_heads
        # A prepared model's committed rows go through its AR decode path: always for a plain AR forward
        # (scoring), and with slots too where the packed weights are the only copy left
        # (`yue.kernels.prepare.release_unpacked`).
        ar = path[0] if path is not None and (not Ts or exact_rows(path)) else None
        cos_c, sin_c = cos[..., :Tc, :], sin[..., :Tc, :]
        q_c, k_c, v_c = self._qkv(h_c, False, cos_c, sin_c) if ar is None else ar.qkv_rope(h_c, cos_c, sin_c)
        finish_c = (lambda h, o: self._finish(h, o, False, route)) if ar is None else ar.finish
        if not Ts:
            o_c = F.scaled_dot_product_attention(
                q_c, k_c, v_c, attn_mask=mask, scale=self.attn_scale, enable_gqa=gqa
            )
            return finish_c(h_c, o_c), h_s
        q_s, k_s, v_s = self._qkv(h_s, True, cos[..., Tc:, :], sin[..., Tc:, :])
        q, k, v = (torch.cat(p, dim=2) for p in ((q_c, q_s), (k_c, k_s), (v_c, v_s)))
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.attn_scale, enable_gqa=gqa)
        o_c, o_s = o.split([Tc, Ts], 2)
        return finish_c(h_c, o_c), self._finish(h_s, o_s, True, route)
