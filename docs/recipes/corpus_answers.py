"""Greedy answers of yue-smol to fresh everyday requests, for its n-gram table (a development script, not
part of the package).

    python docs/recipes/corpus_answers.py OUT_DIR FIRST_CHUNK CHUNKS [SEEN.txt ...]

Each chunk: 32 requests from the everyday templates (`train.everyday`; a sixth of them in a long form,
384 tokens), none whose content hash is in a SEEN file, an earlier chunk's, or a shipped chat set's
(held-out and calibration prompts are never answered), answered greedily in float32 (160 tokens), and a
follow-up turn on a quarter of the answers. Written as OUT_DIR/NNNNN.json.gz ({"ids", "prompt_lens"},
what `yue build-ngrams --sequences` reads) with the requests' hashes beside it; a chunk that exists is
skipped, so a rerun resumes. As it ran on 2026-12-05 (session 8; 76 chunks, 3,053 answers, 374k answer
tokens in ~60 min on one core), then the table was extended (docs/results-log.md, "Session 8"):
    python docs/recipes/corpus_answers.py answers 0 200 campaign/run/seen.txt
    yue build-ngrams yue/assets/yue-smol --extend --min-count 1 --min-share 0.5 \\
        --sequences <each campaign chunk, GPU round answer file and answers/*.json.gz>
"""

import gzip
import json
import random
import sys
import time
from pathlib import Path

import torch

import yue
from yue.train.campaign import FOLLOW_UPS, LONG_FORMS
from yue.train.everyday import everyday_prompts
from yue.train.selfinstruct import content_hash, shipped_set_hashes

PER_CHUNK = 32

out_dir, first, chunks = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
out_dir.mkdir(parents=True, exist_ok=True)
torch.set_num_threads(1)
seen = shipped_set_hashes([str(p) for p in (Path(yue.__file__).parent / "assets").glob("chat_*.jsonl")])
for path in [*map(Path, sys.argv[4:]), *sorted(out_dir.glob("*.hashes"))]:
    seen |= set(path.read_text().split())
engine = yue.load("yue-smol", dtype="float32")
for c in range(first, first + chunks):
    path = out_dir / f"{c:05d}.json.gz"
    if path.exists():
        continue
    t0, rng = time.time(), random.Random(c)
    requests = [m[0]["content"] for m in everyday_prompts(PER_CHUNK, seed=10_000 + c, exclude=seen, strict=False)]
    n_long = len(requests) // 6
    requests[len(requests) - n_long :] = [rng.choice(LONG_FORMS).format(text=t) for t in requests[len(requests) - n_long :]]
    hashes = [content_hash(t) for t in requests]
    seen |= set(hashes)
    ids, lens = [], []
    chats = [[{"role": "user", "content": t}] for t in requests]
    for group, max_new in ((chats[: len(chats) - n_long], 160), (chats[len(chats) - n_long :], 384)):
        texts = [engine.chat_prompt(m) for m in group]
        for m, text, r in zip(group, texts, engine.generate(texts, mode="ar", max_new_tokens=max_new), strict=True):
            p = engine.encode(text)
            ids.append(list(p) + list(r.token_ids)), lens.append(len(p))
            if rng.random() < 0.25:  # a follow-up turn on this greedy answer
                follow = m + [{"role": "assistant", "content": r.text.strip()}, {"role": "user", "content": rng.choice(FOLLOW_UPS)}]
                text = engine.chat_prompt(follow)
                p, more = engine.encode(text), engine.generate(text, mode="ar", max_new_tokens=160)
                ids.append(list(p) + list(more.token_ids)), lens.append(len(p))
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(gzip.compress(json.dumps({"ids": ids, "prompt_lens": lens}).encode()))
    tmp.replace(path)
    path.with_name(f"{c:05d}.hashes").write_text("\n".join(hashes) + "\n")
    tokens = sum(len(x) - p for x, p in zip(ids, lens, strict=True))
    print(f"chunk {c}: {len(ids)} answers, {tokens} tokens, {time.time() - t0:.0f} s", flush=True)
