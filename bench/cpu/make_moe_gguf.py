#!/usr/bin/env python3
"""Writes a synthetic mixture-of-experts GGUF for benchmarks: OLMoE-1B-7B's layer shape
(hidden 2048, 16 heads of 128, 64 experts of 1024, top-8, vocab 50304) with fewer layers so
that it fits this machine, random weights, the matmul weights quantized with gguf-py.

Usage:
  scripts/peer/build-llamacpp.sh     # the llama.cpp tree whose gguf-py this uses
  pip install numpy pyyaml
  LLAMA_CPP_LIB_PATH=<peer build/bin> python3 bench/cpu/make_moe_gguf.py OUT.gguf [--layers 4] [--type q4_0]

The architecture is written as llama with expert_count (Mixtral's layout: stacked
ffn_{gate,up,down}_exps, softmax router, renormalised top-k), which both llama.cpp and
Troupe read. OLMoE itself adds Q/K norms (both engines also run `olmoe` files; the norms cost
little beside the experts); the expert shapes and routing width, which decide the MoE cost,
are OLMoE's. Nothing here is committed: the file
goes where OUT says (outside the repository).
"""
import argparse
import os
import pathlib
import sys

import numpy as np

PEER = pathlib.Path(os.environ.get("LLAMA_CPP_LIB_PATH", "")).resolve()
sys.path.insert(0, str(PEER.parent.parent / "gguf-py"))
import gguf  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--type", default="q4_0", choices=["q4_0", "q4_1", "q8_0"])
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--experts-used", type=int, default=8)
    ap.add_argument("--expert-ffn", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args()
    qt = {"q4_0": gguf.GGMLQuantizationType.Q4_0, "q4_1": gguf.GGMLQuantizationType.Q4_1,
          "q8_0": gguf.GGMLQuantizationType.Q8_0}[a.type]
    rng = np.random.default_rng(a.seed)
    H, E, F, V = a.hidden, a.experts, a.expert_ffn, a.vocab
    w = gguf.GGUFWriter(a.out, "llama")
    w.add_name(f"synthetic-olmoe-shape-{a.layers}l-{a.type}")
    w.add_block_count(a.layers)
    w.add_context_length(4096)
    w.add_embedding_length(H)
    w.add_feed_forward_length(F)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_expert_count(E)
    w.add_expert_used_count(a.experts_used)
    w.add_file_type({"q4_0": 2, "q4_1": 3, "q8_0": 7}[a.type])
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    toks += [f"\u2581t{i}" for i in range(V - len(toks))]
    w.add_tokenizer_model("llama")
    w.add_token_list(toks)
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(V - 259)])
    w.add_token_types([2, 3, 3] + [6] * 256 + [1] * (V - 259))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)

    def rand(shape, scale, offset=0.0):
        return (offset + scale * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)

    def put(name, shape, scale, quant=True, offset=0.0):
        v = rand(shape, scale, offset)
        if quant:
            w.add_tensor(name, gguf.quants.quantize(v, qt), raw_dtype=qt)
        else:
            w.add_tensor(name, v)
        print(f"  {name} {shape}", file=sys.stderr, flush=True)

    ws = 1.0 / np.sqrt(H)
    put("token_embd.weight", (V, H), 1.0)
    put("output_norm.weight", (H,), 0.05, quant=False, offset=1.0)
    put("output.weight", (V, H), ws)
    for l in range(a.layers):
        p = f"blk.{l}."
        put(p + "attn_norm.weight", (H,), 0.05, quant=False, offset=1.0)
        put(p + "ffn_norm.weight", (H,), 0.05, quant=False, offset=1.0)
        for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
            put(p + n + ".weight", (H, H), ws)
        put(p + "ffn_gate_inp.weight", (E, H), ws, quant=False)
        put(p + "ffn_gate_exps.weight", (E, F, H), ws)
        put(p + "ffn_up_exps.weight", (E, F, H), ws)
        put(p + "ffn_down_exps.weight", (E, H, F), 1.0 / np.sqrt(F))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file(progress=True)
    w.close()
    print("wrote", a.out, os.path.getsize(a.out), "bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
