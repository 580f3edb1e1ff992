#!/usr/bin/env python3
"""Makes the mixture-of-experts golden data: llama.cpp's logits on two tiny MoE GGUFs.

Usage:
  scripts/peer/build-llamacpp.sh        # peer llama.cpp + llama-cpp-python==0.3.36
  pip install numpy pyyaml               # (gguf-py imports yaml)
  LLAMA_CPP_LIB_PATH=<peer build/bin> python3 tests/golden/moe/make_golden.py [OUT_DIR]

The models are written here with gguf-py (the one inside the same llama.cpp source) and every
weight is a formula of (tensor name, element index): u = splitmix64(fnv1a64(name) + i) mapped
to [-1, 1) by its top 53 bits, value = scale * u (norms 1 + 0.1 u), F32, or for the
quantized variants the matmul weights (attention, experts, shared expert, output) quantized
row by row with gguf-py's reference quantizer (embeddings, norms and routers stay F32). The C++ test
(tests/runtime/moe_golden_test.cpp, writer in tests/runtime/formula_moe.h) writes the same
tensors with the project's own GGUF writer, so no model file is committed.

  mixtral   arch llama with expert_count 4, expert_used_count 2 (softmax, top-2, renormalised),
            hidden 128, 4 heads of 32 / 2 KV heads, 2 layers, experts 64 wide, vocab 264, ctx 128
  qwen2moe  arch qwen2moe: 8 experts 32 wide, top-2 not renormalised, a 96-wide shared expert
            behind a sigmoid gate, q/k/v biases, NeoX RoPE
  mixtral_q8_0, qwen2moe_q4_1   the same shapes and formulas, quantized as above
  qwen3moe  arch qwen3moe: 8 experts 32 wide, top-2 renormalised, per-head Q/K RMSNorm, NeoX
  olmoe     arch olmoe: 8 experts 32 wide, top-4 not renormalised, Q/K RMSNorm over the whole
            projection, NeoX, 4 KV heads (llama.cpp's olmoe has no GQA)

Writes, into OUT_DIR (default: this folder):
  moe.json         per model and prompt: the token ids, the greedy continuation (16 ids) and
                   the settings and peer version
  moe_logits.f32   raw little-endian float32: for each model, then each prompt in JSON order,
                   the logits of EVERY prompt position [n_tokens, 264] after one batched eval
Settings: n_ctx 128, n_batch 128, n_threads 2, KV f16, flash attention off.
"""
import hashlib
import json
import os
import pathlib
import sys

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
PEER = pathlib.Path(os.environ.get("LLAMA_CPP_LIB_PATH", "")).resolve()
# gguf-py from the same llama.cpp tree as the library (…/vendor/llama.cpp/build/bin -> …/gguf-py)
sys.path.insert(0, str(PEER.parent.parent / "gguf-py"))
import gguf  # noqa: E402
import llama_cpp  # noqa: E402

MASK = (1 << 64) - 1


def fnv1a64(s: str) -> int:
    h = 1469598103934665603
    for c in s.encode():
        h ^= c
        h = (h * 1099511628211) & MASK
    return h


def formula(name: str, shape, scale: float, offset: float = 0.0) -> np.ndarray:
    n = int(np.prod(shape))
    with np.errstate(over="ignore"):
        z = np.arange(n, dtype=np.uint64) + np.uint64(fnv1a64(name))
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(11)).astype(np.float64) * 2.0**-53 * 2.0 - 1.0
    return (offset + scale * u).astype(np.float32).reshape(shape)


SPECS = {
    "mixtral": dict(arch="llama", experts=4, used=2, ffn=64, shared=0, qtype="f32"),
    "qwen2moe": dict(arch="qwen2moe", experts=8, used=2, ffn=32, shared=96, qtype="f32"),
    "mixtral_q8_0": dict(arch="llama", experts=4, used=2, ffn=64, shared=0, qtype="q8_0"),
    "qwen2moe_q4_1": dict(arch="qwen2moe", experts=8, used=2, ffn=32, shared=96, qtype="q4_1"),
    "qwen3moe": dict(arch="qwen3moe", experts=8, used=2, ffn=32, shared=0, qtype="f32"),
    "olmoe": dict(arch="olmoe", experts=8, used=4, ffn=32, shared=0, qtype="f32", kv=4),  # (no GQA, as OLMoE)
}
QTYPES = {"q8_0": "Q8_0", "q4_1": "Q4_1"}
L, H, HEADS, KV_DEFAULT, CTX = 2, 128, 4, 2, 128


def vocab():
    t = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)] + ["\u2581", "a", "b", "\u2581a", "ab"]
    types = [2, 3, 3] + [6] * 256 + [1] * 5
    scores = [0.0] * 259 + [-float(i) for i in range(259, 264)]
    return t, scores, types


def write_model(path: str, spec: dict) -> None:
    a = spec["arch"]
    E, F, S = spec["experts"], spec["ffn"], spec["shared"]
    KV = spec.get("kv", KV_DEFAULT)
    hd = H // HEADS
    w = gguf.GGUFWriter(path, a)
    w.add_name("formula-moe")
    w.add_block_count(L)
    w.add_context_length(CTX)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F if a in ("llama", "olmoe") else 4 * F)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_expert_count(E)
    w.add_expert_used_count(spec["used"])
    if a in ("qwen2moe", "qwen3moe"):
        w.add_expert_feed_forward_length(F)
    if a == "qwen2moe":
        w.add_expert_shared_feed_forward_length(S)
    toks, scores, types = vocab()
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    V = len(toks)
    ws = 1.0 / np.sqrt(H)

    qt = getattr(gguf.GGMLQuantizationType, QTYPES[spec["qtype"]]) if spec["qtype"] != "f32" else None

    def put(name, shape, scale, offset=0.0, quant=False):  # shape row-major, i.e. reversed GGUF ne
        v = formula(name, shape, scale, offset)
        if quant and qt is not None:  # the matmul weights, row by row (gguf-py's reference quantizer)
            w.add_tensor(name, gguf.quants.quantize(v, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, v)

    put("token_embd.weight", (V, H), 1.0)
    put("output_norm.weight", (H,), 0.1, 1.0)
    put("output.weight", (V, H), ws, quant=True)
    for l in range(L):
        p = f"blk.{l}."
        put(p + "attn_norm.weight", (H,), 0.1, 1.0)
        put(p + "ffn_norm.weight", (H,), 0.1, 1.0)
        put(p + "attn_q.weight", (HEADS * hd, H), 3 * ws, quant=True)
        put(p + "attn_k.weight", (KV * hd, H), 3 * ws, quant=True)
        put(p + "attn_v.weight", (KV * hd, H), ws, quant=True)
        put(p + "attn_output.weight", (H, HEADS * hd), ws, quant=True)
        if a == "qwen3moe":  # per-head Q/K norms
            put(p + "attn_q_norm.weight", (hd,), 0.1, 1.0)
            put(p + "attn_k_norm.weight", (hd,), 0.1, 1.0)
        if a == "olmoe":  # Q/K norms over the whole projection
            put(p + "attn_q_norm.weight", (HEADS * hd,), 0.1, 1.0)
            put(p + "attn_k_norm.weight", (KV * hd,), 0.1, 1.0)
        if a == "qwen2moe":
            put(p + "attn_q.bias", (HEADS * hd,), 0.5)
            put(p + "attn_k.bias", (KV * hd,), 0.5)
            put(p + "attn_v.bias", (KV * hd,), 0.5)
        put(p + "ffn_gate_inp.weight", (E, H), 4 * ws)
        put(p + "ffn_gate_exps.weight", (E, F, H), ws, quant=True)
        put(p + "ffn_up_exps.weight", (E, F, H), ws, quant=True)
        put(p + "ffn_down_exps.weight", (E, H, F), 1.0 / np.sqrt(F), quant=True)
        if S:
            put(p + "ffn_gate_inp_shexp.weight", (H,), ws)
            put(p + "ffn_gate_shexp.weight", (S, H), ws, quant=True)
            put(p + "ffn_up_shexp.weight", (S, H), ws, quant=True)
            put(p + "ffn_down_shexp.weight", (H, S), 1.0 / np.sqrt(S), quant=True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


PROMPTS = [
    [1, 259, 260, 261, 262, 263, 40, 77, 100, 3, 9, 200, 201, 17, 17, 18, 259, 260, 45, 46, 47, 130, 131, 5],
    [1, 100],
    [1, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30,
     31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55],
]
GREEDY = 16


def main() -> None:
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE
    tmp = pathlib.Path(os.environ.get("TMPDIR", "/tmp"))
    result = {"llama_cpp_python": llama_cpp.__version__, "n_ctx": CTX, "n_batch": CTX, "n_threads": 2,
              "greedy": GREEDY, "models": {}}
    blob = bytearray()
    for name, spec in SPECS.items():
        path = str(tmp / f"formula_{name}.gguf")
        write_model(path, spec)
        sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
        llm = llama_cpp.Llama(model_path=path, n_ctx=CTX, n_batch=CTX, n_ubatch=CTX, n_threads=2,
                              n_threads_batch=2, logits_all=True, flash_attn=False, verbose=bool(os.environ.get("VERBOSE")), seed=1234)
        prompts = []
        for ids in PROMPTS:
            llm.reset()
            llm.eval(ids)
            logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
            assert logits.shape == (len(ids), 264) and np.isfinite(logits).all()
            blob += logits.tobytes()
            greedy = []
            nxt = int(np.argmax(logits[-1]))
            for _ in range(GREEDY):
                greedy.append(nxt)
                llm.eval([nxt])
                nxt = int(np.argmax(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)))
            prompts.append({"ids": ids, "greedy": greedy})
        del llm
        result["models"][name] = {"spec": spec, "gguf_sha256_of_peer_written_file": sha, "prompts": prompts}
        os.remove(path)
    (out / "moe.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "moe_logits.f32").write_bytes(bytes(blob))
    print("wrote", out / "moe.json", out / "moe_logits.f32", len(blob), "bytes")


if __name__ == "__main__":
    main()
