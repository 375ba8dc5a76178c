"""Round 4 of yue-smol's top-layer NAR set, as it ran on the 2-core AMD EPYC (a development script, not part
of the package; it composes `yue.train.topnar`'s stages as `yue distill --nar-layers` does).

Template everyday requests (`yue.train.everyday`, seed 0, the shipped evaluation sets' texts excluded),
their float32 greedy answers (at most 160 tokens) in chunks of 48 until GEN_UNTIL (unix time), entry
features, a drafting vocabulary mixed from the new answers (VOCAB=mix: tokens seen at least MINC times in
them, most frequent first, up to NEW_TOP, then the shipped vocabulary's order), and training from the
shipped NAR set. Every stage resumes from $W. The choice split is chat_calibration_everyday, with the
standard-library calibration split as a guard; chat_test is never read. As it ran (2026-12-03):
    VOCAB=mix GEN_UNTIL=<35 min of generation> STEPS=450 W=/work/r4/work python recipes/yue_smol_round4.py
then `yue build-ngrams <model> --sequences <the training answers, $W/everyday.json less its first HELD> --extend`.
Not shipped: on the everyday calibration split it left `verified` where round 3 is (measurement log,
"Session 17"), so the shipped NAR set stays round 3's; the report is docs/topnar-round4-experiment-2026-12-03.json.
"""

import json
import os
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from yue.bench.devset import CHAT_SETS
from yue.registry import resolve
from yue.train.everyday import everyday_prompts
from yue.train.selfinstruct import shipped_set_hashes
from yue.train.topnar import (
    ChatSequences,
    TopNARConfig,
    entry_features,
    greedy_answers,
    held_out_tau,
    train_top_nar,
    vocabulary_coverage,
)
from yue.train.topnar_run import (
    TopNARRecipe,
    build_model,
    load_nar_tensors,
    read_chat_prompts,
    save_nar_folder,
    tokenize_chats,
    top_nar_base,
)

W = Path(os.environ.get("W", "/work/r4/work"))
W.mkdir(parents=True, exist_ok=True)
GEN_UNTIL = float(os.environ.get("GEN_UNTIL", "0"))  # unix time: stop generating new chunks then
N_PROMPTS = int(os.environ.get("N_PROMPTS", "6000"))
CHUNK = int(os.environ.get("CHUNK", "48"))
MAXNEW = int(os.environ.get("MAXNEW", "160"))
HELD = int(os.environ.get("HELD", "96"))
STEPS = int(os.environ.get("STEPS", "600"))
LR = float(os.environ.get("LR", "3e-4"))
BATCH = int(os.environ.get("BATCH", "8"))
ANCHORS = int(os.environ.get("ANCHORS", "24"))
EVAL_EVERY = int(os.environ.get("EVAL_EVERY", "100"))
STAGE = os.environ.get("STAGE", "all")
torch.set_num_threads(2)
t0 = time.time()
logf = open(W / "log.txt", "a")


def say(*a):
    msg = f"[{time.strftime('%H:%M:%S')} {time.time() - t0:7.1f}s] " + " ".join(str(x) for x in a)
    print(msg, flush=True)
    logf.write(msg + "\n")
    logf.flush()


base, ar_source = top_nar_base("yue-smol")
shipped = resolve("yue-smol")
model = build_model(base, TopNARRecipe())
load_nar_tensors(model, shipped)
say("loaded", base, shipped)


def answers(name, chats):
    f = W / f"{name}.json"
    if f.is_file():
        return ChatSequences.load(f)
    s = greedy_answers(model, tokenize_chats(base, chats), MAXNEW, CHUNK, progress=False)
    s.save(f)
    say("answers", name, len(s), s.answer_tokens())
    return s


# Evaluation sets: calibration splits (choice) only; chat_test is never looked at here.
evals = {
    k: answers(f"eval_{k}", read_chat_prompts(CHAT_SETS[k])) for k in ("calibration-everyday", "calibration")
}

# Training answers, chunk by chunk until GEN_UNTIL.
exclude = shipped_set_hashes([str(p) for p in CHAT_SETS.values()])
chats = everyday_prompts(N_PROMPTS, seed=0, exclude=exclude)
train_file = W / "everyday.json"
seqs = ChatSequences.load(train_file) if train_file.is_file() else ChatSequences([], [])
while STAGE in ("all", "gen") and len(seqs) < len(chats) and time.time() < GEN_UNTIL:
    part = greedy_answers(
        model, tokenize_chats(base, chats[len(seqs) : len(seqs) + CHUNK]), MAXNEW, CHUNK, progress=False
    )
    seqs = ChatSequences(seqs.ids + part.ids, seqs.prompt_lens + part.prompt_lens)
    tmp = train_file.with_suffix(".tmp")
    seqs.save(tmp)
    tmp.replace(train_file)
    say("everyday answers", len(seqs), seqs.answer_tokens())
if STAGE == "gen":
    sys.exit(0)
held_tpl = ChatSequences(seqs.ids[:HELD], seqs.prompt_lens[:HELD])
train = ChatSequences(seqs.ids[HELD:], seqs.prompt_lens[HELD:])
say("train", len(train), train.answer_tokens(), "held template", len(held_tpl))


def coverage(v):
    return {k: round(vocabulary_coverage(s, v), 4) for k, s in [*evals.items(), ("template-held", held_tpl)]}


old_vocab = model.draft_vocab.clone()
say("vocab coverage (shipped)", json.dumps(coverage(old_vocab)))
if os.environ.get("VOCAB", "") == "mix":
    cnt = Counter(t for x, p in train.pairs() for t in x[p:])
    first = old_vocab.tolist()[:1]  # EOS
    ranked = first + [
        t for t, c in cnt.most_common() if c >= int(os.environ.get("MINC", "2")) and t not in first
    ]
    ranked = ranked[: int(os.environ.get("NEW_TOP", "6144"))]
    seen = set(ranked)
    ranked += [t for t in old_vocab.tolist() if t not in seen]
    model.draft_vocab.copy_(torch.tensor(ranked[: len(old_vocab)]))
    say(
        "vocab coverage (mix)",
        len(set(ranked[: len(old_vocab)]) - set(old_vocab.tolist())),
        "new tokens",
        json.dumps(coverage(model.draft_vocab)),
    )
t = time.time()
feats = {k: entry_features(model, s, progress=False) for k, s in evals.items()}
held_feats = entry_features(model, held_tpl, progress=False)
train_feats = entry_features(model, train, progress=False)
say("features", round(time.time() - t, 1))


def taus():
    out = {k: round(held_out_tau(model, s, feats[k])["tau"], 4) for k, s in evals.items()}
    out["template-held"] = round(held_out_tau(model, held_tpl, held_feats)["tau"], 4)
    return out


say("before", json.dumps(taus()))
cfg = TopNARConfig(
    steps=STEPS, batch_size=BATCH, anchors=ANCHORS, lr=LR, warmup_steps=20, eval_every=EVAL_EVERY, seed=4
)


def on_eval(rec):
    r = taus()
    say(
        "eval",
        rec["step"],
        rec["answer_tokens_seen"],
        round(rec["loss"], 4),
        round(rec["minutes"], 1),
        json.dumps(r),
    )
    save_nar_folder(model, W / f"nar_step{rec['step']}", ar_source)


hist = train_top_nar(
    model,
    train,
    train_feats,
    evals["calibration-everyday"],
    feats["calibration-everyday"],
    cfg,
    W / "run",
    on_eval=on_eval,
    progress=False,
)
say("done", json.dumps(hist[-1]))
