"""`yue distill`'s data: the model's own answers to prompts it is given, in the layout of a `rounds.Rounds` folder.

Design decisions:
- An instruct model (its tokenizer brings a chat template) answers everyday chat requests through that
  template, exactly as `rounds.Rounds.make_chunk` makes them (templates, long forms, requests the
  model writes itself, follow-up turns; greedy and sampled). A base model (no template) continues text:
  passages of the Python documentation on disk (pydoc topics' sections, as `prompts.py` cuts them) and
  windows of the standard library's source code, cut part-way; greedy and sampled continuations.
- Held-out splits are the model's own too: a calibration split (router, free-draft rates, choosing the
  best round) and a test split (the report), never trained on. Chat splits are everyday requests the
  training chunks refuse by content hash (the rounds folder's `seen`); text splits come from other files and
  packages than the training text (split by a hash of the package or pydoc section).
- Prompts are encoded as `Engine.encode` does (`YueTokenizer.encode_prompt`: BOS where the tokenizer
  adds one), and a template is rendered with the tokenizer's BOS/EOS strings, so the answers are the
  ones users get.
- `DistillRounds` is a `Rounds` (its state file, chunks, cached features, resumable rounds, last/
  and best/ folders) that makes continuation chunks for a base model and keeps its evaluation splits'
  features in memory (`Rounds` recomputes them each round; a distill budget is too short for that).
"""

from __future__ import annotations

import functools
import random
from pathlib import Path

import torch

from yue.engine import model_tokenizer
from yue.jsonl import iter_jsonl
from yue.train.data import EXCLUDED_DIR_NAMES, is_test_path, stdlib_root
from yue.train.everyday import everyday_prompts
from yue.train.rounds import Rounds, RoundsConfig, save_gz
from yue.train.selfinstruct import content_hash
from yue.train.stdlib_docs import stable_int, topic_items
from yue.train.topnar import ChatSequences, entry_features, greedy_answers

SPLITS = ("train", "calibration", "test")
CODE_LINES = 24  # a source window
CODE_FILES = 1200  # source files read a split (of ~13k in a Lib/)
CUT_MIN_CHARS, CUT_MAX_CHARS = 120, 480  # where a text is cut for the model to continue


def text_split(key: str) -> str:
    """train / calibration / test (80/10/10) of a split key (package or pydoc section), by sha256."""
    r = stable_int("yue-distill-split:" + key) % 10
    return "test" if r == 0 else "calibration" if r == 1 else "train"


def _cut(text: str) -> str:
    """The first part of a text, ending at a space or line end, for the model to continue."""
    limit = min(CUT_MAX_CHARS, max(CUT_MIN_CHARS, len(text) // 2))
    head = text[:limit]
    cut = max(head.rfind("\n"), head.rfind(" "))
    return head[: cut if cut >= CUT_MIN_CHARS // 2 else limit]


@functools.cache
def text_pool(split: str) -> tuple[str, ...]:
    """Texts to continue, of one split: documentation passages (pydoc topics' sections) and source
    windows (at most `CODE_FILES` files a split) alternating, in a fixed shuffled order (the same on
    every machine). Seconds, not the minute a parse of every docstring takes on two cores."""
    from pydoc_data.topics import topics  # a data module: a dict of str, no side effects

    prose = [_cut(it.doc) for it in topic_items(topics) if text_split(it.key) == split]
    rng = random.Random(split)
    root = stdlib_root()
    files = [
        p
        for p in sorted(root.glob("**/*.py"))
        if text_split(p.relative_to(root).parts[0].removesuffix(".py")) == split
        and not is_test_path(p.relative_to(root))
        and not set(p.relative_to(root).parts) & EXCLUDED_DIR_NAMES
    ]
    rng.shuffle(files)
    code = []
    for path in files[:CODE_FILES]:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        starts = [i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "class "))]
        for i in starts[:: max(1, len(starts) // 6)][:6]:  # a few windows a file
            window = "\n".join(lines[i : i + CODE_LINES])
            if len(window) >= 2 * CUT_MIN_CHARS:
                code.append(_cut(window))
    prose = [t for t in prose if len(t) >= CUT_MIN_CHARS // 2]
    rng.shuffle(prose)
    rng.shuffle(code)
    mixed = [t for pair in zip(prose, code, strict=False) for t in pair]
    longer = prose if len(prose) > len(code) else code
    return tuple(mixed + longer[min(len(prose), len(code)) :])


def heldout_prompts(instruct: bool, n: int, seed: int = 0) -> dict[str, list[str]]:
    """The calibration and test splits' prompt texts: chat requests (one user turn) or texts to continue."""
    if instruct:
        chats = everyday_prompts(2 * n, seed=seed + 424_242, strict=False)
        texts = [c[0]["content"] for c in chats]
        return {"calibration": texts[0::2], "test": texts[1::2]}
    return {split: list(text_pool(split)[:n]) for split in ("calibration", "test")}


def write_prompt_set(texts: list[str], path: Path) -> None:
    """A JSONL of one-turn chats (the rounds' evaluation-set format; a base model continues `content`)."""
    import json

    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps({"messages": [{"role": "user", "content": t}]}) + "\n" for t in texts))
    tmp.replace(path)


class DistillRounds(Rounds):
    """A `Rounds` for `yue distill` (module docstring)."""

    def __init__(
        self,
        folder: str | Path,
        base_dir: str | Path,
        init_from: str | Path,
        eval_sets: dict[str, Path],
        instruct: bool,
        cfg: RoundsConfig,
        device: str = "cpu",
        progress: bool = True,
    ) -> None:
        self.instruct = instruct
        super().__init__(folder, base_dir, init_from, eval_sets, "calibration", cfg, device, progress)
        self.tokenizer = model_tokenizer(
            self.base, self.model.config
        )  # prompts as `Engine.encode` makes them
        self._eval: dict[str, tuple[ChatSequences, list[torch.Tensor]]] = {}

    def _encode(self, chats: list[list[dict]]) -> list[list[int]]:
        tok = self.tokenizer
        bos, eos = (tok.tokenizer.id_to_token(i) if i is not None else "" for i in (tok.bos_id, tok.eos_id))
        if not self.instruct:  # a base model continues the text as written, in half its context at most
            cap = self.model.config.max_position_embeddings // 2
            return [tok.encode_prompt(m[-1]["content"])[:cap] for m in chats]
        return [tok.encode_prompt(self.template.render(m, bos_token=bos, eos_token=eos)) for m in chats]

    def make_chunk(self, seed: int) -> dict:
        if self.instruct:
            return super().make_chunk(seed)
        return self._continuation_chunk(seed)

    def _continuation_chunk(self, seed: int) -> dict:
        """`chunk_prompts` unseen training texts continued greedily and at each sampling temperature."""
        pool, start = text_pool("train"), self.state.get("text_offset", 0)
        texts, end = [], start
        while len(texts) < self.cfg.chunk_prompts and end < len(pool):
            if content_hash(pool[end]) not in self.seen:
                texts.append(pool[end])
            end += 1
        if not texts:
            raise ValueError(f"the training texts ran out after {len(pool)} ({start} used)")
        self.state["text_offset"] = end
        prompts = self._encode([[{"role": "user", "content": t}] for t in texts])
        ids, lens = [], []
        for j, t in enumerate((0.0, *self.cfg.temperatures)):
            out = greedy_answers(
                self.model, prompts, self.cfg.max_new_tokens, self.cfg.gen_batch_size, self.progress,
                t, self.cfg.top_p, seed + 7919 * j,
            )  # fmt: skip
            ids += out.ids
            lens += out.prompt_lens
        keep = list({tuple(x): i for i, x in reversed(list(enumerate(ids)))}.values())[::-1]  # once each
        return {
            "ids": [ids[i] for i in keep],
            "prompt_lens": [lens[i] for i in keep],
            "kinds": ["continuation"] * len(keep),
            "prompts": len(texts),
            "hashes": [content_hash(t) for t in texts],
        }

    def eval_split(self, name: str) -> tuple[ChatSequences, list[torch.Tensor]]:
        """The split's greedy answers (made once, saved) and their entry features (kept in memory)."""
        if name not in self._eval:
            path = self.dir / "eval" / f"{name}.json.gz"
            if path.is_file():
                seqs = ChatSequences.load(path)
            else:
                chats = [r["messages"] for _, r in iter_jsonl(self.eval_sets[name])]
                seqs = greedy_answers(
                    self.model, self._encode(chats), self.cfg.eval_new_tokens, self.cfg.gen_batch_size,
                    self.progress,
                )  # fmt: skip
                save_gz({"ids": seqs.ids, "prompt_lens": seqs.prompt_lens}, path)
            self._eval[name] = (seqs, entry_features(self.model, seqs, progress=False))
        return self._eval[name]

    def train_answers(self) -> ChatSequences:
        """Every training chunk's sequences."""
        ids, lens = [], []
        for n in range(self.state["chunks"]):
            c = self.chunk(n)
            ids += c["ids"]
            lens += c["prompt_lens"]
        return ChatSequences(ids, lens)
