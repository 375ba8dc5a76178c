"""The engine layer: model + tokenizer + loop. The CLI, the server and the benchmark use only this.

- `core.py`: `Engine` (generate, stream, score, chat_prompt, batches) and the hook that makes a model's
  `generate()` decode through the loop.
- `rows.py`: `RowStream`, one request's text (detokenizing, stop strings) and counters over the steps.
- `loading.py`: `load`, `load_from`, `load_unprepared`: a name, folder or GGUF to an Engine.

Every name is importable from here (`from yue.engine import load, Engine, RowStream, ...`).
"""

from __future__ import annotations

from yue.engine.core import SCORE_ROWS, Engine, drafts, request_head_use
from yue.engine.loading import file_or_named_precision, load, load_from, load_unprepared, model_tokenizer
from yue.engine.rows import COLLAPSE_MIN_DECISIONS, COLLAPSE_RANGE, RowStream, TextTracker
from yue.registry import DEFAULT_MODEL

__all__ = [
    "COLLAPSE_MIN_DECISIONS",
    "COLLAPSE_RANGE",
    "DEFAULT_MODEL",
    "SCORE_ROWS",
    "Engine",
    "RowStream",
    "TextTracker",
    "drafts",
    "file_or_named_precision",
    "load",
    "load_from",
    "load_unprepared",
    "model_tokenizer",
    "request_head_use",
]
