"""The settings a user gives (how to decode, which model to load), typed and validated once, importing
no torch or transformers: the command line builds them to parse its options (`yue --help` and argument
errors stay fast), the library checks them the same way.

Design decisions:
- `DecodeConfig` is a frozen dataclass validated once, in `__post_init__`; every user mistake raises a
  `ValueError` that names the field. Decoding strategies are chosen by name (`mode`), never by flags.
- The model's own config (`YueConfig`, a `transformers.PreTrainedConfig`) lives in `yue.config`, which
  re-exports these names; `DecodeConfig.resolved` takes it as an argument.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, replace
from typing import Literal, Protocol, get_args

Mode = Literal["ar", "verified", "hybrid", "nar", "anchor", "anchor-verified"]
MODES: tuple[str, ...] = get_args(Mode)
# Experiments reachable by name, never a default (issue 47; their numbers: docs/results-log.md).
EXPERIMENTAL_MODES: tuple[str, ...] = ("anchor", "anchor-verified")
EXACT_MODES: tuple[str, ...] = ("verified", "anchor-verified")  # greedy output equals `ar`'s by construction
Drafting = Literal["separate", "fused"]
# Modes whose drafting pass always computes the whole block (`nar` commits it; the anchor modes fill
# up to K - 1 tokens a pass), whatever the model's `drafting_slots`.
UNPLANNED_SLOTS = ("nar", "anchor", "anchor-verified")
# The modes a model without a NAR set runs: `verified` there verifies drafts copied from the context.
AR_SET_MODES = ("ar", "verified")
DRAFTINGS: tuple[str, ...] = get_args(Drafting)


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


class ModelDefaults(Protocol):
    """What `DecodeConfig.resolved` reads of a model's config (`yue.config.YueConfig`, named here by
    its shape so that these settings import no transformers)."""

    vocab_size: int
    block_size: int
    drafting_slots: int | None
    draft_gate: float
    hybrid_tolerance: float
    reeval_every: int

    @property
    def decode_mode(self) -> Mode: ...

    @property
    def has_nar(self) -> bool: ...

    @property
    def nar_start(self) -> int: ...


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
            raise ValueError(
                f"repetition_penalty must be in [{lo:g}, {hi:g}], got {self.repetition_penalty!r}"
            )
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

    def draft_gate(self, model_config: ModelDefaults) -> float:
        """The router threshold that gates draft lengths (`VerifiedPolicy.draft_length`): `verified`'s
        own dial; `hybrid`'s dial is its acceptance tolerance, so it drafts as `verified` does by default."""
        return self.router_threshold if self.mode == "verified" else model_config.draft_gate

    def resolved(self, model_config: ModelDefaults) -> DecodeConfig:
        """Fill the model-dependent defaults (mode, threshold, K, reeval) from the checkpoint's config."""
        if self.mode is None:
            return replace(self, mode=model_config.decode_mode).resolved(model_config)
        if self.mode not in AR_SET_MODES and not model_config.has_nar:
            raise ValueError(
                f"mode {self.mode!r} needs a NAR set; this model has none (use mode 'ar' or 'verified')"
            )
        if self.drafting == "fused" and not model_config.has_nar and self.mode != "ar":
            raise ValueError("drafting 'fused' needs a NAR set; this model has none (use drafting 'separate')")
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
        if not model_config.has_nar:
            slots = 1  # no NAR block to draft (`draft_block` 1): `verified` verifies free drafts only
        elif slots is None:
            slots = k if self.mode in UNPLANNED_SLOTS else min(model_config.drafting_slots or k, k)
        # The dial's default is the model's own for the mode (`router_threshold` above).
        default_threshold = (
            model_config.draft_gate if self.mode == "verified" else model_config.hybrid_tolerance
        )
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
            matrix in its ggml block format: about the file's memory) | float32 (the GGUF's values) |
            bfloat16: a named precision, faster where the CPU has
            AVX512-BF16 or AMX | int4 (CPU): the AR layers in 4 bits (a Q4_1 GGUF's own codes) on int8
            activations, as llama.cpp runs them, the fastest; ar and verified stay exact against each
            other in each.
        draft_dtype: Drafting weights: auto (int8 on a CPU) | int8 | bfloat16 | float32; ar and verified
            output is the same whichever.
        low_memory: float32 on a CPU: each weight held once (less memory, slower verifying rows).
        threads: torch threads for the model's work (llama.cpp's -t); None = torch's choice.
        ctx_size: tokens the KV cache holds, prompt and answer together (llama.cpp's -c); None = 4096,
            capped at the model's context.
    """

    model: str | None = None
    adapter: str | None = None
    device: str = "cpu"
    dtype: Precision = "auto"
    draft_dtype: DraftPrecision = "auto"
    low_memory: bool = False
    threads: int | None = None
    ctx_size: int | None = None

    def __post_init__(self) -> None:
        for name, kind in (("dtype", Precision), ("draft_dtype", DraftPrecision)):
            if getattr(self, name) not in get_args(kind):
                raise ValueError(f"{name} must be one of {get_args(kind)}, got {getattr(self, name)!r}")
        for name in ("threads", "ctx_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class EvalConfig:
    """What `evaluate_model` scores (`yue eval`'s options). Bad values raise ValueError naming the field.

    Attributes:
        corpus: 'stdlib', a .txt/.jsonl file or a folder of sources.
        batches: validation batches to score.
        batch_size: sequences per batch.
        seq_len: tokens per sequence.
        anchors: NAR blocks per sequence, as in training.
        val_fraction: share of files held out, split by hash of the file name as training splits them.
        seed: seed for the sequences' order and the NAR blocks' anchors.
    """

    corpus: str = "stdlib"
    batches: int = 8
    batch_size: int = 8
    seq_len: int = 256
    anchors: int = 8
    val_fraction: float = 0.02
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batches", "batch_size", "seq_len", "anchors"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in [0, 1), got {self.val_fraction}")
