#!/usr/bin/env python3
"""Writes a small deterministic ShareGPT-format file for bench_serve.py --dataset sharegpt.

The real ShareGPT dump can't be downloaded here, so this makes look-alike conversations from a
fixed seed and a word list: [{"id": ..., "conversations": [{"from": "human", "value": ...},
{"from": "gpt", "value": ...}, ...]}, ...]. Lengths are drawn log-uniform (most turns short, a
few long, like ShareGPT): human turns 4-600 words, gpt turns 8-500 words, 1-3 exchanges.

  make_sharegpt.py [-o PATH] [-n 200] [--seed 0]
"""
import argparse
import json
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_serve import WORDS  # noqa: E402

OPENERS = ["Can you explain", "Write a short story about", "What is the difference between",
           "Summarize the following text:", "Give me a list of", "How do I", "Translate this:",
           "Why does", "Please describe", "Tell me about"]


def loguniform(rng, lo, hi):
    return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))


def sentence_text(rng, n_words):
    out, i = [], 0
    while i < n_words:
        k = min(n_words - i, rng.randint(5, 18))
        s = [rng.choice(WORDS) for _ in range(k)]
        s[0] = s[0].capitalize()
        out.append(" ".join(s) + rng.choice([".", ".", ".", "?", "!"]))
        i += k
    return " ".join(out)


def make(n, seed):
    rng = random.Random(seed)
    convs = []
    for i in range(n):
        turns = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            h = loguniform(rng, 4, 600)
            g = loguniform(rng, 8, 500)
            turns.append({"from": "human", "value": rng.choice(OPENERS) + " " + sentence_text(rng, h)})
            turns.append({"from": "gpt", "value": sentence_text(rng, g)})
        convs.append({"id": f"synth-{seed}-{i:05d}", "conversations": turns})
    return convs


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    home = os.environ.get("TROUPE_HOME", os.path.expanduser("~/.cache/troupe"))
    p.add_argument("-o", "--out", default=os.path.join(home, "datasets", "sharegpt-synth.json"))
    p.add_argument("-n", "--num", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    convs = make(a.num, a.seed)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(convs, f, indent=1)
        f.write("\n")
    print(f"wrote {len(convs)} conversations to {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
