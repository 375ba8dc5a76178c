"""Request and response bodies of the HTTP API (pydantic), shaped like OpenAI's where they overlap.

Design decisions:
- Schemas check types only (strict: no "5" for 5, no true for 1, no NaN). Ranges and choices are
  checked once, by `DecodeConfig`, whose `ValueError` names the field; the app maps it to a 400 with
  that `param`. The only bounds here are `seed`'s, which `DecodeConfig` leaves to `torch.Generator`,
  and a non-empty `messages`.
- Unknown fields are ignored (as OpenAI-compatible servers commonly do), so clients that send
  `user`, `service_tier`, ... keep working. OpenAI fields that would change the answer are either
  honoured (penalties, `logit_bias`, `echo`, with `logprobs` the prompt's log-probs too, `suffix`
  through the model's FIM tokens) or refused with a 400 when set (`best_of` > 1, chat's `tools` / `functions` and a non-text
  `response_format`). `n` choices per prompt, a list of prompts and token-id
  prompts (`/v1/completions`) each become one generation of the running batch; log-probs come from
  the AR path (`DecodeConfig.logprobs`: a token committed unverified reports null).
- `mode` and `router_threshold` extend every generation endpoint: the speed/fidelity dial.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from yue.settings import Mode

SEED_MAX = 2**63 - 1


class _Body(BaseModel):
    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    """Fields shared by every generation endpoint; defaults of None mean "the server's default"."""

    max_tokens: int | None = Field(None, description="tokens to generate at most")
    temperature: float | None = Field(None, description="in [0, 2]; 0 = greedy")
    top_p: float | None = Field(None, description="nucleus mass in (0, 1]")
    top_k: int | None = Field(None, description="keep the k most likely tokens; 0 = off")
    repetition_penalty: float | None = Field(None, description="in [0.01, 100]; 1 = off")
    presence_penalty: float | None = Field(None, description="OpenAI's, in [-2, 2]; 0 = off")
    frequency_penalty: float | None = Field(None, description="OpenAI's, in [-2, 2]; 0 = off")
    logit_bias: dict[str, float] | None = Field(
        None,
        description='token id (as a string) -> bias in [-100, 100] added to its logit, e.g. {"50256": -100}',
    )
    seed: int | None = Field(None, ge=0, le=SEED_MAX)
    stop: str | list[str] | None = None
    mode: Mode | None = Field(
        None,
        description="decode policy: ar | verified | hybrid | nar (experiments: anchor | anchor-verified)",
    )
    router_threshold: float | None = Field(
        None,
        description="the mode's dial in [0, 1]: hybrid's tolerance t (keep a draft when p_AR(draft) >= "
        "(1 - t) max p_AR; 0 = exact); verified's draft gate (draft slots with router p_ar <= this)",
    )
    stream: bool = False


class _OpenAI(_Sampling):
    model: str | None = Field(None, description="must name the served model when given")
    n: int = Field(1, description="choices per prompt, each generated as its own request (1..16)")
    stream_options: StreamOptions | None = None


class CompletionRequest(_OpenAI):
    prompt: str | list[str] | list[int] | list[list[int]] = Field(
        description="a text, a list of texts, a list of token ids, or a list of such lists"
    )
    logprobs: int | None = Field(
        None, description="the AR path's log-prob of each token plus this many top alternatives (0-20)"
    )
    echo: bool = Field(
        False,
        description="prepend the prompt's text to each choice's; with logprobs, the prompt tokens' log-probs "
        "too (the first null); with max_tokens 0, only that: the prompt scored",
    )
    suffix: str | None = Field(
        None,
        description="text after the insertion point: the prompt is filled in the middle through the model's "
        "FIM tokens (a model without them: 400); text prompts only, not with echo",
    )
    best_of: int | None = Field(None, description="not supported: only null or 1")


class TextPart(_Body):
    type: Literal["text"]
    text: str


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant"]  # developer: OpenAI's newer name for system
    content: str | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_OpenAI):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, description="OpenAI's newer name for max_tokens")
    logprobs: bool = Field(False, description="the AR path's log-prob of each token")
    top_logprobs: int | None = Field(None, description="top alternatives per token (0-20), with logprobs")
    tools: list[dict] | None = Field(None, description="not supported (no tool calls): only null or empty")
    functions: list[dict] | None = Field(
        None, description="not supported (no tool calls): only null or empty"
    )
    response_format: dict | None = Field(
        None, description='not supported but {"type": "text"} (no JSON mode)'
    )
    pieces: bool = Field(
        False,
        description='yue: each streamed delta also carries "pieces", its text split by the path that wrote '
        'it: [[text, "ar" | "nar"], ...]',
    )

    @model_validator(mode="after")
    def _max_completion_tokens(self) -> ChatCompletionRequest:
        if self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        return self


class GenerateRequest(_Sampling):
    prompt: str


class InfillExtra(_Body):
    filename: str = ""
    text: str


class InfillRequest(_Sampling):
    """llama.cpp's `/infill` body. Its other tuning fields (`cache_prompt`, `samplers`, `n_indent`,
    `t_max_predict_ms`, ...) are ignored, as unknown fields are everywhere."""

    input_prefix: str = Field("", description="the text before the cursor")
    input_suffix: str = Field("", description="the text after the cursor")
    input_extra: list[InfillExtra] = Field(
        default_factory=list, description="other files' chunks, as context before the prefix"
    )
    prompt: str = Field("", description="text the middle starts with (after the FIM middle token)")
    n_predict: int | None = Field(None, description="llama.cpp's max_tokens; -1 = the server's default")

    @model_validator(mode="after")
    def _n_predict(self) -> InfillRequest:
        if self.max_tokens is None and self.n_predict is not None and self.n_predict != -1:
            self.max_tokens = self.n_predict
        return self


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionLogprobs(BaseModel):
    """OpenAI's legacy shape. A token committed unverified (`nar`'s slots) has a null log-prob."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(BaseModel):
    """One token's log-prob; null for a token committed unverified (`nar`'s slots)."""

    token: str
    logprob: float | None
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob]


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: str | None
    logprobs: ChatLogprobs | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "yue"
    max_model_len: int
    # yue's: whether the model answers through its chat template (`Engine.instruct`), so that
    # `yue generate --server` sends a plain prompt where `yue generate` would template it.
    instruct: bool = False
    default_mode: str | None = None  # yue's: the mode a request that names none gets


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class GenerateResponse(BaseModel):
    """`/generate`'s answer: the text plus how it was made (who wrote the tokens, how drafting went)."""

    text: str
    tokens: int = Field(description="generated tokens")
    prompt_tokens: int
    finish_reason: str
    latency_ms: float = Field(description="arrival to last token, queueing included")
    ttft_ms: float = Field(description="arrival to first token, queueing included")
    ar_tokens: int
    nar_tokens: int
    drafted: int
    accepted: int
    forwards: int


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "loading", "draining", "failed"]
    running: int
    waiting: int
