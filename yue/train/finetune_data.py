"""Fine-tuning data: a user's file -> one token stream with a loss mask, cut into seeded windows.

Design decisions:
- Three inputs: a plain text file (or a folder of sources, as `data.read_corpus` reads it), JSONL of
  `{"text": ...}`, and chat JSONL of `{"messages": [{"role", "content"}, ...]}` (the two JSONL kinds
  may mix). Text is trained on every token; a chat on its assistant turns only.
- A chat is rendered with the model's chat template (`yue.chat`, the one the server prompts with).
  Assistant turn j spans the characters between the rendering of messages[:j] with the generation
  prompt (where the reply begins) and the rendering of messages[:j+1] without it; a template whose
  renderings are not prefixes of one another cannot be split this way and is a ValueError.
- Each document is `[<|eos|>] + its tokens`, as the engine prompts (`Engine.encode`) and as training
  packs documents; documents are concatenated into one stream. A chat ending on an assistant turn
  also learns the `<|eos|>` that follows it, so the model learns to stop.
- Batches are windows at seeded random offsets: the batch of step s is a pure function of (seed, s),
  so a resumed run replays exactly the batches an uninterrupted one would (as `train.loop` does).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from yue.chat import ChatTemplate
from yue.jsonl import iter_jsonl
from yue.tokenizer import YueTokenizer


@dataclass(frozen=True)
class Document:
    """One training document: its text and the character spans that carry loss (None = all)."""

    text: str
    spans: tuple[tuple[int, int], ...] | None = None  # assistant turns of a chat, [start, end)
    ends_on_target: bool = True  # the <|eos|> after it carries loss (text; a chat ending on a reply)


def chat_document(messages: list[dict], template: ChatTemplate, where: str) -> Document:
    """Render a chat and locate its assistant turns (see the module docstring)."""
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise ValueError(f'{where}: "messages" must be a list of {{"role": str, "content": str}}')
    if not any(m["role"] == "assistant" for m in messages):
        raise ValueError(f"{where}: the chat has no assistant turn to learn")

    def render(msgs: list[dict], generation_prompt: bool) -> str:
        return template.template.render(
            messages=msgs, add_generation_prompt=generation_prompt, bos_token="", eos_token=""
        )

    full = render(messages, False)
    spans = []
    for j, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        start_text, end_text = render(messages[:j], True), render(messages[: j + 1], False)
        if not (end_text.startswith(start_text) and full.startswith(end_text)):
            raise ValueError(f"{where}: the chat template's renderings are not prefixes of one another")
        spans.append((len(start_text), len(end_text)))
    return Document(full, tuple(spans), ends_on_target=messages[-1]["role"] == "assistant")


def read_finetune_data(path: str | Path, template: ChatTemplate) -> list[Document]:
    """Documents of a text file, a folder of sources, or (chat) JSONL. Errors name the line.

    Raises:
        ValueError: a missing or empty file, a malformed line.
    """
    from yue.train.data import read_corpus

    path = Path(path)
    if path.suffix != ".jsonl" or not path.is_file():
        return [Document(d.text) for d in read_corpus(path)]
    docs = []
    for where, obj in iter_jsonl(path):
        if isinstance(obj, dict) and isinstance(obj.get("text"), str):
            if obj["text"].strip():
                docs.append(Document(obj["text"]))
        elif isinstance(obj, dict) and "messages" in obj:
            docs.append(chat_document(obj["messages"], template, where))
        else:
            raise ValueError(f'{where}: expected {{"text": str}} or {{"messages": [...]}}')
    if not docs:
        raise ValueError(f"{path} holds no text to fine-tune on")
    return docs


@dataclass(frozen=True)
class TokenStream:
    """Documents packed into one stream. tokens (N,) long; target (N,) bool: token j carries loss."""

    tokens: torch.Tensor
    target: torch.Tensor
    documents: list[list[int]]  # each document's own token ids (no separator): prompts are cut from them

    @classmethod
    def build(cls, docs: list[Document], tokenizer: YueTokenizer) -> TokenStream:
        tokens: list[int] = []
        target: list[bool] = []
        documents = []
        previous_ends = False
        for doc in docs:
            enc = tokenizer.tokenizer.encode(doc.text, add_special_tokens=False)
            if doc.spans is None:
                on = [True] * len(enc.ids)
            else:  # a token carries loss when it starts inside an assistant span
                on = [any(a <= s < b for a, b in doc.spans) for s, _ in enc.offsets]
            # The separator before this document is the previous one's end: it learns to stop there.
            tokens.append(tokenizer.eos_id)
            target.append(previous_ends)
            tokens += enc.ids
            target += on
            documents.append(list(enc.ids))
            previous_ends = doc.ends_on_target
        tokens.append(tokenizer.eos_id)  # the last document's end
        target.append(previous_ends)
        if len(tokens) < 2 or not any(target):
            raise ValueError("the fine-tuning data has no tokens to learn")
        return cls(torch.tensor(tokens), torch.tensor(target), documents)

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, step: int, batch_size: int, seq_len: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Step `step`'s windows: (x, target), each (B, T) with T = min(seq_len, len(stream))."""
        T = min(seq_len, len(self))
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(0, len(self) - T + 1, (batch_size,), generator=g)
        idx = starts[:, None] + torch.arange(T)
        return self.tokens[idx], self.target[idx]

    def eval_windows(self, seq_len: int, max_windows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
        """Fixed windows tiling the stream from the start (the last one ends at the stream's end)."""
        T = min(seq_len, len(self))
        starts = list(range(0, len(self) - T + 1, T))[:max_windows]
        if starts[-1] + T < len(self) and len(starts) < max_windows:
            starts.append(len(self) - T)
        idx = torch.tensor(starts)[:, None] + torch.arange(T)
        return self.tokens[idx], self.target[idx]
