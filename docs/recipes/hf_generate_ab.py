"""transformers' `generate()` on the default model against transformers' greedy `generate()` on a plain
`LlamaForCausalLM` holding the same AR weights (`export_ar`), interleaved per prompt in one process (a
development script, not part of the package).

    YUE_CACHE_DIR=... python docs/recipes/hf_generate_ab.py [prompts] [max_new_tokens]

Both get the same chat-templated prompt ids and `max_new_tokens`; yue's runs the model's default mode
through the decode loop (`decode/hf_generate.py`). Prints each one's new tokens per second, their ratio,
and how many of yue's outputs equal `yue generate --mode ar`'s (`Engine.generate(mode="ar")`, EOS
appended where it ended on one) and transformers' Llama's. One thread each.
"""

import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import LlamaForCausalLM

import yue
from yue.engine import load_unprepared
from yue.model import export_ar

torch.set_num_threads(1)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
new_tokens = int(sys.argv[2]) if len(sys.argv) > 2 else 128
engine = yue.load()
with tempfile.TemporaryDirectory() as folder:
    export_ar(load_unprepared()[0], folder)
    llama = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
lines = (Path(yue.__file__).parent / "assets" / "chat_calibration.jsonl").read_text().splitlines()
prompts = [engine.chat_prompt(json.loads(line)["messages"]) for line in lines][:n]
eos = engine.tokenizer.eos_id
engine.model.generate(torch.tensor([engine.encode(prompts[0])]), max_new_tokens=8)  # warm-up, step costs
llama.generate(torch.tensor([engine.encode(prompts[0])]), max_new_tokens=8, do_sample=False)
seconds = {"yue": 0.0, "llama": 0.0}
tokens = {"yue": 0, "llama": 0}
same_as_ar = same_as_llama = 0
for prompt in prompts:
    ids = torch.tensor([engine.encode(prompt)])
    runs = {
        "yue": lambda ids=ids: engine.model.generate(ids, max_new_tokens=new_tokens),
        "llama": lambda ids=ids: llama.generate(ids, max_new_tokens=new_tokens, do_sample=False),
    }
    out = {}
    for name, run in runs.items():
        t0 = time.perf_counter()
        with torch.inference_mode():
            out[name] = run()[0, ids.shape[1] :].tolist()
        seconds[name] += time.perf_counter() - t0
        tokens[name] += len(out[name])
    ar = engine.generate(prompt, mode="ar", max_new_tokens=new_tokens)
    same_as_ar += out["yue"] == ar.token_ids + [eos] * (ar.finish_reason == "eos")
    same_as_llama += out["yue"] == out["llama"]
rate = {name: tokens[name] / seconds[name] for name in seconds}
print(f"mode {engine.default_mode}, {n} prompts x {new_tokens} new tokens at most, one thread")
print(f"yue model.generate   {rate['yue']:7.2f} tok/s ({tokens['yue']} tokens)")
print(f"Llama generate       {rate['llama']:7.2f} tok/s ({tokens['llama']} tokens)")
print(
    f"ratio {rate['yue'] / rate['llama']:.2f}x; yue's output equals `yue generate --mode ar`'s in "
    f"{same_as_ar}/{n}, transformers' Llama's in {same_as_llama}/{n}"
)
