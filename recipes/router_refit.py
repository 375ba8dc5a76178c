"""Refit a top-layer NAR folder's router to its current NAR set, on calibration answers only (issue 42;
a development script).

    python recipes/router_refit.py MODEL_FOLDER BASE.gguf ANSWERS.json.gz [ANSWERS ...]

ANSWERS: greedy answers of calibration prompts (a `yue.train.rounds` folder's eval/<split>.json.gz). Router
examples from every block of them (`topnar.router_examples`), a fifth of the sequences held out by
group; prints the current router's and the refit router's AUC / ECE on that fifth, and writes the refit
router into MODEL_FOLDER/model.safetensors only if its BCE there is lower.
"""

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from yue.train.router import RouterTrainConfig, train_router
from yue.train.router_eval import evaluate_router
from yue.train.topnar import ChatSequences, entry_features, router_examples
from yue.train.topnar_run import TopNARRecipe, build_model, load_nar_tensors, top_nar_base


def main(folder: str, gguf: str, *answers: str) -> None:
    torch.set_num_threads(1)
    base, _ = top_nar_base(gguf)
    cfg = json.loads((Path(folder) / "config.json").read_text())
    recipe = TopNARRecipe(
        nar_layers=cfg["nar_layers"], block_size=cfg["block_size"], draft_vocab_size=cfg["draft_vocab_size"]
    )
    model = build_model(base, recipe)
    load_nar_tensors(model, folder)
    ids, lens = [], []
    for path in answers:
        s = ChatSequences.load(path)
        ids, lens = ids + s.ids, lens + s.prompt_lens
    seqs = ChatSequences(ids, lens)
    examples = router_examples(model, seqs, entry_features(model, seqs, progress=False), M=64)
    fit, check = examples.split_by_group(0.2, seed=0)
    before = evaluate_router(model.router, check)
    train_router(model.router, fit, RouterTrainConfig())
    after = evaluate_router(model.router, check)
    keys = ("router_bce", "router_auc", "router_ece", "conf_auc", "mean_accepted_prefix")
    print(
        json.dumps(
            {
                "blocks": [len(fit), len(check)],
                **{n: {k: r[k] for k in keys} for n, r in [("before", before), ("after", after)]},
            }
        )
    )
    if after["router_bce"] < before["router_bce"]:
        path = Path(folder) / "model.safetensors"
        tensors = load_file(str(path))
        for k, v in model.state_dict().items():
            if k.startswith("router."):
                tensors[k] = v.half().contiguous()
        save_file(tensors, str(path), metadata={"format": "pt"})
        print("wrote the refit router into", path)


if __name__ == "__main__":
    main(*sys.argv[1:])
