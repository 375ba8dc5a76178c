"""Measure a model's free-draft rates on its calibration answers, for its config's `free_draft_rates`
(a development script, not part of the package).

The model's float32 greedy answers (128 tokens) to calibration prompt files (JSONL, chat or raw
prompts, as `yue bench --prompts` reads them), then, at every answer position, how copied and corpus
drafts fared by source and match length (`yue.train.free_drafts`). Never give it the split the speed is
reported on. As it ran (2026-12-03), its output's "free_draft_rates" going into each config.json:
    python docs/recipes/free_draft_rates.py yue-smol yue/assets/chat_calibration.jsonl \
        yue/assets/chat_calibration_everyday.jsonl
"""

import json
import sys

import torch

import yue
from yue.bench.prompts import load_prompts
from yue.train.free_drafts import free_draft_rates
from yue.train.topnar import greedy_answers

torch.set_num_threads(2)
engine = yue.load(sys.argv[1])
files = sys.argv[2:]
prompts = [p.ids for f in files for p in load_prompts(f, engine)]
answers = greedy_answers(engine.model, prompts, max_new_tokens=128, batch_size=16)
rates = free_draft_rates(answers, engine.corpus, engine.model.config.block_size - 1)
print(json.dumps({"files": files, "answer_tokens": answers.answer_tokens(), "free_draft_rates": rates}))
