#!/usr/bin/env python3
"""The sim-vs-real table of bench/cpu/sim_ep_validate.sh: per layout and load, the real
server's and the simulator's mean step time (over the steps the real server ran, from its
step log), output throughput and ITL p50, the simulator's error on each, and the median
per-step error. Reads OUT_DIR/{base,ep1,ep2,node1}.json and OUT_DIR/val-*/validation.json."""
import json
import pathlib
import sys

out = pathlib.Path(sys.argv[1])
layouts = [("none", "experts in the stage (no workers)", "base"), ("ep1", "1 local expert worker", "ep1"),
           ("ep2", "2 local expert workers", "ep2"), ("node1", "1 expert worker on a troupe node (loopback)", "node1")]
print("| layout | hand-off fitted (per MoE layer) | load | req/s | step time real / sim (ms) | err | "
      "throughput real / sim (tok/s) | err | ITL p50 real / sim (ms) | err | per-step error p50 / p90 |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
for tag, what, prof in layouts:
    v = out / f"val-{tag}" / "validation.json"
    if not v.exists():
        continue
    p = json.loads((out / f"{prof}.json").read_text())
    hop = "-" if tag == "none" else f"{1e3 * p.get('expert_hop_s', 0):.3f} ms + {1e6 * p.get('expert_row_s', 0):.2f} us/row"
    for lv in json.loads(v.read_text())["levels"]:
        m = {x["metric"]: x for x in lv["metrics"]}

        def cell(name, fmt="{:.1f}"):
            x = m[name]
            return f"{fmt.format(x['real'])} / {fmt.format(x['sim'])}", f"{100 * x['error']:+.1f}%"

        st, ste = cell("step time, mean (ms)")
        tp, tpe = cell("throughput (output tok/s)")
        itl, itle = cell("ITL p50 (ms)")
        s = lv.get("steps", {})
        per = f"{100 * s.get('median_abs_error', 0):.1f}% / {100 * s.get('p90_abs_error', 0):.1f}%"
        print(f"| {what} | {hop} | {lv['level']} | {lv['rate_req_s']:.3f} | {st} | {ste} | {tp} | {tpe} | {itl} | "
              f"{itle} | {per} |")
