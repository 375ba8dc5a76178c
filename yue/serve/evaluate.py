"""`POST /eval`: `yue eval` on the served model, for `yue eval --server URL` (`cli/evaluate.py`).

Design decisions:
- The numbers are `yue.train.evaluate.evaluate_model`'s on the files the server loaded its model from
  (`Engine.source`), the function the in-process command runs, so the JSON is the same. The served
  (prepared) model cannot be scored itself: preparing consumed its trainable form, and the loss is the
  model's as stored.
- It runs off the event loop, one evaluation at a time (each is a whole corpus pass; decoding goes on
  beside it); a bad field or a missing corpus is a 400 naming the field.
- A model loaded with an adapter, or built in memory, has no files to reload: a 400 that says to run
  `yue eval` in-process.
"""

from __future__ import annotations

import asyncio
from dataclasses import fields

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

from yue.serve import schemas as s
from yue.serve.errors import ApiError
from yue.settings import EvalConfig

_DEFAULTS = EvalConfig()


class EvalRequest(BaseModel):
    """`EvalConfig`'s fields, with its defaults (`yue eval --help` says what each is)."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")
    corpus: str = _DEFAULTS.corpus
    batches: int = _DEFAULTS.batches
    batch_size: int = _DEFAULTS.batch_size
    seq_len: int = _DEFAULTS.seq_len
    anchors: int = _DEFAULTS.anchors
    val_fraction: float = _DEFAULTS.val_fraction
    seed: int = _DEFAULTS.seed


def eval_config(body: EvalRequest) -> EvalConfig:
    """The request as an `EvalConfig`; its ValueError (naming the field) a 400."""
    try:
        return EvalConfig(**{f.name: getattr(body, f.name) for f in fields(EvalConfig)})
    except ValueError as e:
        raise ApiError(400, str(e), param=str(e).split(" ", 1)[0], code="invalid_value") from None


def install_eval(app: FastAPI, state) -> None:
    """yue's /eval (`state`: app.py's ServerState)."""
    one_at_a_time = asyncio.Lock()

    @app.post("/eval", responses={code: {"model": s.ErrorResponse} for code in (400, 401, 503)})
    async def evaluate(body: EvalRequest) -> dict:
        engine = state.ready()
        cfg = eval_config(body)
        source = getattr(engine, "source", None)
        if source is None:
            raise ApiError(
                400,
                f"the served model {engine.name} has no files to score as stored (loaded with an adapter, "
                "or built in memory): run `yue eval` in-process",
                code="not_reloadable",
            )
        from yue.train.evaluate import evaluate_model  # torch's training side, loaded on first use

        async with one_at_a_time:
            try:
                return await asyncio.to_thread(evaluate_model, source, cfg)
            except (ValueError, FileNotFoundError) as e:  # the corpus (missing, empty), or seq_len too long
                param = "seq_len" if str(e).startswith("seq_len") else "corpus"
                raise ApiError(400, str(e), param=param, code="invalid_value") from None
