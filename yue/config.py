"""Configuration: the model's Hugging Face config and the typed, validated decode settings.

Design decisions:
- `YueConfig` is a `transformers.PreTrainedConfig`, so checkpoints round-trip through `save_pretrained`
  / `AutoConfig` and the AR set's fields read exactly like `LlamaConfig`'s (export is a field copy).
- `DecodeConfig` is a frozen dataclass validated once, in `__post_init__`; every user mistake raises a
  `ValueError` that names the field. Decoding strategies are chosen by name (`mode`), never by flags.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Literal, get_args

from transformers import PreTrainedConfig

Mode = Literal["ar", "verified", "hybrid", "nar", "anchor", "anchor-verified"]
MODES: tuple[str, ...] = get_args(Mode)
# Experiments reachable by name, never a default (issue 47; their numbers: docs/results-log.md).
EXPERIMENTAL_MODES: tuple[str, ...] = ("anchor", "anchor-verified")
EXACT_MODES: tuple[str, ...] = ("verified", "anchor-verified")  # greedy output equals `ar`'s by construction
Drafting = Literal["separate", "fused"]
LayerRouting = Literal["type", "four-expert"]
# Modes whose drafting pass always computes the whole block (`nar` commits it; the anchor modes fill
# up to K - 1 tokens a pass), whatever the model's `drafting_slots`.
UNPLANNED_SLOTS = ("nar", "anchor", "anchor-verified")
DRAFTINGS: tuple[str, ...] = get_args(Drafting)


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


MAX_LOGPROBS = 20  # top alternatives per token, as OpenAI's top_logprobs allows


# DecodeConfig's fields by type, checked first (`__post_init__`); None passes where a field allows it.
_INTEGER_FIELDS = (
    "max_new_tokens",
    "top_k",
    "seed",
    "block_size",
    "drafting_slots",
    "reeval_every",
    "logprobs",
)
_NUMBER_FIELDS = (
    "temperature",
    "top_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "router_threshold",
)
MAX_PENALTY, MAX_LOGIT_BIAS = 2.0, 100.0  # OpenAI's ranges for the penalties and logit_bias
MAX_TEMPERATURE = 2.0  # OpenAI's cap
# repetition_penalty's range: logits divided or multiplied by at most 100 stay finite in float16 too, so
# sampling never sees inf - inf = NaN (a penalty of 1e-38 once overflowed the scores to inf).
REPETITION_PENALTY_RANGE = (0.01, 100.0)


@dataclass(frozen=True)
class DecodeConfig:
    """How to decode one request. Validated once; bad values raise `ValueError` naming the field.

    Attributes:
        mode: decode policy by name (docs/design.md §2): `ar` (reference), `verified` (lossless drafting),
            `hybrid` (drafts kept within a tolerance of the AR path's choice), `nar` (whole blocks, lowest fidelity);
            None (not given) = the model's `default_mode` (verified for yue-smol, hybrid for yue-code-mini;
            ar without a NAR set: `YueConfig.decode_mode`, filled by `resolved`).
        max_new_tokens: hard cap on generated tokens.
        temperature: in [0, 2] (OpenAI's range); 0 means greedy (argmax), decided in one place (`decode.sampling`).
        top_k: keep the k most likely tokens (0 = off).
        top_p: nucleus mass in (0, 1]; 1 = off.
        repetition_penalty: CTRL-style penalty on tokens already in the context, in [0.01, 100]; 1 = off.
        presence_penalty / frequency_penalty: OpenAI's penalties, in [-2, 2]: a generated token's logit
            minus presence_penalty once it has been generated, and minus frequency_penalty times how
            often (the prompt's tokens do not count); 0 = off.
        logit_bias: (token id, bias) pairs added to those tokens' logits, each bias in [-100, 100]
            (OpenAI's `logit_bias`; -100 bans a token in effect); () = off. Applied after the
            penalties, before temperature; a dict is taken too.
        seed: seeds the request's own `torch.Generator`; same seed, same sample.
        stop: strings that end generation; the text is cut before the first one.
        router_threshold: the mode's one dial, speed against fidelity; None = the model's calibrated
            default. `verified`: the router gate, a slot is drafted when the router's p_ar <= threshold
            (speed only, the output is `ar`'s; 1 = every slot; default `YueConfig.draft_gate`).
            `hybrid`: the acceptance tolerance t, a draft is kept when p_AR(draft) >= (1 - t) * max
            p_AR (0 = `verified`, exact; 1 = every draft; default `YueConfig.hybrid_tolerance`).
            `ar`, `nar`: unused.
        block_size: slots drafted per step, at most the model's K; None = the model's K.
        drafting_slots: `verified` / `hybrid`, separate drafting: slots a drafting pass computes (slot 1
            revealed, then drafting_slots - 1 drafts), at most block_size; copied drafts may run to
            block_size - 1. None = the model's `drafting_slots` (capped at block_size); `nar`: block_size.
        reeval_every: verified / hybrid with a router gate below 1: AR steps after a futile router probe
            before it is asked again (doubling, capped); None = model default.
        trace: record a per-step `Step` trace (cheap; off by default for the leanest loop).
        ignore_eos: keep writing past <|eos|> (fixed-length runs: self-distillation corpora).
        drafting: where a step's draft block is computed (docs/design.md §2). "separate" (default): after the
            step's forward, in a NAR-only pass anchored at the last kept token, with slot 1 revealed
            (its token, the AR path's, is known by then), so slots 2.. are drafted knowing it: two
            forwards per drafting step, K slot rows. "fused": in the step's own forward, one block at
            the last fed token (`verified`: one at every fed draft position, so that whichever prefix
            is accepted has one), slot 1 a mask: one forward, K slot rows per block. On the 2-core
            CPU the bench runs on, separate is the faster for every mode (and the better drafts);
            on a GPU at batch 1, where a forward costs about the same whatever its rows, fused may
            be (not measured: no GPU was available).
        prompt_lookup: `verified` / `hybrid` with separate drafting: where the context's last few
            tokens occurred before, draft the tokens that followed them (no forward) instead of
            running the NAR drafting pass, when this request's record of such copies says they pay
            (`decode/lookup.py`). `verified`'s output is `ar`'s either way.
        corpus_drafts: `verified` / `hybrid` with separate drafting, a model that ships an n-gram
            table of its own answers (`decode/corpus.py`): where the context has no copy, draft what
            followed the context's last few tokens in that corpus (no forward), when this request's
            record of such drafts says they pay. `verified`'s output is `ar`'s either way.
        logprobs: report each generated token's log-probability under the AR path (raw log-softmax of
            its logits, before penalties, logit bias and temperature) with this many top alternatives (0 = the
            token's own only); None = off. A token committed unverified (`nar`'s slots) has no AR
            log-prob at commit time and reports None.
    """

    mode: Mode | None = None
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    router_threshold: float | None = None
    block_size: int | None = None
    drafting_slots: int | None = None
    reeval_every: int | None = None
    trace: bool = False
    ignore_eos: bool = False
    drafting: Drafting = "separate"
    prompt_lookup: bool = True
    corpus_drafts: bool = True
    logprobs: int | None = None

    def __post_init__(self) -> None:
        for name in _INTEGER_FIELDS + _NUMBER_FIELDS:  # a wrong type is named, not a TypeError deep inside
            value, kind = getattr(self, name), numbers.Integral if name in _INTEGER_FIELDS else numbers.Real
            if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
                what = "an integer" if kind is numbers.Integral else "a number"
                raise ValueError(f"{name} must be {what}, got {value!r}")
        if self.mode is not None and self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not math.isfinite(self.temperature) or not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got {self.temperature!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0, got {self.top_k!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        lo, hi = REPETITION_PENALTY_RANGE
        if not math.isfinite(self.repetition_penalty) or not lo <= self.repetition_penalty <= hi:
            raise ValueError(f"repetition_penalty must be in [{lo:g}, {hi:g}], got {self.repetition_penalty!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -MAX_PENALTY <= getattr(self, name) <= MAX_PENALTY:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)!r}")
        object.__setattr__(self, "logit_bias", _logit_bias(self.logit_bias))
        if self.router_threshold is not None and not (0.0 <= self.router_threshold <= 1.0):
            raise ValueError(f"router_threshold must be in [0, 1], got {self.router_threshold!r}")
        if self.block_size is not None and self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size!r}")
        if self.drafting_slots is not None and self.drafting_slots < 1:
            raise ValueError(f"drafting_slots must be >= 1, got {self.drafting_slots!r}")
        if self.reeval_every is not None and self.reeval_every < 1:
            raise ValueError(f"reeval_every must be >= 1, got {self.reeval_every!r}")
        if self.drafting not in DRAFTINGS:
            raise ValueError(f"drafting must be one of {', '.join(DRAFTINGS)}; got {self.drafting!r}")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_LOGPROBS:
            raise ValueError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        object.__setattr__(self, "stop", tuple(s for s in self.stop if s))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def adjusts_logits(self) -> bool:
        """Whether the AR logits are adjusted before a token is chosen (penalties, logit bias)."""
        return (
            self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or bool(self.logit_bias)
        )

    @property
    def draft_block(self) -> int:
        """Slots of the block a step drafts from: `block_size` with fused drafting (in the step's own
        forward), else `drafting_slots` (a drafting pass; `block_size` where unset)."""
        separate = self.drafting == "separate" and self.drafting_slots is not None
        return (self.drafting_slots if separate else self.block_size) or 1

    def draft_gate(self, model_config: YueConfig) -> float:
        """The router threshold that gates draft lengths (`VerifiedPolicy.draft_length`): `verified`'s
        own dial; `hybrid`'s dial is its acceptance tolerance, so it drafts as `verified` does by default."""
        return self.router_threshold if self.mode == "verified" else model_config.draft_gate

    def resolved(self, model_config: YueConfig) -> DecodeConfig:
        """Fill the model-dependent defaults (mode, threshold, K, reeval) from the checkpoint's config."""
        if self.mode is None:
            return replace(self, mode=model_config.decode_mode).resolved(model_config)
        if self.mode != "ar" and not model_config.has_nar:
            raise ValueError(f"mode {self.mode!r} needs a NAR set; this model has none (use mode 'ar')")
        if self.drafting == "fused" and model_config.nar_start > 0 and self.mode != "ar":
            raise ValueError(
                "drafting 'fused' needs a NAR set in every layer; this model's slots enter at layer "
                f"{model_config.nar_start} (use drafting 'separate')"
            )
        if self.mode.startswith("anchor") and self.drafting != "separate":
            raise ValueError(f"mode {self.mode!r} fills in a drafting pass: drafting must be 'separate'")
        k = self.block_size if self.block_size is not None else model_config.block_size
        if k > model_config.block_size:
            raise ValueError(
                f"block_size must be <= the model's block_size {model_config.block_size}, got {k}"
            )
        if self.drafting_slots is not None and self.drafting_slots > k:
            raise ValueError(f"drafting_slots must be <= block_size {k}, got {self.drafting_slots}")
        vocab = model_config.vocab_size
        if bad := [t for t, _ in self.logit_bias if not 0 <= t < vocab]:
            raise ValueError(f"logit_bias: token id {bad[0]} is not in this model's vocabulary [0, {vocab})")
        slots = self.drafting_slots
        if slots is None:
            slots = k if self.mode in UNPLANNED_SLOTS else min(model_config.drafting_slots or k, k)
        # The dial's default is the model's own for the mode (`router_threshold` above).
        default_threshold = model_config.draft_gate if self.mode == "verified" else model_config.hybrid_tolerance
        return replace(
            self,
            router_threshold=self.router_threshold
            if self.router_threshold is not None
            else default_threshold,
            block_size=k,
            drafting_slots=slots,
            reeval_every=self.reeval_every if self.reeval_every is not None else model_config.reeval_every,
        )


def _logit_bias(bias) -> tuple[tuple[int, float], ...]:
    """`DecodeConfig.logit_bias` as sorted (token id, bias) pairs (hashable: it is part of a batch's key)
    from pairs or a dict; ValueError on a wrong type or a bias outside [-100, 100]."""
    pairs = bias.items() if isinstance(bias, dict) else bias
    try:
        pairs = [(t, b) for t, b in pairs]
    except (TypeError, ValueError):
        raise ValueError(f"logit_bias must map token ids to numbers, got {bias!r}") from None
    for t, b in pairs:
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise ValueError(f"logit_bias: token ids must be integers, got {t!r}")
        if (
            isinstance(b, bool)
            or not isinstance(b, numbers.Real)
            or not -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS
        ):
            raise ValueError(
                f"logit_bias: each bias must be a number in [-100, 100], got {b!r} for token {t}"
            )
    return tuple(sorted((int(t), float(b)) for t, b in dict(pairs).items()))


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


Precision = Literal["auto", "file", "float32", "bfloat16", "int4"]
# The context `yue.load` sizes a model for by default (tokens; capped at the model's own), as llama.cpp's.
DEFAULT_CTX_SIZE = 4096
DraftPrecision = Literal["auto", "int8", "bfloat16", "float32"]


@dataclass(frozen=True)
class LoadConfig:
    """Which model `yue.load` loads, where and in what precision, as one value (`engine.load_from`: the
    loading options of `yue generate`, `chat` and `serve`). The device is checked at load.

    Attributes:
        model: A model's name (yue-smol, yue-code-mini), a model folder or a .gguf file (default: the
            default model).
        adapter: A `yue finetune` adapter folder for this model.
        device: cpu | cuda | cuda:N | auto (CUDA when available).
        dtype: auto (a .gguf file's own codes on a CPU, else float32) | file (a GGUF's own codes, each
            matrix in its ggml block format: about the file's memory) | float32 (the GGUF's values) | bfloat16: a named precision, faster where the CPU has
            AVX512-BF16 or AMX | int4 (CPU): the AR layers in 4 bits (a Q4_1 GGUF's own codes) on int8
            activations, as llama.cpp runs them, the fastest; ar and verified stay exact against each
            other in each.
        draft_dtype: Drafting weights: auto (int8 on a CPU) | int8 | bfloat16 | float32; ar and verified
            output is the same whichever.
        low_memory: float32 on a CPU: each weight held once (less memory, slower verifying rows).
    """

    model: str | None = None
    adapter: str | None = None
    device: str = "cpu"
    dtype: Precision = "auto"
    draft_dtype: DraftPrecision = "auto"
    low_memory: bool = False

    def __post_init__(self) -> None:
        for name, kind in (("dtype", Precision), ("draft_dtype", DraftPrecision)):
            if getattr(self, name) not in get_args(kind):
                raise ValueError(f"{name} must be one of {get_args(kind)}, got {getattr(self, name)!r}")
