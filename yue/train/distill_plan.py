"""`yue distill MODEL --hours H`'s choices: the NAR set's shape and the budget's split, from the model's
shape and the verifying-row costs measured on this machine (docs/design.md §8, §9).

Design decisions:
- Top layers (`nar_layers`): about one in eight of the model's layers, 1 to 4 (docs/design.md §8: a NAR
  set on the top 2-4 layers of SmolLM2's 30 trains on a CPU; more does not fit an hour), and never so
  many that a drafting pass's matmuls pass `DRAFT_SHARE` of an AR step's (counted in weights read).
- Drafting vocabulary (FR-Spec): the most frequent tokens of the model's own answers, as many as keep
  the slot rows' head at most `HEAD_LAYERS` layers' weights (SmolLM2: 8,192 of 49,152; a 262k
  vocabulary: 16,384), a power of two, at least 1,024, at most the vocabulary. The ids themselves are
  ranked after the data exists (`distill_run`), and their coverage of held-out answers is reported.
- Slots (`block_size` K): the K in 2..8 whose block is worth most per unit of cost, with the measured
  cost of verifying K rows (`decode.costs.verify_cost_curve`, a few seconds) plus an estimated drafting
  pass, and a per-slot acceptance of `TARGET_ACCEPTANCE` (what drafts are trained toward: docs/design.md
  §9's aim of tau 3 is about 0.7 a slot). On a CPU, where each verifying row costs ~0.3 of a step, this
  gives 4; where rows are almost free (a GPU) it gives 8. The router picks each step's length <= K.
- Held-out splits: as many prompts (6 to 64 each) as answering them greedily takes about
  `HELDOUT_SHARE` of the data share, at the answering rate measured on this machine.
- The budget: `SHARES` of the wall time for data (the model's answers: the costly part on a CPU),
  training, and calibration + the held-out report; each stage stops at its share (at least one unit of
  work each, so a tiny budget still finishes), and the time spent is kept across interruptions.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

DRAFT_SHARE = 0.25  # a drafting pass's weights at most this share of an AR step's
HEAD_LAYERS = 2.0  # the slot rows' head at most this many layers' weights
TARGET_ACCEPTANCE = 0.7  # per-slot acceptance the slot count is chosen for
SHARES = {"data": 0.45, "train": 0.40, "calibrate": 0.15}
HELDOUT_SHARE = 0.25  # of the data share, for the held-out splits' answers
HELDOUT_NEW_TOKENS = 128  # an evaluation answer's length (`CampaignConfig.eval_new_tokens`)
MAX_BLOCK = 8  # the cost curve measures 1..9 rows


@dataclass(frozen=True)
class DistillPlan:
    """What `yue distill` builds and how it spends the budget; `why` says how each was chosen."""

    nar_layers: int
    block_size: int
    draft_vocab_size: int
    heldout_prompts: int  # per held-out split (calibration, test)
    budget_s: float
    shares: dict[str, float]
    verify_ratios: list[float]  # a step feeding n rows over a 1-row step, n = 1..9 (measured, `monotone`)
    why: dict[str, str]

    def stage_budget(self, stage: str) -> float:
        """Seconds the stage may spend."""
        return self.budget_s * self.shares[stage]

    def to_dict(self) -> dict:
        return asdict(self)


def layer_weights(config) -> int:
    """Weights of one AR layer's matmuls (attention projections + MLP) of a YueConfig."""
    d, hd = config.hidden_size, config.head_dim
    attention = d * hd * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    return attention + 3 * d * config.intermediate_size


def choose_nar_layers(config, draft_vocab: int) -> tuple[int, str]:
    L, per_layer = config.num_hidden_layers, layer_weights(config)
    step = L * per_layer + config.vocab_size * config.hidden_size
    by_depth = min(4, max(1, round(L / 8)))
    by_cost = int((DRAFT_SHARE * step - draft_vocab * config.hidden_size) // per_layer)
    n = max(1, min(by_depth, by_cost, L - 1 if L > 1 else 1))
    why = (
        f"{n} of {L} layers: about one in eight, 1-4 ({by_depth}), drafting pass <= {DRAFT_SHARE:.0%} "
        f"of an AR step's weights ({max(by_cost, 0)} layers fit beside the drafting head; at least 1)"
    )
    return n, why


def choose_draft_vocab(config) -> tuple[int, str]:
    V, d = config.vocab_size, config.hidden_size
    cap = max(1024, HEAD_LAYERS * layer_weights(config) / d)
    size = 1 << (int(cap).bit_length() - 1)  # power of two <= cap
    size = min(V, size)
    why = f"{size:,} of {V:,} tokens: the slot head <= {HEAD_LAYERS:g} layers' weights (FR-Spec)"
    return size, why


def draft_pass_ratio(config, nar_layers: int, draft_vocab: int, rows_ratio: float) -> float:
    """Estimated drafting pass over K slots, in AR steps: the share of a step's weights it reads (NAR
    layers + the drafting head) times the measured cost of a K-row step."""
    per_layer = layer_weights(config)
    step = config.num_hidden_layers * per_layer + config.vocab_size * config.hidden_size
    return (nar_layers * per_layer + draft_vocab * config.hidden_size) / step * rows_ratio


def choose_block_size(
    config, ratios: list[float], nar_layers: int, draft_vocab: int, p: float = TARGET_ACCEPTANCE
) -> tuple[int, str]:
    """K maximising expected tokens per verifying step over its cost (see the module docstring).

    Args:
        ratios: measured step cost over a 1-row step for 1..9 fed rows.
    """
    best, best_value = 2, 0.0
    for K in range(2, min(MAX_BLOCK, len(ratios) - 1) + 1):
        drafts = K - 1  # slot 1 is the AR path's own token
        tokens = sum(p**i for i in range(drafts + 1))  # 1 + p + ... + p^drafts
        cost = ratios[drafts] + draft_pass_ratio(config, nar_layers, draft_vocab, ratios[K - 1])
        if tokens / cost > best_value:
            best, best_value = K, tokens / cost
    why = (
        f"K = {best}: most tokens per unit cost at {p:g} acceptance a slot, verifying "
        f"{best} rows measured at {ratios[best - 1]:.2f}x a 1-row step"
    )
    return best, why


def monotone(ratios: list[float]) -> list[float]:
    """The cost curve made non-decreasing from the right (n rows cost at most what n + 1 rows do): one
    slow timing on a busy machine then does not make a row count look dearer than longer ones."""
    out = list(ratios)
    for i in range(len(out) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


def make_plan(config, ratios: list[float], hours: float, answer_tok_s: float) -> DistillPlan:
    """The plan for an AR set of `config`'s shape, the measured row costs, and a budget of `hours`.

    Args:
        answer_tok_s: measured greedy tokens/s of one unbatched answer (the held-out splits are sized to
            take about `HELDOUT_SHARE` of the data share at that rate: a lower bound, batches run faster).
    """
    if not hours > 0:
        raise ValueError(f"hours must be > 0, got {hours}")
    vocab, why_vocab = choose_draft_vocab(config)
    layers, why_layers = choose_nar_layers(config, vocab)
    ratios = monotone(ratios)
    block, why_block = choose_block_size(config, ratios, layers, vocab)
    seconds = HELDOUT_SHARE * SHARES["data"] * hours * 3600.0
    heldout = int(min(64, max(6, seconds * answer_tok_s / (2 * HELDOUT_NEW_TOKENS))))
    return DistillPlan(
        nar_layers=layers,
        block_size=block,
        draft_vocab_size=vocab,
        heldout_prompts=heldout,
        budget_s=hours * 3600.0,
        shares=dict(SHARES),
        verify_ratios=[round(r, 4) for r in ratios],
        why={
            "nar_layers": why_layers,
            "block_size": why_block,
            "draft_vocab_size": why_vocab,
            "heldout_prompts": f"{heldout} prompts per held-out split (6-64): their answers about "
            f"{HELDOUT_SHARE:.0%} of the data share at {answer_tok_s:.1f} tok/s measured",
            "shares": ", ".join(f"{k} {v:.0%}" for k, v in SHARES.items()),
        },
    )
