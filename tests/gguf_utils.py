"""A tiny random Llama written as a GGUF file, as llama.cpp's converter writes one (test helper).

`write_tiny_llama_gguf(path)` writes a 2-layer Llama with grouped-query attention, tied embeddings,
a gpt2-style byte-level BPE tokenizer (ChatML control tokens, as SmolLM2's) and a ChatML chat
template in its metadata. Q and K rows are permuted the way llama.cpp's `convert_hf_to_gguf.py`
permutes them, and weights may be quantized (Q4_1, Q8_0), so a reader must undo both to get the
values back. The returned `TinyGGUF` holds the values a correct reader must produce (the dequantized
weights under `LlamaForCausalLM`'s names) and the LlamaConfig to build the reference model from.

Used by the GGUF loading tests and by the bench's llama.cpp peer test (the same file runs there).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

# SmolLM2's control tokens and chat template (its GGUF's, verbatim), so chat tests read like the real model.
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2: unk, bos, eos (= pad)
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
CORPUS = [
    "The sea is calm tonight. Write a haiku about the sea and the moon.",
    "def add(a, b):\n    return a + b\n",
    "Hello, world! How are you today? I am fine, thank you.",
    "system user assistant: You are a helpful assistant.",
]

QUANT_TYPES = {
    "F32": gguf.GGMLQuantizationType.F32,
    "Q8_0": gguf.GGMLQuantizationType.Q8_0,
    "Q4_1": gguf.GGMLQuantizationType.Q4_1,
    "Q4_K": gguf.GGMLQuantizationType.Q4_K,
}
# "Q4_K_M": llama.cpp's mix (Q4_K matrices, Q6_K V and down): rows and columns a multiple of 256.
Q6_K_PARTS = ("attn_v", "ffn_down")


@dataclass
class TinyGGUF:
    """A written tiny GGUF and what a faithful reader must get back from it.

    Attributes:
        path: the .gguf file.
        config: the LlamaConfig of the model it holds.
        state_dict: float32 values under LlamaForCausalLM's names (Q/K un-permuted, dequantized).
        tokenizer: the byte-level BPE whose vocabulary and merges the file stores.
        chat_template: the template in its metadata.
    """

    path: Path
    config: LlamaConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: Tokenizer
    chat_template: str

    def reference_model(self) -> LlamaForCausalLM:
        """transformers' LlamaForCausalLM holding exactly `state_dict` (eager attention, eval mode)."""
        model = LlamaForCausalLM(self.config).eval()
        missing, unexpected = model.load_state_dict(self.state_dict, strict=False)
        assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
        model.tie_weights()
        return model


def tiny_tokenizer(vocab_size: int = 320) -> Tokenizer:
    """A gpt2-style byte-level BPE trained on a few sentences (deterministic): control tokens first."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=CONTROL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer=trainer)
    return tok


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py): HF's rotate-half row order -> GGML's
    interleaved pairs, per head. (out, in) -> (out, in)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# Byte ranges of a K-quant super-block holding float16 scales (d, and dmin for Q4_K), set to small values
# so that random code bytes make finite weights (gguf-py dequantizes K-quants but does not quantize them).
K_SCALES = {gguf.GGMLQuantizationType.Q4_K: (0, 4), gguf.GGMLQuantizationType.Q6_K: (208, 210)}


def random_k_blocks(rows: int, cols: int, qtype: gguf.GGMLQuantizationType, rng) -> np.ndarray:
    """(rows, bytes) random K-quant blocks whose float16 scales are small and finite."""
    elems, size = gguf.GGML_QUANT_SIZES[qtype]
    data = rng.integers(0, 256, size=(rows, cols // elems, size), dtype=np.uint8)
    a, b = K_SCALES[qtype]
    data[:, :, a:b] = np.frombuffer(np.full((b - a) // 2, 0.0004, np.float16).tobytes(), np.uint8)
    return data.reshape(rows, -1)


def _stored(w: np.ndarray, qtype: gguf.GGMLQuantizationType, rng=None) -> tuple[np.ndarray, np.ndarray]:
    """(bytes or floats to write, the float32 values a reader recovers from them); K-quants are random
    blocks (`random_k_blocks`), not `w` quantized."""
    if qtype == gguf.GGMLQuantizationType.F32:
        return w, w
    if qtype in K_SCALES:
        data = random_k_blocks(*w.shape, qtype, rng)
        return data, gguf.quants.dequantize(data, qtype).reshape(w.shape).astype(np.float32)
    data = gguf.quants.quantize(w, qtype)
    return data, gguf.quants.dequantize(data, qtype).reshape(w.shape).astype(np.float32)


def write_tiny_llama_gguf(
    path: str | Path,
    *,
    seed: int = 0,
    quant: str = "Q4_1",
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int = 128,
    tie_word_embeddings: bool = True,
    add_bos_token: bool = False,
    chat_template: str = CHATML_TEMPLATE,
    tokenizer_pre: str = "smollm",
    extra_tokens: tuple[tuple[str, int], ...] = (),
    sort_tensors: bool = False,
) -> TinyGGUF:
    """Write a tiny random Llama GGUF to `path` (a few hundred KB; well under a second).

    Args:
        quant: matmul weights' storage: "F32", "Q8_0", "Q4_1", or "Q4_K_M" (Q4_K, with V and down in
            Q6_K, random blocks; sizes a multiple of 256) (the embedding stays Q8_0 as in SmolLM2's
            file, norms F32); rows must be a multiple of 32 for the block types.
        add_bos_token: the tokenizer flag llama.cpp and transformers read to prefix BOS.
        tokenizer_pre: `tokenizer.ggml.pre` (which split regex the vocabulary's merges were learned on).
        extra_tokens: (token, llama.cpp token type) pairs appended to the vocabulary.
        sort_tensors: write the tensors in name order (the same values as unsorted): a layer's ffn_norm
            then lies between its ffn_gate and ffn_up, which are no longer neighbours in the file.
    """
    path = Path(path)
    tok = tiny_tokenizer()
    vocab = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    token_types = [3 if t in CONTROL_TOKENS else 1 for t in vocab]  # 3 CONTROL, 1 NORMAL
    vocab += [t for t, _ in extra_tokens]
    token_types += [k for _, k in extra_tokens]
    head_dim = hidden // heads
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    rng = np.random.default_rng(seed)

    def randn(*shape: int, scale: float = 0.08) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    matmul_type = QUANT_TYPES["Q4_K" if quant == "Q4_K_M" else quant]
    f32 = gguf.GGMLQuantizationType.F32
    # (gguf name, HF name, values in HF layout, GGML storage type, heads to permute by or None)
    q8 = gguf.GGMLQuantizationType.Q8_0
    entries = [
        ("token_embd.weight", "model.embed_tokens.weight", randn(len(vocab), hidden, scale=0.5), q8, None)
    ]
    for i in range(layers):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        entries += [
            (b + "attn_norm.weight", h + "input_layernorm.weight", 1 + randn(hidden), f32, None),
            (
                b + "attn_q.weight",
                h + "self_attn.q_proj.weight",
                randn(heads * head_dim, hidden),
                matmul_type,
                heads,
            ),
            (
                b + "attn_k.weight",
                h + "self_attn.k_proj.weight",
                randn(kv_heads * head_dim, hidden),
                matmul_type,
                kv_heads,
            ),
            (
                b + "attn_v.weight",
                h + "self_attn.v_proj.weight",
                randn(kv_heads * head_dim, hidden),
                matmul_type,
                None,
            ),
            (
                b + "attn_output.weight",
                h + "self_attn.o_proj.weight",
                randn(hidden, heads * head_dim),
                matmul_type,
                None,
            ),
            (b + "ffn_norm.weight", h + "post_attention_layernorm.weight", 1 + randn(hidden), f32, None),
            (
                b + "ffn_gate.weight",
                h + "mlp.gate_proj.weight",
                randn(intermediate, hidden),
                matmul_type,
                None,
            ),
            (b + "ffn_up.weight", h + "mlp.up_proj.weight", randn(intermediate, hidden), matmul_type, None),
            (
                b + "ffn_down.weight",
                h + "mlp.down_proj.weight",
                randn(hidden, intermediate),
                matmul_type,
                None,
            ),
        ]
    entries.append(("output_norm.weight", "model.norm.weight", 1 + randn(hidden), f32, None))
    if not tie_word_embeddings:
        entries.append(
            ("output.weight", "lm_head.weight", randn(len(vocab), hidden, scale=0.5), matmul_type, None)
        )

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_block_count(layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(intermediate)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(len(vocab))
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1 if quant == "Q4_1" else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(tokenizer_pre)
    w.add_token_list(vocab)
    w.add_token_types(token_types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_add_bos_token(add_bos_token)
    w.add_chat_template(chat_template)

    state_dict, stored = {}, []
    for gguf_name, hf_name, values, qtype, n_head in entries:
        if quant == "Q4_K_M" and gguf_name.split(".")[-2] in Q6_K_PARTS:
            qtype = gguf.GGMLQuantizationType.Q6_K
        ggml_layout = _permute(values, n_head) if n_head else values
        data, recovered = _stored(ggml_layout, qtype, rng)
        # The reader's values: dequantized, then un-permuted (the permutation only moves rows, so this
        # equals permuting the dequantized rows back; Q/K rows quantize independently of their order).
        recovered = _permute_back(recovered, n_head) if n_head else recovered
        state_dict[hf_name] = torch.from_numpy(np.ascontiguousarray(recovered, dtype=np.float32))
        stored.append((gguf_name, data, qtype))
    for gguf_name, data, qtype in sorted(stored, key=lambda t: t[0]) if sort_tensors else stored:
        w.add_tensor(gguf_name, data, raw_dtype=qtype if qtype != f32 else None)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return TinyGGUF(path, config, state_dict, tok, chat_template)


def _permute_back(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of `_permute` (transformers' `LlamaTensorProcessor._reverse_permute_weights`)."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
