"""Measure a model's free-draft rates on its calibration answers, for its config's `free_draft_rates`
(greedy) or `sampled_draft_rates` (a development script, not part of the package).

The model's float32 answers (128 tokens) to calibration prompt files (JSONL, chat or raw prompts, as
`yue bench --prompts` reads them), then, at every answer position, how copied and corpus drafts fared
by source and match length (`yue.train.free_drafts`). Greedy answers give the rates greedy `verified`
meets (a draft holds where it is the AR path's choice). Answers sampled at `--temperature T` give the
rates speculative sampling meets at T: an answer's token at a position is a sample of the model's
warped p there, so a draft x matches it with probability p(x), the chance that the speculative rule
accepts a draft proposed with certainty; and drafts 1..j all match with the chance that they are all
accepted. `--samples N` answers each prompt N times (seeds 0, 1000, ...). Never give it the split the
speed is reported on. As they ran, their output's rates going into each config.json:
    python docs/recipes/free_draft_rates.py yue-smol yue/assets/chat_calibration.jsonl \
        yue/assets/chat_calibration_everyday.jsonl                                   (2026-12-03)
    python docs/recipes/free_draft_rates.py yue-smol --temperature 0.7 --samples 2 \
        yue/assets/chat_calibration.jsonl yue/assets/chat_calibration_everyday.jsonl (2026-12-04)
    python docs/recipes/free_draft_rates.py yue-code-mini --temperature 0.7 --samples 4 \
        yue/assets/devset.jsonl                                (2026-12-07, 20,474 answer tokens)
"""

import argparse
import json

import torch

import yue
from yue.bench.prompts import load_prompts
from yue.train.free_drafts import free_draft_rates
from yue.train.topnar import ChatSequences, greedy_answers

parser = argparse.ArgumentParser()
parser.add_argument("model")
parser.add_argument("files", nargs="+")
parser.add_argument("--temperature", type=float, default=0.0)
parser.add_argument("--samples", type=int, default=1)
args = parser.parse_args()
torch.set_num_threads(2)
engine = yue.load(args.model)
prompts = [p.ids for f in args.files for p in load_prompts(f, engine)]
answers = ChatSequences([], [])
for s in range(args.samples if args.temperature > 0 else 1):
    got = greedy_answers(
        engine.model, prompts, max_new_tokens=128, batch_size=16, temperature=args.temperature, seed=1000 * s
    )
    answers = ChatSequences(answers.ids + got.ids, answers.prompt_lens + got.prompt_lens)
rates = free_draft_rates(answers, engine.corpus, engine.model.config.block_size - 1)
doc = {"files": args.files, "temperature": args.temperature, "samples": args.samples}
print(json.dumps(doc | {"answer_tokens": answers.answer_tokens(), "free_draft_rates": rates}))
