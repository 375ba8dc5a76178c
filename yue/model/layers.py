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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from yue.config import YueConfig


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019), computed in float32 as Llama does."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class RotaryTable:
    """cos/sin tables for rotary position embeddings (Su et al. 2021), in Llama's half-split layout."""

    def __init__(self, head_dim: int, theta: float, max_positions: int) -> None:
        self.head_dim, self.theta, self.max_positions = head_dim, theta, max_positions
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
            inv_freq = 1.0 / (
                self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
            )
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


class MLP(nn.Module):
    """SwiGLU feed-forward (Shazeer 2020), Llama's names."""

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        d, f = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(d, f, bias=False)
        self.up_proj = nn.Linear(d, f, bias=False)
        self.down_proj = nn.Linear(f, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class AttentionProjections(nn.Module):
    """Q/K/V/O projections of one parameter set (AR or NAR). Grouped-query: fewer K/V heads than Q."""

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        d, hd = config.hidden_size, config.head_dim
        self.q_proj = nn.Linear(d, config.num_attention_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, config.num_key_value_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.num_key_value_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.num_attention_heads * hd, d, bias=False)


class MoTLayer(nn.Module):
    """One transformer layer with an AR and a NAR parameter set sharing one attention."""

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        # AR set: Hugging Face Llama names, so `export-ar` is a rename-free copy.
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = AttentionProjections(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)
        # NAR set: same shapes, parallel names.
        self.nar_input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.nar_self_attn = AttentionProjections(config)
        self.nar_post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.nar_mlp = MLP(config)

    def _split_apply(self, h: torch.Tensor, n_c: int, ar_fn, nar_fn) -> torch.Tensor:
        """Apply `ar_fn` to the first n_c positions and `nar_fn` to the rest. h: (B, T, *)."""
        if n_c == h.shape[1]:
            return ar_fn(h)
        if n_c == 0:
            return nar_fn(h)
        return torch.cat([ar_fn(h[:, :n_c]), nar_fn(h[:, n_c:])], dim=1)

    def _attend(self, q, k, v, mask, n_committed: int, start: int, cached: bool) -> torch.Tensor:
        """SDPA for q (B, H, T, Dh) over k, v (B, Hkv, S, Dh). In a decode step with slots, committed
        queries attend over committed keys only, in a call of their own: their numbers are then
        bit-identical to a step without slots (same shapes, same kernel), not merely equal up to
        rounding, which keeps `verified` == `ar` exact even at near-ties."""
        gqa = self.n_kv != self.n_heads
        T = q.shape[2]
        if not cached or n_committed == T:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
        s_c = start + n_committed
        m_c = None if mask is None else mask[..., :n_committed, :s_c]
        m_s = None if mask is None else mask[..., n_committed:, :]
        out_c = F.scaled_dot_product_attention(
            q[:, :, :n_committed], k[:, :, :s_c], v[:, :, :s_c], m_c, enable_gqa=gqa
        )
        out_s = F.scaled_dot_product_attention(q[:, :, n_committed:], k, v, m_s, enable_gqa=gqa)
        return torch.cat([out_c, out_s], dim=2)

    def forward(
        self,
        h: torch.Tensor,
        n_committed: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor | None,
        kv: tuple[torch.Tensor, torch.Tensor] | None = None,
        start: int = 0,
    ) -> torch.Tensor:
        """One layer.

        Args:
            h: (B, T, D) hidden states; the first `n_committed` positions are committed, the rest slots.
            n_committed: number of committed positions at the front of `h`.
            cos, sin: RoPE rows for the T positions, (1|B, 1, T, Dh).
            mask: (1|B, 1, T, S) bool, True = may attend; S = start + T with a cache, T without.
                None means every query may see every key (a single committed token).
            kv: this layer's cache buffers (k, v), each (B, Hkv, T_max, Dh), or None (training).
            start: absolute cache index of h's first position; new K/V are written at [start, start+T).
        Returns:
            (B, T, D) hidden states.
        """
        B, T, _ = h.shape
        a, n = self.self_attn, self.nar_self_attn
        # 1. Pre-attention norm and Q/K/V, per parameter set.
        x = self._split_apply(h, n_committed, self.input_layernorm, self.nar_input_layernorm)
        q = self._split_apply(x, n_committed, a.q_proj, n.q_proj)
        k = self._split_apply(x, n_committed, a.k_proj, n.k_proj)
        v = self._split_apply(x, n_committed, a.v_proj, n.v_proj)
        q = q.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)
        k = k.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)  # (B, Hkv, T, Dh)
        v = v.view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # 2. One shared attention. With a cache, K/V land at their absolute indices (slots too: they
        #    sit past the committed length, in scratch space the next committed write overwrites).
        if kv is not None:
            k_buf, v_buf = kv
            k_buf[:, :, start : start + T] = k
            v_buf[:, :, start : start + T] = v
            k, v = k_buf[:, :, : start + T], v_buf[:, :, : start + T]  # (B, Hkv, S, Dh)
        out = self._attend(q, k, v, mask, n_committed, start, kv is not None)
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        h = h + self._split_apply(out, n_committed, a.o_proj, n.o_proj)
        # 3. Post-attention norm and MLP, per parameter set.
        x = self._split_apply(
            h, n_committed, self.post_attention_layernorm, self.nar_post_attention_layernorm
        )
        return h + self._split_apply(x, n_committed, self.mlp, self.nar_mlp)
