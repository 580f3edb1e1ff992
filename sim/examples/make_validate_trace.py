#!/usr/bin/env python3
"""Writes sim/examples/validate-cpu.csv, the trace `troupe sim validate` replays by default.

40 requests, Poisson arrivals at a nominal 1 request/s (validate rescales the times per load
level), prompts of 32-192 tokens, outputs of 16-64 tokens; a third of the requests share one
of two 48-token prefixes, so prefix caching acts on both the real server and the simulator.
Deterministic: python3 sim/examples/make_validate_trace.py > sim/examples/validate-cpu.csv
"""
import random

rng = random.Random(20261130)
t = 0.0
print("arrival_s,prompt_tokens,output_tokens,priority,prefix_group,prefix_tokens")
for i in range(40):
    t += rng.expovariate(1.0)
    prompt = rng.randint(32, 192)
    output = rng.randint(16, 64)
    if rng.random() < 1 / 3:
        group, prefix = rng.randint(0, 1), 48
        prompt = max(prompt, prefix + 8)
    else:
        group, prefix = -1, 0
    print(f"{t:.4f},{prompt},{output},0,{group},{prefix}")
