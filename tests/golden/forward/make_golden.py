#!/usr/bin/env python3
"""Makes the forward-pass golden data: llama.cpp's logits and greedy tokens for SmolLM2-135M Q4_1.

Usage:
  scripts/peer/build-llamacpp.sh             # peer llama.cpp + llama-cpp-python==0.3.36 (no compile twice)
  LLAMA_CPP_LIB_PATH=<peer build/bin> python3 tests/golden/forward/make_golden.py [MODEL.gguf] [OUT_DIR]

Writes, into OUT_DIR (default: this folder):
  smollm2_q4_1.json        per prompt: text, prompt ids, the 32 greedy ids, the last-logit summary
                           (argmax, max, a few top-k), plus the settings, the peer's version and
                           "noise_floor" (how much llama.cpp's own logits move; see below).
  smollm2_q4_1_logits.f32  raw little-endian float32: for each prompt in JSON order, the n_vocab
                           (49152) logits of the LAST prompt position after evaluating the prompt
                           in one batch (n_batch 512), n_threads 2.

Settings (the peer's, to be matched by the comparison test): n_ctx 512, n_batch = n_ubatch 512,
n_threads = n_threads_batch 2, KV cache f16, flash attention off, logits for all positions,
seed 1234 (unused: greedy is a plain argmax over the logits, no sampler).
Tokenization: llama_tokenize(text, add_special=False, parse_special=True); the model has
tokenizer.ggml.add_bos_token = false, so add_special=True gives the same ids (checked below).
Greedy: after the prompt, argmax of the last logits, then evaluate that ONE token, argmax again,
32 tokens, never stopping at EOS. Ties go to the lowest id (numpy argmax).

Noise floor: the same prompts are also run (a) one token per llama_decode call (n_threads 2),
(b) with n_threads = n_threads_batch 1, (c) with flash attention on. The max |difference| of the
last-position logits (and of all prompt positions) against the reference run, plus whether the
greedy tokens change, is what llama.cpp itself cannot hold fixed; Troupe's tolerance is justified
against these numbers.
"""
import hashlib
import json
import os
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(
    os.environ.get("TROUPE_HOME", os.path.expanduser("~/.cache/troupe")),
    "models", "SmolLM2-135M-Instruct.Q4_1.gguf")

N_CTX = 512
N_BATCH = 512
N_THREADS = 2
SEED = 1234
N_GREEDY = 32

LONG_PARAGRAPH = (
    "The history of computing is often told as a sequence of machines, each faster and smaller "
    "than the last, but it is equally a history of ideas about what a machine should do. In the "
    "nineteenth century Charles Babbage designed an Analytical Engine that could, in principle, "
    "follow any sequence of arithmetic instructions punched on cards, and Ada Lovelace wrote "
    "notes explaining how it might compute Bernoulli numbers. A century later Alan Turing "
    "described an abstract machine that reads and writes symbols on an endless tape, and showed "
    "that a single universal machine could imitate every other. Engineers then built electronic "
    "computers from vacuum tubes, later from transistors, and finally from integrated circuits "
    "containing billions of switches. Each step lowered the cost of a calculation by orders of "
    "magnitude, which in turn made new applications practical: weather forecasting, payroll, "
    "spreadsheets, the web, and now language models that predict the next word. Through all of "
    "these changes the central question stayed the same: how do we describe a process precisely "
    "enough that a machine can carry it out?"
)

PROMPTS = [
    ("capital", "The capital of France is"),
    ("chat", "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
             "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the boiling point of water at "
             "sea level?<|im_end|>\n<|im_start|>assistant\n"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2:\n"
             "        return n\n"),
    ("long", LONG_PARAGRAPH),
    ("unicode", "Über den Wolken: naïve café — 東京は日本の首都です。 Привет, мир! 🚀✨ π ≈ 3.14159"),
    ("one_token", "Hello"),
    ("list", "Here are three tips for staying healthy:\n1."),
    ("math", "Question: What is 17 + 25?\nAnswer:"),
]


def make_llama(model, n_threads, logits_all=True, flash_attn=False):
    from llama_cpp import Llama
    return Llama(
        model_path=model, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH,
        n_threads=n_threads, n_threads_batch=n_threads, n_gpu_layers=0,
        logits_all=logits_all, flash_attn=flash_attn, seed=SEED, verbose=False,
        use_mmap=True, offload_kqv=False)


def run_prompt(llm, ids, one_by_one=False, greedy=0):
    """Returns (prompt logits [n, vocab] float32, greedy ids)."""
    llm.reset()
    if one_by_one:
        for t in ids:
            llm.eval([t])
    else:
        assert len(ids) <= N_BATCH
        llm.eval(ids)
    prompt_logits = np.array(llm.scores[:len(ids), :], dtype=np.float32, copy=True)
    out = []
    last = prompt_logits[-1]
    for _ in range(greedy):
        tok = int(np.argmax(last))
        out.append(tok)
        llm.eval([tok])
        last = np.asarray(llm.scores[llm.n_tokens - 1, :], dtype=np.float32)
    return prompt_logits, out


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL
    out_dir = sys.argv[2] if len(sys.argv) > 2 else HERE
    if "LLAMA_CPP_LIB_PATH" not in os.environ:
        print("note: LLAMA_CPP_LIB_PATH is not set; llama_cpp loads its bundled libllama.so",
              file=sys.stderr)
    import llama_cpp

    t0 = time.time()
    ref = make_llama(model, N_THREADS)
    vocab = ref.n_vocab()
    add_bos = bool(llama_cpp.llama_vocab_get_add_bos(llama_cpp.llama_model_get_vocab(ref.model)))
    system_info = llama_cpp.llama_print_system_info().decode().strip()

    cases, blobs, prompt_logits_ref = [], [], []
    for name, text in PROMPTS:
        ids = ref.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        ids_special = ref.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        assert ids == ids_special, f"{name}: add_special changes the ids (model adds BOS/EOS?)"
        logits, greedy = run_prompt(ref, ids, greedy=N_GREEDY)
        last = logits[-1]
        prompt_logits_ref.append(logits)
        blobs.append(last.astype("<f4").tobytes())
        top = np.argsort(-last, kind="stable")[:10]
        cases.append({
            "name": name,
            "prompt": text,
            "prompt_ids": ids,
            "n_prompt": len(ids),
            "greedy_ids": greedy,
            "greedy_text": ref.detokenize(greedy, special=True).decode("utf-8", errors="replace"),
            "last_logits": {
                "offset_floats": len(blobs[:-1]) * vocab,
                "argmax": int(top[0]),
                "max": float(last[top[0]]),
                "min": float(last.min()),
                "mean": float(last.mean()),
                "top10_ids": [int(i) for i in top],
                "top10_logits": [float(last[i]) for i in top],
            },
        })
        print(f"[{name}] {len(ids)} prompt tokens, argmax {top[0]} ({last[top[0]]:.4f}), "
              f"greedy: {cases[-1]['greedy_text']!r}")

    # ---- noise floor: llama.cpp against itself ----
    def compare(label, other_llm, one_by_one):
        worst_last, worst_all, greedy_changed, per = 0.0, 0.0, [], {}
        for (name, _), case, ref_logits in zip(PROMPTS, cases, prompt_logits_ref):
            logits, greedy = run_prompt(other_llm, case["prompt_ids"], one_by_one, N_GREEDY)
            d_last = float(np.max(np.abs(logits[-1] - ref_logits[-1])))
            d_all = float(np.max(np.abs(logits - ref_logits)))
            worst_last, worst_all = max(worst_last, d_last), max(worst_all, d_all)
            same = greedy == case["greedy_ids"]
            first_diff = next((i for i, (a, b) in enumerate(zip(greedy, case["greedy_ids"]))
                               if a != b), None)
            if not same:
                greedy_changed.append(name)
            per[name] = {"max_abs_last": d_last, "max_abs_all_positions": d_all,
                         "greedy_same": same, "greedy_first_diff": first_diff}
            print(f"  noise {label} [{name}]: max|d| last {d_last:.3e}, all positions "
                  f"{d_all:.3e}, greedy {'same' if same else f'differs at step {first_diff}'}")
        print(f"noise {label}: max|d| last-position {worst_last:.3e}, all positions "
              f"{worst_all:.3e}, greedy changed in {greedy_changed or 'none'}")
        return {"max_abs_last": worst_last, "max_abs_all_positions": worst_all,
                "greedy_changed": greedy_changed, "per_prompt": per}

    noise = {}
    noise["batch512_vs_token_by_token"] = compare("n_batch 512 vs token-by-token (2 threads)",
                                                  ref, True)
    del ref
    one = make_llama(model, 1)
    noise["threads2_vs_threads1"] = compare("n_threads 2 vs 1 (n_batch 512)", one, False)
    del one
    fa = make_llama(model, N_THREADS, flash_attn=True)
    noise["flash_attn_off_vs_on"] = compare("flash attention off vs on (n_batch 512, 2 threads)",
                                            fa, False)
    del fa
    logit_scale = max(float(np.max(np.abs(l[-1]))) for l in prompt_logits_ref)
    noise["max_abs_last_logit"] = logit_scale
    noise["note"] = ("max |logit difference| of llama.cpp against its own reference run "
                     "(n_threads 2, n_batch 512, no flash attention); max_abs_last = at the last "
                     "prompt position (the logits stored in the .f32 file); max_abs_all_positions "
                     "= over every prompt position. Threads only split rows, so 1 vs 2 threads is "
                     "bit-identical (observed); a 1-token decode and flash attention take other "
                     "kernel paths and move logits by up to ~1-2 (observed; with token-by-token, "
                     "the first 6 positions match bit-for-bit and later ones diverge).")

    blob = b"".join(blobs)
    bin_path = os.path.join(out_dir, "smollm2_q4_1_logits.f32")
    with open(bin_path, "wb") as f:
        f.write(blob)

    with open(model, "rb") as f:
        h = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    doc = {
        "model": os.path.basename(model),
        "model_sha256": h.hexdigest(),
        "n_vocab": vocab,
        "peer": {
            "llama_cpp_python": llama_cpp.__version__,
            "llama_cpp_commit": "0c1e57098 (vendored by llama-cpp-python 0.3.36; ggml 0.25.3)",
            "system_info": system_info,
        },
        "settings": {
            "n_ctx": N_CTX, "n_batch": N_BATCH, "n_ubatch": N_BATCH, "n_threads": N_THREADS,
            "n_threads_batch": N_THREADS, "flash_attn": False, "type_k": "f16", "type_v": "f16",
            "logits_all": True, "seed": SEED, "add_bos_token": add_bos,
            "tokenize": "llama_tokenize(add_special=false, parse_special=true)",
            "greedy": f"argmax (lowest id on ties), {N_GREEDY} tokens, one token per decode, "
                      "no stop at EOS",
        },
        "logits_file": {
            "path": "smollm2_q4_1_logits.f32", "dtype": "float32", "endianness": "little",
            "layout": "[n_prompts][n_vocab], last prompt position, prompts in 'cases' order",
            "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest(),
        },
        "noise_floor": noise,
        "cases": cases,
    }
    json_path = os.path.join(out_dir, "smollm2_q4_1.json")
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {json_path} and {bin_path} ({len(blob)} bytes) in {time.time() - t0:.1f}s")
    print("noise floor (max |d logit|, last position / all prompt positions):")
    for k in ("batch512_vs_token_by_token", "threads2_vs_threads1", "flash_attn_off_vs_on"):
        print(f"  {k}: {noise[k]['max_abs_last']:.3e} / {noise[k]['max_abs_all_positions']:.3e}"
              f"  greedy changed: {noise[k]['greedy_changed'] or 'none'}")
    print(f"  (largest |logit| at a last position: {logit_scale:.3f})")


if __name__ == "__main__":
    main()
