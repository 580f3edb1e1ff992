#!/usr/bin/env python3
"""Writes the tiny Mixtral-shaped GGUF of the MoE golden test with the standard library only
(no numpy, no gguf-py), for tests/cli/cli_test.sh: `troupe run -m` on a MoE file.

  python3 tests/cli/make_tiny_moe.py OUT.gguf [EXPERTS_USED]   (default 2; more than 4: a hostile file)

The weights are the formulas of tests/runtime/formula_moe.h and tests/golden/moe/make_golden.py
(spec "mixtral": arch llama, 4 experts top-2 of width 64, hidden 128, 4 heads / 2 KV heads,
2 layers, vocab 264, F32), so the file holds the same tensors as the one llama.cpp's golden
logits were computed on.
"""
import struct
import sys
from array import array

MASK = (1 << 64) - 1
L, H, HEADS, KV, CTX, E, K, F = 2, 128, 4, 2, 128, 4, 2, 64


def fnv1a64(s):
    h = 1469598103934665603
    for c in s.encode():
        h = ((h ^ c) * 1099511628211) & MASK
    return h


def formula(name, n, scale, offset=0.0):
    base = fnv1a64(name)
    out = array("f")
    for i in range(n):
        z = (base + i + 0x9E3779B97F4A7C15) & MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
        z ^= z >> 31
        out.append(offset + scale * ((z >> 11) * 2.0**-53 * 2.0 - 1.0))
    return out


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def main():
    out = sys.argv[1]
    used = int(sys.argv[2]) if len(sys.argv) > 2 else K
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581", "a", "b", "\u2581a", "ab"]
    types = [2, 3, 3] + [6] * 256 + [1] * 5
    scores = [0.0] * 259 + [-float(i) for i in range(259, 264)]
    kv = []

    def u32(k, v):
        kv.append(gstr(k) + struct.pack("<II", 4, v))

    def f32(k, v):
        kv.append(gstr(k) + struct.pack("<If", 6, v))

    def string(k, v):
        kv.append(gstr(k) + struct.pack("<I", 8) + gstr(v))

    a = "llama"
    string("general.architecture", a)
    string("general.name", "formula-moe")
    u32(a + ".block_count", L)
    u32(a + ".context_length", CTX)
    u32(a + ".embedding_length", H)
    u32(a + ".feed_forward_length", F)
    u32(a + ".attention.head_count", HEADS)
    u32(a + ".attention.head_count_kv", KV)
    f32(a + ".attention.layer_norm_rms_epsilon", 1e-5)
    f32(a + ".rope.freq_base", 10000.0)
    u32(a + ".expert_count", E)
    u32(a + ".expert_used_count", used)
    string("tokenizer.ggml.model", "llama")
    kv.append(gstr("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, len(toks)) + b"".join(gstr(t) for t in toks))
    kv.append(gstr("tokenizer.ggml.scores") + struct.pack("<IIQ", 9, 6, len(scores)) +
              struct.pack("<%df" % len(scores), *scores))
    kv.append(gstr("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, len(types)) +
              struct.pack("<%di" % len(types), *types))
    u32("tokenizer.ggml.bos_token_id", 1)
    u32("tokenizer.ggml.eos_token_id", 2)
    u32("tokenizer.ggml.unknown_token_id", 0)

    tensors = []  # (name, ne, data)
    hd = H // HEADS
    V = len(toks)
    ws = 1.0 / H**0.5

    def put(name, ne, scale, offset=0.0):
        n = 1
        for d in ne:
            n *= d
        tensors.append((name, ne, formula(name, n, scale, offset).tobytes()))

    put("token_embd.weight", [H, V], 1.0)
    put("output_norm.weight", [H], 0.1, 1.0)
    put("output.weight", [H, V], ws)
    for l in range(L):
        p = f"blk.{l}."
        put(p + "attn_norm.weight", [H], 0.1, 1.0)
        put(p + "ffn_norm.weight", [H], 0.1, 1.0)
        put(p + "attn_q.weight", [H, HEADS * hd], 3 * ws)
        put(p + "attn_k.weight", [H, KV * hd], 3 * ws)
        put(p + "attn_v.weight", [H, KV * hd], ws)
        put(p + "attn_output.weight", [HEADS * hd, H], ws)
        put(p + "ffn_gate_inp.weight", [H, E], 4 * ws)
        put(p + "ffn_gate_exps.weight", [H, F, E], ws)
        put(p + "ffn_up_exps.weight", [H, F, E], ws)
        put(p + "ffn_down_exps.weight", [F, H, E], 1.0 / F**0.5)

    align = 32
    infos, offset = [], 0
    for name, ne, data in tensors:
        infos.append(gstr(name) + struct.pack("<I", len(ne)) + struct.pack("<%dQ" % len(ne), *ne) +
                     struct.pack("<IQ", 0, offset))
        offset += (len(data) + align - 1) // align * align
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)) + b"".join(kv) + b"".join(infos)
    head += b"\0" * ((align - len(head) % align) % align)
    with open(out, "wb") as f:
        f.write(head)
        for _, _, data in tensors:
            f.write(data)
            f.write(b"\0" * ((align - len(data) % align) % align))


if __name__ == "__main__":
    main()
