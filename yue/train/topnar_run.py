"""`yue distill-recipe --nar-layers N`: a top-layer NAR set and router for a Llama-family chat model, end to end.

The stages of `topnar.py` in order, each resumable from `out_dir/work/`: the greedy answers are saved
once generated, training checkpoints atomically at every evaluation, and a rerun of the same command
picks up where the last one stopped. The result is a model folder holding only what yue adds to the
base (NAR set, slot entry, drafting vocabulary, router; float16) plus its config and report: the AR set
stays the base's, read from its own files at load (`ar_source.json`).
"""

from __future__ import annotations

import json
import logging
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from accelerate import Accelerator
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer

from yue.chat import ChatTemplate, find_chat_template
from yue.decode.corpus import CorpusNgrams
from yue.jsonl import iter_jsonl
from yue.model.hf import NGRAMS_FILE, from_llama, is_nar_or_router, model_files
from yue.model.mot import YueForCausalLM
from yue.train.distill import load_llama
from yue.train.router import RouterTrainConfig, train_router
from yue.train.router_eval import evaluate_router
from yue.train.topnar import (
    ChatSequences,
    TopNARConfig,
    drafting_vocabulary,
    entry_features,
    greedy_answers,
    held_out_tau,
    router_examples,
    train_top_nar,
    vocabulary_coverage,
)
from yue.train.trainer import StageTimer, make_accelerator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopNARRecipe:
    """What `distill_top_nar` builds and how long it trains. Defaults: the shipped yue-smol."""

    nar_layers: int = 4  # top layers with a NAR set (docs/design.md §8: 2-4)
    block_size: int = 8  # K
    draft_vocab_size: int = 8192  # FR-Spec drafting vocabulary
    max_new_tokens: int = 256  # greedy answer length cap
    gen_batch_size: int = 32
    held_out: int = 64  # sequences kept out of training: tau and the router's labels
    train: TopNARConfig = field(default_factory=TopNARConfig)
    router: RouterTrainConfig = field(default_factory=RouterTrainConfig)

    def __post_init__(self) -> None:
        for name in ("nar_layers", "block_size", "draft_vocab_size", "max_new_tokens", "gen_batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.held_out < 2:
            raise ValueError(f"held_out must be >= 2, got {self.held_out}")


def read_chat_prompts(path: str | Path) -> list[list[dict]]:
    """JSONL of {"messages": [...]} (or {"prompt": text}, read as one user message)."""
    out = []
    for where, record in iter_jsonl(path):
        if isinstance(record, dict) and "messages" in record:
            out.append(record["messages"])
        elif isinstance(record, dict) and "prompt" in record:
            out.append([{"role": "user", "content": record["prompt"]}])
        else:
            raise ValueError(f"{where}: a record needs 'messages' or 'prompt'")
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def top_nar_base(base: str | Path) -> tuple[Path, dict]:
    """`yue distill-recipe --nar-layers`' base (a .gguf file, or a model name or folder whose AR set comes
    from one) -> (the converted Llama folder, the `ar_source.json` the new model will carry)."""
    from yue.model.gguf import convert_gguf, source_sha256
    from yue.registry import AR_SOURCE, resolve

    path = resolve(base)
    if path.is_file() and path.suffix.lower() == ".gguf":
        folder = convert_gguf(path)
        return folder, {"gguf_path": str(path.resolve()), "sha256": source_sha256(folder)}
    if (path / AR_SOURCE).is_file():
        files = model_files(path)
        return files.ar_dir, json.loads((path / AR_SOURCE).read_text())
    raise ValueError(
        f"base: {base} is neither a .gguf file nor a model whose AR set comes from one; a top-layer NAR "
        "set is stored apart from its AR set, which must come from a GGUF (convert a Llama folder to GGUF, "
        "or use `yue distill` without --nar-layers)"
    )


def build_model(base_dir: str | Path, recipe: TopNARRecipe) -> YueForCausalLM:
    """The base as the AR set, a NAR set on its top layers initialised as a copy of them, and a slot
    entry that starts as the identity on the anchor's hidden state."""
    llama = load_llama(base_dir)
    model = from_llama(
        llama,
        block_size=recipe.block_size,
        nar_layers=recipe.nar_layers,
        draft_vocab_size=recipe.draft_vocab_size,
    )
    with torch.no_grad():
        model.model.slot_entry.proj.weight.zero_()
        model.model.slot_entry.slot_embed.zero_()
        model.model.slot_entry.norm.weight.fill_(1.0)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def tokenize_chats(base_dir: str | Path, chats: list[list[dict]]) -> list[list[int]]:
    """Each conversation through the base's chat template (with the generation prompt), as token ids."""
    tok = Tokenizer.from_file(str(Path(base_dir) / "tokenizer.json"))
    template = ChatTemplate(find_chat_template(base_dir))
    return [tok.encode(template.render(m), add_special_tokens=False).ids for m in chats]


def load_nar_tensors(model: YueForCausalLM, folder: str | Path) -> None:
    """Load the NAR set, slot entry, drafting vocabulary and router of a top-layer yue folder into
    `model` (same shapes), or raise naming what does not fit."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted(Path(folder).glob("model*.safetensors")):
        tensors.update(load_file(str(file)))
    own = {k: v for k, v in model.state_dict().items() if is_nar_or_router(k)}
    if set(tensors) != set(own):
        raise ValueError(
            f"{folder}: its NAR tensors do not match this model's: {sorted(set(tensors) ^ set(own))[:5]}"
        )
    for k, v in own.items():
        if tensors[k].shape != v.shape:
            raise ValueError(
                f"{folder}: {k} has shape {tuple(tensors[k].shape)}, this model {tuple(v.shape)}"
            )
        with torch.no_grad():
            v.copy_(tensors[k].to(v.dtype))


def save_nar_folder(
    model: YueForCausalLM, out_dir: str | Path, ar_source: dict, max_shard_bytes: int | None = None
) -> Path:
    """Write what yue adds to the base: config.json, the NAR/router tensors (float16, ids as they are)
    in one or more `model*.safetensors` files, and `ar_source.json` naming where the AR set comes from."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.config.save_pretrained(str(out))
    state = {
        k: (v.half() if v.is_floating_point() else v).contiguous().cpu()
        for k, v in model.state_dict().items()
        if is_nar_or_router(k)
    }
    shards: list[dict] = [{}]
    for k, v in state.items():
        size = sum(t.numel() * t.element_size() for t in shards[-1].values())
        if max_shard_bytes and shards[-1] and size + v.numel() * v.element_size() > max_shard_bytes:
            shards.append({})
        shards[-1][k] = v
    for old in out.glob("model*.safetensors"):
        old.unlink()
    for i, shard in enumerate(shards):
        name = (
            "model.safetensors" if len(shards) == 1 else f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        )
        save_file(shard, str(out / name), metadata={"format": "pt"})
    (out / "ar_source.json").write_text(json.dumps(ar_source, indent=2) + "\n")
    return out


def distill_top_nar(
    base_dir: str | Path,
    chats: list[list[dict]],
    out_dir: str | Path,
    recipe: TopNARRecipe = TopNARRecipe(),
    ar_source: dict | None = None,
    device: str = "cpu",
    max_shard_bytes: int | None = None,
    progress: bool = True,
    init_from: str | Path | None = None,
    extra_sequences: Sequence[str | Path] = (),
) -> dict:
    """Base Llama folder + chat prompts -> a top-layer NAR model folder (see the module docstring).

    Args:
        init_from: a top-layer yue folder of the same shape whose NAR set, slot entry, drafting
            vocabulary and router training continues from (a further round, e.g. on new prompts).
        extra_sequences: `sequences.json` files of earlier rounds, trained on alongside this round's
            (the held-out split stays this round's own).
    Returns the report, also written to `out_dir/topnar_report.json`.

    Under `accelerate launch --num_processes N` the main process writes the greedy answers and the
    folder; every process computes the entry features and trains its share of each global batch.
    """
    accelerator = make_accelerator(cpu=device == "cpu")
    device = str(accelerator.device)  # under a launch: this process's GPU
    out, work = Path(out_dir), Path(out_dir) / "work"
    work.mkdir(parents=True, exist_ok=True)
    timer = StageTimer()
    model = build_model(base_dir, recipe).to(device)
    if init_from is not None:
        load_nar_tensors(model, init_from)
    # 1. Greedy answers (saved: generation is the costly part on a CPU).
    seqs = greedy_answers_once(model, base_dir, chats, recipe, work / "sequences.json", accelerator, progress)
    timer.mark("greedy_answers_s")
    train, held = seqs.split(recipe.held_out)
    for file in extra_sequences:
        more = ChatSequences.load(file)
        train = ChatSequences(train.ids + more.ids, train.prompt_lens + more.prompt_lens)
    # 2. Drafting vocabulary from the training answers, unless continuing a model's.
    if init_from is None:
        set_drafting_vocabulary(model, train, recipe.draft_vocab_size)
    vocab = model.draft_vocab.cpu()
    # 3. Entry features.
    timer.restart()
    train_feats = entry_features(model, train, progress=progress)
    held_feats = entry_features(model, held, progress=progress)
    timer.mark("features_s")
    # 4. Training, resumable.
    before = held_out_tau(model, held, held_feats)
    history = train_top_nar(
        model, train, train_feats, held, held_feats, recipe.train, work,
        progress=progress, accelerator=accelerator,
    )  # fmt: skip
    timer.mark("training_s")
    # 5. Router on held-out blocks.
    router_report = fit_router(model, held, held_feats, recipe)
    timer.mark("router_s")
    report = {
        **data_summary(recipe, chats, train, held, vocab),
        "held_out_before": before,
        "history": history,
        "router": router_report,
        "times_s": timer.marks,
        "wall_s": timer.total(),
        "hardware": hardware(device, accelerator.num_processes),
    }
    if accelerator.is_main_process:  # the same weights on every process: one writes them
        save_nar_folder(model, out, ar_source or {"base": str(base_dir)}, max_shard_bytes)
        # 6. The n-gram table of the training answers, for `verified`'s corpus drafts (seconds).
        report["ngrams"] = save_ngrams(model, train, out)
        (out / "topnar_report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def greedy_answers_once(
    model: YueForCausalLM,
    base_dir: str | Path,
    chats: list[list[dict]],
    recipe: TopNARRecipe,
    seq_file: Path,
    accelerator: Accelerator,
    progress: bool,
) -> ChatSequences:
    """The base's greedy answers to `chats`, generated once and kept in `seq_file`: the main process
    goes first; the others, and every rerun, read its file."""
    with accelerator.main_process_first():
        if seq_file.is_file():
            seqs = ChatSequences.load(seq_file)
            log.info("reusing %d greedy answers from %s", len(seqs), seq_file)
        else:
            prompts = tokenize_chats(base_dir, chats)
            seqs = greedy_answers(model, prompts, recipe.max_new_tokens, recipe.gen_batch_size, progress)
            seqs.save(seq_file)
    return seqs


def set_drafting_vocabulary(model: YueForCausalLM, train: ChatSequences, size: int) -> None:
    """The drafting vocabulary: the `size` tokens most frequent in the training answers, EOS always in."""
    eos = model.config.eos_token_id
    vocab = drafting_vocabulary(train, size, always=[eos] if isinstance(eos, int) else eos)
    model.draft_vocab.copy_(vocab.to(model.draft_vocab.device))


def fit_router(
    model: YueForCausalLM, held: ChatSequences, held_feats: torch.Tensor, recipe: TopNARRecipe
) -> dict:
    """Train the router on the held-out sequences' blocks; its report on its own held-out fifth of them."""
    examples = router_examples(model, held, held_feats)
    fit, check = examples.split_by_group(0.2, seed=recipe.train.seed)
    train_router(model.router, fit, recipe.router)
    return evaluate_router(model.router, check if len(check) else fit)


def data_summary(
    recipe: TopNARRecipe,
    chats: list[list[dict]],
    train: ChatSequences,
    held: ChatSequences,
    vocab: torch.Tensor,
) -> dict:
    """The report's opening: the recipe, the data's sizes, and the held-out answers' drafting-vocabulary
    coverage."""
    return {
        "recipe": asdict(recipe),
        "prompts": len(chats),
        "sequences": {"train": len(train), "held_out": len(held)},
        "answer_tokens": {"train": train.answer_tokens(), "held_out": held.answer_tokens()},
        "draft_vocab_coverage_held_out": vocabulary_coverage(held, vocab),
    }


def hardware(device: str, processes: int) -> dict:
    """What the stage ran on: the GPU's or CPU's name, torch's threads, the processes."""
    name = torch.cuda.get_device_name() if device.startswith("cuda") else platform.processor() or "cpu"
    return {"device": name, "threads": torch.get_num_threads(), "processes": processes}


def save_ngrams(model: YueForCausalLM, train: ChatSequences, out: Path) -> dict:
    """The n-gram table of the training answers (`NGRAMS_FILE` in `out`); returns its size."""
    ngrams = CorpusNgrams.build(train.pairs(), model.config.vocab_size)
    ngrams.save(out / NGRAMS_FILE, source=f"{len(train)} training answers of {out.name}")
    return {"entries": len(ngrams), "sequences": len(train)}
