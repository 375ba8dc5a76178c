"""Greedy answers of yue-smol to fresh everyday requests, for its n-gram table (a development script, not
part of the package).

    python recipes/corpus_answers.py OUT_DIR FIRST_CHUNK CHUNKS DTYPE [SEEN.txt ...]

Each chunk: 96 requests from the everyday templates (`train.everyday`, seed 20,000 + chunk; a sixth of
them in a long form, 384 tokens), none whose content hash is in a SEEN file, an earlier chunk's, or a
shipped chat set's (held-out and calibration prompts are never answered), answered greedily (160
tokens) in DTYPE (int4 or float32) in lockstep batches of 16 (`topnar.greedy_answers`), and a follow-up
turn on a quarter of the answers, batched the same way. Written as OUT_DIR/NNNNN.json.gz ({"ids",
"prompt_lens"}, what `yue build-ngrams --sequences` reads) with the requests' hashes beside it; a chunk
that exists is skipped, so a rerun resumes. Batched, a chunk of ~115 answers takes ~65 s in int4 and
~105 s in float32 on one core of the 2-core EPYC (~290 and ~180 answer tokens a second; answering one
request at a time in float32, as this script did in session 8, gave ~104). As it ran on 2026-12-05 (session 9), then the table was
extended (docs/results-log.md, "Session 9"). Two runs side by side take different chunk numbers, so
different seeds (a request both draw counts once in the table: `build-ngrams` keeps one answer a prompt).
    python recipes/corpus_answers.py answers-int4 0 200 int4
    python recipes/corpus_answers.py answers-float32 1000 200 float32
    yue build-ngrams yue/assets/yue-smol --extend --max-order 6 --min-share 0.5 \
        $(for f in answers-int4/*.json.gz answers-float32/*.json.gz; do echo --sequences $f; done)
"""

import gzip
import json
import random
import sys
import time
from pathlib import Path

import torch

import yue
from yue.train.everyday import everyday_prompts
from yue.train.rounds import FOLLOW_UPS, LONG_FORMS
from yue.train.selfinstruct import content_hash, shipped_set_hashes
from yue.train.topnar import greedy_answers

PER_CHUNK, BATCH = 96, 16

out_dir, first, chunks, dtype = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
out_dir.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(1)
seen = shipped_set_hashes([str(p) for p in (Path(yue.__file__).parent / "assets").glob("chat_*.jsonl")])
for path in [*map(Path, sys.argv[5:]), *sorted(out_dir.glob("*.hashes"))]:
    seen |= set(path.read_text().split())
engine = yue.load("yue-smol", dtype=None if dtype == "float32" else dtype)


def answer(chats: list[list[dict]], max_new: int):
    prompts = [engine.encode(engine.chat_prompt(m)) for m in chats]
    got = greedy_answers(engine.model, prompts, max_new_tokens=max_new, batch_size=BATCH, progress=False)
    return [[int(t) for t in ids] for ids in got.ids], [int(p) for p in got.prompt_lens]


for c in range(first, first + chunks):
    path = out_dir / f"{c:05d}.json.gz"
    if path.exists():
        continue
    t0, rng = time.time(), random.Random(c)
    requests = [
        m[0]["content"] for m in everyday_prompts(PER_CHUNK, seed=20_000 + c, exclude=seen, strict=False)
    ]
    n_long = len(requests) // 6
    tail = requests[len(requests) - n_long :]
    requests[len(requests) - n_long :] = [rng.choice(LONG_FORMS).format(text=t) for t in tail]
    hashes = [content_hash(t) for t in requests]
    seen |= set(hashes)
    chats = [[{"role": "user", "content": t}] for t in requests]
    ids, lens = [], []
    for group, max_new in ((chats[: len(chats) - n_long], 160), (chats[len(chats) - n_long :], 384)):
        got, got_lens = answer(group, max_new)
        ids += got
        lens += got_lens
        follow = []  # a follow-up turn on a quarter of these greedy answers
        for m, a, p in zip(group, got, got_lens, strict=True):
            if rng.random() < 0.25:
                said = {"role": "assistant", "content": engine.tokenizer.decode(a[p:]).strip()}
                follow.append(m + [said, {"role": "user", "content": rng.choice(FOLLOW_UPS)}])
        if follow:
            got, got_lens = answer(follow, 160)
            ids += got
            lens += got_lens
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(gzip.compress(json.dumps({"ids": ids, "prompt_lens": lens}).encode()))
    tmp.replace(path)
    path.with_name(f"{c:05d}.hashes").write_text("\n".join(hashes) + "\n")
    tokens = sum(len(x) - p for x, p in zip(ids, lens, strict=True))
    print(f"chunk {c}: {len(ids)} answers, {tokens} tokens, {time.time() - t0:.0f} s", flush=True)
