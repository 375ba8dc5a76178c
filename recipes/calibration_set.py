"""The shipped standard-library calibration set, `yue/assets/chat_calibration.jsonl`: 40 prompts of the
calibration split of `yue.train.prompts` (never trained on), with the pool sizes of each split.

    python -m recipes.calibration_set
"""

from __future__ import annotations

import json
from pathlib import Path

from yue.train.prompts import chat_prompt_records, count_chat_prompts, prompt_pool
from yue.train.stdlib_docs import SPLITS, split_items

CALIBRATION_OUT = Path(__file__).resolve().parent.parent / "yue" / "assets" / "chat_calibration.jsonl"


def write_calibration_set(out: str | Path = CALIBRATION_OUT, n: int = 40, seed: int = 0) -> Path:
    """Write `n` calibration prompts as JSONL `{"messages": [...], "source": ...}`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for p in chat_prompt_records(n, seed, "calibration"):
            record = {
                "messages": p.messages,
                "source": f"stdlib-calibration:{p.task}:{p.source.removeprefix('stdlib:')}",
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return out


if __name__ == "__main__":
    path = write_calibration_set()
    for split in SPLITS:
        sizes = {t: len(p) for t, p in prompt_pool(split).items()}
        print(
            f"{split}: {count_chat_prompts(split)} distinct prompts, {len(split_items(split))} items; {sizes}"
        )
    print(f"wrote {path}")
