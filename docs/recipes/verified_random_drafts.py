"""`verified` == `ar` under random draft lengths, on yue-smol's chat prompts (a development script, not
part of the package; it found the bfloat16 bug of the measurement log's "A bfloat16 exactness miss").

    python docs/recipes/verified_random_drafts.py [dtype] [prompts] [tokens] [passes]

The router's draft length follows measured costs and the text, so a bench run tries few of the step
shapes `verified` can take; here every draft length (`policies.best_draft`) and probe length
(`policies.probe_length`) is drawn at random (seeded), so verifying steps land across cache
boundaries and row counts a bench would rarely reach. For the first `prompts` (default 16) prompts of
the held-out and the calibration chat sets, each `verified` answer of `tokens` (default 128) tokens,
`passes` (default 2) times, is compared with the same prompt's `ar` answer; prints every difference
(prompt, first differing token) and the count. `dtype`: float32 (default), bfloat16 or int4.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import torch

import yue
from yue.bench.prompts import load_prompts
from yue.decode import policies


def main(dtype: str = "float32", n_prompts: int = 16, tokens: int = 128, passes: int = 2) -> None:
    torch.set_num_threads(1)
    engine = yue.load("yue-smol", dtype=dtype)
    assets = Path(yue.__file__).parent / "assets"
    prompts = [
        p.text
        for split in ("chat_test", "chat_calibration")
        for p in load_prompts(assets / f"{split}.jsonl", engine, n_prompts)
    ]
    rng = random.Random(0)
    policies.best_draft = lambda st, survival, draft_pass=True: (rng.randint(0, len(survival)), 1.0)
    policies.probe_length = lambda st, n: rng.randint(1, n)

    def answer(mode: str, text: str) -> list[int]:
        return engine.generate(text, mode=mode, max_new_tokens=tokens).token_ids

    ar = [answer("ar", p) for p in prompts]
    differing = 0
    for k in range(passes):
        for i, p in enumerate(prompts):
            got = answer("verified", p)
            if got != ar[i]:
                differing += 1
                at = next(
                    (j for j, (a, b) in enumerate(zip(got, ar[i], strict=False)) if a != b),
                    min(len(got), len(ar[i])),
                )
                print(f"pass {k} prompt {i}: differs from ar at token {at}", flush=True)
    print(f"{dtype}: {differing} of {passes * len(prompts)} verified answers differ from ar")


if __name__ == "__main__":
    args = sys.argv[1:]
    main(*(args[:1]), *(int(a) for a in args[1:4]))
