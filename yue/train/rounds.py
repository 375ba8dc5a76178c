"""Resumable, open-ended rounds of training a top-layer NAR set on the model's own answers.

Why: one fixed set of answers flattens as training repeats it; acceptance on everyday chat needs many
distinct requests, answered the way users get answers (greedy and sampled at chat temperatures). A
`Rounds` folder alternates two things for as long as it is left running, one round at a time:

1. a new chunk of data: `chunk_prompts` requests never seen before (everyday templates, the same in long
   form, requests the model writes itself, and follow-up turns of conversations), each answered greedily
   and at every temperature in `temperatures`; texts of the shipped evaluation sets are refused by
   content hash (`selfinstruct.content_hash`), so neither held-out nor calibration prompts are trained on;
2. `steps_per_round` training steps on the newest `window` chunks (entry features cached per chunk),
   then teacher-forced tau on the held-out and the calibration split's greedy answers, one line of
   `log.jsonl` (tau against training answer tokens and distinct prompts), the NAR folder in `last/`,
   and in `best/` when the calibration split's tau is the best so far (chosen on calibration only).

`yue distill` runs its training through it (`distill_data.DistillRounds`); the yue-smol campaign that
made round 5 is its command line (`recipes/yue_smol_campaign.py`, outside the package).

Layout of the folder (everything a rerun needs to carry on where the last one stopped):

    state.json            rounds done, chunks made, answer tokens trained on, best calibration tau
    seen.txt              content hash of every request used (one a line; the evaluation sets' first)
    chunks/00012.json.gz  a chunk: {"ids", "prompt_lens", "kinds", "prompts"} (ChatSequences + labels)
    feats/00012.safetensors  its entry features (float16, or bfloat16: `topnar.compact`)
    eval/<split>.json.gz  greedy answers of the evaluation splits (made once)
    round/                the running round's checkpoints (`train_top_nar`'s run_dir): a kill resumes
    last/, best/          NAR folders (what `topnar_run.load_nar_tensors` reads)
    log.jsonl             one record per round

Chunks written elsewhere (a GPU round's answers) join with `import_sequences`.
"""

from __future__ import annotations

import gzip
import json
import logging
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from yue.chat import ChatTemplate, find_chat_template
from yue.model.mot import YueForCausalLM
from yue.train.everyday import everyday_prompts
from yue.train.selfinstruct import SENTINEL, content_hash, shipped_set_hashes
from yue.train.topnar import (
    ChatSequences,
    TopNARConfig,
    entry_features,
    greedy_answers,
    held_out_tau,
    train_top_nar,
)
from yue.train.topnar_run import (
    TopNARRecipe,
    build_model,
    load_nar_tensors,
    read_chat_prompts,
    save_nar_folder,
)
from yue.train.trainer import append_jsonl

log = logging.getLogger(__name__)

# Second user turns of a conversation: what people ask after a first answer.
FOLLOW_UPS = [
    "Can you make it shorter?",
    "Can you explain that more simply?",
    "Give me another example.",
    "Thanks! Can you say more about that?",
    "Can you put that as a numbered list?",
    "What would you change to make it better?",
    "Can you write it again in a more formal tone?",
    "Why is that?",
    "Can you summarize that in one sentence?",
    "That's great. What should I do next?",
    "Can you make it funnier?",
    "Is there anything I should be careful about?",
]
# Asking for a long answer: the same requests, and answers up to `long_new_tokens`.
LONG_FORMS = [
    "{text} Please answer in detail.",
    "{text} Give a thorough answer with several paragraphs.",
    "{text} Explain step by step, in detail.",
    "I have time to read a long answer. {text}",
]
KINDS = ("template", "long", "model_written", "multi_turn")


@dataclass(frozen=True)
class RoundsConfig:
    """Sizes of one round. Defaults: the yue-smol campaign's on CPU (one thread, shared cores)."""

    chunk_prompts: int = 48  # distinct new requests per chunk (before follow-up turns)
    mix: tuple[float, float, float] = (0.5, 0.15, 0.35)  # template, long, model-written shares
    follow_ups: float = 0.25  # follow-up conversations, as a share of the chunk's one-turn requests
    temperatures: tuple[float, ...] = (0.7,)  # sampled answers besides the greedy one
    top_p: float = 0.95
    max_new_tokens: int = 160
    long_new_tokens: int = 384
    gen_batch_size: int = 16
    window: int = 12  # newest chunks trained on in a round
    eval_prompts: int = 40
    eval_new_tokens: int = 128
    train: TopNARConfig = field(
        default_factory=lambda: TopNARConfig(
            steps=60, batch_size=8, anchors=24, lr=2e-4, warmup_steps=5, min_lr_ratio=1.0, eval_every=60
        )
    )

    def __post_init__(self) -> None:
        if self.chunk_prompts < 1 or self.window < 1 or self.gen_batch_size < 1:
            raise ValueError("chunk_prompts, window and gen_batch_size must be >= 1")
        if len(self.mix) != 3 or min(self.mix) < 0 or sum(self.mix) <= 0:
            raise ValueError(f"mix must be three non-negative shares, got {self.mix}")
        if any(not 0 < t <= 2 for t in self.temperatures):
            raise ValueError(f"temperatures must be in (0, 2], got {self.temperatures}")


class Rounds:
    """A rounds folder (see the module docstring) over a base Llama folder and a starting NAR folder."""

    def __init__(
        self,
        folder: str | Path,
        base_dir: str | Path,
        init_from: str | Path,
        eval_sets: dict[str, str | Path],
        calibration: str,
        cfg: RoundsConfig = RoundsConfig(),
        device: str = "cpu",
        progress: bool = False,
        exclude: Sequence[str | Path] = (),
    ) -> None:
        """eval_sets: split name -> JSONL of chat prompts (never trained on); `calibration` names the one
        that chooses `best/`; `exclude`: further JSONL chat sets whose texts are never trained on."""
        if calibration not in eval_sets:
            raise ValueError(f"calibration split {calibration!r} is not among {sorted(eval_sets)}")
        self.dir, self.base, self.cfg, self.progress = Path(folder), Path(base_dir), cfg, progress
        self.eval_sets, self.calibration = eval_sets, calibration
        for sub in ("chunks", "feats", "eval"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        self.state = self._read_state()
        self.model = build_model(self.base, _recipe_of(init_from)).to(device)
        start = self.dir / "last" if (self.dir / "last").is_dir() else Path(init_from)
        load_nar_tensors(self.model, start)
        self.tok = Tokenizer.from_file(str(self.base / "tokenizer.json"))
        self.template = ChatTemplate(find_chat_template(self.base))
        seen_file = self.dir / "seen.txt"
        if not seen_file.is_file():  # the evaluation sets' texts first: never a training request
            seen_file.write_text("")
        self.seen = set(seen_file.read_text().split())
        refused = shipped_set_hashes([str(p) for p in [*eval_sets.values(), *exclude]])
        self._remember(sorted(refused - self.seen))
        self._feats: dict[int, list[torch.Tensor]] = {}

    # ---------------------------------------------------------------------------------------------
    # state

    def _read_state(self) -> dict:
        path = self.dir / "state.json"
        if path.is_file():
            return json.loads(path.read_text())
        return {
            "rounds": 0,
            "chunks": 0,
            "tokens_seen": 0,
            "best_calibration_tau": None,
            "config": asdict(self.cfg),
        }

    def _write_state(self) -> None:
        tmp = self.dir / "state.json.tmp"
        tmp.write_text(json.dumps(self.state, indent=1) + "\n")
        tmp.replace(self.dir / "state.json")

    def _remember(self, hashes: list[str]) -> None:
        self.seen.update(hashes)
        with open(self.dir / "seen.txt", "a") as f:
            f.writelines(h + "\n" for h in hashes)

    # ---------------------------------------------------------------------------------------------
    # data

    def _encode(self, chats: list[list[dict]]) -> list[list[int]]:
        return [self.tok.encode(self.template.render(m), add_special_tokens=False).ids for m in chats]

    def _fresh(self, texts: list[str], n: int) -> list[str]:
        """Up to `n` of `texts` never seen (by content hash), first come first kept."""
        out, hashes = [], set()
        for t in texts:
            h = content_hash(t)
            if h not in self.seen and h not in hashes and len(t) >= 8:
                hashes.add(h)
                out.append(t)
            if len(out) == n:
                break
        return out

    def model_written(self, n: int, seed: int) -> list[str]:
        """Requests the model writes itself (Magpie: the template up to a user turn, sampled at T=1,
        top-p 0.95, 48 tokens; finished ones only)."""
        text = self.template.render([{"role": "user", "content": SENTINEL}])
        prefix = self.tok.encode(text[: text.index(SENTINEL)], add_special_tokens=False).ids
        eos = _eos(self.model)
        out = greedy_answers(
            self.model,
            [prefix] * (2 * n),
            48,
            self.cfg.gen_batch_size,
            False,
            temperature=1.0,
            top_p=0.95,
            seed=seed,
        )
        texts = [
            self.tok.decode(x[p:-1], skip_special_tokens=True).strip()
            for x, p in zip(out.ids, out.prompt_lens, strict=True)
            if x[-1] == eos and len(x) > p + 1
        ]
        return self._fresh(texts, n)

    def new_requests(self, n: int, seed: int) -> tuple[list[list[dict]], list[str], list[int]]:
        """`n` distinct unseen one-turn requests: (chats, kinds, answer lengths)."""
        c = self.cfg
        shares = [s / sum(c.mix) for s in c.mix]
        n_long, n_model = round(n * shares[1]), round(n * shares[2])
        n_template = n - n_long - n_model
        rng = random.Random(seed)
        # More than needed: the long forms take theirs from the rest.
        pool = [m[0]["content"] for m in everyday_prompts(2 * n, seed, self.seen, strict=False)]
        template = self._fresh(pool, n_template)
        long = self._fresh([rng.choice(LONG_FORMS).format(text=t) for t in pool[n_template:]], n_long)
        written = self.model_written(n_model, seed) if n_model else []
        texts = template + long + written
        kinds = ["template"] * len(template) + ["long"] * len(long) + ["model_written"] * len(written)
        lengths = [c.long_new_tokens if k == "long" else c.max_new_tokens for k in kinds]
        return [[{"role": "user", "content": t}] for t in texts], kinds, lengths

    def answer(
        self, chats: list[list[dict]], lengths: list[int], seed: int
    ) -> tuple[ChatSequences, list[int]]:
        """Greedy and sampled answers of `chats` (grouped by answer length): (sequences, chat index of each)."""
        ids, lens, owner = [], [], []
        prompts = self._encode(chats)
        for length in sorted(set(lengths)):
            which = [i for i, n in enumerate(lengths) if n == length]
            group = [prompts[i] for i in which]
            temps = (0.0, *self.cfg.temperatures)
            for j, t in enumerate(temps):
                out = greedy_answers(
                    self.model,
                    group,
                    length,
                    self.cfg.gen_batch_size,
                    self.progress,
                    t,
                    self.cfg.top_p,
                    seed + 7919 * j,
                )
                ids += out.ids
                lens += out.prompt_lens
                owner += which
        return ChatSequences(ids, lens), owner

    def make_chunk(self, seed: int) -> dict:
        """One chunk of new data (module docstring, step 1)."""
        chats, kinds, lengths = self.new_requests(self.cfg.chunk_prompts, seed)
        seqs, owner = self.answer(chats, lengths, seed)
        # Follow-up turns on the greedy answers of some one-turn requests.
        eos, rng = _eos(self.model), random.Random(seed + 1)
        greedy = {o: i for i, o in reversed(list(enumerate(owner)))}  # first (greedy) sequence of each chat
        picks = rng.sample(range(len(chats)), min(len(chats), round(self.cfg.follow_ups * len(chats))))
        follow = []
        for i in picks:
            x, p = seqs.ids[greedy[i]], seqs.prompt_lens[greedy[i]]
            reply = self.tok.decode([t for t in x[p:] if t != eos], skip_special_tokens=True).strip()
            follow.append(
                chats[i]
                + [
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": rng.choice(FOLLOW_UPS)},
                ]
            )
        if follow:
            more, more_owner = self.answer(follow, [self.cfg.max_new_tokens] * len(follow), seed + 2)
            seqs = ChatSequences(seqs.ids + more.ids, seqs.prompt_lens + more.prompt_lens)
            owner += [len(chats) + o for o in more_owner]
            kinds += ["multi_turn"] * len(follow)
        # Identical sequences (greedy == sampled) once only.
        keep, seen_ids = [], set()
        for i, x in enumerate(seqs.ids):
            key = tuple(x)
            if key not in seen_ids:
                seen_ids.add(key)
                keep.append(i)
        hashes = [content_hash(m[0]["content"]) for m in chats]
        return {
            "ids": [seqs.ids[i] for i in keep],
            "prompt_lens": [seqs.prompt_lens[i] for i in keep],
            "kinds": [kinds[owner[i]] for i in keep],
            "prompts": len(chats) + len(follow),
            "hashes": hashes,
        }

    def add_chunk(self, chunk: dict) -> int:
        """Write a chunk (made here or imported) and remember its requests; returns its number."""
        n = self.state["chunks"]
        save_gz(chunk, self.dir / "chunks" / f"{n:05d}.json.gz")
        self._remember(chunk.get("hashes", []))
        self.state["chunks"] = n + 1
        self._write_state()
        return n

    def import_sequences(self, path: str | Path, per_chunk: int = 2048) -> list[int]:
        """Chunks written elsewhere (same keys as `make_chunk`'s, e.g. a GPU round's), split into chunks of
        at most `per_chunk` sequences; a file already imported (by name) is skipped."""
        done = self.state.setdefault("imported", [])
        if Path(path).name in done:
            return []
        data = json.loads(gzip.decompress(Path(path).read_bytes()))
        out = []
        for s in range(0, len(data["ids"]), per_chunk):
            part = {k: data[k][s : s + per_chunk] for k in ("ids", "prompt_lens", "kinds")}
            part["prompts"] = data["prompts"] if s == 0 else 0
            part["hashes"] = data.get("hashes", []) if s == 0 else []
            out.append(self.add_chunk(part))
        done.append(Path(path).name)
        self._write_state()
        return out

    def chunk(self, n: int) -> dict:
        return json.loads(gzip.decompress((self.dir / "chunks" / f"{n:05d}.json.gz").read_bytes()))

    def features(self, n: int, seqs: ChatSequences) -> list[torch.Tensor]:
        """Chunk n's entry features, from the cache or computed and cached (`topnar.compact`)."""
        if n in self._feats:
            return self._feats[n]
        path = self.dir / "feats" / f"{n:05d}.safetensors"
        if path.is_file():
            stored = load_file(str(path))
            feats = [stored[str(i)] for i in range(len(seqs))]
        else:
            feats = entry_features(self.model, seqs, progress=self.progress)
            save_file({str(i): f.contiguous() for i, f in enumerate(feats)}, str(path))
        self._feats = {k: v for k, v in self._feats.items() if k > n - self.cfg.window}
        self._feats[n] = feats
        return feats

    def eval_split(self, name: str) -> tuple[ChatSequences, list[torch.Tensor]]:
        """Greedy answers of an evaluation split's first `eval_prompts` prompts (made once), and features."""
        path = self.dir / "eval" / f"{name}.json.gz"
        if path.is_file():
            seqs = ChatSequences.load(path)
        else:
            chats = read_chat_prompts(self.eval_sets[name])[: self.cfg.eval_prompts]
            seqs = greedy_answers(
                self.model,
                self._encode(chats),
                self.cfg.eval_new_tokens,
                self.cfg.gen_batch_size,
                self.progress,
            )
            save_gz({"ids": seqs.ids, "prompt_lens": seqs.prompt_lens}, path)
        return seqs, entry_features(self.model, seqs, progress=False)

    # ---------------------------------------------------------------------------------------------
    # rounds

    def evaluate(self) -> dict[str, float]:
        return {
            name: round(held_out_tau(self.model, *self.eval_split(name))["tau"], 4) for name in self.eval_sets
        }

    def run_round(self, make_data: bool = True) -> dict:
        """One round (module docstring): a new chunk unless `make_data` is False, training, evaluation."""
        t0 = time.perf_counter()
        r = self.state["rounds"]
        if self.state["rounds"] == 0 and not (self.dir / "log.jsonl").is_file():
            self._log({"round": 0, "tokens_seen": 0, "distinct_prompts": 0, "tau": self.evaluate()})
        if make_data and self.state.get("data_round") != r:  # a round's chunk survives a kill
            self.add_chunk(self.make_chunk(seed=10_000 + 97 * r))
            self.state["data_round"] = r
            self._write_state()
        if self.state["chunks"] == 0:
            raise ValueError("no data: make a chunk or import sequences first")
        newest = self.state["chunks"] - 1
        numbers = list(range(max(0, newest - self.cfg.window + 1), newest + 1))
        ids, lens, feats, prompts = [], [], [], 0
        for n in numbers:
            c = self.chunk(n)
            seqs = ChatSequences(c["ids"], c["prompt_lens"])
            ids += seqs.ids
            lens += seqs.prompt_lens
            feats += self.features(n, seqs)
            prompts += c["prompts"]
        train = ChatSequences(ids, lens)
        held, held_feats = self.eval_split(self.calibration)
        tcfg = TopNARConfig(**{**asdict(self.cfg.train), "seed": self.cfg.train.seed + r})
        history = train_top_nar(
            self.model, train, feats, held, held_feats, tcfg, self.dir / "round", progress=self.progress
        )
        self.state["tokens_seen"] += history[-1]["answer_tokens_seen"]
        tau = self.evaluate()
        save_nar_folder(self.model, self.dir / "last.tmp", {"base": str(self.base)})
        replace_dir(self.dir / "last.tmp", self.dir / "last")
        best = self.state["best_calibration_tau"]
        if best is None or tau[self.calibration] > best:
            self.state["best_calibration_tau"] = tau[self.calibration]
            shutil.copytree(self.dir / "last", self.dir / "best.tmp")
            replace_dir(self.dir / "best.tmp", self.dir / "best")
        record = {
            "round": r + 1,
            "tokens_seen": self.state["tokens_seen"],
            "chunks": numbers,
            "distinct_prompts": prompts,
            "sequences": len(train),
            "loss": round(history[-1]["loss"], 4),
            "tau": tau,
            "minutes": round((time.perf_counter() - t0) / 60, 2),
        }
        self._log(record)
        shutil.rmtree(self.dir / "round")  # the round is done: the next starts its own checkpoints
        self.state["rounds"] = r + 1
        self._write_state()
        return record

    def _log(self, record: dict) -> None:
        record = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **record}
        log.info("round: %s", json.dumps(record))
        append_jsonl(self.dir / "log.jsonl", record)


def _recipe_of(folder: str | Path) -> TopNARRecipe:
    """The `TopNARRecipe` shape of a top-layer NAR folder (its config.json)."""
    cfg = json.loads((Path(folder) / "config.json").read_text())
    return TopNARRecipe(
        nar_layers=cfg["nar_layers"], block_size=cfg["block_size"], draft_vocab_size=cfg["draft_vocab_size"]
    )


def _eos(model: YueForCausalLM) -> int:
    eos = model.config.eos_token_id
    return eos if isinstance(eos, int) else eos[0]


def save_gz(obj: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(gzip.compress(json.dumps(obj).encode(), 6))
    tmp.replace(path)


def replace_dir(src: Path, dst: Path) -> None:
    """Swap a finished folder in (the old one is removed first; a kill between leaves `src` whole)."""
    if dst.exists():
        shutil.rmtree(dst)
    src.rename(dst)
