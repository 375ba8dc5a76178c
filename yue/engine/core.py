"""Engine: model + tokenizer + device, ready to generate. The CLI, the server and the benchmark use only
this (through `yue.engine`).

- `generate()` is `stream()` consumed to the end, through the same row stream (`rows.RowStream`), so
  streamed text equals generated text by construction (and by test).
- User mistakes (bad DecodeConfig values, a prompt that does not fit the context) raise ValueError
  naming the field before any model work starts.
- How text becomes prompt ids is the model's (`YueTokenizer.prompt_prefix`): yue-code-mini was trained
  with documents after <|eos|>; a Llama or GGUF model starts with BOS only if its tokenizer adds one.
  Chat messages go through the model's template in one place, `chat_prompt`, for the CLI, the server
  and the bench alike.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import torch

from yue.chat import DEFAULT_CHAT_TEMPLATE, ChatTemplate
from yue.config import DecodeConfig, YueConfig
from yue.decode import hf_generate
from yue.decode.corpus import CorpusNgrams
from yue.decode.costs import HeadUse, StepCosts, head_use, measured_costs
from yue.decode.loop import DecodeBatch, decode
from yue.decode.modes import get_policy
from yue.decode.prefix import PrefixCache
from yue.decode.types import GenerationResult, Step, StreamEvent, TokenLogprob
from yue.engine.rows import RowStream
from yue.infill import infill_ids
from yue.model.mot import YueForCausalLM
from yue.model.prepared import PreparedModel, as_decoded
from yue.settings import AR_SET_MODES
from yue.tokenizer import YueTokenizer

# Rows of a scored prompt whose (n, V) log-probs are made at once (`Engine.score`).
SCORE_ROWS = 256


class Engine:
    """A loaded model ready to generate.

    Attributes:
        model: the model prepared for decoding (`PreparedModel`: `generate()`, `config`, `device`, the
            plain AR forward, ...), in eval mode on `device`; a trained YueForCausalLM decodes as trained.
        tokenizer: its YueTokenizer.
        name: model id reported by the CLI and the server (its name, or the folder's / file's).
        chat_template: the Jinja source `chat_prompt` renders: the tokenizer's own (an instruct
            model's), else one stored in the model folder, else the built-in default.
        corpus: the model's n-gram table of its own answers, for `verified`'s corpus drafts
            (`decode/corpus.py`; the model folder's `ngrams.safetensors`), or None.
        source: where the model was loaded from (a folder or a .gguf, `yue.load`'s), for what reloads it
            as stored (`yue eval` on a server's model, `serve/evaluate.py`); None for a model built in
            memory or loaded with an adapter merged.
    """

    def __init__(
        self,
        model: PreparedModel | YueForCausalLM,
        tokenizer: YueTokenizer,
        name: str = "yue",
        chat_template: str | None = None,
        corpus: CorpusNgrams | None = None,
        source: Path | None = None,
    ) -> None:
        self.model = as_decoded(model).eval()
        self.source = source
        self.tokenizer = tokenizer
        self.name = name
        self.chat_template = tokenizer.chat_template or chat_template or DEFAULT_CHAT_TEMPLATE
        self._template = ChatTemplate(self.chat_template)
        self.corpus = corpus
        # Step costs for the router's draft lengths: set by hand (then every request weighs these), or
        # measured on first need per head use (`_costs`).
        self.costs: StepCosts | None = None
        self.costs_by_use: dict[HeadUse, StepCosts] = {}  # measured, per what the rows serve
        _holders[self.model] = weakref.ref(self)  # `model.generate()` drafts with its corpus and costs

    @property
    def instruct(self) -> bool:
        """Whether the model is an instruct model: its tokenizer brings a chat template (a GGUF's, an HF
        tokenizer_config's). `yue generate` then templates a plain prompt; a completion model (the
        template, if any, only adapts it to the chat endpoint) continues the prompt as written."""
        return self.tokenizer.chat_template is not None

    @property
    def has_nar_set(self) -> bool:
        """False for a plain Llama or GGUF loaded as an AR set (`nar_layers=0`): only mode "ar" runs."""
        return self.model.config.has_nar

    @property
    def default_mode(self) -> str:
        """The mode a caller who names none gets (`YueConfig.decode_mode`)."""
        return self.model.config.decode_mode

    def chat_prompt(self, messages: list[dict[str, str]], template: ChatTemplate | None = None) -> str:
        """The prompt text for a conversation: the chat template rendered with the generation prompt,
        ending where the assistant's reply begins. Encoded by `encode`, its ids equal transformers'
        `apply_chat_template(messages, add_generation_prompt=True, tokenize=True)` for the same tokenizer.

        Args:
            messages: [{"role": ..., "content": ...}, ...].
            template: another template to render instead (`serve.create_app`'s chat_template override).
        Raises:
            TypeError: `messages` is not a list of {"role": str, "content": str} dicts.
        """
        ok = isinstance(messages, list | tuple) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
        if not ok:
            raise TypeError(
                'messages: a list of {"role": str, "content": str} dicts, e.g. [{"role": "user", "content": "hi"}]'
            )
        tok = self.tokenizer.tokenizer
        return (template or self._template).render(
            messages,
            bos_token=tok.id_to_token(self.tokenizer.bos_id),
            eos_token=tok.id_to_token(self.tokenizer.eos_id),
        )

    @property
    def model_config(self) -> YueConfig:
        return self.model.config

    @property
    def context_length(self) -> int:
        """Maximum prompt + generated tokens."""
        return self.model.config.max_position_embeddings

    @property
    def device(self) -> torch.device:
        return self.model.device

    def count_tokens(self, text: str) -> int:
        return len(self.encode(text))

    @torch.inference_mode()
    def score(self, ids: list[int], top: int = 0) -> list[TokenLogprob]:
        """The AR path's log-probability of each token of `ids` given the tokens before it, with its
        `top` most likely alternatives: what `echo` with `logprobs` reports for a prompt (OpenAI's legacy
        scoring, vLLM's prompt log-probs). The first token has none (logprob None). One plain AR forward
        (`YueForCausalLM.forward`, the one `yue eval`'s loss takes), the head and its log-softmax run
        SCORE_ROWS rows at a time so a long prompt's (T, V) float32 log-probs never sit in memory whole.
        """
        model = self.model
        x = torch.tensor([ids], device=model.device)  # (1, T)
        T = x.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()[None, None]
        hidden = model.hidden_states(x, torch.arange(T, device=x.device), T, causal)[0]  # (T, D)
        out = [TokenLogprob(ids[0], None)]
        for start in range(0, T - 1, SCORE_ROWS):
            logp = (
                model.ar_logits(hidden[None, start : min(start + SCORE_ROWS, T - 1)])[0]
                .float()
                .log_softmax(-1)
            )  # (n, V)
            targets = ids[start + 1 : start + 1 + logp.shape[0]]
            chosen = logp[torch.arange(len(targets)), torch.tensor(targets, device=x.device)].tolist()
            alts = torch.topk(logp, top) if top else None
            for j, (token, lp) in enumerate(zip(targets, chosen, strict=True)):
                best = (
                    {}
                    if alts is None
                    else dict(zip(alts.indices[j].tolist(), alts.values[j].tolist(), strict=True))
                )
                out.append(TokenLogprob(token, lp, best))
        return out

    def encode(self, text: str) -> list[int]:
        """Prompt ids: the tokenizer's prompt prefix (yue-code-mini: an <|eos|> separator, marking a
        document start as in training; a Llama: BOS if its tokenizer adds one), then the text's tokens.
        A text that already starts with the prefix (a chat template that writes BOS) gets no second
        one, and an empty prompt gets one token to condition on (BOS, if there is no prefix)."""
        return self.tokenizer.encode_prompt(text)

    def infill(
        self, prefix: str, suffix: str, extra: Sequence[tuple[str, str]] = (), start: str = ""
    ) -> list[int]:
        """A fill-in-the-middle prompt's ids from the vocabulary's FIM tokens (`yue.infill.infill_ids`);
        pass them to `generate`/`stream` as the prompt.

        Raises:
            NoFimTokens (a ValueError): the model's vocabulary has no FIM tokens.
        """
        return infill_ids(self.tokenizer, prefix, suffix, extra=extra, start=start, model_name=self.name)

    def _config(self, config: DecodeConfig | None, overrides: dict) -> DecodeConfig:
        # No mode named: the model's own default (`YueConfig.decode_mode`), filled by `resolved`.
        cfg = config or DecodeConfig()
        if overrides:
            unknown = set(overrides) - set(DecodeConfig.__dataclass_fields__)
            if unknown:
                raise ValueError(f"unknown decode option(s): {', '.join(sorted(unknown))}")
            cfg = replace(cfg, **overrides)
        if cfg.mode is not None and cfg.mode not in AR_SET_MODES and not self.has_nar_set:
            raise ValueError(
                f"mode {cfg.mode!r} needs a NAR set, and {self.name} has none (an AR set only): use mode 'ar' "
                "or 'verified' (which verifies drafts copied from the context)"
            )
        return cfg.resolved(self.model.config)

    def _check_fits(self, n_prompt: int, cfg: DecodeConfig) -> None:
        if n_prompt + cfg.max_new_tokens > self.context_length:
            raise ValueError(
                f"prompt: {n_prompt} tokens + max_new_tokens {cfg.max_new_tokens} exceed the model's "
                f"context of {self.context_length} tokens"
            )

    def stream(
        self,
        prompt: str | list[int],
        config: DecodeConfig | None = None,
        cancel: Callable[[], bool] | None = None,
        **overrides,
    ) -> Iterator[StreamEvent]:
        """Generate for one prompt, yielding text deltas as steps commit tokens.

        Args:
            prompt: the text to continue.
            config: decode settings (default: `DecodeConfig` in the model's `default_mode`); keyword
                overrides are applied on top.
            cancel: called before every decode step; returning True ends the stream ("cancelled").
        Yields:
            StreamEvent per step; the last one carries finish_reason and stats.
        """
        ids, cfg = self.request(prompt, config, overrides)
        yield from self._stream_ids(ids, cfg, cancel)

    def _stream_ids(
        self, ids: list[int], cfg: DecodeConfig, cancel: Callable[[], bool] | None
    ) -> Iterator[StreamEvent]:
        row = self.row_stream(cfg)
        for em in decode(self.model, [ids], cfg, cancel, self._costs(cfg), self.corpus):
            event = row.fold(em, 0)
            yield event
            if event.finish_reason is not None:
                return

    def decode_batch(
        self,
        cfg: DecodeConfig,
        max_prefill_tokens: int | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> DecodeBatch:
        """An empty running batch for requests sharing cfg's `batch_key` (cfg already resolved), resuming
        prefills from `prefix_cache` (if any): the seam `batcher.Batcher` decodes through."""
        return DecodeBatch(self.model, cfg, self._costs(cfg), max_prefill_tokens, self.corpus, prefix_cache)

    def request(
        self, prompt: str | list[int], config: DecodeConfig | None, overrides: dict
    ) -> tuple[list[int], DecodeConfig]:
        """A request's prompt ids (text encoded) and resolved config, checked to fit the context.

        Raises:
            ValueError: a bad setting, or a prompt plus max_new_tokens longer than the context.
        """
        cfg = self._config(config, overrides)
        ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_fits(len(ids), cfg)
        return ids, cfg

    def row_stream(self, cfg: DecodeConfig) -> RowStream:
        """A request's text and counters over the steps of its row."""
        return RowStream(self.tokenizer, cfg, cfg.draft_gate(self.model.config))

    def _costs(self, cfg: DecodeConfig) -> StepCosts | None:
        """The step costs draft lengths weigh: `costs` if set, else measured for this model on this
        machine, for what the request's rows serve (`request_head_use`), the first time a drafting
        request needs them (seconds, then cached on disk)."""
        if not drafts(cfg):
            return None
        if self.costs is not None:
            return self.costs
        use = request_head_use(self.model, cfg)
        if use not in self.costs_by_use:
            self.costs_by_use[use] = measured_costs(self.model, use=use)
        return self.costs_by_use[use]

    def generate(
        self, prompt: str | list[int] | list[str], config: DecodeConfig | None = None, **overrides
    ) -> GenerationResult | list[GenerationResult]:
        """Generate for one prompt, a text or its token ids (-> GenerationResult), or a batch of texts
        (-> list, decoded together with per-row acceptance; row b seeded with seed + b)."""
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            return self._generate_batch(prompt, self._config(config, overrides))
        ids, cfg = self.request(prompt, config, overrides)
        parts, tokens, trace = [], [], []
        logprobs = None if cfg.logprobs is None else []
        for ev in self._stream_ids(ids, cfg, None):
            parts.append(ev.delta)
            tokens.extend(ev.token_ids)
            trace.extend(ev.trace)
            if logprobs is not None:
                logprobs.extend(ev.logprobs or [])
            last = ev
        text = "".join(parts)
        return GenerationResult(text, tokens, last.finish_reason, len(ids), last.stats, trace, logprobs)

    def _generate_batch(self, prompts: list[str], cfg: DecodeConfig) -> list[GenerationResult]:
        """A batch decoded together, each row accepting its own drafts (no lockstep minimum); row b is
        seeded with seed + b. Each result has its own stats, counting the forwards its row ran in."""
        if not prompts:
            raise ValueError("prompt: the batch is empty")
        if not all(isinstance(p, str) for p in prompts):
            raise TypeError(
                "prompt: a string, or a list of strings (a batch), got a list holding other values"
            )
        ids = [self.encode(p) for p in prompts]
        for x in ids:
            self._check_fits(len(x), cfg)
        rows = [self.row_stream(cfg) for _ in ids]
        parts: list[list[str]] = [[] for _ in ids]
        tokens: list[list[int]] = [[] for _ in ids]
        logprobs = None if cfg.logprobs is None else [[] for _ in ids]
        trace: list[Step] = []
        done = lambda: all(r.finish_reason is not None for r in rows)  # noqa: E731
        for em in decode(self.model, ids, cfg, done, self._costs(cfg), self.corpus):
            if em.step is not None:
                trace.append(em.step)
            for b, row in enumerate(rows):
                if row.finish_reason is None:
                    event = row.fold(em, b)
                    parts[b].append(event.delta)
                    tokens[b].extend(event.token_ids)
                    if logprobs is not None:
                        logprobs[b].extend(event.logprobs or [])
        return [
            GenerationResult(
                "".join(parts[b]),
                tokens[b],
                r.finish_reason or "stop",
                len(ids[b]),
                r.stats,
                trace,
                None if logprobs is None else logprobs[b],
            )
            for b, r in enumerate(rows)
        ]


def drafts(cfg: DecodeConfig) -> bool:
    """Whether a (resolved) config drafts, and so weighs step costs."""
    return cfg.mode in ("verified", "hybrid") and (cfg.block_size or 1) >= 2


def request_head_use(model, cfg: DecodeConfig) -> HeadUse:
    """What a request's AR rows serve (`costs.head_use`), as its decode loop decides it (`DecodeBatch`:
    the screen where the policy needs only the argmax and the request asks no log-probs)."""
    argmax_only = get_policy(cfg.mode).argmax_only(cfg, as_decoded(model).config) and cfg.logprobs is None
    return head_use(cfg, argmax_only)


# The Engine holding each model, for `generate()`; weak both ways, so neither outlives its users here.
_holders: weakref.WeakKeyDictionary[PreparedModel, weakref.ref[Engine]] = weakref.WeakKeyDictionary()


def _model_generate(model: PreparedModel | YueForCausalLM, inputs, generation_config, streamer, mode, kwargs):
    """`generate()` of a PreparedModel or a YueForCausalLM (decoded as trained) through the decode loop
    (`decode/hf_generate.py`), with the corpus and step costs of the Engine holding the model, if any
    (`yue.load`'s), else costs measured for it."""
    model = as_decoded(model)
    holder = _holders.get(model)
    engine = holder() if holder is not None else None
    if engine is not None:
        costs, corpus = engine._costs, engine.corpus
    else:
        costs = lambda cfg: measured_costs(model, use=request_head_use(model, cfg)) if drafts(cfg) else None  # noqa: E731
        corpus = None
    return hf_generate.generate(model, inputs, generation_config, streamer, mode, kwargs, costs, corpus)


YueForCausalLM.decode_generate = _model_generate
