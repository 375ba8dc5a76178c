"""Measure a model's free-draft rates on its calibration answers, for its config's `free_draft_rates`
(a development script, not part of the package).

The model's float32 greedy answers (128 tokens) to the calibration chat splits, then, at every answer
position, how copied and corpus drafts fared by source and match length (`yue.train.free_drafts`).
chat_test is never read: it is the split the speed is reported on. As it ran for yue-smol (2026-12-03):
    python docs/recipes/free_draft_rates.py yue-smol > rates.json
and the result went into yue/assets/yue-smol/config.json.
"""

import json
import sys

import torch

import yue
from yue.bench.devset import load_chat_set
from yue.train.free_drafts import free_draft_rates
from yue.train.topnar import greedy_answers

torch.set_num_threads(2)
engine = yue.load(sys.argv[1] if len(sys.argv) > 1 else "yue-smol")
sets = ("calibration", "calibration-everyday")
prompts = [engine.encode(engine.chat_prompt(r["messages"])) for name in sets for r in load_chat_set(name)]
answers = greedy_answers(engine.model, prompts, max_new_tokens=128, batch_size=16)
rates = free_draft_rates(answers, engine.corpus, engine.model.config.block_size - 1)
print(json.dumps({"splits": sets, "answer_tokens": answers.answer_tokens(), "free_draft_rates": rates}))
