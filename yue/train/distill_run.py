"""`yue distill MODEL --hours H`: one command from a user's model to a model folder with a NAR set.

The stages, in order, each resumable (a rerun of the same command carries on where a kill stopped it):

1. plan: resolve the model's AR set (a GGUF, a Hugging Face folder of one of the families, or a yue
   model's own), measure its verifying-row costs on this machine, and choose the NAR set's shape and
   the budget's split (`distill_plan.py`); write the held-out prompt sets.
2. heldout: the model's greedy answers to the calibration and test prompts (`distill_data.py`).
3. data: chunks of the model's own answers to training prompts, until the data share of the budget is
   spent; each chunk's entry features are cached with it.
4. train: the drafting vocabulary from the training answers, then rounds (`rounds.py`: each
   round trains on every chunk, measures teacher-forced tau on both held-out splits, keeps the best on
   calibration) until the training share is spent.
5. calibrate: the router on the calibration split's blocks, the free-draft rates on its answers, the
   n-gram table of the training answers; the model folder is written into OUT.
6. report: `verified` against `ar` on the test split, timed in the same run, and tau against training
   tokens: OUT/distill_report.json and OUT/distill_report.png.

OUT/work holds the state (`distill_state.json`: the plan, seconds spent per stage, stages done) and the
campaign folder (chunks, features, round checkpoints, last/ and best/), written atomically; OUT itself
becomes a model folder (config.json, the NAR tensors, ar_source.json, ngrams.safetensors) at stage 5.
"""

from __future__ import annotations

import gc
import gzip
import json
import logging
import time
from dataclasses import replace
from pathlib import Path

import torch

from yue.decode.corpus import CorpusNgrams
from yue.decode.costs import verify_cost_curve
from yue.engine import load as load_engine
from yue.model.family import FAMILIES
from yue.model.gguf import convert_gguf, source_sha256
from yue.model.hf import NGRAMS_FILE, export_ar, load_model
from yue.registry import AR_SOURCE, ar_source, resolve
from yue.train.distill_data import DistillRounds, heldout_prompts, write_prompt_set
from yue.train.distill_plan import DistillPlan, make_plan
from yue.train.distill_report import bench_heldout, write_report
from yue.train.free_drafts import free_draft_rates
from yue.train.rounds import RoundsConfig
from yue.train.router import RouterTrainConfig, train_router
from yue.train.router_eval import evaluate_router
from yue.train.topnar import (
    ChatSequences,
    TopNARConfig,
    drafting_vocabulary,
    router_examples,
    vocabulary_coverage,
)
from yue.train.topnar_run import TopNARRecipe, build_model, load_nar_tensors, save_nar_folder

log = logging.getLogger(__name__)

STAGES = ("plan", "heldout", "data", "train", "calibrate", "report")
BUDGET_OF = {"heldout": "data", "report": "calibrate"}  # the stage whose share a stage spends
FIRST_CHUNK_PROMPTS = 8  # the first chunk measures the answering rate the later ones are sized by
CHUNK_S = 300.0  # a chunk's target seconds at most (a kill loses at most the running chunk)
ROUNDS = 6  # training rounds the budget aims at (points on the tau curve)
FIRST_ROUND_STEPS = 10


class DistillStopped(Exception):
    """Raised after the stage `stop_after` named (for tests and scripted runs); rerun to continue."""


def base_of(model: str, work: Path) -> tuple[Path, dict]:
    """MODEL -> (a Hugging Face folder holding its AR set, the `ar_source.json` the new folder carries).

    A .gguf is converted once (cached); a family folder is its own; a yue folder gives its AR source,
    or, holding its AR set itself, has it exported as a Llama folder into `work/base`.
    """
    path = resolve(model)
    if path.is_file():
        folder = convert_gguf(path)
        return folder, {"gguf_path": str(path.resolve()), "sha256": source_sha256(folder)}
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type in FAMILIES:
        return path, {"ar_path": str(path.resolve())}
    source = ar_source(path)
    if source is not None and source[0].is_dir():
        return source[0], {"ar_path": str(source[0].resolve())}
    if source is not None:
        spec = json.loads((path / AR_SOURCE).read_text())
        if "gguf_path" in spec:
            spec["gguf_path"] = str(source[0].resolve())
        return convert_gguf(source[0]), spec
    base = work / "base"
    if not (base / "config.json").is_file():
        export_ar(load_model(path), work / "base.tmp", tokenizer_file=path / "tokenizer.json")
        (work / "base.tmp").rename(base)
    return base, {"ar_path": "work/base"}


class DistillRun:
    """One `yue distill` output folder and its state (see the module docstring)."""

    def __init__(
        self,
        model: str,
        out_dir: str | Path,
        hours: float,
        device: str = "cpu",
        progress: bool = True,
        stop_after: str | None = None,
    ) -> None:
        if stop_after is not None and stop_after not in STAGES:
            raise ValueError(f"stop_after must be one of {', '.join(STAGES)}, got {stop_after!r}")
        if not hours > 0:
            raise ValueError(f"hours must be > 0, got {hours}")
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        resolve(model)  # an unknown name or path fails here, before anything is written
        self.model_name, self.out, self.hours = str(model), Path(out_dir), hours
        self.work = self.out / "work"
        self.device, self.progress, self.stop_after = device, progress, stop_after
        self.work.mkdir(parents=True, exist_ok=True)
        file = self.work / "distill_state.json"
        self.state = json.loads(file.read_text()) if file.is_file() else {"spent": {}, "done": []}
        if self.state.get("model", self.model_name) != self.model_name:
            raise ValueError(
                f"{self.out} holds a distillation of {self.state['model']!r}, not {self.model_name!r}: "
                "rerun with that model, or give another --out"
            )
        self.state["model"] = self.model_name
        self.camp: DistillRounds | None = None
        self._mark = time.perf_counter()

    # ---------------------------------------------------------------------------------------------
    # state and budget

    def _save(self) -> None:
        tmp = self.work / "distill_state.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=1) + "\n")
        tmp.replace(self.work / "distill_state.json")

    def _spend(self, stage: str) -> float:
        """Add the seconds since the last mark to `stage`, save the state; returns the stage's total."""
        now = time.perf_counter()
        spent = self.state["spent"]
        spent[stage] = round(spent.get(stage, 0.0) + now - self._mark, 2)
        self._mark = now
        self._save()
        return spent[stage]

    def left(self, stage: str) -> float:
        """Seconds the stage may still spend (the budget follows this run's --hours)."""
        return self.plan.stage_budget(stage) - self.state["spent"].get(stage, 0.0)

    def _finish(self, stage: str) -> None:
        self._spend(BUDGET_OF.get(stage, stage))
        self.state["done"].append(stage)
        self._save()
        log.info("distill: stage %s done (spent: %s)", stage, self.state["spent"])
        if stage == self.stop_after:
            raise DistillStopped(f"stopped after stage {stage!r}; run the same command again to continue")

    @property
    def plan(self) -> DistillPlan:
        p = dict(self.state["plan"])
        p["budget_s"] = self.hours * 3600.0
        return DistillPlan(**p)

    # ---------------------------------------------------------------------------------------------
    # stages

    def run(self) -> dict:
        """Run (or resume) every stage; returns the report."""
        if self.state["done"]:
            log.info(
                "distill: resuming %s: stages done %s, seconds spent %s",
                self.out, ", ".join(self.state["done"]), self.state["spent"],
            )  # fmt: skip
        for stage in STAGES:
            if stage in self.state["done"]:
                continue
            self._mark = time.perf_counter()
            try:
                getattr(self, f"stage_{stage}")()
            except KeyboardInterrupt:  # the interrupted work's seconds count against the budget too
                self._spend(BUDGET_OF.get(stage, stage))
                raise
            self._finish(stage)
        return json.loads((self.out / "distill_report.json").read_text())

    def stage_plan(self) -> None:
        base, source = base_of(self.model_name, self.work)
        engine = load_engine(str(base), device=self.device)
        curve = verify_cost_curve(engine.model, context=128, warmup=1, tries=5)
        t0 = time.perf_counter()  # the answering rate the held-out splits are sized by
        rate = len(engine.generate("The", mode="ar", max_new_tokens=32, ignore_eos=True).token_ids)
        plan = make_plan(engine.model.config, curve.ratios, self.hours, rate / (time.perf_counter() - t0))
        instruct = engine.instruct
        del engine
        gc.collect()
        for why in plan.why.values():
            log.info("distill plan: %s", why)
        log.info(
            "distill budget: %.2f h = data %.0f s, training %.0f s, calibration + report %.0f s",
            self.hours, *(plan.stage_budget(s) for s in ("data", "train", "calibrate")),
        )  # fmt: skip
        recipe = TopNARRecipe(plan.nar_layers, plan.block_size, plan.draft_vocab_size)
        save_nar_folder(build_model(base, recipe), self.work / "init", source)
        sets = heldout_prompts(instruct, plan.heldout_prompts)
        (self.work / "heldout").mkdir(exist_ok=True)
        for name, texts in sets.items():
            write_prompt_set(texts, self.work / "heldout" / f"{name}.jsonl")
        self.state.update(
            plan=plan.to_dict(), base=str(base), source=source, instruct=instruct, device=self.device
        )
        gc.collect()

    def campaign(self) -> DistillRounds:
        """The campaign over the work folder (built once per run)."""
        if self.camp is None:
            cfg = RoundsConfig(window=1_000_000, eval_prompts=self.plan.heldout_prompts)
            sets = {s: self.work / "heldout" / f"{s}.jsonl" for s in ("calibration", "test")}
            self.camp = DistillRounds(
                self.work / "campaign", self.state["base"], self.work / "init", sets,
                self.state["instruct"], cfg, self.device, self.progress,
            )  # fmt: skip
        return self.camp

    def stage_heldout(self) -> None:
        camp = self.campaign()
        for name in ("calibration", "test"):
            camp.eval_split(name)
            self._spend("data")

    def stage_data(self) -> None:
        camp = self.campaign()
        while True:
            n_chunks, left = camp.state["chunks"], self.left("data")
            rate = self.state.get("prompts_per_s")
            if n_chunks and (rate is None or left < 4 / rate):
                break
            prompts = FIRST_CHUNK_PROMPTS if rate is None else int(rate * min(left, CHUNK_S))
            camp.cfg = replace(camp.cfg, chunk_prompts=max(4, min(256, prompts)))
            t0 = time.perf_counter()
            chunk = camp.make_chunk(seed=10_000 + 97 * n_chunks)
            n = camp.add_chunk(chunk)
            camp.features(n, ChatSequences(chunk["ids"], chunk["prompt_lens"]))
            self.state["prompts_per_s"] = chunk["prompts"] / (time.perf_counter() - t0)
            spent = self._spend("data")
            log.info(
                "distill data: chunk %d, %d prompts, %d answer tokens; %.0f of %.0f s",
                n, chunk["prompts"], ChatSequences(chunk["ids"], chunk["prompt_lens"]).answer_tokens(),
                spent, self.plan.stage_budget("data"),
            )  # fmt: skip

    def stage_train(self) -> None:
        camp, plan = self.campaign(), self.plan
        if not self.state.get("vocab"):  # the drafting vocabulary, from the training answers
            train = camp.train_answers()
            eos = camp.model.config.eos_token_id
            vocab = drafting_vocabulary(train, plan.draft_vocab_size, [eos] if isinstance(eos, int) else eos)
            camp.model.draft_vocab.copy_(vocab.to(camp.model.draft_vocab.device))
            save_nar_folder(camp.model, camp.dir / "last", self.state["source"])
            held, _ = camp.eval_split("calibration")
            self.state["vocab"] = {
                "size": len(vocab),
                "coverage_calibration": vocabulary_coverage(held, vocab),
            }
            self._save()
        while True:
            rounds, left = camp.state["rounds"], self.left("train")
            step_s = self.state.get("step_s")
            if rounds and (step_s is None or left < 4 * step_s):
                break
            target = min(left, max(plan.stage_budget("train") / ROUNDS, 20.0))
            steps = FIRST_ROUND_STEPS if step_s is None else max(4, min(2000, int(target / step_s)))
            running = self.state.get("running_round")
            if running and running["round"] == rounds:  # a killed round resumes as it was planned
                steps = running["steps"]
            self.state["running_round"] = {"round": rounds, "steps": steps}
            self._save()
            train = TopNARConfig(
                steps=steps, batch_size=8, anchors=24, lr=5e-4, warmup_steps=max(1, min(10, steps // 5)),
                min_lr_ratio=1.0, eval_every=max(1, steps // 3), seed=rounds,
            )  # fmt: skip
            camp.cfg = replace(camp.cfg, train=train)
            t0 = time.perf_counter()
            record = camp.run_round(make_data=False)
            self.state["step_s"] = (time.perf_counter() - t0) / steps
            spent = self._spend("train")
            log.info(
                "distill train: round %d, %d steps, tau %s; %.0f of %.0f s",
                record["round"], steps, record["tau"], spent, plan.stage_budget("train"),
            )  # fmt: skip

    def stage_calibrate(self) -> None:
        camp, plan = self.campaign(), self.plan
        model = camp.model
        load_nar_tensors(model, camp.dir / "best")
        held, feats = camp.eval_split("calibration")
        examples = router_examples(model, held, feats)
        fit, check = examples.split_by_group(0.2, seed=0)
        train_router(model.router, fit, RouterTrainConfig())
        router = evaluate_router(model.router, check if len(check) else fit)
        train = camp.train_answers()
        vocab = model.config.vocab_size
        # Contexts of up to 4 tokens, as many as fit a 64-bit key (3 for a 262k vocabulary's 18-bit ids).
        order = min(4, 64 // max(16, (vocab - 1).bit_length()))
        ngrams = CorpusNgrams.build(train.pairs(), vocab, max_order=order)
        rates = free_draft_rates(held, ngrams, plan.block_size - 1)
        model.config.default_mode = "verified"
        model.config.drafting_slots = plan.block_size
        model.config.free_draft_rates = rates
        save_nar_folder(model, self.out, self.state["source"])
        ngrams.save(self.out / NGRAMS_FILE, source=f"{len(train)} training answers of yue distill")
        self.state["calibration"] = {
            "router": router,
            "free_draft_rates": rates,
            "ngrams": len(ngrams),
            "best_calibration_tau": camp.state["best_calibration_tau"],
        }

    def stage_report(self) -> None:
        camp = self.campaign()
        test = [
            json.loads(line)["messages"]
            for line in (self.work / "heldout" / "test.jsonl").read_text().splitlines()
        ]
        self.camp = None  # the training model's memory, before the new folder loads
        del camp
        gc.collect()
        left = max(self.left("calibrate") - self._since_mark(), 30.0)
        bench = bench_heldout(self.out, test, self.state["instruct"], self.device, left)
        self._spend("calibrate")  # the report's own time, in the report
        curve = [json.loads(line) for line in (self.work / "campaign" / "log.jsonl").open()]
        report = {
            "model": self.model_name,
            "out": str(self.out),
            "device": self.device,
            "threads": torch.get_num_threads(),
            "kind": "instruct (chat template)" if self.state["instruct"] else "base (text continuation)",
            "plan": self.state["plan"] | {"budget_s": self.hours * 3600.0},
            "spent_s": self.state["spent"],
            "drafting_vocabulary": self.state["vocab"],
            "data": _data_summary(self.work / "campaign"),
            "tau_curve": [
                {
                    "tokens_seen": r["tokens_seen"],
                    "round": r["round"],
                    **{f"tau_{k}": v for k, v in r["tau"].items()},
                }
                for r in curve
            ],
            "calibration": self.state["calibration"],
            "heldout_bench": bench,
        }
        write_report(report, self.out)

    def _since_mark(self) -> float:
        return time.perf_counter() - self._mark


def _data_summary(folder: Path) -> dict:
    state = json.loads((folder / "state.json").read_text())
    prompts = tokens = sequences = 0
    for n in range(state["chunks"]):
        c = json.loads(gzip.decompress((folder / "chunks" / f"{n:05d}.json.gz").read_bytes()))
        seqs = ChatSequences(c["ids"], c["prompt_lens"])
        prompts, sequences, tokens = (
            prompts + c["prompts"],
            sequences + len(seqs),
            tokens + seqs.answer_tokens(),
        )
    return {"chunks": state["chunks"], "prompts": prompts, "sequences": sequences, "answer_tokens": tokens}


def distill(model: str, out_dir: str | Path, hours: float, **options) -> dict:
    """`yue distill MODEL --hours H --out OUT` (module docstring; `options`: `DistillRun`'s device,
    progress, stop_after); returns the report.

    Raises:
        DistillStopped: after the stage `stop_after` (the state is saved; rerun to continue).
    """
    return DistillRun(model, out_dir, hours, **options).run()
