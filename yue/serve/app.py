"""HTTP <-> DecodeConfig <-> Engine.stream: the FastAPI app behind `yue serve`.

Design decisions:
- A thin adapter: a request is parsed (schemas.py), turned into a `DecodeConfig` (whose validation
  checks the decode fields' ranges: its `ValueError` names the field, which becomes the error's
  `param`; `n`, `seed`, token ids and `logit_bias` keys are checked before it),
  checked against the limits (config.check_limits), admitted by the scheduler (or refused with 503),
  and run by its one thread, batched with every other running request (`yue.batcher`). Streamed and
  non-streamed answers both come from the same events, so a disconnect can cancel either.
- Errors have one shape everywhere, OpenAI's `{"error": {message, type, param, code}}`; FastAPI's 422
  is replaced by 400 (in the handlers and in the OpenAPI document); a 500 never shows a traceback.
- API key and body size are checked by a pure ASGI middleware (`Gate`) before anything parses the
  body; it counts bytes as they arrive, so a chunked body cannot slip past the limit.
- Every prompt's text passes `ServerState.screen` before it is tokenized: logged at debug, and with
  `--redact-pii` redacted in the log or in the prompt too (serve/pii.py). llama.cpp's `/infill` and
  completions' `suffix` build a fill-in-the-middle prompt from the model's FIM tokens (serve/infill.py).
- `create_app` takes an engine or a loader; with a loader the model loads in the background and
  `/health` answers 503 until it is ready (and again while draining after SIGTERM, see server.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from yue import __version__
from yue.chat import ChatTemplate
from yue.config import DecodeConfig
from yue.decode.prefix import MIB, PrefixCache
from yue.decode.types import GenerationStats
from yue.serve import schemas as s
from yue.serve.api_error import overloaded
from yue.serve.config import ServeConfig, check_choices, check_limits
from yue.serve.errors import ApiError, install_error_handlers, internal_error, openapi_without_422
from yue.serve.evaluate import install_eval
from yue.serve.gate import Gate
from yue.serve.infill import install_infill, suffixed_prompt
from yue.serve.metrics import Metrics
from yue.serve.pii import PiiGuard
from yue.serve.request_fields import check_unsupported, check_unsupported_chat, completion_prompts, logit_bias
from yue.serve.scheduler import Overloaded, Scheduler
from yue.serve.streaming import (
    ChatFormat,
    Choice,
    CompletionFormat,
    Format,
    GenerateFormat,
    Outcome,
    collect,
    generate_body,
    openai_finish_reason,
    scored_events,
    sse_events,
    total_usage,
)
from yue.settings import AR_SET_MODES

log = logging.getLogger("yue.serve")
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions", "/generate", "/infill")
DEMO_PAGE = Path(__file__).parent / "static" / "index.html"
_REQUEST_FIELD = {"max_new_tokens": "max_tokens"}  # DecodeConfig names that differ from the request's
_ROLES = {"developer": "system"}  # chat roles the template knows by another name
_SAMPLING_FIELDS = (  # request fields passed to DecodeConfig as they are (when given)
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "mode",
    "router_threshold",
)
_ERRORS = {code: {"model": s.ErrorResponse} for code in (400, 401, 404, 413, 500, 503)}
_STREAM = {200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}}


@dataclass
class Prepared:
    """A validated generation (one choice of a request), ready to run."""

    prompt: list[int]  # token ids (encoded once, here, not again on the scheduler thread)
    prompt_tokens: int
    decode: DecodeConfig
    prompt_index: int = 0  # which of the request's prompts


class ServerState:
    """Everything the routes share: settings, engine, scheduler, metrics, lifecycle flags."""

    def __init__(self, engine, config: ServeConfig, chat_template: str | None) -> None:
        self.config = config
        self.loader: Callable | None = engine if callable(engine) and not hasattr(engine, "stream") else None
        self.engine = None if self.loader else engine
        self.scheduler: Scheduler | None = None
        self.chat_template_source = chat_template
        self.template: ChatTemplate | None = None
        self.draining = False
        self.failed: str | None = None
        self.lifespans = 0
        self.created = int(time.time())
        self.pii: PiiGuard | None = None  # loaded with the model when --redact-pii is on
        mb = config.prefix_cache_mb
        self.prefix_cache = PrefixCache(mb * MIB) if mb else None
        self.metrics = Metrics(
            running=lambda: self.scheduler.running if self.scheduler else 0,
            waiting=lambda: self.scheduler.waiting if self.scheduler else 0,
            prefix_cache=self.prefix_cache,
        )

    async def start(self) -> None:
        """Load the engine (once) and start the workers. Lifespans are counted: a second one on the same
        app (test clients do this) shares the workers, and the last one to end stops them."""
        self.lifespans += 1
        if self.scheduler is not None:
            return
        try:
            if self.config.redact_pii != "off" and self.pii is None:
                self.pii = await asyncio.to_thread(PiiGuard)
            if self.engine is None:
                self.engine = await asyncio.to_thread(self.loader)
            # An override given by the caller; None: the model's own (`Engine.chat_prompt`).
            self.template = ChatTemplate(self.chat_template_source) if self.chat_template_source else None
            c = self.config
            self.scheduler = Scheduler(
                self.engine,
                c.max_batch_size,
                c.max_queue,
                c.max_batch_tokens,
                on_step=self.metrics.step,
                prefix_cache=self.prefix_cache,
            )
            self.metrics.model_name = self.engine.name
            log.info("model %s ready", self.engine.name)
        except Exception as e:
            log.exception("model failed to load")
            self.failed = f"{type(e).__name__}: {e}"

    def stop(self) -> None:
        self.lifespans -= 1
        if self.lifespans == 0 and self.scheduler is not None:
            self.scheduler.close()
            self.scheduler = None

    @property
    def status(self) -> str:
        if self.failed:
            return "failed"
        if self.draining:
            return "draining"
        return "ok" if self.scheduler is not None else "loading"

    def ready(self):
        """The engine, or a 503 while loading/draining."""
        status = self.status
        if status == "draining":
            raise draining_error(self, "the server is shutting down")
        if status != "ok":
            message = "the model failed to load" if status == "failed" else "the model is loading"
            raise ApiError(
                503, message, type="service_unavailable_error", code=status, headers=self.retry_after
            )
        return self.engine

    def screen(self, text: str, where: str) -> str:
        """A prompt's text on its way to the model: logged (at debug), redacted in the log with
        `--redact-pii logs` and in the prompt too with `prompts`; returns what the model gets."""
        redact_prompt = self.config.redact_pii == "prompts"
        if not (redact_prompt or log.isEnabledFor(logging.DEBUG)):
            return text
        clean = text
        if self.pii is not None:
            start = time.perf_counter()
            clean = self.pii.redact(text)
            self.metrics.pii.observe(time.perf_counter() - start)
        log.debug("prompt (%s): %r", where, clean)
        return clean if redact_prompt else text

    @property
    def retry_after(self) -> dict[str, str]:
        return {"Retry-After": str(self.config.retry_after_s)}


def draining_error(state: ServerState, message: str) -> ApiError:
    """The 503 of a server that is shutting down: for new requests, and for those the drain cut off."""
    return ApiError(
        503, message, type="service_unavailable_error", code="draining", headers=state.retry_after
    )


def create_app(engine, config: ServeConfig | None = None, *, chat_template: str | None = None) -> FastAPI:
    """The server's ASGI app.

    Args:
        engine: a loaded `Engine`, or a zero-argument callable returning one (loaded in the background).
        config: limits and settings; defaults when None.
        chat_template: Jinja source overriding the model's; None = the model's (`Engine.chat_prompt`).
    """
    state = ServerState(engine, config or ServeConfig(), chat_template)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        task = asyncio.create_task(state.start())
        yield
        await task
        await asyncio.to_thread(state.stop)

    app = FastAPI(title="yue", version=__version__, lifespan=lifespan, docs_url="/docs", redoc_url=None)
    app.state.yue = state

    def book(path: str, reason: str) -> None:  # counts failures of generation requests
        if path in GENERATION_PATHS:
            state.metrics.failure.labels(reason=reason).inc()

    app.add_middleware(Gate, config=state.config, book=book)
    install_error_handlers(app, book)
    _install_routes(app, state)
    openapi_without_422(app)
    return app


def _install_routes(app: FastAPI, state: ServerState) -> None:
    """Every route: the demo page and the server's own (health, metrics, models), then the generation
    endpoints (OpenAI's completions and chat completions, yue's /generate and /eval, llama.cpp's /infill)."""
    _install_info_routes(app, state)
    _install_completions(app, state)
    _install_chat_completions(app, state)
    _install_generate(app, state)
    install_infill(app, state, _prepare, _respond)
    install_eval(app, state)


def _install_info_routes(app: FastAPI, state: ServerState) -> None:
    """The demo page, /health (503 while loading or draining), /metrics and /v1/models."""
    demo = DEMO_PAGE.read_text(encoding="utf-8")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def index() -> HTMLResponse:
        return HTMLResponse(demo)

    @app.get("/health", response_model=s.Health, responses={503: {"model": s.Health}})
    async def health() -> JSONResponse:
        sch = state.scheduler
        body = {
            "status": state.status,
            "running": sch.running if sch else 0,
            "waiting": sch.waiting if sch else 0,
        }
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", response_model=s.ModelList, responses=_ERRORS)
    async def models() -> s.ModelList:
        engine = state.ready()
        return s.ModelList(data=[_card(state, engine)])

    @app.get("/v1/models/{model_id}", response_model=s.ModelCard, responses=_ERRORS)
    async def model(model_id: str) -> s.ModelCard:
        engine = _check_model(state, model_id)  # another id: 404 model_not_found
        return _card(state, engine)


def _install_completions(app: FastAPI, state: ServerState) -> None:
    """OpenAI's legacy /v1/completions: prompts as text or token ids, `n` choices each, echo and the
    prompt's log-probabilities (`max_tokens` 0 scores a prompt, as evaluation harnesses ask)."""

    @app.post("/v1/completions", response_model=s.CompletionResponse, responses=_ERRORS | _STREAM)
    async def completions(body: s.CompletionRequest, request: Request):
        engine = _check_model(state, body.model)
        check_unsupported(body)
        prompts = completion_prompts(body.prompt, engine)  # no tokenizing yet
        check_choices(state.config, len(prompts), body.n)
        if body.suffix:  # fill in the middle: each text prompt is the prefix (yue.serve.infill)
            texts = prompts
            prompts = await asyncio.to_thread(lambda: [suffixed_prompt(state, p, body.suffix) for p in texts])
        # max_tokens 0 with echo: score the prompt, generate nothing (the config is checked as for 1).
        only_score = body.max_tokens == 0
        checked = body.model_copy(update={"max_tokens": 1}) if only_score else body
        prepared = await asyncio.to_thread(  # tokenizing a long prompt must not hold the event loop
            lambda: [
                _prepare(
                    state,
                    checked,
                    p,
                    "prompt",
                    default_max_tokens=16,
                    temperature=1.0,
                    logprobs=body.logprobs,
                )
                for p in prompts
            ]
        )
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        tokenizer = engine.tokenizer if body.logprobs is not None else None
        fmt = CompletionFormat(
            f"cmpl-{uuid.uuid4().hex}", int(time.time()), engine.name, include_usage, tokenizer
        )
        if body.echo:  # each choice's prompt as text (token ids decoded as they stand)
            texts = [p if isinstance(p, str) else engine.tokenizer.decode(p) for p in prompts]
            fmt.echo = [texts[i] for i in range(len(prompts)) for _ in range(body.n)]
        if body.echo and body.logprobs is not None:  # the prompt's own log-probs lead each choice's
            scored = [await _score(state, p.prompt, body.logprobs) for p in prepared]
            fmt.prompt_logprobs = [scored[i] for i in range(len(prompts)) for _ in range(body.n)]

        def build(outcomes: list[Outcome]) -> s.CompletionResponse:
            choices = [
                s.CompletionChoice(
                    index=i,
                    text=fmt.text(i, o.text),
                    finish_reason=openai_finish_reason(o.finish_reason),
                    logprobs=fmt.logprobs(i, fmt.with_prompt(i, o.logprobs)),
                )
                for i, o in enumerate(outcomes)
            ]
            return s.CompletionResponse(choices=choices, **_envelope(fmt, outcomes))

        choices = _choices(prepared, body.n)
        if only_score:
            outcomes = [_scored_outcome(p) for p in choices]
            if body.stream:
                return EventStream(scored_events(fmt, outcomes), on_close=lambda: None)
            return build(outcomes)
        return await _respond(state, request, choices, fmt, body.stream, build)


def _install_chat_completions(app: FastAPI, state: ServerState) -> None:
    """OpenAI's /v1/chat/completions: the conversation through the model's chat template."""

    @app.post("/v1/chat/completions", response_model=s.ChatCompletionResponse, responses=_ERRORS | _STREAM)
    async def chat_completions(body: s.ChatCompletionRequest, request: Request):
        engine = _check_model(state, body.model)
        check_unsupported_chat(body)
        check_choices(state.config, 1, body.n)
        # OpenAI's "developer" messages are the system prompt under a newer name (chat templates know "system").
        messages = [{"role": _ROLES.get(m.role, m.role), "content": m.text()} for m in body.messages]
        logprobs = (body.top_logprobs or 0) if body.logprobs else None
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(
                400, "top_logprobs needs logprobs: true", param="top_logprobs", code="invalid_value"
            )

        def prepare() -> Prepared:  # off the event loop: templating and tokenizing a long chat
            try:
                prompt = engine.chat_prompt(messages, state.template)
            except Exception as e:  # a model's template may reject a conversation (raise_exception)
                raise ApiError(400, f"chat template: {e}", param="messages", code="invalid_value") from e
            return _prepare(
                state,
                body,
                prompt,
                "messages",
                default_max_tokens=state.config.default_max_tokens,
                temperature=1.0,
                logprobs=logprobs,
            )

        prepared = await asyncio.to_thread(prepare)
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        tokenizer = engine.tokenizer if logprobs is not None else None
        fmt = ChatFormat(
            f"chatcmpl-{uuid.uuid4().hex}",
            int(time.time()),
            engine.name,
            include_usage,
            tokenizer,
            pieces_tokenizer=engine.tokenizer if body.pieces else None,
        )

        def build(outcomes: list[Outcome]) -> s.ChatCompletionResponse:
            choices = [
                s.ChatChoice(
                    index=i,
                    message=s.AssistantMessage(content=o.text),
                    finish_reason=openai_finish_reason(o.finish_reason),
                    logprobs=fmt.logprobs(i, o.logprobs),
                )
                for i, o in enumerate(outcomes)
            ]
            return s.ChatCompletionResponse(choices=choices, **_envelope(fmt, outcomes))

        return await _respond(state, request, _choices([prepared], body.n), fmt, body.stream, build)


def _install_generate(app: FastAPI, state: ServerState) -> None:
    """yue's own /generate: raw text in, the answer and how it was made (which path wrote the tokens) out."""

    @app.post("/generate", response_model=s.GenerateResponse, responses=_ERRORS | _STREAM)
    async def generate(body: s.GenerateRequest, request: Request):
        engine = state.ready()
        prepared = await asyncio.to_thread(
            _prepare, state, body, body.prompt, "prompt", default_max_tokens=128, temperature=None
        )
        fmt = GenerateFormat(engine.tokenizer)
        return await _respond(state, request, [prepared], fmt, body.stream, lambda o: generate_body(o[0]))


def _envelope(fmt, outcomes: list[Outcome]) -> dict:
    """The fields every OpenAI completion response shares: id, created, model, usage."""
    return {
        "id": fmt.id,
        "created": fmt.created,
        "model": fmt.model,
        "usage": s.Usage(**total_usage(outcomes)),
    }


async def _score(state: ServerState, ids: list[int], top: int) -> list:
    """`Engine.score` on the scheduler thread (between decode steps: the engine has one user)."""
    try:
        future = state.scheduler.call(lambda: state.engine.score(ids, top))
    except Overloaded:
        raise draining_error(state, "the server is shutting down") from None
    return await asyncio.wrap_future(future)


def _scored_outcome(p: Prepared) -> Outcome:
    """A choice that generated nothing (max_tokens 0: the prompt scored, with echo)."""
    return Outcome("", "length", GenerationStats(), p.prompt_tokens, 0.0, 0.0, [], p.prompt_index)


def _choices(prepared: list[Prepared], n: int) -> list[Prepared]:
    """n choices per prompt (their count checked first: `check_choices`), prompt-major (choice i * n + j
    is prompt i's j-th); a seeded request's choice j samples with seed + j, so its choices differ and
    each is reproducible."""
    out = []
    for i, p in enumerate(prepared):
        for j in range(n):
            seed = p.decode.seed
            decode = p.decode if seed is None or j == 0 else replace(p.decode, seed=(seed + j) % 2**64)
            out.append(replace(p, decode=decode, prompt_index=i))
    return out


def _card(state: ServerState, engine) -> s.ModelCard:
    return s.ModelCard(
        id=engine.name,
        created=state.created,
        max_model_len=engine.context_length,
        instruct=engine.instruct,
        default_mode=engine.default_mode,
    )


def _check_model(state: ServerState, model: str | None):
    engine = state.ready()
    if model is not None and model != engine.name:
        raise ApiError(
            404,
            f"the model `{model}` does not exist; this server serves `{engine.name}`",
            param="model",
            code="model_not_found",
        )
    return engine


def _prepare(
    state: ServerState,
    body: s._Sampling,
    prompt: str | list[int],
    prompt_param: str,
    *,
    default_max_tokens: int,
    temperature: float | None,
    logprobs: int | None = None,
) -> Prepared:
    """Request fields -> a validated `DecodeConfig` within the server's limits (or a 400)."""
    engine = state.engine
    if isinstance(prompt, str):
        prompt = state.screen(prompt, prompt_param)
    try:
        ids = engine.encode(prompt) if isinstance(prompt, str) else prompt
    except ValueError as e:  # text the tokenizer cannot take (a lone UTF-16 surrogate, `YueTokenizer.encode`)
        raise ApiError(400, f"{prompt_param}: {e}", param=prompt_param, code="invalid_value") from e
    n = len(ids)
    max_tokens = body.max_tokens
    if max_tokens is None:  # a default never overflows the context; an explicit value may (and 400s)
        max_tokens = max(1, min(default_max_tokens, engine.context_length - n))
    stop = () if body.stop is None else (body.stop,) if isinstance(body.stop, str) else tuple(body.stop)
    fields = {"max_new_tokens": max_tokens, "stop": stop, "mode": engine.default_mode, "logprobs": logprobs}
    if temperature is not None:
        fields["temperature"] = temperature
    for name in _SAMPLING_FIELDS:
        if (value := getattr(body, name)) is not None:
            fields[name] = value
    if body.logit_bias:
        fields["logit_bias"] = logit_bias(body.logit_bias, engine.model_config.vocab_size)
    try:
        decode = DecodeConfig(**fields)
    except ValueError as e:  # the message starts with the field's name
        field = (str(e).split() or [""])[0].rstrip(":")
        param = _REQUEST_FIELD.get(field, field) if field in DecodeConfig.__dataclass_fields__ else None
        if field == "logprobs" and prompt_param == "messages":
            param = "top_logprobs"
        raise ApiError(
            400, str(e).replace("max_new_tokens", "max_tokens"), param=param, code="invalid_value"
        ) from e
    if decode.mode not in AR_SET_MODES and not engine.has_nar_set:
        raise ApiError(
            400,
            f"mode {decode.mode!r} needs a NAR set; {engine.name} has none: use mode 'ar' or 'verified'",
            param="mode",
            code="invalid_value",
        )
    check_limits(
        state.config,
        prompt_tokens=n,
        max_tokens=decode.max_new_tokens,
        context_length=engine.context_length,
        stop=stop,
        prompt_param=prompt_param,
    )
    return Prepared(ids, n, decode)


async def _respond(
    state: ServerState,
    request: Request,
    prepared: list[Prepared],
    fmt: Format,
    stream: bool,
    build,
    events=None,
):
    """Admit the request's generations (all or none), then stream them (through `events`, a filter of
    the event stream, when given) or collect them; a disconnect cancels them."""
    arrival = request.scope.get("yue.arrival") or time.perf_counter()
    scheduler = state.scheduler
    try:
        jobs = scheduler.submit_all([(p.prompt, p.decode) for p in prepared])
    except Overloaded:
        raise overloaded(state.retry_after) from None
    choices = [
        Choice(i, job, state.metrics.track(arrival), p.prompt_tokens, p.prompt_index)
        for i, (job, p) in enumerate(zip(jobs, prepared, strict=True))
    ]

    def cancel_all() -> None:
        for job in jobs:
            scheduler.cancel(job)

    if stream:
        stream_events = sse_events(choices, fmt)
        return EventStream(events(stream_events) if events else stream_events, on_close=cancel_all)
    try:
        task = asyncio.ensure_future(asyncio.gather(*(collect(c) for c in choices)))
        while not (await asyncio.wait({task}, timeout=0.25))[0]:
            if await request.is_disconnected():
                cancel_all()  # the engine drops them before its next step; the answer goes nowhere
        outcomes = task.result()
    except ApiError as e:  # the drain ran out (503 draining)
        for c in choices:
            c.tracker.fail(e.code)
        e.counted = True
        raise
    except ValueError as e:  # the engine refused the request itself
        for c in choices:
            c.tracker.fail("invalid_request")
        raise ApiError(400, str(e), code="invalid_value") from e
    except (
        Exception
    ) as e:  # logged with its traceback; the client gets the 500 shape, and the connection lives
        log.error("generation failed", exc_info=e)
        for c in choices:
            c.tracker.fail("engine_error")
        error = internal_error()
        error.counted = True
        raise error from e
    finally:
        cancel_all()
    return build(outcomes)


class EventStream(StreamingResponse):
    """`text/event-stream` whose generation is cancelled however the response ends (a disconnect too)."""

    media_type = "text/event-stream"

    def __init__(self, content, on_close: Callable[[], None]) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()
            await self.body_iterator.aclose()
