"""How each bench entry is run and timed: ours through the public Engine API, the peers through
Hugging Face `generate` on our AR set as its family's transformers model: a yue folder's exported to
`LlamaForCausalLM`; a model that is an AR set alone (a family's folder, a converted GGUF: Gemma 3, Qwen)
that folder itself, loaded by `AutoModelForCausalLM`.

Design decisions:
- A runner takes a batch of (prompt index, Prompt) and returns one `Sample`: the rows it wrote and
  the call's wall time, time to first token, forward count and accept lengths.
- Timing is wall clock around the public call (`Engine.stream` / `Engine.generate` for a batch,
  `LlamaForCausalLM.generate`). Time to first token runs from that call to the first generated token:
  for ours the first streamed event carrying tokens (a batch: the engine's own `ttft_s`), for the
  peers the first `put` after the prompt to a streamer that only records timestamps.
- Peers are counted by a forward pre-hook on the Llama; pairing each forward's input length (drafts
  fed after the uncached committed token) with the streamer's chunk (accepted drafts + the model's
  own token) gives prompt lookup's accept lengths without touching transformers' internals.
- Both sides stop at <|eos|>; the EOS token itself is not counted as generated.
- Sampling is one `Sampling` for every runner: temperature 0 is greedy everywhere; above it each side
  samples from softmax(logits / temperature) cut to the nucleus top_p, with no top-k (transformers'
  generation config and llama.cpp's defaults would add one) and prompt i's draw seeded with seed + i
  (ours: the request's generator; transformers: torch's global one; llama.cpp: its sampler's seed), so
  the same seed gives the same outputs run after run. llama.cpp cuts the nucleus before dividing by the
  temperature, transformers and ours after: the same at top_p 1.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

LOOKUP_TOKENS = 10  # prompt_lookup_num_tokens of the hf-prompt-lookup peer


@dataclass(frozen=True)
class Sampling:
    """How every bench entry and peer picks its tokens. Validated here (ValueError naming the field).

    Attributes:
        temperature: 0 = greedy; else softmax(logits / temperature), in (0, 2] (`DecodeConfig`'s range).
        top_p: nucleus mass in (0, 1]; 1 = off.
        seed: prompt i's draw is seeded with seed + i on every side.
    """

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def describe(self) -> str:
        if self.greedy:
            return "greedy (temperature 0)"
        return f"temperature {self.temperature:g}, top_p {self.top_p:g}, prompt i seeded with {self.seed} + i"


@dataclass(frozen=True)
class Prompt:
    """A bench prompt: its text, the true continuation (optional), and the ids `Engine.encode` gives."""

    text: str
    reference: str | None
    ids: list[int]


@dataclass
class Sample:
    """One timed call: rows[i] = (prompt index, generated tokens, text); counters for the call;
    token_sources: its rows' tokens by the source that wrote them (`GenerationStats.token_sources`;
    None for a peer)."""

    rows: list[tuple[int, list[int], str]]
    wall_s: float
    ttft_s: float | None
    forwards: int
    accept_lengths: list[int]
    token_sources: dict[str, int] | None = None

    @property
    def new_tokens(self) -> int:
        return sum(len(t) for _, t, _ in self.rows)


class OurRunner:
    """Runs one entry through the public Engine API."""

    def __init__(
        self,
        engine,
        mode: str,
        threshold: float | None,
        max_new_tokens: int,
        drafting: str = "separate",
        sampling: Sampling = Sampling(),
    ) -> None:
        self.engine, self.sampling = engine, sampling
        self.kw = dict(
            mode=mode,
            router_threshold=threshold,
            max_new_tokens=max_new_tokens,
            drafting=drafting,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
        )

    def __call__(self, batch: list[tuple[int, Prompt]]) -> Sample:
        seed = self.sampling.seed + batch[0][0]  # a batch: row b seeded with seed + b (`Engine.generate`)
        if len(batch) > 1:
            t0 = time.perf_counter()
            results = self.engine.generate([p.text for _, p in batch], seed=seed, **self.kw)
            wall = time.perf_counter() - t0
            rows = [(i, r.token_ids, r.text) for (i, _), r in zip(batch, results, strict=True)]
            # The batch ran as many forwards as its longest-running row took part in; rows keep their own
            # acceptance (no lockstep minimum), so every row's accept lengths count.
            forwards = max(r.stats.forwards for r in results)
            lengths = [a for r in results for a in r.stats.accept_lengths]
            written = Counter()
            for r in results:
                written.update(r.stats.token_sources)
            return Sample(rows, wall, results[0].stats.ttft_s, forwards, lengths, dict(written))
        (i, p), ttft, tokens, parts, stats = batch[0], None, [], [], None
        t0 = time.perf_counter()
        for ev in self.engine.stream(p.text, seed=seed, **self.kw):
            if ttft is None and ev.token_ids:
                ttft = time.perf_counter() - t0
            tokens += ev.token_ids
            parts.append(ev.delta)
            stats = ev.stats or stats
        wall = time.perf_counter() - t0
        row = (i, tokens, "".join(parts))
        return Sample(
            [row], wall, ttft, stats.forwards, list(stats.accept_lengths), dict(stats.token_sources)
        )


class Recorder:
    """A transformers streamer that only timestamps chunks, plus a forward pre-hook counting inputs."""

    def __init__(self) -> None:
        self.puts: list[tuple[float, int]] = []  # (time, tokens in chunk); the first chunk is the prompt
        self.inputs: list[int] = []  # input length of every forward

    def put(self, value: torch.Tensor) -> None:
        self.puts.append((time.perf_counter(), value.numel()))

    def end(self) -> None:
        pass

    def hook(self, module, args, kwargs) -> None:
        ids = kwargs.get("input_ids") if kwargs.get("input_ids") is not None else args[0]
        self.inputs.append(ids.shape[-1])


class HFRunner:
    """Runs a Hugging Face `generate` peer (plain, or with prompt lookup) on the AR set's transformers
    model (`load_peers`), greedy or sampled as `sampling` says."""

    def __init__(
        self,
        llama,
        recorder: Recorder,
        tokenizer,
        lookup: bool,
        max_new_tokens: int,
        sampling: Sampling = Sampling(),
    ) -> None:
        self.llama, self.rec, self.tok, self.sampling = llama, recorder, tokenizer, sampling
        self.eos = llama.generation_config.eos_token_id
        self.kw = dict(
            max_new_tokens=max_new_tokens,
            do_sample=not sampling.greedy,
            eos_token_id=self.eos,
            pad_token_id=llama.generation_config.pad_token_id,
        )
        if not sampling.greedy:  # no top-k: the model's generation config may carry one
            self.kw.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        if lookup:
            self.kw["prompt_lookup_num_tokens"] = LOOKUP_TOKENS

    def __call__(self, batch: list[tuple[int, Prompt]]) -> Sample:
        (i, p), rec = batch[0], self.rec
        assert len(batch) == 1, "peers run at batch 1"
        ids = torch.tensor([p.ids], device=self.llama.device)
        rec.puts.clear(), rec.inputs.clear()
        torch.manual_seed(self.sampling.seed + i)  # transformers samples from torch's global generator
        t0 = time.perf_counter()
        out = self.llama.generate(ids, attention_mask=torch.ones_like(ids), streamer=rec, **self.kw)
        wall = time.perf_counter() - t0
        tokens = out[0, ids.shape[1] :].tolist()
        if self.eos in tokens:
            tokens = tokens[: tokens.index(self.eos)]
        ttft = rec.puts[1][0] - t0 if len(rec.puts) > 1 else None
        # Step j's forward fed the drafts of that step after its uncached committed token(s); the
        # streamer's chunk j + 1 holds the accepted drafts plus the model's own token.
        accepted = []
        if len(rec.inputs) == len(rec.puts) - 1:
            for j, (n_in, (_, n_out)) in enumerate(zip(rec.inputs, rec.puts[1:], strict=True)):
                if n_in - (len(p.ids) if j == 0 else 1) > 0:
                    accepted.append(n_out - 1)
        text = self.tok.decode(tokens)
        return Sample([(i, tokens, text)], wall, ttft, len(rec.inputs), accepted)


def load_peers(
    model: str | Path | None, device: str, tmp: str, dtype: torch.dtype = torch.float32
) -> tuple[torch.nn.Module, Recorder, Path]:
    """The transformers model of `model`'s AR set (a name or path, as `yue.load` takes it) in `dtype`,
    with the recorder's forward hook attached, and the folder it was loaded from.

    A model that is an AR set alone (a family's transformers folder, a GGUF converted to one) is that folder,
    loaded as its family's class. A yue folder's AR set is exported as stored to `tmp` as a
    `LlamaForCausalLM` (not an engine's: a model prepared for decoding may hold its layers only packed).
    """
    from transformers import AutoModelForCausalLM

    from yue.engine import load_unprepared
    from yue.model.hf import export_ar, model_files
    from yue.registry import resolve

    files = model_files(resolve(model))
    if files.yue_dir is None and files.ar_dir is not None:
        folder = files.ar_dir
    elif files.yue_dir is None:  # a GGUF alone: transformers reads the folder it converts to
        from yue.model.gguf import convert_gguf

        folder = convert_gguf(files.gguf)
    else:
        folder = export_ar(load_unprepared(model)[0], tmp)
    peer = AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype).to(device).eval()
    rec = Recorder()
    peer.register_forward_pre_hook(rec.hook, with_kwargs=True)
    return peer, rec, Path(folder)
