"""A tiny random GGUF model for tests of the real llama.cpp server (no download).

Random weights, one layer, a byte-level vocabulary (3 specials + 256 byte tokens, so
one token per byte of text) and a ChatML chat template in the file, so the server uses
the model's own template as it would for a real model. It writes garbage text fast;
what it says is never the point, the server's protocol is.
"""

from __future__ import annotations

from pathlib import Path

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
          "{{ message['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path: Path, *, trained_window: int = 65536, seed: int = 0,
                    favour: bytes = b"", vocab: int = 0, endless: bool = False) -> Path:
    """``favour``: bytes the model writes often (about one token in five at temperature
    0.7, each), whatever the prompt: every embedding carries a constant feature that only
    these bytes' output rows read. A string argument decoded under a grammar then ends
    within a few tokens when ``favour`` is ``b'"'``, so a forced call is complete.
    ``vocab``: pad the vocabulary with unused tokens to this size (Qwen2.5's is 151,936):
    what the server allocates per token of context scales with it (logits), while the
    tokenizer still writes one byte per token. ``endless``: the model never writes its
    end-of-text token (a logit of about -8, as the unused ones), so every reply runs to
    its limit, as a real model's that does not end would."""
    import gguf
    import numpy as np

    emb, ff = 64, 128
    tokens = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{i:02X}>".encode() for i in range(256)]
    pad = max(0, vocab - len(tokens))
    tokens += [f"<unused{i}>".encode() for i in range(pad)]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-random")
    w.add_context_length(trained_window)
    w.add_embedding_length(emb)
    w.add_block_count(1)
    w.add_feed_forward_length(ff)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(emb // 4)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([2, 3, 3] + [6] * 256 + [5] * pad)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_chat_template(CHATML)
    rng = np.random.default_rng(seed)

    def rnd(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    shapes = [("token_embd", (len(tokens), emb)), ("output", (len(tokens), emb)),
              ("blk.0.ffn_gate", (ff, emb)), ("blk.0.ffn_up", (ff, emb)),
              ("blk.0.ffn_down", (emb, ff))]
    shapes += [(f"blk.0.attn_{x}", (emb, emb)) for x in ("q", "k", "v", "output")]
    for name, shape in shapes:
        weights = rnd(*shape)
        if (favour or pad or endless) and name == "token_embd":
            weights[:, 0] = 1.0  # dominates the normed state: about 8 after RMS norm
        elif favour and name == "output":
            weights[:, 0] = 0.0
            for byte in favour:
                weights[3 + byte, 0] = 0.38  # a logit of about 3 over the others' 0
        if pad and name == "output":
            weights[259:, :] = 0.0
            weights[259:, 0] = -1.0  # a logit of about -8: the unused tokens are never written
        if endless and name == "output":
            weights[2, :] = 0.0
            weights[2, 0] = -1.0  # end-of-text, likewise
        w.add_tensor(name + ".weight", weights)
    for name in ("output_norm", "blk.0.attn_norm", "blk.0.ffn_norm"):
        w.add_tensor(name + ".weight", np.ones(emb, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
