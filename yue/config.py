"""Configuration: the model's Hugging Face config, and (from `yue.settings`) the typed, validated decode
and load settings.

Design decisions:
- `YueConfig` is a `transformers.PreTrainedConfig`, so checkpoints round-trip through `save_pretrained`
  / `AutoConfig` and the AR set's fields read exactly like `LlamaConfig`'s (export is a field copy).
- The user's settings (`DecodeConfig`, `LoadConfig`, the mode names) live in `yue.settings`, which imports
  no transformers, so the command line parses them without loading it; they are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, get_args

from transformers import PreTrainedConfig

from yue.settings import (  # noqa: F401  (re-exported: the settings' home before yue.settings)
    DRAFTINGS,
    EXACT_MODES,
    EXPERIMENTAL_MODES,
    MAX_LOGIT_BIAS,
    MAX_LOGPROBS,
    MAX_PENALTY,
    MAX_TEMPERATURE,
    MODES,
    REPETITION_PENALTY_RANGE,
    UNPLANNED_SLOTS,
    DecodeConfig,
    Drafting,
    DraftPrecision,
    LoadConfig,
    Mode,
    Precision,
)

LayerRouting = Literal["type", "four-expert"]

Activation = Literal["silu", "gelu_tanh"]


@dataclass(frozen=True)
class Features:
    """How a model family's layers differ from Llama's (docs/design.md §9): each field one named difference that
    the shared layer code applies (`model/layers.py`, `model/mot.py`), so a family is data, not a fork.
    Read from a Hugging Face config or GGUF metadata by `model/family.py`; the defaults are Llama's."""

    # Biases on the Q, K and V projections (Qwen2 / Qwen2.5).
    qkv_bias: bool = False
    # An RMSNorm over each head of Q and of K, before RoPE (Qwen3, Gemma 3).
    qk_norm: bool = False
    # Norm weights applied as (offset + w): 1.0 for Gemma's (1 + w) RMSNorm, 0.0 for Llama's.
    norm_offset: float = 0.0
    # Gemma's four norms a layer: attention output and MLP output normed before their residual adds,
    # the MLP input by its own norm (`pre_feedforward_layernorm`).
    sandwich_norms: bool = False
    # The gated MLP's activation: SwiGLU's silu, or GeGLU's tanh-approximated GELU (Gemma).
    activation: Activation = "silu"
    # Embeddings multiplied by sqrt(hidden_size) (Gemma).
    embed_scale: bool = False
    # Attention's softmax scale (Gemma: query_pre_attn_scalar ** -0.5); None = head_dim ** -0.5.
    attn_scale: float | None = None
    # Keys a sliding-window layer's query sees, its own included (Mistral, Gemma 3); None = every key.
    sliding_window: int | None = None
    # Per layer, whether it is a sliding-window one (Gemma 3's local layers between global ones); empty =
    # every layer is, where `sliding_window` is set (Mistral).
    sliding_layers: tuple[bool, ...] = ()
    # RoPE base of the sliding-window layers where it differs from `rope_theta` (Gemma 3's 10k local).
    local_rope_theta: float | None = None
    # Llama 3's RoPE scaling: (factor, low_freq_factor, high_freq_factor, original_max_position_embeddings).
    llama3_rope: tuple[float, float, float, int] | None = None

    def __post_init__(self) -> None:
        if self.activation not in get_args(Activation):
            raise ValueError(
                f"features.activation must be one of {get_args(Activation)}, got {self.activation!r}"
            )
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"features.sliding_window must be >= 1, got {self.sliding_window}")

    def sliding(self, layer: int) -> bool:
        """Whether layer `layer` attends through a sliding window."""
        if self.sliding_window is None:
            return False
        return self.sliding_layers[layer] if self.sliding_layers else True

    def to_dict(self) -> dict:
        """JSON-ready, only the fields that differ from Llama's (a Llama config stays as it was)."""
        plain = Features()
        return {k: v for k, v in vars(self).items() if v != getattr(plain, k)}

    @classmethod
    def from_dict(cls, d: dict | None) -> Features:
        d = dict(d or {})
        for name in ("sliding_layers", "llama3_rope"):
            if d.get(name) is not None:
                d[name] = tuple(d[name])
        unknown = sorted(d.keys() - {f.name for f in fields(cls)})
        if unknown:
            raise ValueError(f"features: unknown field(s) {', '.join(unknown)}")
        return cls(**d)


class YueConfig(PreTrainedConfig):
    """Shape of the AR-NAR Mixture-of-Transformers and the defaults it was calibrated with.

    The AR-set fields (`hidden_size` ... `rope_theta`) mean exactly what they mean in `LlamaConfig`;
    the NAR set has the same shapes. `block_size` (K) is the number of mask slots a NAR block holds.
    """

    model_type = "yue"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    initializer_range: float = 0.02
    tie_word_embeddings: bool = True
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    pad_token_id: int | None = 0
    mask_token_id: int = 3
    # K: slots per NAR block; docs/design.md §7 found slots beyond ~4 add little, 8 keeps headroom.
    block_size: int = 8
    # `verified` / `hybrid`, separate drafting: slots a drafting pass computes by default (slot 1
    # revealed, so drafting_slots - 1 drafts; copied drafts may still run to K - 1), chosen by speed on
    # a calibration split: later slots are rarely accepted and each costs the pass rows. None = K.
    drafting_slots: int | None = None
    # Router hidden width: small, the router must stay well under 1% of the parameters.
    router_hidden_size: int = 64
    # `hybrid`'s default dial (a request's `router_threshold` in that mode), chosen on a calibration split:
    # its acceptance tolerance t, a draft is kept when p_AR(draft) >= (1 - t) * max p_AR
    # (`decode.sampling.within_tolerance`); 0 = exact. Uncalibrated default 0.1: an accepted token costs
    # at most -log(0.9) = 0.105 nats of AR NLL.
    hybrid_tolerance: float = 0.1
    # The mode a caller who names none gets (`decode_mode`): "hybrid" where it is within its fidelity
    # bounds on held-out text and faster than `verified`, else "verified" (exact; yue-smol's hybrid is
    # within its NLL bound but no faster at its default, see its card).
    default_mode: Mode = "hybrid"
    # The router gate on draft lengths: `verified`'s default dial (a request's `router_threshold` in that
    # mode), and `hybrid`'s gate (`DecodeConfig.draft_gate`). 1 leaves
    # the router unasked, and each draft length follows the request's own acceptance record and the
    # step costs measured on the machine (`VerifiedPolicy.record_length`); below 1 the router's
    # predictions, scaled by that record, pick them (`VerifiedPolicy.draft_length`). yue-smol
    # ships 0.8, yue-code-mini 1, each chosen on its calibration split (their config.json).
    draft_gate: float = 1.0
    # verified / hybrid with a router gate below 1: after a futile router probe, AR steps before it is
    # asked again (doubling after each futile probe, up to 8x).
    reeval_every: int = 5
    # Loss weights the checkpoint was trained with (alpha, beta, gamma of docs/design.md §3), for the record.
    loss_weights: dict | None = None
    # Layers holding a NAR set: None = every layer (slots enter at the embedding); N = the top N only,
    # slots entering there from the anchor's hidden state (`mot.SlotEntry`), so a large pretrained AR
    # set needs a NAR set of N layers, not L (docs/design.md §8); 0 = no NAR set (an AR-only model: mode "ar").
    nar_layers: int | None = None
    # Slot rows' head over this many of the most frequent output tokens (FR-Spec, Zhao et al. 2025),
    # their ids in the checkpoint's `draft_vocab`; None = the full LM head.
    draft_vocab_size: int | None = None
    # `verified` / `hybrid`: how free drafts fared on the calibration split's answers, per source and
    # match length ("copy:2" ... "corpus:4", `VerifiedPolicy.copy`): c_j, the chance that draft j
    # held where drafts 1..j-1 did. The prior of each request's record of them (`AcceptanceRecord`);
    # None, or a kind not listed: c_j = 1 (draft, and learn from the request).
    free_draft_rates: dict | None = None
    # The same rates as speculative sampling meets them, measured on answers sampled at a temperature
    # (`docs/recipes/free_draft_rates.py --temperature`): {"0.7": {"copy:2": [c_1, ...], ...}}. A
    # sampled request's records start from those measured at the nearest temperature
    # (`sources.draft_rates`); None: from `free_draft_rates`.
    sampled_draft_rates: dict | None = None
    # The AR set's model family ("llama", "qwen2", "qwen3", "gemma3_text", "mistral") and how its layers
    # differ from Llama's (`Features.to_dict`; None = Llama's), read by `model/family.py`.
    family: str = "llama"
    features: dict | None = None
    # Which MLP a position runs in each layer (issue 47): "type" = its type's set (committed: AR,
    # slots: NAR); "four-expert" = a per-layer top-2 router over AR, NAR, fused and fallback experts
    # (`model/experts.py`), an experiment trained by `yue train --layer-routing four-expert`.
    layer_routing: LayerRouting = "type"
    # four-expert only: the sticky term, added to a position's gate logit for the expert it took first
    # at the layer below (0 = none).
    expert_stick: float = 0.0
    # `anchor` / `anchor-verified` decoding (`decode/anchor.py`): the attention bias added on each
    # anchor's key for fill slots, per unit of the anchor's confidence (trained with it: `yue train
    # --objective anchor`); and whether the checkpoint holds the anchor-count head (`AnchorHead`).
    anchor_bias: float = 0.0
    anchor_head: bool = False

    def __post_init__(self, **kwargs):
        if self.head_dim is None:
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:
            self.num_key_value_heads = self.num_attention_heads
        if self.loss_weights is None:
            self.loss_weights = {"ar": 1.0, "nar": 0.8, "kl": 0.2}
        # Checkpoints written before the two dials had names of their own: `router_threshold` was
        # hybrid's tolerance, `verified_threshold` the draft gate.
        for old, new in (("router_threshold", "hybrid_tolerance"), ("verified_threshold", "draft_gate")):
            if old in kwargs:
                setattr(self, new, kwargs.pop(old))
        super().__post_init__(**kwargs)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_key_value_heads must divide num_attention_heads")
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.drafting_slots is not None and not 1 <= self.drafting_slots <= self.block_size:
            raise ValueError(f"drafting_slots must be in [1, block_size], got {self.drafting_slots}")
        for name in ("hybrid_tolerance", "draft_gate"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.default_mode not in MODES:
            raise ValueError(f"default_mode must be one of {', '.join(MODES)}; got {self.default_mode!r}")
        if self.nar_layers is not None and not 0 <= self.nar_layers <= self.num_hidden_layers:
            raise ValueError(f"nar_layers must be in [0, num_hidden_layers], got {self.nar_layers}")
        if self.draft_vocab_size is not None and not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(f"draft_vocab_size must be in (0, vocab_size], got {self.draft_vocab_size}")
        _check_rates("free_draft_rates", self.free_draft_rates or {})
        for t, table in (self.sampled_draft_rates or {}).items():
            if not _is_temperature(t) or not isinstance(table, dict):
                raise ValueError(
                    f"sampled_draft_rates: keys are temperatures in (0, 2] holding rates by kind, got {t!r}"
                )
            _check_rates(f"sampled_draft_rates[{t!r}]", table)
        if self.layer_routing not in get_args(LayerRouting):
            raise ValueError(
                f"layer_routing must be one of {get_args(LayerRouting)}; got {self.layer_routing!r}"
            )
        if self.layer_routing == "four-expert" and (self.nar_layers is not None or self.features):
            raise ValueError(
                "layer_routing 'four-expert' needs a NAR set in every layer of a Llama-shaped stack"
            )
        layer_features = self.layer_features
        if layer_features.sliding_layers and len(layer_features.sliding_layers) != self.num_hidden_layers:
            raise ValueError("features.sliding_layers must name every layer")

    @property
    def layer_features(self) -> Features:
        """The family's differences from Llama's layers (`Features`)."""
        return Features.from_dict(self.features)

    @property
    def nar_start(self) -> int:
        """Index of the first layer with a NAR set: where slots enter the stack."""
        n = self.num_hidden_layers if self.nar_layers is None else self.nar_layers
        return self.num_hidden_layers - n

    @property
    def has_nar(self) -> bool:
        return self.nar_layers != 0

    @property
    def decode_mode(self) -> Mode:
        """The mode a caller who names none gets, decided here only: `default_mode`, or "ar" for a model
        without a NAR set (an AR set loaded alone)."""
        return self.default_mode if self.has_nar else "ar"


def _check_rates(name: str, table: dict) -> None:
    """ValueError unless every kind of `table` holds a list of rates in [0, 1]."""
    for kind, rates in table.items():
        if not isinstance(rates, list) or not all(isinstance(c, int | float) and 0 <= c <= 1 for c in rates):
            raise ValueError(f"{name}[{kind!r}]: a list of rates in [0, 1], got {rates!r}")


def _is_temperature(key: object) -> bool:
    """Whether a `sampled_draft_rates` key names a sampling temperature, in (0, 2]."""
    try:
        return 0.0 < float(key) <= 2.0
    except (TypeError, ValueError):
        return False
