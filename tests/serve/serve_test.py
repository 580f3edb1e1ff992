#!/usr/bin/env python3
"""End-to-end checks of `troupe serve` that start their own servers (python3 stdlib only).

  python3 tests/serve/serve_test.py --troupe build/bin/troupe [--only a,b] [--skip c] [--list] [-v]

Checks:
  batch_invariance  greedy outputs (text and token lists) of 18 prompts of 5..300 tokens are
                    the same alone, concurrent, with chunked prefill, and under KV pressure
                    (preemption), on fresh servers
  prefix_cache      a shared ~600-token prefix is not recomputed; outputs equal those of a
                    --no-prefix-caching server; n=4 choices share the prompt's blocks
  disconnect        clients that leave while queued / prefilling / streaming free every KV block
                    and are never started; then 200 random early disconnects, and 80 more under
                    KV pressure with a small admission cap (no slot leaks, outputs still right)
  disconnect_pipelined  the same when bytes follow the request (a stray CRLF, a pipelined request)
  bad_requests      auth, HTTP limits (413/431/408), JSON and parameter validation (400/404/405),
                    queue cap (429 + Retry-After); the server keeps answering normal requests
  drain             SIGTERM: /health turns 503, new requests 503, in-flight streams finish, exit 0
  metrics_health    /health, and the Prometheus series and histograms of /metrics
  step_failure      a failing engine step (--debug-fail-step): running requests end with a typed
                    error, /health 503, new requests 503, KV at baseline, SIGTERM exits 0
  step_hang         a step that never returns (--debug-hang-step): /health 503 'engine stalled' after
                    --stall-timeout while the heartbeat goes on; SIGTERM still exits 0
  neighbours        a greedy request beside neighbours with extreme sampling settings (and refused
                    ones) gives its solo tokens; the forced neighbour only its forced token
  overload          bursts at 3x capacity: the excess refused with 429 within 50 ms (p99), the
                    admitted run as fast as at capacity alone, memory bounded
  connections       --max-connections: one connection over the cap gets a 503 and is closed; a low
                    open-file limit lowers the cap instead of exhausting descriptors; no busy loop
  speculative       --speculative ngram and self:20: greedy and seeded outputs (tokens, logprobs)
                    equal a plain server's alone, concurrent and streamed; drafts accepted (metrics,
                    usage); KV back to baseline; bad num_speculative_tokens and flags refused
  json_mode         response_format json_object: outputs that end are one JSON object (greedy,
                    sampled, streamed), a prose prompt's unconstrained answer is not; a json_schema
                    without a schema, unknown types and ignore_eos with it are refused with 400
                    (structured output: tests/serve/structured_output_test.py, ctest
                    serve_structured_output)
  remote_stage      a pipeline stage in a `troupe node` process (--remote-stage): the same greedy
                    outputs as in one process; wrong keys and garbage refused before any decoding;
                    a killed node fails its requests with an error naming it, a restarted one
                    rejoins (prefix cache dropped, outputs unchanged); a frozen node fails its
                    step at --node-timeout, then rejoins; the node exits 0 on SIGTERM
  expert_parallel   a MoE model's experts on expert-worker actors and on a `troupe node`: the
                    outputs of one process; MoE metrics; a killed expert node fails its requests
                    naming it (/health 503) and rejoins once restarted; bad placements refused
  soak              eight clients on ten slots for --soak-seconds (default 45): normal requests,
                    early disconnects and malformed requests mixed; all answered right, KV back to
                    baseline at idle, resident memory flat after the warm-up, greedy output unchanged

Each server runs under `nice -n 5` with `-t 2` on a port in 18000-18100 and is killed (its
process group) when its check ends. Prints one PASS/FAIL line per check with measured figures
and exits 1 if any check failed. Takes about 2-3 minutes on an idle 2-core machine.
"""
import argparse
import hashlib
import hmac
import http.client
import json
import os
import random
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

HOST = "127.0.0.1"
PORT_RANGE = range(18000, 18101)
VERBOSE = False
TROUPE = None

WORDS = (
    "the of and to in is was for on that with as by at from his her an are were which this be or had have not but "
    "they you one all their there been has more when who will would can said what about if out up into them only "
    "other new some time could these two may then first any my now such like our over man me even most made after "
    "also did many before must through back years where much your way well down should because each just those "
    "people how too little state good very make world still own see men work long get here between both life being "
    "under never day same another know while last might us great old year off come since against go came right used "
    "take three river music garden window doctor winter market letter forest engine silver island"
).split()


class CheckFailed(AssertionError):
    pass


def check(cond, msg):
    if not cond:
        raise CheckFailed(msg)


def log(msg):
    if VERBOSE:
        print("    " + msg, flush=True)


def words(rng, n):
    """n random common words: about one token each for this tokenizer."""
    return " ".join(rng.choice(WORDS) for _ in range(n))


# ----------------------------------------------------------------------------------------------
# Servers

_port_lock = threading.Lock()
_next_port = [PORT_RANGE.start]


def free_port():
    with _port_lock:
        while _next_port[0] < PORT_RANGE.stop:
            p = _next_port[0]
            _next_port[0] += 1
            s = socket.socket()
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((HOST, p))
                return p
            except OSError:
                continue
            finally:
                s.close()
    raise RuntimeError("no free port left in 18000-18100")


LIVE = set()  # servers started and not yet killed


class Server:
    """`troupe serve` in its own process group; `with Server(...) as s:` starts it and waits for
    /health 200, and always kills it at the end. Dying on its own is reported as a failure."""

    def __init__(self, *args, name="server", nofile=None):
        self.args = [str(a) for a in args]
        self.name = name
        self.nofile = nofile  # an open-file limit (soft and hard) for the server process
        self.port = None
        self.proc = None
        self.log_file = None
        self.exit_expected = False

    def start(self, timeout=90):
        self.port = free_port()
        self.log_file = tempfile.NamedTemporaryFile(prefix=f"serve_test_{self.port}_", suffix=".log", delete=False)
        cmd = ["nice", "-n", "5", TROUPE, "serve", "-t", "2", "--port", str(self.port)] + self.args
        log(f"start {self.name}: {' '.join(cmd[3:])} (log {self.log_file.name})")
        limit = self.nofile
        pre = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))) if limit else None
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, preexec_fn=pre)
        LIVE.add(self)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise CheckFailed(f"{self.name} exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            try:
                st, _, _ = request(self.port, "GET", "/health", timeout=5)
                if st == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.1)
        raise CheckFailed(f"{self.name} not healthy after {timeout} s:\n{self.log_tail()}")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n=25):
        try:
            with open(self.log_file.name, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
            return "\n".join("      | " + l for l in lines[-n:])
        except Exception as e:  # noqa: BLE001
            return f"(no log: {e})"

    def signal(self, sig):
        """Sends `sig` to the server; its exit is then expected, not a crash."""
        self.exit_expected = True
        os.kill(self.proc.pid, sig)

    def kill(self):
        LIVE.discard(self)
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(timeout=10)
        try:
            self.log_file.close()
            if not VERBOSE:
                os.unlink(self.log_file.name)
        except OSError:
            pass

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.kill()
            raise

    def __exit__(self, et, ev, tb):
        died = self.proc is not None and self.proc.poll() is not None and not self.exit_expected
        rc = self.proc.returncode if died else None
        tail = self.log_tail() if died else ""
        self.kill()
        if died and et is None:
            raise CheckFailed(f"{self.name} died during the check (exit code {rc}):\n{tail}")
        return False


# ----------------------------------------------------------------------------------------------
# HTTP helpers

def request(port, method, path, body=None, headers=None, timeout=120):
    """One request on a fresh connection: (status, headers with lower-case names, body bytes)."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        elif isinstance(body, str):
            body = body.encode()
        h = {"Content-Type": "application/json"} if body is not None else {}
        h.update(headers or {})
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data
    finally:
        conn.close()


def call(port, path, obj, headers=None, timeout=120):
    st, h, data = request(port, "POST", path, obj, headers, timeout)
    try:
        j = json.loads(data)
    except ValueError:
        j = None
    return st, j, h, data


def complete(port, prompt, max_tokens=24, headers=None, timeout=120, **extra):
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    body.update(extra)
    st, j, _, data = call(port, "/v1/completions", body, headers, timeout=timeout)
    check(st == 200, f"completion: status {st}: {data[:300]!r}")
    return j


def outcome(resp):
    """(text, token list) of each choice: what must match between runs."""
    return [(c["text"], tuple((c.get("logprobs") or {}).get("tokens") or ())) for c in resp["choices"]]


def tokenize(port, text, headers=None):
    st, j, _, data = call(port, "/tokenize", {"prompt": text}, headers)
    check(st == 200, f"/tokenize: status {st}: {data[:200]!r}")
    return j["tokens"]


class Metrics:
    def __init__(self, text):
        self.text = text
        self.series = {}  # full key (name{labels}) -> value
        self.by_name = {}  # name -> sum over label sets
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            key, val = line.rsplit(" ", 1)
            v = float(val)
            self.series[key] = v
            name = key.split("{", 1)[0]
            self.by_name[name] = self.by_name.get(name, 0.0) + v

    def __getitem__(self, name):
        if name not in self.by_name:
            raise CheckFailed(f"/metrics has no series {name}")
        return self.by_name[name]

    def has(self, name):
        return name in self.by_name


def metrics(port, headers=None):
    st, _, data = request(port, "GET", "/metrics", headers=headers, timeout=30)
    check(st == 200, f"/metrics status {st}")
    return Metrics(data.decode())


def wait_idle(port, timeout=10.0, headers=None):
    """Polls /metrics until no sequence runs or waits; returns (metrics, seconds waited)."""
    t0 = time.time()
    while True:
        m = metrics(port, headers)
        if m["troupe:num_requests_running"] + m["troupe:num_requests_waiting"] == 0:
            return m, time.time() - t0
        if time.time() - t0 > timeout:
            raise CheckFailed(f"server not idle after {timeout} s: running {m['troupe:num_requests_running']:.0f}, "
                              f"waiting {m['troupe:num_requests_waiting']:.0f}")
        time.sleep(0.05)


def build_request(port, method, path, body=b"", headers=None):
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    h = {"Host": f"{HOST}:{port}", "Content-Type": "application/json", "Content-Length": str(len(body))}
    h.update(headers or {})
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items() if v is not None) + "\r\n"
    return head.encode() + body


class Raw:
    """A raw TCP client, for requests that are closed early or malformed on purpose."""

    def __init__(self, port, timeout=30):
        self.sock = socket.create_connection((HOST, port), timeout=timeout)
        self.buf = b""
        self.eof = False

    def send(self, data):
        self.sock.sendall(data)

    def _recv(self):
        d = self.sock.recv(65536)
        if not d:
            self.eof = True
            raise EOFError("connection closed by the server")
        self.buf += d

    def wait_for(self, pattern, count=1, timeout=30):
        """Reads until `pattern` occurs `count` times in what was received."""
        self.sock.settimeout(timeout)
        deadline = time.time() + timeout
        while self.buf.count(pattern) < count:
            if time.time() > deadline:
                raise socket.timeout(f"no {pattern!r} x{count} within {timeout} s")
            self._recv()

    def read_response(self, timeout=30):
        """(status, headers, body) of one whole response (Content-Length, chunked, or to EOF)."""
        self.sock.settimeout(timeout)
        while b"\r\n\r\n" not in self.buf:
            self._recv()
        head, rest = self.buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        hdrs = {}
        for l in lines[1:]:
            k, _, v = l.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if "content-length" in hdrs:
            n = int(hdrs["content-length"])
            self.buf = rest
            while len(self.buf) < n:
                self._recv()
            body, self.buf = self.buf[:n], self.buf[n:]
        elif hdrs.get("transfer-encoding", "").lower() == "chunked":
            self.buf, body = rest, b""
            while True:
                while b"\r\n" not in self.buf:
                    self._recv()
                size_line, self.buf = self.buf.split(b"\r\n", 1)
                size = int(size_line.split(b";")[0], 16)
                while len(self.buf) < size + 2:
                    self._recv()
                body += self.buf[:size]
                self.buf = self.buf[size + 2:]
                if size == 0:
                    break
        else:
            self.buf = rest
            try:
                while True:
                    self._recv()
            except EOFError:
                pass
            body, self.buf = self.buf, b""
        return status, hdrs, body

    def closed_by_peer(self, timeout=1.0):
        """True when the server closed the connection (EOF or reset) within `timeout`."""
        self.sock.settimeout(timeout)
        try:
            while True:
                d = self.sock.recv(65536)
                if not d:
                    return True
                self.buf += d
        except (ConnectionResetError, BrokenPipeError):
            return True
        except socket.timeout:
            return False

    def close(self, reset=False):
        try:
            if reset:  # RST instead of FIN
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.sock.close()
        except OSError:
            pass


def sse_stream(port, path, body, on_event=None, headers=None, timeout=120):
    """A streamed request read to its end: (status, list of data payloads, saw [DONE])."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        conn.request("POST", path, body=json.dumps(body), headers=h)
        r = conn.getresponse()
        if r.status != 200:
            return r.status, [r.read()], False
        events, done = [], False
        while True:
            line = r.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            payload = line[6:]
            if payload == b"[DONE]":
                done = True
                break
            events.append(json.loads(payload))
            if on_event:
                on_event(events[-1])
        return 200, events, done
    finally:
        conn.close()


def run_threads(fns):
    """Runs the callables at the same time; returns their results (exceptions as values)."""
    results = [None] * len(fns)
    barrier = threading.Barrier(len(fns))

    def runner(i, fn):
        try:
            barrier.wait(timeout=30)
            results[i] = fn()
        except BaseException as e:  # noqa: BLE001
            results[i] = e

    ts = [threading.Thread(target=runner, args=(i, f), daemon=True) for i, f in enumerate(fns)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=600)
    return results


# ----------------------------------------------------------------------------------------------
# Checks: name -> function() that raises CheckFailed and returns a note with figures

CHECKS = []


def register(name):
    def deco(fn):
        CHECKS.append((name, fn))
        return fn
    return deco


BI_LENGTHS = [5, 7, 10, 14, 20, 28, 40, 52, 63, 65, 80, 100, 128, 160, 200, 240, 275, 300]
BI_MAX_TOKENS = 24


def bi_prompts():
    rng = random.Random(1234)
    out = []
    for i, n in enumerate(BI_LENGTHS):
        # Different openings, so that no two prompts share a first KV block.
        opening = ["Once upon a time", "Q:", "List:", "The report said", "Dear friend,", "In 1850"][i % 6]
        out.append(opening + " " + words(rng, max(1, n - 4)))
    return out


def bi_run(port, prompts, concurrent, what=""):
    # Generous timeouts: a loaded machine can be 10x slower; a hung request still shows.
    def one(p):
        return complete(port, p, BI_MAX_TOKENS, timeout=300)
    if not concurrent:
        return [one(p) for p in prompts]
    t0 = time.time()
    res = run_threads([lambda p=p: one(p) for p in prompts])
    bad = [f"request {i} ({BI_LENGTHS[i]} tok): {r!r}" for i, r in enumerate(res) if isinstance(r, BaseException)]
    check(not bad, f"{what}: {len(bad)} of {len(prompts)} concurrent requests failed ({time.time() - t0:.0f}s):\n      " +
          "\n      ".join(bad))
    return res


def bi_compare(ref, got, what):
    bad, max_lp = [], 0.0
    for i, (a, b) in enumerate(zip(ref, got)):
        if outcome(a) != outcome(b):
            bad.append(f"prompt {i} ({BI_LENGTHS[i]} tok): solo {outcome(a)[0][0]!r} vs {what} {outcome(b)[0][0]!r}")
        else:
            la = a["choices"][0]["logprobs"]["token_logprobs"]
            lb = b["choices"][0]["logprobs"]["token_logprobs"]
            max_lp = max([max_lp] + [abs(x - y) for x, y in zip(la, lb)])
        check(b["usage"]["completion_tokens"] == BI_MAX_TOKENS, f"{what}: prompt {i}: usage {b['usage']}")
    check(not bad, f"{what}: {len(bad)}/{len(ref)} outputs differ from the solo run:\n      " + "\n      ".join(bad[:6]))
    return max_lp


@register("batch_invariance")
def t_batch_invariance():
    prompts = bi_prompts()
    notes = []
    with Server(name="A (default)") as a:
        counts = [len(tokenize(a.port, p)) for p in prompts]
        check(min(counts) <= 8 and max(counts) >= 250, f"prompt token counts {counts} do not span 5..300")
        t0 = time.time()
        solo = bi_run(a.port, prompts, concurrent=False)
        t_solo = time.time() - t0
        for i, r in enumerate(solo):
            check(r["usage"]["prompt_tokens"] == counts[i], f"prompt {i}: usage {r['usage']} vs /tokenize {counts[i]}")
            check(r["choices"][0]["finish_reason"] == "length", f"prompt {i}: finish {r['choices'][0]['finish_reason']}")
        check(len({outcome(r)[0] for r in solo}) > 1, "every prompt produced the same output")
        t0 = time.time()
        conc = bi_run(a.port, prompts, concurrent=True, what="A")
        lp = bi_compare(solo, conc, "A concurrent")
        notes.append(f"A: solo {t_solo:.1f}s, concurrent {time.time() - t0:.1f}s, max|dlogprob| {lp:.2g}")
    with Server("--max-num-batched-tokens", 64, name="B (chunked prefill)") as b:
        t0 = time.time()
        conc = bi_run(b.port, prompts, concurrent=True, what="B (--max-num-batched-tokens 64)")
        lp = bi_compare(solo, conc, "B chunked-prefill concurrent")
        m = metrics(b.port)
        notes.append(f"B: {time.time() - t0:.1f}s, {m['troupe:engine_steps_total']:.0f} steps, max|dlogprob| {lp:.2g}")
    kv_tokens = 1024
    check(max(counts) + BI_MAX_TOKENS <= kv_tokens, "the longest prompt would not fit the KV pool alone")
    with Server("--kv-cache-tokens", kv_tokens, "--block-size", 16, "--max-num-batched-tokens", 64,
                name="C (KV pressure)") as c:
        m0 = metrics(c.port)
        check(m0["troupe:kv_cache_free_blocks"] == -(-kv_tokens // 16),
              f"C: {m0['troupe:kv_cache_free_blocks']:.0f} free blocks at start, expected {-(-kv_tokens // 16)}")
        t0 = time.time()
        conc = bi_run(c.port, prompts, concurrent=True, what="C (--kv-cache-tokens 1024)")
        elapsed = time.time() - t0
        m, _ = wait_idle(c.port)
        pre = m["troupe:num_preemptions_total"]
        lp = bi_compare(solo, conc, "C KV-pressure concurrent")
        check(pre > 0, f"C: no preemption with {sum(counts)} prompt tokens + 18x{BI_MAX_TOKENS} in a {kv_tokens}-token pool")
        check(m["troupe:kv_cache_free_blocks"] == m0["troupe:kv_cache_free_blocks"],
              f"C: {m['troupe:kv_cache_free_blocks']:.0f} free blocks after, {m0['troupe:kv_cache_free_blocks']:.0f} before")
        notes.append(f"C: {elapsed:.1f}s, {pre:.0f} preemptions, computed {m['troupe:prompt_tokens_computed_total']:.0f}"
                     f"/{m['troupe:prompt_tokens_total']:.0f} prompt tok, max|dlogprob| {lp:.2g}")
    with Server("--pipeline-stages", 3, "--max-num-batched-tokens", 64, name="D (3 pipeline stages)") as d:
        t0 = time.time()
        conc = bi_run(d.port, prompts, concurrent=True, what="D (--pipeline-stages 3)")
        lp = bi_compare(solo, conc, "D pipeline concurrent")
        m = metrics(d.port)
        inflight = m["troupe:step_plans_in_flight_max"]
        check(2 <= inflight <= 3, f"D: at most {inflight:.0f} step plans were in flight through 3 stages")
        notes.append(f"D: {time.time() - t0:.1f}s, up to {inflight:.0f} plans in flight, max|dlogprob| {lp:.2g}")
    return f"18 prompts of {min(counts)}..{max(counts)} tokens identical in all runs; " + "; ".join(notes)


@register("prefix_cache")
def t_prefix_cache():
    rng = random.Random(77)
    base = "Read the following notes carefully. " + words(rng, 600)
    pa, pb = base + " Question A: what is the first word?", base + " Question B: what is the last word?"
    with Server(name="default") as s:
        ta, tb = tokenize(s.port, pa), tokenize(s.port, pb)
        shared = next((i for i, (x, y) in enumerate(zip(ta, tb)) if x != y), min(len(ta), len(tb)))
        check(shared >= 550, f"the prompts share only {shared} tokens")
        m0 = metrics(s.port)
        ra = complete(s.port, pa)
        m1 = metrics(s.port)
        comp_a = m1["troupe:prompt_tokens_computed_total"] - m0["troupe:prompt_tokens_computed_total"]
        check(comp_a == len(ta), f"first request: {comp_a:.0f} prompt tokens computed, prompt has {len(ta)} (cold cache)")
        rb = complete(s.port, pb)
        m2 = metrics(s.port)
        comp_b = m2["troupe:prompt_tokens_computed_total"] - m1["troupe:prompt_tokens_computed_total"]
        hits_b = m2["troupe:prefix_cache_hits_total"] - m1["troupe:prefix_cache_hits_total"]
        check(rb["usage"]["prompt_tokens"] == len(tb), f"usage {rb['usage']} vs {len(tb)} tokens")
        check(comp_b < len(tb) - 500,
              f"second request computed {comp_b:.0f} of {len(tb)} prompt tokens (shared prefix {shared}); expected < {len(tb) - 500}")
        reusable = shared // 16 * 16
        check(comp_b >= len(tb) - reusable,
              f"second request computed only {comp_b:.0f} tokens but at most {reusable} (whole blocks of the shared "
              f"{shared}-token prefix) can be reused: tokens that differ were served from the cache")
        check(hits_b >= 500, f"prefix_cache_hits_total grew by {hits_b:.0f}")
        # The same prompt again: every block is cached.
        rb2 = complete(s.port, pb)
        m3 = metrics(s.port)
        comp_b2 = m3["troupe:prompt_tokens_computed_total"] - m2["troupe:prompt_tokens_computed_total"]
        check(outcome(rb2) == outcome(rb), f"repeated prompt B: {outcome(rb2)[0][0]!r} != {outcome(rb)[0][0]!r}")
        check(comp_b2 <= 16, f"repeated prompt B: {comp_b2:.0f} prompt tokens computed")
        m_idle, _ = wait_idle(s.port)
        check(m_idle["troupe:kv_cache_free_blocks"] == m0["troupe:kv_cache_free_blocks"],
              f"free blocks {m_idle['troupe:kv_cache_free_blocks']:.0f} after, {m0['troupe:kv_cache_free_blocks']:.0f} before")
    with Server("--no-prefix-caching", name="no-prefix-caching") as s:
        m0 = metrics(s.port)
        ra_ref = complete(s.port, pa)
        rb_ref = complete(s.port, pb)
        m1 = metrics(s.port)
        comp = m1["troupe:prompt_tokens_computed_total"] - m0["troupe:prompt_tokens_computed_total"]
        hits = m1["troupe:prefix_cache_hits_total"] - m0["troupe:prefix_cache_hits_total"]
        check(outcome(ra_ref) == outcome(ra), f"prompt A: cached server {outcome(ra)[0][0]!r} vs no-cache {outcome(ra_ref)[0][0]!r}")
        check(outcome(rb_ref) == outcome(rb),
              f"prompt B (prefix from the cache): {outcome(rb)[0][0]!r} vs no-cache {outcome(rb_ref)[0][0]!r}")
        check(comp == len(ta) + len(tb) and hits == 0,
              f"--no-prefix-caching: computed {comp:.0f} of {len(ta) + len(tb)} prompt tokens, {hits:.0f} cache hits")
    # n = 4: the choices share the prompt's blocks.
    q = "Write a short story about " + words(random.Random(5), 300)
    body = {"prompt": q, "n": 4, "temperature": 0.8, "seed": 1234, "max_tokens": 24, "ignore_eos": True, "logprobs": 1}
    with Server(name="default (n=4)") as s:
        tq = len(tokenize(s.port, q))
        m0 = metrics(s.port)
        st, r, _, data = call(s.port, "/v1/completions", body)
        check(st == 200, f"n=4: status {st}: {data[:200]!r}")
        m1 = metrics(s.port)
        comp_n = m1["troupe:prompt_tokens_computed_total"] - m0["troupe:prompt_tokens_computed_total"]
        check(sorted(c["index"] for c in r["choices"]) == [0, 1, 2, 3], f"n=4: indices {[c['index'] for c in r['choices']]}")
        check(r["usage"]["completion_tokens"] == 4 * 24, f"n=4: usage {r['usage']}")
        check(comp_n < 2 * tq, f"n=4: {comp_n:.0f} prompt tokens computed for a {tq}-token prompt (>= 2x)")
        distinct = len({c["text"] for c in r["choices"]})
        st, r2, _, _ = call(s.port, "/v1/completions", body)
        check(st == 200 and [c["text"] for c in r2["choices"]] == [c["text"] for c in r["choices"]],
              "n=4 with a seed: a repeated request gave different choices")
        m2, _ = wait_idle(s.port)
        check(m2["troupe:kv_cache_free_blocks"] == m0["troupe:kv_cache_free_blocks"], "n=4: KV blocks not all freed")
    return (f"prompts {len(ta)}/{len(tb)} tok sharing {shared}: computed {comp_a:.0f} then {comp_b:.0f} (hits {hits_b:.0f}), "
            f"repeat {comp_b2:.0f}; outputs = --no-prefix-caching; n=4 computed {comp_n:.0f} for {tq} tok, "
            f"{distinct} distinct choices, seeded repeat identical")


# --- disconnect -------------------------------------------------------------------------------

def gen_body(prompt, n, stream, max_tokens, chat=False, **extra):
    b = {"n": n, "stream": stream, "max_tokens": max_tokens, "temperature": 0.7 if n > 1 else 0, "seed": 1,
         "ignore_eos": True}
    if chat:
        b["messages"] = [{"role": "user", "content": prompt}]
    else:
        b["prompt"] = prompt
    b.update(extra)
    return b


def open_blockers(port, rng, count=2, max_tokens=400):
    """Long streaming requests that occupy the running batch; returns their sockets once each
    has streamed its first token."""
    socks = []
    try:
        for _ in range(count):
            r = Raw(port)
            socks.append(r)
            r.send(build_request(port, "POST", "/v1/completions", gen_body("Story: " + words(rng, 8), 1, True, max_tokens)))
        for r in socks:
            r.wait_for(b"data: ", 1, timeout=30)
    except BaseException:
        for r in socks:
            r.close()
        raise
    return socks


def wait_metric(port, pred, timeout):
    t0 = time.time()
    while True:
        m = metrics(port)
        if pred(m):
            return m, True
        if time.time() - t0 > timeout:
            return m, False
        time.sleep(0.03)


def choice_texts(data):
    """{choice index: text} of a JSON or server-sent-events response body."""
    out = {}
    if data.lstrip().startswith(b"data:"):
        for line in data.splitlines():
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            for c in json.loads(line[6:]).get("choices", []):
                piece = c.get("text") if "text" in c else (c.get("delta") or {}).get("content")
                out[c["index"]] = out.get(c["index"], "") + (piece or "")
        return out
    for c in json.loads(data)["choices"]:
        out[c["index"]] = c["text"] if "text" in c else c["message"]["content"]
    return out


def new_counters():
    return {"lock": threading.Lock(), "rst": 0, "answered": 0, "429": 0, "errors": 0}


def fmt_counters(c):
    return (f"{c.get('finished', 0)} read to the end, {c['rst']} closed by RST, {c['answered']} had answer bytes, "
            f"{c['429']} got 429, {c['errors']} socket errors")


def random_disconnects(port, seed, cycles, max_n, counters, prompt_len=(3, 400), delay=(0.0, 0.3), finish_frac=0.0):
    """Requests of random shape (n, stream, chat, prompt length, max_tokens), each closed (FIN,
    or RST) after a random delay without reading the answer; a fraction `finish_frac` of them
    are instead read to the end (they keep the KV pool busy)."""
    r = random.Random(seed)
    for _ in range(cycles):
        n = r.randint(1, max_n)
        chat = r.random() < 0.3
        body = gen_body(words(r, r.randint(*prompt_len)), n, r.random() < 0.5, r.randint(4, 64), chat=chat)
        path = "/v1/chat/completions" if chat else "/v1/completions"
        if r.random() < finish_frac:
            st, _, data = request(port, "POST", path, body, timeout=120)
            with counters["lock"]:
                counters["finished"] = counters.get("finished", 0) + 1
                counters["429"] += st == 429
                if st == 200:
                    counters.setdefault("done", []).append((path, body, choice_texts(data)))
                elif st != 429:
                    counters.setdefault("bad", []).append(f"{st} {data[:100]!r}")
            continue
        try:
            c = Raw(port, timeout=10)
            c.send(build_request(port, "POST", path, body))
            time.sleep(r.uniform(*delay))
            try:
                c.sock.setblocking(False)
                head = c.sock.recv(16, socket.MSG_PEEK)
                if head:
                    with counters["lock"]:
                        counters["answered"] += 1
                        counters["429"] += head.startswith(b"HTTP/1.1 429")
            except (BlockingIOError, OSError):
                pass
            reset = r.random() < 0.3
            c.close(reset=reset)
            with counters["lock"]:
                counters["rst"] += reset
        except OSError:
            with counters["lock"]:
                counters["errors"] += 1


@register("disconnect")
def t_disconnect():
    rng = random.Random(99)
    figures = []
    with Server("--max-num-seqs", 2, "--max-num-batched-tokens", 64, name="disconnect") as s:
        port = s.port
        m0, _ = wait_idle(port)
        baseline = m0["troupe:kv_cache_free_blocks"]
        check(baseline == 32768 // 16, f"baseline free blocks {baseline:.0f}, expected {32768 // 16}")
        ref_prompt = "The capital of France is"
        ref = complete(port, ref_prompt, 16)
        failures = []

        def after_case(label, t_close, extra=""):
            m, waited = wait_idle(port, 10)
            free = m["troupe:kv_cache_free_blocks"]
            ok = free == baseline
            line = f"{label}: idle {time.time() - t_close:.2f}s after close, free {free:.0f}/{baseline:.0f} {extra}"
            log(("ok   " if ok else "LEAK ") + line)
            if not ok:
                failures.append(f"{label}: {baseline - free:.0f} KV blocks leaked {extra}")
            return m

        for phase in ("queued", "queued_immediate", "prefilling", "streaming"):
            for stream in (True, False):
                for n in (1, 4):
                    label = f"{phase}/{'stream' if stream else 'json'}/n={n}"
                    try:
                        if phase.startswith("queued"):
                            blockers = open_blockers(port, rng)
                            try:
                                vprompt = "Summary: " + words(rng, 200)
                                mb = metrics(port)
                                v = Raw(port)
                                v.send(build_request(port, "POST", "/v1/completions", gen_body(vprompt, n, stream, 24)))
                                if phase == "queued":
                                    _, seen = wait_metric(port, lambda m: m["troupe:num_requests_waiting"] >= n, 5)
                                    if not seen:
                                        failures.append(f"{label}: the victim never showed up as waiting")
                                v.close()
                                t_close = time.time()
                                if phase == "queued_immediate":
                                    # The victim may not have reached the scheduler yet (still being read
                                    # or tokenized), so "0 waiting" below could hold before it was ever
                                    # queued; give its submission and its cancel time to land while the
                                    # blockers still hold both slots.
                                    time.sleep(0.3)
                                m, gone = wait_metric(port, lambda m: m["troupe:num_requests_waiting"] == 0, 5)
                                if not gone:
                                    failures.append(f"{label}: victim still waiting 5 s after its client left "
                                                    f"({m['troupe:num_requests_waiting']:.0f} waiting)")
                                if m["troupe:num_requests_running"] != 2:
                                    failures.append(f"{label}: {m['troupe:num_requests_running']:.0f} running while the "
                                                    f"2 blockers stream")
                            finally:
                                for b in blockers:
                                    b.close()
                            m = after_case(label, t_close)
                            computed = m["troupe:prompt_tokens_computed_total"] - mb["troupe:prompt_tokens_computed_total"]
                            if computed != 0:
                                failures.append(f"{label}: {computed:.0f} prompt tokens computed after the victim "
                                                f"(~200 tokens) left the queue: it was started anyway")
                        elif phase == "prefilling":
                            vprompt = "Essay: " + words(rng, 1500)
                            mb = metrics(port)
                            v = Raw(port)
                            v.send(build_request(port, "POST", "/v1/completions", gen_body(vprompt, n, stream, 24)))
                            # Close once the first chunks are computed (~0.2 s on an idle machine): mid-prefill.
                            t_sent = time.time()
                            mm, started = wait_metric(port, lambda m: m["troupe:prompt_tokens_computed_total"] >
                                                      mb["troupe:prompt_tokens_computed_total"], 15)
                            time.sleep(max(0.0, 0.2 - (time.time() - t_sent)))
                            mm = metrics(port)
                            v.close()
                            if not started:
                                failures.append(f"{label}: no prompt token computed 15 s after sending")
                            t_close = time.time()
                            m = after_case(label, t_close)
                            computed = m["troupe:prompt_tokens_computed_total"] - mb["troupe:prompt_tokens_computed_total"]
                            at_close = mm["troupe:prompt_tokens_computed_total"] - mb["troupe:prompt_tokens_computed_total"]
                            log(f"     prefilled {at_close:.0f} tok at close, {computed:.0f} in all (prompt ~1500)")
                            if computed >= 1400:
                                failures.append(f"{label}: {computed:.0f} prompt tokens computed: the prefill of a "
                                                f"1500-token prompt went on after the client left")
                        else:  # streaming
                            vprompt = "Poem: " + words(rng, 40)
                            mb = metrics(port)
                            v = Raw(port)
                            v.send(build_request(port, "POST", "/v1/completions", gen_body(vprompt, n, stream, 200)))
                            if stream:
                                v.wait_for(b"data: ", 4, timeout=30)
                            else:  # close 0.5 s after sending, or once generation has begun if later
                                t_sent = time.time()
                                _, started = wait_metric(port, lambda m: m["troupe:generation_tokens_total"] >=
                                                         mb["troupe:generation_tokens_total"] + 2, 15)
                                time.sleep(max(0.0, 0.5 - (time.time() - t_sent)))
                                if not started:
                                    failures.append(f"{label}: no token generated 15 s after sending")
                            v.close()
                            t_close = time.time()
                            m = after_case(label, t_close)
                            gen = m["troupe:generation_tokens_total"] - mb["troupe:generation_tokens_total"]
                            log(f"     generated {gen:.0f} tokens of {200 * n}")
                            if gen >= 200 * n:
                                failures.append(f"{label}: all {gen:.0f} tokens were generated: not cancelled")
                            if stream and gen < 1:
                                failures.append(f"{label}: no token generated before the close")
                    except CheckFailed as e:
                        failures.append(f"{label}: {e}")
                    except OSError as e:
                        failures.append(f"{label}: socket error {e!r}")
            if not s.alive():
                break
        check(s.alive(), "the server died during the disconnect cases:\n" + s.log_tail())
        figures.append(f"{4 * 4} phase cases")

        # Randomized: 200 requests in 4 parallel streams, each closed after 0-300 ms.
        counters = new_counters()
        t0 = time.time()
        res = run_threads([lambda i=i: random_disconnects(port, 1000 + i, 50, 4, counters) for i in range(4)])
        failures += [f"random loop worker: {r!r}" for r in res if isinstance(r, BaseException)]
        t_loop = time.time() - t0
        check(s.alive(), "the server died during the random disconnects:\n" + s.log_tail())
        try:
            m, waited = wait_idle(port, 30)
            free = m["troupe:kv_cache_free_blocks"]
            if free != baseline:
                failures.append(f"random loop: {baseline - free:.0f} KV blocks leaked ({free:.0f}/{baseline:.0f} free)")
        except CheckFailed as e:
            failures.append(f"random loop: {e}")
            waited = -1
        after = complete(port, ref_prompt, 16)
        if outcome(after) != outcome(ref):
            failures.append(f"after the random loop: {outcome(after)[0][0]!r} != before {outcome(ref)[0][0]!r}")
        figures.append(f"random: 200 requests in {t_loop:.1f}s ({fmt_counters(counters)}), idle {waited:.1f}s later, "
                       f"free {m['troupe:kv_cache_free_blocks']:.0f}/{baseline:.0f}")
        check(not failures, f"{len(failures)} problem(s):\n      " + "\n      ".join(failures))

    # Randomized again under KV pressure (preemption) with a small admission cap (--max-num-seqs 4
    # + --max-queue 2 = 6 sequences): afterwards every block must be free and all 6 slots usable,
    # i.e. no request's accounting outlived its client.
    with Server("--max-num-seqs", 4, "--max-queue", 2, "--kv-cache-tokens", 512, "--max-num-batched-tokens", 64,
                name="disconnect (KV pressure, cap 6)") as s:
        port = s.port
        m0, _ = wait_idle(port)
        baseline = m0["troupe:kv_cache_free_blocks"]
        counters = new_counters()
        t0 = time.time()
        res = run_threads([lambda i=i: random_disconnects(port, 2000 + i, 20, 2, counters, prompt_len=(60, 250),
                                                          delay=(0.1, 1.2), finish_frac=0.3) for i in range(4)])
        failures += [f"random loop 2 worker: {r!r}" for r in res if isinstance(r, BaseException)]
        failures += [f"random loop 2: a request read to the end got {b}" for b in counters.get("bad", [])]
        t_loop = time.time() - t0
        check(s.alive(), "the server died during the random disconnects under KV pressure:\n" + s.log_tail())
        m, waited = wait_idle(port, 30)
        free = m["troupe:kv_cache_free_blocks"]
        if free != baseline:
            failures.append(f"random loop 2 (KV pressure): {baseline - free:.0f} KV blocks leaked")
        time.sleep(0.5)
        slots = []
        try:
            for i in range(6):
                r = Raw(port)
                slots.append(r)
                r.send(build_request(port, "POST", "/v1/completions", gen_body("Tale " + words(rng, 5), 1, True, 300)))
            statuses = []
            for r in slots:
                r.wait_for(b"\r\n\r\n", 1, timeout=30)
                statuses.append(int(r.buf.split(b" ", 2)[1]))
            if statuses != [200] * 6:
                failures.append(f"random loop 2: 6 requests on the idle server (cap 6) got {statuses}: admission slots "
                                f"leaked by disconnected requests")
        finally:
            for r in slots:
                r.close()
        m, _ = wait_idle(port, 10)
        if m["troupe:kv_cache_free_blocks"] != baseline:
            failures.append(f"random loop 2: {baseline - m['troupe:kv_cache_free_blocks']:.0f} KV blocks leaked at the end")
        # The requests that were read to the end ran among preemptions and cancellations: their
        # outputs (greedy, or seeded for n > 1) must match a rerun on the idle server.
        done = counters.get("done", [])[:8]
        for path, body, texts in done:
            st, _, data = request(port, "POST", path, body)
            again = choice_texts(data) if st == 200 else {"status": st}
            if again != texts:
                failures.append(f"random loop 2: n={body['n']} {'chat' if 'messages' in body else 'completion'} "
                                f"(temperature {body['temperature']}, seed 1) gave {texts} amid the disconnects "
                                f"but {again} alone")
        figures.append(f"random under KV pressure: 80 requests in {t_loop:.1f}s ({fmt_counters(counters)}), "
                       f"{m['troupe:num_preemptions_total']:.0f} preemptions, free {free:.0f}/{baseline:.0f}, 6/6 slots usable, "
                       f"{len(done)} finished outputs = idle rerun")
        check(not failures, f"{len(failures)} problem(s):\n      " + "\n      ".join(failures))
    return "; ".join(figures) + "; every case back to the baseline free blocks; queued victims never computed"


@register("disconnect_pipelined")
def t_disconnect_pipelined():
    """A client that leaves while bytes beyond its request are buffered (a pipelined second
    request, or one stray CRLF after the body, which RFC 9112 asks servers to tolerate) must be
    noticed like any other."""
    failures, figures = [], []
    with Server(name="pipelined") as s:
        port = s.port
        m0, _ = wait_idle(port)
        baseline = m0["troupe:kv_cache_free_blocks"]
        for label, tail, stream in (("trailing CRLF after the body", b"\r\n", False),
                                    ("trailing CRLF after the body, stream", b"\r\n", True),
                                    ("pipelined second request", None, False)):
            body = {"prompt": "Once upon a time " + label, "max_tokens": 40, "ignore_eos": True, "temperature": 0,
                    "stream": stream}
            req = build_request(port, "POST", "/v1/completions", body)
            mb = metrics(port)
            c = Raw(port)
            c.send(req + (tail if tail is not None else req))
            wait_metric(port, lambda m: m["troupe:generation_tokens_total"] >= mb["troupe:generation_tokens_total"] + 2, 15)
            c.close()
            t_close = time.time()
            m, _ = wait_idle(port, 60)
            t_idle = time.time() - t_close
            gen = m["troupe:generation_tokens_total"] - mb["troupe:generation_tokens_total"]
            figures.append(f"{label}: {gen:.0f}/40 tokens generated, idle {t_idle:.1f}s after the close")
            if gen >= 40:
                failures.append(f"{label}: the client closed after ~2 tokens but all {gen:.0f} tokens were generated "
                                f"({t_idle:.1f}s more): the disconnect was not noticed")
            if m["troupe:kv_cache_free_blocks"] != baseline:
                failures.append(f"{label}: {baseline - m['troupe:kv_cache_free_blocks']:.0f} KV blocks leaked")
    check(not failures, "\n      ".join(failures))
    return "; ".join(figures)


# --- bad requests -----------------------------------------------------------------------------

KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}


def error_shape(data):
    """The OpenAI error object, or a string saying what is wrong with it."""
    try:
        j = json.loads(data)
    except ValueError:
        return f"not JSON: {data[:120]!r}"
    e = j.get("error") if isinstance(j, dict) else None
    if not isinstance(e, dict):
        return f"no 'error' object: {data[:120]!r}"
    if set(e) != {"message", "type", "param", "code"}:
        return f"error keys {sorted(e)}"
    if not isinstance(e["message"], str) or not e["message"] or not isinstance(e["type"], str):
        return f"bad message/type: {e}"
    if not (e["param"] is None or isinstance(e["param"], str)) or not (e["code"] is None or isinstance(e["code"], str)):
        return f"bad param/code: {e}"
    return e


@register("bad_requests")
def t_bad_requests():
    CTX = 512
    failures, notes, passed = [], [], [0]
    with Server("--api-key", KEY, "--max-body-bytes", 65536, "--max-header-bytes", 8192, "--read-timeout", 3,
                "--max-queue", 0, "--max-num-seqs", 2, "-c", CTX, name="strict") as s:
        port = s.port
        ref = complete(port, "Hello there", 2, headers=AUTH)
        rng = random.Random(3)

        def normal_ok(after):
            try:
                r = complete(port, "Hello there", 2, headers=AUTH)
                if outcome(r) != outcome(ref):
                    failures.append(f"after {after}: normal completion gave {outcome(r)} != {outcome(ref)}")
            except (CheckFailed, OSError) as e:
                failures.append(f"after {after}: normal completion failed: {e}")

        def expect(label, status, st, hdrs, data, param=Ellipsis, json_error=True, extra_ok=None):
            problems = []
            if st != status:
                problems.append(f"status {st}, expected {status}: {data[:200]!r}")
            elif json_error:
                e = error_shape(data)
                if isinstance(e, str):
                    problems.append(f"error body: {e}")
                elif param is not Ellipsis and e["param"] != param:
                    problems.append(f"param {e['param']!r}, expected {param!r} ({e['message'][:100]})")
            if extra_ok:
                p = extra_ok(hdrs, data)
                if p:
                    problems.append(p)
            if problems:
                failures.append(f"{label}: " + "; ".join(problems))
            else:
                passed[0] += 1
            log(f"{'ok  ' if not problems else 'FAIL'} {label}: {st} {data[:100]!r}")

        since_check = [0]

        def post(label, status, body, path="/v1/completions", headers=AUTH, param=Ellipsis, check_after=None):
            try:
                st, hdrs, data = request(port, "POST", path, body, headers, timeout=30)
            except OSError as e:
                failures.append(f"{label}: connection error {e!r}")
                st, hdrs, data = None, {}, b""
            else:
                expect(label, status, st, hdrs, data, param)
            since_check[0] += 1
            if check_after or (check_after is None and since_check[0] >= 4):  # every few bad requests
                since_check[0] = 0
                normal_ok(label)
            return st, hdrs, data

        def comp(**kw):
            b = {"prompt": "Hello there", "max_tokens": 2}
            b.update(kw)
            return b

        # --- authentication
        post("no key", 401, comp(), headers={}, param=None)
        post("wrong key (same length)", 401, comp(), headers={"Authorization": "Bearer sekrix"})
        post("shorter key", 401, comp(), headers={"Authorization": "Bearer sekri"})
        post("longer key", 401, comp(), headers={"Authorization": "Bearer sekrit-and-more"})
        post("key without Bearer", 401, comp(), headers={"Authorization": KEY})
        st, _, data = request(port, "GET", "/health")
        expect("/health without key", 200, st, {}, data, json_error=False)
        st, _, data = request(port, "GET", "/v1/models")
        expect("/v1/models without key", 401, st, {}, data)
        st, _, data = request(port, "GET", "/metrics")
        notes.append(f"/metrics without key -> {st}")

        # --- HTTP limits
        big = json.dumps(comp(user="x" * 70000)).encode()
        try:  # the client sends everything, then reads (as most clients do)
            r = Raw(port)
            try:
                r.send(build_request(port, "POST", "/v1/completions", big, AUTH))
            except (BrokenPipeError, ConnectionResetError):
                pass
            st, hdrs, data = r.read_response(timeout=10)
            expect("body 70 KB > 64 KiB", 413, st, hdrs, data)
            r.close()
        except (OSError, EOFError, ValueError) as e:
            failures.append(f"body 70 KB > 64 KiB: no 413 response, {e!r}")
        try:  # headers first, then wait for the answer before sending the body
            r = Raw(port)
            head = build_request(port, "POST", "/v1/completions", big, AUTH)
            r.send(head[:head.index(b"\r\n\r\n") + 4])
            st, hdrs, data = r.read_response(timeout=10)
            expect("Content-Length 70 KB > 64 KiB (headers only)", 413, st, hdrs, data)
            r.close()
        except (OSError, EOFError, ValueError) as e:
            failures.append(f"Content-Length > 64 KiB (headers only): no 413 response, {e!r}")
        try:  # a client that goes on sending its 4 MB body after the 413 is out (lingering close:
            # the server drains it, so no reset and no broken pipe before the client reads)
            r = Raw(port)
            huge = json.dumps(comp(user="y" * 4_000_000)).encode()
            req = build_request(port, "POST", "/v1/completions", huge, AUTH)
            cut = req.index(b"\r\n\r\n") + 4
            r.send(req[:cut])
            time.sleep(0.5)  # (the 413 has been written by now)
            for i in range(cut, len(req), 65536):
                r.send(req[i:i + 65536])
                if i < cut + 8 * 65536:
                    time.sleep(0.02)
            st, hdrs, data = r.read_response(timeout=10)
            expect("4 MB body sent whole after the 413", 413, st, hdrs, data)
            r.close()
        except (OSError, EOFError, ValueError) as e:
            failures.append(f"4 MB body sent whole: the 413 was lost ({e!r})")
        normal_ok("413")
        try:
            r = Raw(port)
            hdr = dict(AUTH)
            hdr["X-Padding"] = "p" * 9000
            try:
                r.send(build_request(port, "POST", "/v1/completions", comp(), hdr))
            except (BrokenPipeError, ConnectionResetError):
                pass
            st, hdrs, data = r.read_response(timeout=10)
            expect("header block 9 KB > 8 KiB", 431, st, hdrs, data)
            r.close()
        except (OSError, EOFError, ValueError) as e:
            failures.append(f"header block 9 KB > 8 KiB: no 431 response, {e!r}")
        try:  # many small headers adding up to more than 8 KiB
            r = Raw(port)
            hdr = dict(AUTH)
            hdr.update({f"X-H{i}": "v" * 90 for i in range(100)})
            try:
                r.send(build_request(port, "POST", "/v1/completions", comp(), hdr))
            except (BrokenPipeError, ConnectionResetError):
                pass
            st, hdrs, data = r.read_response(timeout=10)
            expect("100 headers of 100 B > 8 KiB", 431, st, hdrs, data)
            r.close()
        except (OSError, EOFError, ValueError) as e:
            failures.append(f"100 headers > 8 KiB: no 431 response, {e!r}")
        try:  # a chunked body over the limit
            r = Raw(port)
            head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                    f"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
            payload = b"".join(b"%x\r\n%s\r\n" % (8192, b" " * 8192) for _ in range(9))
            try:
                r.send(head + payload)
            except (BrokenPipeError, ConnectionResetError):
                pass
            st, hdrs, data = r.read_response(timeout=10)
            expect("chunked body 72 KiB > 64 KiB", 413, st, hdrs, data)
            r.close()
        except (OSError, EOFError, ValueError) as e:
            failures.append(f"chunked body > 64 KiB: no 413 response, {e!r}")
        for label, raw in (("garbage request line", b"HELLO\r\n\r\n"),
                           ("Content-Length: -5", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"),
                           ("two different Content-Lengths", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}x")):
            try:
                r = Raw(port)
                r.send(raw)
                st, hdrs, data = r.read_response(timeout=10)
                expect(label, 400, st, hdrs, data)
                r.close()
            except (OSError, EOFError, ValueError) as e:
                failures.append(f"{label}: no 400 response, {e!r}")
        normal_ok("431")
        # A JSON error leaves a keep-alive connection usable.
        conn = http.client.HTTPConnection(HOST, port, timeout=30)
        try:
            conn.request("POST", "/v1/completions", body="[1]", headers=dict(AUTH, **{"Content-Type": "application/json"}))
            r1 = conn.getresponse()
            r1.read()
            conn.request("POST", "/v1/completions", body=json.dumps(comp()), headers=dict(AUTH, **{"Content-Type": "application/json"}))
            r2 = conn.getresponse()
            d2 = r2.read()
            expect("keep-alive: 400 then a normal request on the same connection", 200, r2.status, {}, d2, json_error=False)
        except (OSError, http.client.HTTPException) as e:
            failures.append(f"keep-alive after a 400: {e!r}")
        finally:
            conn.close()
        # Slow headers and slow body (read timeout 3 s), both at once: within 4 s the server must
        # answer 408 or close the connection. Records when and how.
        slow_h, slow_b = Raw(port), Raw(port)
        slow_h.send(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bea")
        body = json.dumps(comp()).encode()
        slow_b.send(build_request(port, "POST", "/v1/completions", body, AUTH)[:-len(body) + 5])
        t0 = time.time()
        for label, r in (("slow headers (--read-timeout 3)", slow_h), ("slow body (--read-timeout 3)", slow_b)):
            short = label.split(" (")[0]
            try:
                r.sock.settimeout(max(0.05, 4.0 - (time.time() - t0)))
                first = r.sock.recv(65536)
                t_ev = time.time() - t0
                if not first:
                    passed[0] += 1
                    notes.append(f"{short}: closed after {t_ev:.1f}s with no 408 sent")
                else:
                    r.buf = first
                    st, hdrs, data = r.read_response(timeout=2)
                    expect(label, 408, st, hdrs, data)
                    notes.append(f"{short}: {st} after {t_ev:.1f}s")
            except ConnectionResetError:
                passed[0] += 1
                notes.append(f"{short}: reset after {time.time() - t0:.1f}s")
            except socket.timeout:
                failures.append(f"{label}: connection still open and silent after {time.time() - t0:.1f} s")
            except (EOFError, ValueError, OSError) as e:
                failures.append(f"{label}: {e!r}")
            r.close()
        normal_ok("read timeouts")

        # --- JSON
        post("invalid JSON", 400, '{"prompt": "hi", ', param=None)
        post("body [1]", 400, "[1]", param=None)
        post("body \"str\"", 400, '"hello"', param=None)
        post("empty body", 400, "", param=None)
        post("10000-deep nesting", 400, '{"prompt":"x","a":' + "[" * 10000 + "]" * 10000 + "}", param=None)
        post("10000-deep objects", 400, '{"prompt":"x","a":' + '{"a":' * 10000 + "1" + "}" * 10000 + "}", param=None)
        post("invalid UTF-8 in a string", 400, b'{"prompt": "caf\xc3\x28 \xff\xfe", "max_tokens": 2}', param=None)
        post("trailing garbage", 400, '{"prompt": "hi", "max_tokens": 2} x', param=None)

        # --- prompts and messages
        post("empty prompt", 400, comp(prompt=""), param="prompt")
        post("prompt []", 400, comp(prompt=[]), param="prompt")
        post("missing prompt", 400, {"max_tokens": 2}, param="prompt")
        post("empty messages", 400, {"messages": [], "max_tokens": 2}, path="/v1/chat/completions", param="messages")
        post("message without role", 400, {"messages": [{"content": "hi"}]}, path="/v1/chat/completions", param="messages")
        post("token id 999999", 400, comp(prompt=[1, 2, 999999]), param="prompt")
        post("token id -1", 400, comp(prompt=[-1]), param="prompt")
        long_prompt = words(rng, 1000)
        post(f"prompt ~1000 tok > -c {CTX}", 400, {"prompt": long_prompt}, param="prompt")
        post(f"chat ~1000 tok > -c {CTX}", 400, {"messages": [{"role": "user", "content": long_prompt}]},
             path="/v1/chat/completions", param="messages")
        p500 = words(rng, 505)
        n500 = len(tokenize(port, p500, AUTH))
        post(f"prompt {n500} + max_tokens {CTX - n500 + 1} > {CTX}", 400, {"prompt": p500, "max_tokens": CTX - n500 + 1},
             param="max_tokens")
        st, hdrs, data = request(port, "POST", "/v1/completions",
                                 {"prompt": p500, "max_tokens": CTX - n500, "ignore_eos": True}, AUTH)
        expect(f"prompt {n500} + max_tokens {CTX - n500} = {CTX} (fits)", 200, st, hdrs, data, json_error=False)
        post("prompt 300 + max_tokens 300 > 512", 400, {"prompt": words(rng, 300), "max_tokens": 300}, param="max_tokens")

        # --- numeric parameters
        for v in (0, -1, 1e9, "10", 1.5, True, [1]):
            post(f"max_tokens {v!r}", 400, comp(max_tokens=v), param="max_tokens")
        post("max_tokens 1e999", 400, '{"prompt": "hi", "max_tokens": 1e999}', param=None)
        for v in (0, -1, 17, 1.5, "2"):
            post(f"n {v!r}", 400, comp(n=v), param="n")
        normal_ok("max_tokens / n cases")
        bad_sampling = {
            "temperature": [-1, 5, "x", 2.5],
            "top_p": [-1, 5, "x", 0],
            "top_k": [-2, "x", 1.5],
            "min_p": [-1, 5, "x"],
            "presence_penalty": [5, -3, "x"],
            "frequency_penalty": [5, "x"],
            "repetition_penalty": [0, 5, "x"],
        }
        for name, values in bad_sampling.items():
            for v in values:
                post(f"{name} {v!r}", 400, comp(**{name: v}), param=name)
            post(f"{name} NaN (literal)", 400, '{"prompt": "hi", "max_tokens": 2, "%s": NaN}' % name, param=None)
            post(f"{name} 1e999", 400, '{"prompt": "hi", "max_tokens": 2, "%s": 1e999}' % name)
            post(f"{name} Infinity (literal)", 400, '{"prompt": "hi", "max_tokens": 2, "%s": Infinity}' % name,
                 param=None)
        for name, v in (("top_k", -1), ("top_k", 5), ("presence_penalty", -1), ("seed", -1), ("top_p", 1)):
            st, hdrs, data = request(port, "POST", "/v1/completions", comp(**{name: v}), AUTH)
            expect(f"{name} {v} (valid)", 200, st, hdrs, data, json_error=False)
        post("chat top_logprobs 21", 400, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                            "logprobs": True, "top_logprobs": 21},
             path="/v1/chat/completions", param="top_logprobs")
        post("completions logprobs 21", 400, comp(logprobs=21), param="logprobs")
        post("5 stop strings", 400, comp(stop=["a", "b", "c", "d", "e"]), param="stop")
        post("10 KB stop string", 400, comp(stop="s" * 10240), param="stop")
        post("empty stop string", 400, comp(stop=[""]), param="stop")
        post("stop [1]", 400, comp(stop=[1]), param="stop")
        post("stop_token_ids [999999]", 400, comp(stop_token_ids=[999999]), param="stop_token_ids")
        post('logit_bias {"999999": 1}', 400, comp(logit_bias={"999999": 1}), param="logit_bias")
        post('logit_bias {"abc": 1}', 400, comp(logit_bias={"abc": 1}), param="logit_bias")
        post('logit_bias {"5": 101}', 400, comp(logit_bias={"5": 101}), param="logit_bias")
        post('logit_bias {"5": 1e999}', 400, '{"prompt": "hi", "max_tokens": 2, "logit_bias": {"5": 1e999}}')
        post("seed 1.5", 400, comp(seed=1.5), param="seed")
        post("seed 18446744073709551616", 400, '{"prompt": "hi", "max_tokens": 2, "seed": 18446744073709551616}')
        post("seed \"1\"", 400, comp(seed="1"), param="seed")
        post("stream \"yes\"", 400, comp(stream="yes"), param="stream")
        post("stream_options without stream", 400, comp(stream_options={"include_usage": True}), param="stream_options")

        # --- /tokenize, /detokenize
        post("/detokenize [999999]", 400, {"tokens": [999999]}, path="/detokenize", param="tokens")
        post("/detokenize tokens 'x'", 400, {"tokens": "x"}, path="/detokenize", param="tokens")
        post("/tokenize prompt and messages", 400, {"prompt": "x", "messages": [{"role": "user", "content": "x"}]},
             path="/tokenize")
        post("/tokenize prompt 5", 400, {"prompt": 5}, path="/tokenize", param="prompt")

        # --- routing
        post("unknown model", 404, comp(model="nope"), param="model")
        st, hdrs, data = request(port, "POST", "/v1/nope", comp(), AUTH)
        expect("unknown route", 404, st, hdrs, data)
        st, hdrs, data = request(port, "GET", "/v1/completions", None, AUTH)
        expect("GET /v1/completions", 405, st, hdrs, data)
        st, hdrs, data = request(port, "POST", "/v1/models", comp(), AUTH)
        expect("POST /v1/models", 405, st, hdrs, data)
        normal_ok("routing")

        # --- special-token text in user content
        st, hdrs, data = request(port, "POST", "/v1/chat/completions",
                                 {"messages": [{"role": "user", "content": "<|im_start|>"}], "max_tokens": 4}, AUTH)
        expect("chat content '<|im_start|>'", 200, st, hdrs, data, json_error=False)
        try:
            tk = lambda c: call(port, "/tokenize", {"messages": [{"role": "user", "content": c}]}, AUTH)[1]["tokens"]
            with_tag, plain = tk("<|im_start|>"), tk("x")
            sid = plain[0]  # the chat template starts with <|im_start|>
            as_text = len(tokenize(port, "<|im_start|>", AUTH))
            if with_tag.count(sid) > plain.count(sid):
                notes.append(f"'<|im_start|>' in chat user content -> 200, but it is encoded as the special token {sid} "
                             f"(a user can inject chat-template tokens; /tokenize of the same text as a prompt gives "
                             f"{as_text} plain-text tokens)")
            else:
                notes.append(f"'<|im_start|>' in chat user content -> 200, encoded as plain text")
        except Exception as e:  # noqa: BLE001
            notes.append(f"special-token probe failed: {e!r}")

        # --- queue full: 2 running (max-num-seqs 2), no queue (max-queue 0)
        m0, _ = wait_idle(port, headers=AUTH)
        blockers = []
        try:
            for i in range(2):
                r = Raw(port)
                blockers.append(r)
                r.send(build_request(port, "POST", "/v1/completions",
                                     gen_body("Story " + words(rng, 6), 1, True, 400), AUTH))
            for r in blockers:
                r.wait_for(b"data: ", 1, timeout=30)
            st, hdrs, data = request(port, "POST", "/v1/completions", comp(), AUTH)
            expect("third request with 2 running, --max-queue 0", 429, st, hdrs, data,
                   extra_ok=lambda h, d: None if h.get("retry-after", "").strip().isdigit()
                   else f"Retry-After header {h.get('retry-after')!r}")
            st, hdrs, data = request(port, "POST", "/v1/chat/completions",
                                     {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}, AUTH)
            expect("third (chat) request with 2 running", 429, st, hdrs, data)
        finally:
            for r in blockers:
                r.close()
        try:
            m1, _ = wait_idle(port, headers=AUTH)
            if m1["troupe:kv_cache_free_blocks"] != m0["troupe:kv_cache_free_blocks"]:
                failures.append(f"after the 429 case: {m0['troupe:kv_cache_free_blocks'] - m1['troupe:kv_cache_free_blocks']:.0f}"
                                f" KV blocks not freed")
        except CheckFailed as e:
            failures.append(f"after the 429 case: {e}")
        ok_after = False
        for _ in range(30):  # the two closed requests must give their slots back
            st, _, _ = request(port, "POST", "/v1/completions", comp(), AUTH)
            if st == 200:
                ok_after = True
                break
            time.sleep(0.1)
        if not ok_after:
            failures.append(f"after closing the 2 blockers: still {st} 3 s later (queue slots leaked)")
        st, hdrs, data = request(port, "POST", "/v1/completions", comp(n=2), AUTH)
        expect("n=2 on an idle server (fits --max-num-seqs 2)", 200, st, hdrs, data, json_error=False)
        st, hdrs, data = request(port, "POST", "/v1/completions", comp(n=3), AUTH)
        notes.append(f"n=3 with capacity 2 (can never fit) -> {st}" + (" + Retry-After" if "retry-after" in hdrs else ""))
        normal_ok("the end")
        check(s.alive(), "the server died:\n" + s.log_tail())
    check(not failures, f"{len(failures)} of {len(failures) + passed[0]} cases failed:\n      " + "\n      ".join(failures))
    return f"{passed[0]} cases as expected; " + "; ".join(notes)


# --- drain ------------------------------------------------------------------------------------

@register("drain")
def t_drain():
    notes = []
    with Server("--drain-timeout", 20, name="drain") as s:
        port = s.port
        first = threading.Event()
        prompts = ["Tell me about rivers.", "Write about winter markets.", "Describe a silver engine."]

        ended = [None] * 3

        def one(i, p):
            try:
                return sse_stream(port, "/v1/completions",
                                  {"prompt": p, "max_tokens": 60, "ignore_eos": True, "temperature": 0, "stream": True,
                                   "stream_options": {"include_usage": True}},
                                  on_event=lambda e: first.set())
            finally:
                ended[i] = time.time()

        results = [None] * 3
        threads = []
        for i, p in enumerate(prompts):
            t = threading.Thread(target=lambda i=i, p=p: results.__setitem__(i, _capture(one, i, p)), daemon=True)
            t.start()
            threads.append(t)
        check(first.wait(30), "no streamed chunk within 30 s")
        t_sig = time.time()
        s.signal(signal.SIGTERM)
        health_503 = None
        while time.time() - t_sig < 1.0:
            try:
                st, _, data = request(port, "GET", "/health", timeout=1)
                if st == 503:
                    health_503 = time.time() - t_sig
                    check(b"draining" in data, f"/health 503 body {data!r}")
                    break
            except OSError as e:
                raise CheckFailed(f"/health unreachable {time.time() - t_sig:.2f}s after SIGTERM: {e!r}")
            time.sleep(0.01)
        check(health_503 is not None, "/health still 200 one second after SIGTERM")
        try:
            st, hdrs, data = request(port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}, timeout=5)
            check(st == 503, f"new request while draining: {st} {data[:200]!r}")
            check(hdrs.get("retry-after", "").strip().isdigit(), f"503 without Retry-After: {hdrs}")
            e = error_shape(data)
            check(not isinstance(e, str), f"503 body: {e}")
            notes.append(f"new request -> 503, Retry-After {hdrs['retry-after']}")
        except ConnectionRefusedError:
            notes.append("new request -> connection refused")
        for t in threads:
            t.join(60)
        for i, r in enumerate(results):
            check(not isinstance(r, BaseException), f"stream {i}: {r!r}")
            st, events, done = r
            check(st == 200, f"stream {i}: status {st}")
            check(done, f"stream {i}: no [DONE] ({len(events)} events), connection ended "
                        f"{ended[i] - t_sig:.1f}s after SIGTERM")
            usage = [e["usage"] for e in events if e.get("usage")]
            check(usage and usage[-1]["completion_tokens"] == 60, f"stream {i}: usage {usage}")
            finish = [c["finish_reason"] for e in events for c in e.get("choices", []) if c.get("finish_reason")]
            check(finish == ["length"], f"stream {i}: finish reasons {finish}")
        try:
            rc = s.proc.wait(timeout=25)
        except subprocess.TimeoutExpired:
            raise CheckFailed("server still running 25 s after SIGTERM (--drain-timeout 20)")
        t_exit = time.time() - t_sig
        check(rc == 0, f"exit code {rc} after SIGTERM:\n{s.log_tail()}")
        check(t_exit < 20, f"exit {t_exit:.1f}s after SIGTERM")
    # Past the deadline, requests still running are cancelled and the server exits 0.
    with Server("--drain-timeout", 1, name="drain-timeout") as s:
        r = Raw(s.port)
        r.send(build_request(s.port, "POST", "/v1/completions",
                             {"prompt": "Count:", "max_tokens": 3000, "ignore_eos": True, "stream": True}))
        r.wait_for(b"data: ", 1)
        t_sig = time.time()
        s.signal(signal.SIGTERM)
        try:
            rc = s.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            raise CheckFailed("--drain-timeout 1: server still running 10 s after SIGTERM with a long request")
        t_exit2 = time.time() - t_sig
        ended = r.closed_by_peer(2)
        r.close()
        check(rc == 0, f"--drain-timeout 1: exit code {rc}:\n{s.log_tail()}")
        check(ended, "--drain-timeout 1: the cancelled stream's connection was not closed")
    return (f"/health 503 {health_503 * 1000:.0f} ms after SIGTERM; " + "; ".join(notes) +
            f"; 3 streams got 60 tokens + [DONE]; exit 0 after {t_exit:.1f}s; --drain-timeout 1 with a 3000-token "
            f"request: exit 0 after {t_exit2:.1f}s")


def _capture(fn, *a):
    try:
        return fn(*a)
    except BaseException as e:  # noqa: BLE001
        return e


# --- metrics and health -----------------------------------------------------------------------

SERIES = ["troupe:kv_cache_free_blocks", "troupe:num_requests_running", "troupe:num_requests_waiting",
          "troupe:prefix_cache_hits_total", "troupe:prefix_cache_queries_total", "troupe:prompt_tokens_total",
          "troupe:prompt_tokens_computed_total", "troupe:generation_tokens_total", "troupe:num_preemptions_total",
          "troupe:itl_target_capped_steps_total", "troupe:step_time_fixed_seconds",
          "troupe:step_time_per_token_seconds", "troupe:step_time_per_row_seconds",
          "troupe:step_time_per_pair_seconds"]
HISTOGRAMS = ["troupe:time_to_first_token_seconds", "troupe:inter_token_latency_seconds",
              "troupe:e2e_request_latency_seconds", "troupe:request_queue_time_seconds"]


def check_histogram(m, name):
    buckets = [(k, v) for k, v in m.series.items() if k.startswith(name + "_bucket{")]
    check(buckets, f"no {name}_bucket")
    check(m.has(name + "_count") and m.has(name + "_sum"), f"{name}: _count or _sum missing")
    values = [v for _, v in buckets]
    check(values == sorted(values), f"{name}: buckets not cumulative: {values}")
    inf = [v for k, v in buckets if 'le="+Inf"' in k]
    check(inf and inf[0] == m[name + "_count"], f"{name}: +Inf bucket {inf} != count {m[name + '_count']}")
    check(f"# TYPE {name} histogram" in m.text, f"{name}: no TYPE line")


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        x = f.read().rsplit(")", 1)[1].split()
    return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")


@register("connections")
def t_connections():
    """--max-connections: with the cap's worth of idle connections open, one more is answered
    503 (JSON error, Retry-After) and closed, the open ones still work, and the server sits
    idle; after they close, requests are served again. Under an open-file limit of 100 the
    server lowers the cap to fit (100 - 64 reserved = 36) instead of running out of
    descriptors, where accepting would fail -- and, before the fix, spin a core retrying."""
    notes = []
    for label, args, nofile, cap in (("--max-connections 8", ("--max-connections", 8), None, 8),
                                     ("open-file limit 100", (), 100, 36)):
        with Server(*args, name=label, nofile=nofile) as s:
            port = s.port
            ref = complete(port, "Hello there", 2)
            if nofile:
                with open(s.log_file.name, "rb") as f:
                    logtext = f.read().decode("utf-8", "replace")
                check(f"--max-connections 1024 lowered to {cap}" in logtext,
                      f"{label}: no warning that the cap was lowered to {cap}:\n{s.log_tail()}")
            held = []
            try:
                for _ in range(cap):
                    held.append(Raw(port, timeout=10))
                time.sleep(0.3)
                refused, extra = 0, 30 if nofile else 4
                for _ in range(extra):
                    c = Raw(port, timeout=10)
                    try:
                        st, hdrs, body = c.read_response(timeout=5)  # (nothing sent: the server speaks first)
                    finally:
                        c.close()
                    if st == 503:
                        check(hdrs.get("retry-after") == "1", f"{label}: 503 without Retry-After: {hdrs}")
                        e = error_shape(body)
                        check(not isinstance(e, str) and "too many open connections" in e["message"],
                              f"{label}: 503 body {body!r}")
                        refused += 1
                check(refused == extra, f"{label}: {refused} of {extra} connections over the cap got a 503")
                c0 = cpu_seconds(s.proc.pid)
                time.sleep(2.0)
                idle_cpu = cpu_seconds(s.proc.pid) - c0
                check(idle_cpu < 0.5, f"{label}: the server used {idle_cpu:.2f} s of CPU in 2 s with {cap} idle connections")
                # a held connection still works
                h = held.pop()
                h.send(build_request(port, "POST", "/v1/completions",
                                     {"prompt": "Hello there", "max_tokens": 2, "temperature": 0}))
                st, _, body = h.read_response(timeout=30)
                check(st == 200, f"{label}: a held connection got {st}: {body[:80]!r}")
                h.close()
            finally:
                for h in held:
                    h.close()
            time.sleep(0.5)
            again = outcome(complete(port, "Hello there", 2))
            check(again == outcome(ref), f"{label}: after closing, {again} != {outcome(ref)}")
            notes.append(f"{label}: cap {cap}, {extra} over it refused with 503, {idle_cpu:.2f} s CPU in 2 s idle")
    return "; ".join(notes)


def burst_requests(port, bodies, path="/v1/completions", timeout=300):
    """Sends one request per body at once, each on its own connection, from one thread
    (sockets connected first, requests written back to back, answers read as they come), so
    that the timings are the server's and not client threads waiting for each other. Returns
    [(status, seconds from sending to the answer's first byte, seconds to its last byte, body)]."""
    socks = [socket.create_connection((HOST, port), timeout=30) for _ in bodies]
    sel = selectors.DefaultSelector()
    state = []
    try:
        for i, (sk, body) in enumerate(zip(socks, bodies)):
            sk.sendall(build_request(port, "POST", path, body))
            state.append({"sent": time.perf_counter(), "buf": b"", "first": None, "done": None})
            sk.setblocking(False)
            sel.register(sk, selectors.EVENT_READ, i)
        left, deadline = len(socks), time.time() + timeout
        while left and time.time() < deadline:
            for key, _ in sel.select(timeout=1.0):
                i, st_ = key.data, state[key.data]
                try:
                    d = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                now = time.perf_counter()
                if st_["first"] is None and d:
                    st_["first"] = now
                st_["buf"] += d
                head, sep, body = st_["buf"].partition(b"\r\n\r\n")
                length = None
                for line in head.split(b"\r\n")[1:]:
                    k, _, v = line.partition(b":")
                    if k.strip().lower() == b"content-length":
                        length = int(v)
                if not d or (sep and length is not None and len(body) >= length):
                    st_["done"] = now
                    sel.unregister(key.fileobj)
                    left -= 1
        out = []
        for st_ in state:
            check(st_["done"] is not None, f"no complete answer within {timeout} s: {st_['buf'][:120]!r}")
            status = int(st_["buf"].split(b" ", 2)[1]) if st_["buf"].startswith(b"HTTP/1.1 ") else 0
            body = st_["buf"].partition(b"\r\n\r\n")[2]
            out.append((status, st_["first"] - st_["sent"], st_["done"] - st_["sent"], body))
        return out
    finally:
        sel.close()
        for sk in socks:
            sk.close()


@register("overload")
def t_overload():
    """Three times the capacity at once: a server with 4 running slots and a queue of 4 (8
    sequences) gets bursts of 24 concurrent requests. The 16 over capacity must be refused
    with 429 within 50 ms (p99, request sent to answer), the 8 admitted ones must take about
    as long as 8 alone (at most 1.5x), and resident memory stays bounded (64 MB)."""
    running, queue, burst, rounds = 4, 4, 24, 3
    with Server("--max-num-seqs", running, "--max-queue", queue, name="overload") as s:
        port = s.port
        pid = s.proc.pid
        rng = random.Random(11)

        def bodies(n):  # fresh prompts each time: no prefix-cache hits between rounds
            return [{"prompt": words(rng, 40), "max_tokens": 32, "temperature": 0, "ignore_eos": True} for _ in range(n)]

        base = []
        for _ in range(2):  # capacity's worth at once, nothing refused
            wait_idle(port, timeout=60)
            got = burst_requests(port, bodies(running + queue))
            for st, _, _, data in got:
                check(st == 200, f"baseline request: status {st}: {data[:160]!r}")
            base += [t for _, _, t, _ in got]
        base_mean = sum(base) / len(base)
        rss0 = rss_kb(pid)
        refused_lat, admitted_lat, peak = [], [], rss0
        for _ in range(rounds):
            wait_idle(port, timeout=60)
            for st, first, done, data in burst_requests(port, bodies(burst)):
                if st == 429:
                    refused_lat.append(done)
                elif st == 200:
                    admitted_lat.append(done)
                else:
                    raise CheckFailed(f"overload request: status {st}, expected 200 or 429: {data[:160]!r}")
            peak = max(peak, rss_kb(pid))
        m, _ = wait_idle(port, timeout=60)
        n_ref = len(refused_lat)
        expect_ref = rounds * (burst - running - queue)
        check(n_ref == expect_ref, f"{n_ref} requests refused over {rounds} bursts, expected {expect_ref} "
                                   f"({len(admitted_lat)} admitted)")
        refused_lat.sort()
        p99 = refused_lat[min(len(refused_lat) - 1, int(0.99 * len(refused_lat)))]
        adm_mean = sum(admitted_lat) / len(admitted_lat)
        growth = (peak - rss0) / 1024
        note = (f"{n_ref} of {rounds * burst} refused with 429 (p50 {refused_lat[len(refused_lat) // 2] * 1000:.1f} ms, "
                f"p99 {p99 * 1000:.1f} ms); admitted requests {adm_mean:.2f} s each vs {base_mean:.2f} s at capacity "
                f"alone ({adm_mean / base_mean:.2f}x); RSS {rss0 / 1024:.0f} MB before, peak {peak / 1024:.0f} MB")
        check(p99 <= 0.050, f"429s too slow: {note}")
        check(adm_mean <= 1.5 * base_mean, f"admitted requests slowed down: {note}")
        check(growth <= 64, f"memory grew {growth:.0f} MB under overload: {note}")
        check(m["troupe:num_requests_running"] == 0, "requests still running at idle")
        return note


@register("step_hang")
def t_step_hang():
    """A step that never returns (--debug-hang-step, as a hung device would) while the
    scheduler keeps its heartbeat: /health must turn 503 ('engine stalled') once the step
    has run longer than --stall-timeout (2 s here) -- before this check, /health answered
    200 for as long as the scheduler beat -- and /metrics shows the step's age; SIGTERM
    still ends the process (the drain times out, the hung worker is let go), exit 0."""
    with Server("--debug-hang-step", 10, "--stall-timeout", 2, "--drain-timeout", 1, name="hang") as s:
        port = s.port
        st, _, _ = request(port, "GET", "/health")
        check(st == 200, f"/health before the hang: {st}")
        r = Raw(port)
        r.send(build_request(port, "POST", "/v1/completions", gen_body("Tell me a story.", 1, True, 100)))
        t0 = time.time()
        seen_ok, stalled = False, None
        while time.time() - t0 < 20:
            st, _, data = request(port, "GET", "/health", timeout=5)
            h = json.loads(data)
            if st == 200:
                seen_ok = True
            elif h.get("status") == "engine stalled":
                stalled = (time.time() - t0, h)
                break
            time.sleep(0.2)
        check(stalled is not None, f"/health never reported the stall within 20 s (last: {st} {data[:200]!r})")
        check(stalled[1]["oldest_step_seconds"] > 2 and "--stall-timeout 2" in stalled[1].get("error", ""),
              f"/health while stalled: {stalled[1]}")
        m = metrics(port)
        check(m["troupe:engine_oldest_step_seconds"] > 2, "/metrics: troupe:engine_oldest_step_seconds "
                                                          f"{m['troupe:engine_oldest_step_seconds']}")
        check(m["troupe:engine_heartbeat_age_seconds"] < 5, "the scheduler's heartbeat stopped too (expected it alive)")
        s.signal(signal.SIGTERM)
        try:
            rc = s.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            raise CheckFailed("no exit within 30 s of SIGTERM with a hung step")
        finally:
            r.close()
        check(rc == 0, f"exit code {rc} after SIGTERM with a hung step")
        return (f"/health 503 'engine stalled' {stalled[0]:.1f} s after the request (step age "
                f"{stalled[1]['oldest_step_seconds']:.1f} s; 200 before: {seen_ok}); exit 0 on SIGTERM")


@register("itl_target")
def t_itl_target():
    """The inter-token latency target end to end (--itl-target-ms, docs/serving.md): with
    three requests streaming, a 1,200-word prompt arrives. Under the default target the
    scheduler actor has learned step times (the /metrics gauges) and caps the steps that
    carry the prompt (troupe:itl_target_capped_steps_total grows); with --itl-target-ms 0
    no step is capped. Either way the prompt's greedy tokens equal its solo run's: smaller
    chunks change when tokens are computed, not what they are."""
    rng = random.Random(23)
    prompt = "Summarize: " + words(rng, 1200)
    out = []
    for flags, capped in ((), True), (("--itl-target-ms", 0), False):
        # No prefix cache: the prompt beside the streams is computed again, not found.
        with Server("--max-num-seqs", 8, "--no-prefix-caching", *flags, name="itl-target") as s:
            port = s.port
            solo = outcome(complete(port, prompt, 8))
            blockers = open_blockers(port, random.Random(5), count=3, max_tokens=300)
            try:
                m0 = metrics(port)
                beside = outcome(complete(port, prompt, 8))
                m1 = metrics(port)
            finally:
                for r in blockers:
                    r.close()
            check(beside == solo, f"{flags}: the prompt's tokens beside streams {beside} != solo {solo}")
            grew = m1["troupe:itl_target_capped_steps_total"] - m0["troupe:itl_target_capped_steps_total"]
            per_token = m1["troupe:step_time_per_token_seconds"]
            if capped:
                check(per_token > 0 and m1["troupe:step_time_fixed_seconds"] >= 0,
                      f"step-time model not learned: per token {per_token}")
                check(grew > 0, "no step was capped while three requests streamed")
            else:
                check(m1["troupe:itl_target_capped_steps_total"] == 0, f"--itl-target-ms 0 capped "
                                                                      f"{m1['troupe:itl_target_capped_steps_total']} steps")
            out.append(f"{'target 100 ms' if capped else 'off'}: {grew:.0f} capped steps, "
                       f"{per_token * 1000:.2f} ms/token learned")
    return "; ".join(out) + "; greedy tokens equal to the solo run's"


@register("neighbours")
def t_neighbours():
    """Adversarial batch neighbours (RELIABILITY.md, determinism): a greedy request runs beside
    requests with extreme sampling settings -- +100 on one token, -100 on 1,000 tokens,
    penalties at their limits, temperature 2 with top_k 1, n = 3 with seeds, 20 top logprobs
    -- and beside refused ones (a logit_bias id outside the vocabulary, a NaN temperature).
    Its tokens must equal its solo run's; the forced neighbour must produce only its forced
    token (the bias lands on its own row, nowhere else)."""
    with Server("--max-num-seqs", 16, name="neighbours") as s:
        port = s.port
        prompt = "Write a short list of three fruits and their colours:"
        ref = outcome(complete(port, prompt, 40))
        forced = tokenize(port, " banana")[-1]
        bias_many = {str(t): -100 for t in range(1000, 2000)}
        neighbours = [
            {"prompt": "Tell me about the sea.", "max_tokens": 40, "logit_bias": {str(forced): 100}, "temperature": 0},
            {"prompt": "Tell me about the sea.", "max_tokens": 40, "logit_bias": bias_many, "temperature": 0.9, "seed": 3},
            {"prompt": "Once upon a time", "max_tokens": 40, "presence_penalty": 2, "frequency_penalty": 2,
             "repetition_penalty": 2, "temperature": 1, "seed": 4},
            {"prompt": "Once upon a time", "max_tokens": 40, "temperature": 2, "top_k": 1},
            {"prompt": "List some numbers:", "max_tokens": 40, "n": 3, "temperature": 1.5, "top_p": 0.5, "seed": 5},
            {"prompt": "The weather today", "max_tokens": 40, "logprobs": 20, "temperature": 0.7, "seed": 6},
        ]
        bad = [b'{"prompt": "x", "max_tokens": 4, "logit_bias": {"999999": 5}}',
               b'{"prompt": "x", "max_tokens": 4, "temperature": NaN}']
        for round_ in range(2):
            fns = [lambda: complete(port, prompt, 40)]
            fns += [lambda b=b: call(port, "/v1/completions", b) for b in neighbours]
            fns += [lambda b=b: request(port, "POST", "/v1/completions", b) for b in bad]
            res = run_threads(fns)
            for r in res:
                check(not isinstance(r, BaseException), f"round {round_}: a request failed: {r!r}")
            check(outcome(res[0]) == ref, f"round {round_}: the greedy request changed beside its neighbours: "
                                          f"{outcome(res[0])} != {ref}")
            for i, r in enumerate(res[1:1 + len(neighbours)]):
                check(r[0] == 200, f"round {round_}: neighbour {i}: status {r[0]}: {r[3][:160]!r}")
            forced_tokens = tokenize(port, res[1][1]["choices"][0]["text"])
            check(forced_tokens and all(t == forced for t in forced_tokens),
                  f"round {round_}: the forced neighbour produced {res[1][1]['choices'][0]['text'][:80]!r}")
            for r in res[1 + len(neighbours):]:
                check(r[0] == 400, f"round {round_}: a bad neighbour got {r[0]}, expected 400")
        return f"greedy output unchanged beside {len(neighbours)} extreme and {len(bad)} refused neighbours, 2 rounds"


@register("step_failure")
def t_step_failure():
    """A failing engine step (RELIABILITY.md: injected with --debug-fail-step, as a broken
    device would fail): every running request ends with a typed error -- a 503 with an
    OpenAI error body, or an error event in a stream that then ends -- within seconds;
    /health turns 503 and names the cause; new requests get 503; the KV pool is back at its
    baseline; SIGTERM still exits 0. With one pipeline stage and with two (a plan in flight
    per stage)."""
    notes = []
    for stages in (1, 2):
        with Server("--debug-fail-step", 25, "--pipeline-stages", stages, name=f"fail-step-{stages}") as s:
            port = s.port
            m0, _ = wait_idle(port)

            def one(i):
                chat = i % 2 == 1
                body = gen_body(f"Tell me story number {i}.", 1, i >= 2, 120, chat=chat)
                return request(port, "POST", "/v1/chat/completions" if chat else "/v1/completions", body, timeout=60)

            t0 = time.time()
            res = run_threads([lambda i=i: one(i) for i in range(4)])
            took = time.time() - t0
            for i, r in enumerate(res):
                check(not isinstance(r, BaseException), f"{stages} stage(s): request {i} failed on the client: {r!r}")
                st, _, data = r
                if i < 2:  # not streamed: the error is the response
                    check(st == 503, f"{stages} stage(s): request {i}: status {st}, expected 503: {data[:160]!r}")
                    e = error_shape(data)
                    check(not isinstance(e, str) and "injected fault" in e["message"],
                          f"{stages} stage(s): request {i}: error body {data[:200]!r}")
                else:  # streamed: an error event, then the stream ends
                    check(st == 200, f"{stages} stage(s): stream {i}: status {st}")
                    check(b'"error"' in data and b"injected fault" in data,
                          f"{stages} stage(s): stream {i} has no error event: {data[-300:]!r}")
            check(took < 30, f"{stages} stage(s): the failed requests took {took:.1f} s to end")
            st, _, data = request(port, "GET", "/health")
            h = json.loads(data)
            check(st == 503 and h.get("status") == "failed" and "injected fault" in h.get("error", ""),
                  f"{stages} stage(s): /health after the failure: {st} {data[:200]!r}")
            st, _, data = request(port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3})
            check(st == 503 and b"engine has failed" in data, f"{stages} stage(s): a new request got {st} {data[:160]!r}")
            m, _ = wait_idle(port)
            check(m["troupe:kv_cache_free_blocks"] == m0["troupe:kv_cache_free_blocks"],
                  f"{stages} stage(s): {m0['troupe:kv_cache_free_blocks'] - m['troupe:kv_cache_free_blocks']:.0f} KV "
                  f"blocks not freed after the failure")
            s.signal(signal.SIGTERM)
            try:
                rc = s.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                raise CheckFailed(f"{stages} stage(s): no exit within 30 s of SIGTERM after the failure")
            check(rc == 0, f"{stages} stage(s): exit code {rc} after SIGTERM")
            notes.append(f"{stages} stage(s): 4 requests ended with the error in {took:.1f} s, /health 503, new requests 503, "
                         f"KV at baseline, exit 0")
    return "; ".join(notes)


@register("json_mode")
def t_json_mode():
    """JSON mode (docs/serving.md, "JSON mode"): the sampler only draws tokens that keep the
    output one JSON object, and ends only when it is closed."""
    prompts = ["What is the capital of France? Answer in JSON.", "Describe a cat with a name and an age, in JSON.",
               "List three fruits and their colors as JSON.", "Who wrote Hamlet, and when? Reply in JSON."]
    fmt = {"type": "json_object"}
    with Server(name="json") as s:
        port = s.port

        def chat(p, **extra):
            body = {"messages": [{"role": "user", "content": p}], "max_tokens": 200, "temperature": 0}
            body.update(extra)
            st, _, data = request(port, "POST", "/v1/chat/completions", body)
            check(st == 200, f"{p!r}: status {st} {data[:200]!r}")
            c = json.loads(data)["choices"][0]
            return c["message"]["content"], c["finish_reason"]

        done, objects = 0, 0
        runs = [(p, {}) for p in prompts] + [(prompts[1], {"temperature": 0.9, "seed": 5}),
                                              (prompts[3], {"temperature": 0.9, "seed": 5})]
        for p, extra in runs:
            text, finish = chat(p, response_format=fmt, **extra)
            if finish != "stop":
                continue
            done += 1
            try:
                obj = json.loads(text)
            except ValueError:
                raise CheckFailed(f"{p!r} {extra}: finished, but not JSON: {text!r}")
            check(isinstance(obj, dict), f"{p!r}: JSON but not an object: {text!r}")
            objects += 1
        check(done >= 4, f"only {done} of {len(runs)} JSON-mode answers ended within 200 tokens")
        plain, _ = chat(prompts[0])
        try:
            json.loads(plain)
            raise CheckFailed(f"the unconstrained answer is JSON too, so this proves nothing: {plain!r}")
        except ValueError:
            pass
        # streamed: the deltas add up to an object
        st, events, done_seen = sse_stream(port, "/v1/chat/completions",
                                           {"messages": [{"role": "user", "content": prompts[0]}], "max_tokens": 200,
                                            "temperature": 0, "stream": True, "response_format": fmt})
        text = "".join((e["choices"][0]["delta"].get("content") or "") for e in events if e.get("choices"))
        check(st == 200 and done_seen and isinstance(json.loads(text), dict), f"streamed JSON mode: {text!r}")
        bad = [({"type": "json_schema", "json_schema": {"name": "x"}}, "json_schema"),
               ({"type": "xml"}, "must be 'text', 'json_object' or 'json_schema'"), ("json", "must be an object"),
               ({}, "must be a string")]
        for rf, words in bad:
            st, _, data = request(port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3, "response_format": rf})
            e = error_shape(data)
            check(st == 400 and not isinstance(e, str) and words in e["message"] and e.get("param") == "response_format",
                  f"response_format {rf!r}: {st} {data[:200]!r}")
        st, _, data = request(port, "POST", "/v1/completions",
                              {"prompt": "hi", "max_tokens": 3, "ignore_eos": True, "response_format": fmt})
        check(st == 400 and b"ignore_eos" in data, f"json_object with ignore_eos: {st} {data[:200]!r}")
    return (f"{objects} of {len(runs)} answers ended as JSON objects (the rest hit max_tokens), the streamed one "
            f"too; the unconstrained answer is not JSON; 5 bad response_formats refused with 400")


SPEC_PASSAGE = ("The committee approved the budget for the new library on Monday, and construction will start in "
                "the spring. The library will hold forty thousand books, a children's room and a small cafe.")


@register("speculative")
def t_speculative():
    """--speculative ngram and self:20 (docs/serving.md, "Speculative decoding"): greedy and seeded outputs,
    tokens and log-probabilities, equal those of a server without it, alone and concurrent;
    drafts are accepted on a copy prompt (metrics and usage say how many); KV back to baseline;
    bad num_speculative_tokens refused with 400; bad flags refused at start-up."""
    copy = [f"Repeat this text exactly.\nText: {SPEC_PASSAGE}\nRepeat: {SPEC_PASSAGE}\nText: {SPEC_PASSAGE}\nRepeat:",
            f"Here is a list: apples, pears, plums, apples, pears, plums, apples, pears, plums, apples,"]
    prompts = copy + bi_prompts()[:6]
    seeded = {"temperature": 0.8, "top_p": 0.95, "seed": 11, "frequency_penalty": 0.3}
    runs = [(p, {}) for p in prompts] + [(p, seeded) for p in prompts[:4]]
    with Server(name="plain") as a:
        ref = [outcome_lp(complete(a.port, p, 48, **x)) for p, x in runs]
        st, _, data = request(a.port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2,
                                                                   "num_speculative_tokens": 2})
        check(st == 400 and b"--speculative" in data, f"plain server, num_speculative_tokens 2: {st} {data[:200]!r}")
        r = complete(a.port, "hi", 2, num_speculative_tokens=0)
        check("completion_tokens_details" not in r["usage"], f"plain server usage {r['usage']}")
    with Server("--speculative", "ngram", "--num-speculative-tokens", 6, name="ngram") as b:
        m0 = metrics(b.port)
        solo = [complete(b.port, p, 48, **x) for p, x in runs]
        bad = [i for i, r in enumerate(solo) if outcome_lp(r) != ref[i]]
        check(not bad, f"runs {bad} differ from the plain server: {[outcome(solo[i]) for i in bad[:2]]} vs "
                       f"{[ref[i] for i in bad[:2]]}")
        details = solo[0]["usage"].get("completion_tokens_details") or {}
        check(details.get("accepted_prediction_tokens", 0) > 0, f"copy prompt: usage {solo[0]['usage']}")
        conc = run_threads([lambda p=p, x=x: complete(b.port, p, 48, **x) for p, x in runs])
        bad = [i for i, r in enumerate(conc) if isinstance(r, BaseException) or outcome_lp(r) != ref[i]]
        check(not bad, f"concurrent runs {bad} differ from the plain server")
        # streamed: the deltas add up to the same text
        st, events, done = sse_stream(b.port, "/v1/completions", {"prompt": copy[0], "max_tokens": 48,
                                                                   "temperature": 0, "ignore_eos": True,
                                                                   "stream": True})
        text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
        check(st == 200 and done and text == ref[0][0][0], f"streamed: {text!r} vs {ref[0][0][0]!r}")
        for v, words in [(-1, "num_speculative_tokens"), (7, "num_speculative_tokens"), ("x", "integer")]:
            st, _, data = request(b.port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2,
                                                                       "num_speculative_tokens": v})
            e = error_shape(data)
            check(st == 400 and not isinstance(e, str) and words in e["message"] and
                  e.get("param") == "num_speculative_tokens", f"num_speculative_tokens {v!r}: {st} {data[:200]!r}")
        r = complete(b.port, copy[0], 24, num_speculative_tokens=0)
        d0 = r["usage"].get("completion_tokens_details") or {}
        check(d0.get("accepted_prediction_tokens") == 0 and d0.get("rejected_prediction_tokens") == 0,
              f"num_speculative_tokens 0: usage {r['usage']}")
        m, _ = wait_idle(b.port)
        drafted = m["troupe:spec_decode_num_draft_tokens_total"]
        accepted = m["troupe:spec_decode_num_accepted_tokens_total"]
        check(0 < accepted <= drafted, f"metrics: {accepted:.0f} accepted of {drafted:.0f} drafted")
        check(m["troupe:spec_decode_num_drafts_total"] > 0, "no draft steps counted")
        check(m["troupe:kv_cache_free_blocks"] == m0["troupe:kv_cache_free_blocks"],
              f"{m['troupe:kv_cache_free_blocks']:.0f} free blocks after, {m0['troupe:kv_cache_free_blocks']:.0f} before")
        gen = m["troupe:generation_tokens_total"]
    # Self-drafting: the first 20 of 30 layers draft in rounds inside the worker's step.
    with Server("--speculative", "self:20", name="self20") as c:
        m0 = metrics(c.port)
        solo = [complete(c.port, p, 48, **x) for p, x in runs]
        bad = [i for i, r in enumerate(solo) if outcome_lp(r) != ref[i]]
        check(not bad, f"self:20: runs {bad} differ from the plain server")
        conc = run_threads([lambda p=p, x=x: complete(c.port, p, 48, **x) for p, x in runs])
        bad = [i for i, r in enumerate(conc) if isinstance(r, BaseException) or outcome_lp(r) != ref[i]]
        check(not bad, f"self:20: concurrent runs {bad} differ from the plain server")
        m, _ = wait_idle(c.port)
        self_drafted = m["troupe:spec_decode_num_draft_tokens_total"]
        self_accepted = m["troupe:spec_decode_num_accepted_tokens_total"]
        check(0 < self_drafted and self_accepted <= self_drafted,
              f"self:20 metrics: {self_accepted:.0f} accepted of {self_drafted:.0f} drafted")
        check(m["troupe:kv_cache_free_blocks"] == m0["troupe:kv_cache_free_blocks"],
              f"self:20: {m['troupe:kv_cache_free_blocks']:.0f} free blocks after, "
              f"{m0['troupe:kv_cache_free_blocks']:.0f} before")
    for flags, words, code in [(["--speculative", "medusa"], "unknown speculative method", 2),
                               (["--speculative", "ngram", "--num-speculative-tokens", "0"], "--num-speculative-tokens", 2),
                               (["--speculative", "self:0"], "layer count", 2),
                               (["--speculative", "self:31"], "must be 1..30", 1),
                               (["--speculative", "self:8", "--pipeline-stages", "2"], "one stage", 1)]:
        p = subprocess.run([TROUPE, "serve", "--port", "0"] + flags, capture_output=True, text=True, timeout=60)
        check(p.returncode == code and words in p.stdout + p.stderr,
              f"{flags}: exit {p.returncode}: {p.stderr[-300:]!r}")
    return (f"{len(runs)} runs (greedy and seeded) equal the plain server's tokens and logprobs alone and "
            f"concurrent, and streamed; ngram: {accepted:.0f} of {drafted:.0f} drafts accepted over {gen:.0f} tokens; "
            f"self:20: {self_accepted:.0f} of {self_drafted:.0f}; bad values and flags refused")


class Node:
    """`troupe node` (a stage node for --remote-stage) in its own process group on `port`."""

    def __init__(self, port, key_file, name="node", model=None):
        self.port, self.key_file, self.name, self.model = port, key_file, name, model
        self.proc = None
        self.log_file = tempfile.NamedTemporaryFile(prefix=f"serve_test_node_{port}_", suffix=".log", delete=False)

    def start(self, timeout=60):
        cmd = ["nice", "-n", "5", TROUPE, "node", "-t", "1", "--port", str(self.port), "--key-file", self.key_file]
        if self.model:
            cmd += ["-m", self.model]
        log(f"start {self.name}: {' '.join(cmd[3:])}")
        self.proc = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise CheckFailed(f"{self.name} exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            with open(self.log_file.name, "rb") as f:
                if b"listening on" in f.read():
                    return self
            time.sleep(0.1)
        raise CheckFailed(f"{self.name} not listening after {timeout} s:\n{self.log_tail()}")

    def log_tail(self, n=25):
        with open(self.log_file.name, "rb") as f:
            return "\n".join("      | " + l for l in f.read().decode("utf-8", "replace").splitlines()[-n:])

    def kill(self, sig=signal.SIGKILL):
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                pass
            if sig in (signal.SIGKILL, signal.SIGTERM):
                self.proc.wait(timeout=30)


def node_handshake(port, key, magic=b"TRPNODE1"):
    """The head's side of the node link's handshake (actors/node_link.h) by hand: the node's
    proof of the key (32 bytes), or b"" when it closed the connection instead."""
    with socket.create_connection((HOST, port), timeout=10) as c:
        got = b""
        while len(got) < 40:
            chunk = c.recv(40 - len(got))
            if not chunk:
                return b""
            got += chunk
        check(got[:8] == b"TRPNODE1", f"node greeting {got[:8]!r}")
        nn, nh = got[8:], os.urandom(32)
        c.sendall(magic + nh + hmac.new(key, b"head" + nn + nh, hashlib.sha256).digest())
        try:
            proof = c.recv(32)
        except ConnectionResetError:
            return b""
        if proof:
            check(proof == hmac.new(key, b"node" + nn + nh, hashlib.sha256).digest(), "the node's proof is wrong")
        return proof


@register("remote_stage")
def t_remote_stage():
    """Pipeline stage 1 of 2 in a `troupe node` process (docs/serving.md, "Stages on other
    nodes"; RELIABILITY.md's node-link and multi-process items)."""
    tmp = tempfile.mkdtemp(prefix="serve_test_node_")
    key_file, wrong_file = os.path.join(tmp, "node.key"), os.path.join(tmp, "wrong.key")
    key = os.urandom(24).hex().encode()
    for path, k in ((key_file, key), (wrong_file, os.urandom(24).hex().encode())):
        with open(path, "wb") as f:
            f.write(k + b"\n")
        os.chmod(path, 0o600)
    rng = random.Random(77)
    # the long one fills several KV blocks: after the node restarts, the head's prefix cache
    # must not offer blocks whose stage-1 half died with the node
    prompts = ["The capital of France is", "Write a haiku about " + words(rng, 6),
               "Summarize: " + words(rng, 90)]
    notes = []
    with Server("--pipeline-stages", 2, name="one-process") as s:
        ref = [outcome(complete(s.port, p, 16)) for p in prompts]
    node = Node(free_port(), key_file)
    head_flags = ("--pipeline-stages", 2, "--remote-stage", f"1=127.0.0.1:{node.port}", "--node-key-file", key_file,
                  "--node-timeout", 3)
    try:
        node.start()
        with Server(*head_flags, name="head") as s:
            port = s.port
            m0, _ = wait_idle(port)
            got = run_threads([lambda p=p: outcome(complete(port, p, 16)) for p in prompts])
            for i, g in enumerate(got):
                check(g == ref[i], f"prompt {i}: over the link {g!r} != in one process {ref[i]!r}")
            st, _, data = request(port, "POST", "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": "What is the capital of France? Answer in JSON."}],
                                   "max_tokens": 200, "temperature": 0, "response_format": {"type": "json_object"}})
            c = json.loads(data)["choices"][0]
            check(st == 200 and c["finish_reason"] == "stop" and isinstance(json.loads(c["message"]["content"]), dict),
                  f"JSON mode over the link: {data[:300]!r}")
            notes.append("3 concurrent greedy outputs equal one process's")
            # Strangers: a wrong key and garbage are closed before anything is decoded; the
            # right key gets the node's proof (then the busy node would refuse the hello).
            check(node_handshake(node.port, b"not the key at all, no") == b"", "a wrong key got a proof")
            check(node_handshake(node.port, key, magic=b"GARBAGE!") == b"", "a wrong magic got a proof")
            with socket.create_connection((HOST, node.port), timeout=10) as c:
                c.recv(40)
                c.sendall(os.urandom(300))
                try:
                    rest = c.recv(100)
                except ConnectionResetError:
                    rest = b""
                check(rest == b"", f"garbage got an answer {rest[:40]!r}")
            check(len(node_handshake(node.port, key)) == 32, "the right key got no proof")
            fds = lambda: len(os.listdir(f"/proc/{node.proc.pid}/fd"))
            fd0 = fds()
            for _ in range(100):  # a scanner: each connection gets closed, none is kept
                with socket.create_connection((HOST, node.port), timeout=10) as c:
                    c.recv(40)
                    c.sendall(os.urandom(72))
                    try:
                        c.recv(10)
                    except ConnectionResetError:
                        pass
            time.sleep(0.3)
            check(fds() <= fd0 + 2, f"100 refused connections left the node with {fds() - fd0} more descriptors")
            check(outcome(complete(port, prompts[0], 16)) == ref[0], "the head's output changed after the strangers")
            notes.append("wrong key, wrong magic and garbage closed, the right key proved, 100 more leaked no descriptor")
            # A second head with the wrong key cannot start.
            bad = subprocess.run([TROUPE, "serve", "--port", str(free_port()), "-t", "1", "--pipeline-stages", "2",
                                  "--remote-stage", f"1=127.0.0.1:{node.port}", "--node-key-file", wrong_file],
                                 capture_output=True, timeout=60)
            check(bad.returncode != 0 and b"did not accept the key" in bad.stderr,
                  f"a head with the wrong key: exit {bad.returncode}, {bad.stderr[-300:]!r}")
            # Kill the node under a stream.
            results = []
            body = gen_body("Tell me a long story.", 1, True, 400, ignore_eos=True)
            th = threading.Thread(target=lambda: results.append(request(port, "POST", "/v1/completions", body, timeout=60)))
            th.start()
            time.sleep(1.0)
            t0 = time.time()
            node.kill(signal.SIGKILL)
            th.join(timeout=30)
            took = time.time() - t0
            check(results and results[0][0] == 200 and b'"error"' in results[0][2] and b"stage 1 on node" in results[0][2],
                  f"the stream did not end with an error naming the node: {results[0][2][-300:] if results else None!r}")
            check(took < 10, f"the stream took {took:.1f} s to fail after the node died")
            st, _, data = request(port, "GET", "/health")
            check(st == 503 and b"stage 1 on node" in data, f"/health with the node dead: {st} {data[:200]!r}")
            st, _, data = request(port, "POST", "/v1/completions", {"prompt": "hi", "max_tokens": 3})
            check(st == 503, f"a request with the node dead: {st} {data[:160]!r}")
            m, _ = wait_idle(port)
            check(m["troupe:kv_cache_free_blocks"] == m0["troupe:kv_cache_free_blocks"], "KV blocks not freed after the node died")
            notes.append(f"killed node: the stream failed in {took:.1f} s naming it, /health 503, KV at baseline")
            # Restart it: the head reconnects; cached prefixes are gone with the old stage.
            node = Node(node.port, key_file, name="node (restarted)")
            node.start()
            t0 = time.time()
            while time.time() - t0 < 20 and request(port, "GET", "/health")[0] != 200:
                time.sleep(0.2)
            back = time.time() - t0
            check(back < 20, "the head did not recover within 20 s of the node's restart")
            for i in (2, 0):
                g = outcome(complete(port, prompts[i], 16))
                check(g == ref[i], f"after the rejoin, prompt {i}: {g!r} != {ref[i]!r}")
            notes.append(f"restarted node rejoined in {back:.1f} s, outputs unchanged")
            # Killed while idle: /health must not stay 200 with a stage gone.
            node.kill(signal.SIGKILL)
            t0 = time.time()
            while time.time() - t0 < 10 and request(port, "GET", "/health")[0] == 200:
                time.sleep(0.1)
            idle_took = time.time() - t0
            st, _, data = request(port, "GET", "/health")
            check(st == 503 and b"connection lost" in data, f"/health after an idle node died: {st} {data[:200]!r}")
            node = Node(node.port, key_file, name="node (restarted again)")
            node.start()
            t0 = time.time()
            while time.time() - t0 < 20 and request(port, "GET", "/health")[0] != 200:
                time.sleep(0.2)
            check(time.time() - t0 < 20, "the head did not recover from the idle kill within 20 s")
            notes.append(f"idle kill: /health 503 after {idle_took:.1f} s, back after the restart")
            # Freeze it: the step in flight fails at --node-timeout; thawed, it rejoins.
            results.clear()
            th = threading.Thread(target=lambda: results.append(request(port, "POST", "/v1/completions", body, timeout=60)))
            th.start()
            time.sleep(1.0)
            t0 = time.time()
            node.kill(signal.SIGSTOP)
            th.join(timeout=30)
            took = time.time() - t0
            check(results and b"no answer to step" in results[0][2], f"a frozen node: {results[0][2][-300:] if results else None!r}")
            check(took < 3 + 4, f"the frozen node's stream took {took:.1f} s to fail (timeout 3 s)")
            node.kill(signal.SIGCONT)
            t0 = time.time()
            while time.time() - t0 < 20 and request(port, "GET", "/health")[0] != 200:
                time.sleep(0.2)
            check(time.time() - t0 < 20, "the head did not recover within 20 s of the node's thaw")
            check(outcome(complete(port, prompts[1], 16)) == ref[1], "after the thaw the output changed")
            notes.append(f"frozen node: the stream failed after {took:.1f} s, rejoined when thawed")
            node.kill(signal.SIGTERM)
            check(node.proc.returncode == 0, f"node exit code {node.proc.returncode} after SIGTERM:\n{node.log_tail()}")
        notes.append("node exit 0 on SIGTERM")
        # A middle stage on the node: its activations come back to the head's last stage.
        node = Node(free_port(), key_file, name="node (middle stage)")
        node.start()
        with Server("--pipeline-stages", 3, "--remote-stage", f"1=127.0.0.1:{node.port}", "--node-key-file", key_file,
                    name="head (3 stages)") as s:
            got = run_threads([lambda p=p: outcome(complete(s.port, p, 16)) for p in prompts])
            for i, g in enumerate(got):
                check(g == ref[i], f"middle stage remote, prompt {i}: {g!r} != {ref[i]!r}")
        notes.append("stage 1 of 3 on the node: outputs equal")
    finally:
        node.kill()
    return "; ".join(notes)


def outcome_lp(resp):
    """outcome() plus each token's log-probability as the server printed it: equal bits print equal."""
    return [(c["text"], tuple((c.get("logprobs") or {}).get("tokens") or ()),
             tuple((c.get("logprobs") or {}).get("token_logprobs") or ())) for c in resp["choices"]]


@register("expert_parallel")
def t_expert_parallel():
    """A MoE model (tests/cli/make_tiny_moe.py) with its routed experts on expert-worker actors
    (--expert-parallel) and on a `troupe node` process (--expert-placement): the greedy
    outputs and logprobs of one process, the troupe:moe_* metrics, and a killed expert node
    failing its requests with an error naming it, /health 503, rejoining once restarted."""
    tmp = tempfile.mkdtemp(prefix="serve_test_ep_")
    model = os.path.join(tmp, "tiny-moe.gguf")
    subprocess.run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cli",
                    "make_tiny_moe.py"), model], check=True, capture_output=True)
    key_file = os.path.join(tmp, "node.key")
    with open(key_file, "wb") as f:
        f.write(os.urandom(24).hex().encode() + b"\n")
    os.chmod(key_file, 0o600)
    prompts = ["ab ab a", "b a b a b a b", "aaa bbb ab"]
    notes = []
    with Server("-m", model, name="one process") as s:
        ref = [outcome_lp(complete(s.port, p, 16)) for p in prompts]
    with Server("-m", model, "--expert-parallel", 2, name="2 expert workers") as s:
        got = run_threads([lambda p=p: outcome_lp(complete(s.port, p, 16)) for p in prompts])
        for i, g in enumerate(got):
            check(g == ref[i], f"--expert-parallel 2, prompt {i}: {g!r} != {ref[i]!r}")
        m, _ = wait_idle(s.port)
        routed = m["troupe:moe_expert_tokens_total"]
        per_expert = sum(1 for k in m.series if k.startswith("troupe:moe_expert_tokens_total{"))
        check(per_expert == 2 * 4, f"{per_expert} troupe:moe_expert_tokens_total series (2 layers x 4 experts)")
        check(routed > 0 and m["troupe:moe_dispatches_total"] > 0 and m["troupe:moe_dispatch_bytes_total"] > 0,
              f"MoE metrics: routed {routed}, dispatches {m['troupe:moe_dispatches_total']}")
        check(m["troupe:moe_imbalance_ratio"] >= 1.0, f"imbalance {m['troupe:moe_imbalance_ratio']}")
        notes.append(f"--expert-parallel 2: 3 concurrent outputs equal one process's, {routed:.0f} tokens routed")
    with Server("-m", model, "--pipeline-stages", 2, "--expert-parallel", 2, name="2 stages x 2 expert workers") as s:
        got = run_threads([lambda p=p: outcome_lp(complete(s.port, p, 16)) for p in prompts])
        for i, g in enumerate(got):
            check(g == ref[i], f"2 stages x 2 expert workers, prompt {i}: {g!r} != {ref[i]!r}")
        notes.append("2 pipeline stages x 2 expert workers: outputs equal")
    node = Node(free_port(), key_file, name="expert node", model=model)
    placement = os.path.join(tmp, "placement.json")
    with open(placement, "w") as f:
        json.dump({"workers": [{"name": "here", "experts": "0-1"},
                               {"name": "far", "experts": "2-3", "node": f"127.0.0.1:{node.port}"},
                               {"name": "hot", "experts": [0], "layers": [1]}]}, f)
    try:
        node.start()
        with Server("-m", model, "--expert-placement", placement, "--node-key-file", key_file, "--expert-timeout", 3,
                    name="head with an expert node") as s:
            port = s.port
            got = run_threads([lambda p=p: outcome_lp(complete(port, p, 16)) for p in prompts])
            for i, g in enumerate(got):
                check(g == ref[i], f"expert node, prompt {i}: {g!r} != {ref[i]!r}")
            notes.append("experts 2-3 in another process (+ a replica): outputs equal")
            # Requests back to back while the node is killed: the one in flight fails naming it.
            results, stop = [], threading.Event()

            def hammer():
                body = {"prompt": "ab ab", "max_tokens": 100, "temperature": 0, "ignore_eos": True}
                while not stop.is_set():
                    st, _, data = request(port, "POST", "/v1/completions", body, timeout=60)
                    results.append((st, data))
                    if st != 200:
                        return
            th = threading.Thread(target=hammer)
            th.start()
            time.sleep(0.5)
            t0 = time.time()
            node.kill(signal.SIGKILL)
            th.join(timeout=15)
            stop.set()
            th.join(timeout=60)
            took = time.time() - t0
            failed = [d for st, d in results if st != 200]
            check(failed and b"expert worker 'far'" in failed[0],
                  f"no request failed naming the expert worker: {results[-1] if results else None!r}")
            st, _, data = request(port, "GET", "/health")
            check(st == 503 and b"expert worker 'far'" in data, f"/health with the expert node dead: {st} {data[:200]!r}")
            notes.append(f"killed expert node: the request in flight failed naming it ({took:.1f} s), /health 503")
            node = Node(node.port, key_file, name="expert node (restarted)", model=model)
            node.start()
            t0 = time.time()
            while time.time() - t0 < 20 and request(port, "GET", "/health")[0] != 200:
                time.sleep(0.2)
            back = time.time() - t0
            check(back < 20, f"the head did not recover within 20 s of the expert node's restart: "
                             f"{request(port, 'GET', '/health')[2][:200]!r}")
            check(outcome_lp(complete(port, prompts[0], 16)) == ref[0], "after the rejoin the output changed")
            notes.append(f"restarted expert node rejoined in {back:.1f} s, output unchanged")
            # Killed while idle: the proxy notices the closed link within its one-second check.
            node.kill(signal.SIGKILL)
            t0 = time.time()
            while time.time() - t0 < 10 and request(port, "GET", "/health")[0] == 200:
                time.sleep(0.1)
            idle_took = time.time() - t0
            st, _, data = request(port, "GET", "/health")
            check(st == 503 and b"connection lost" in data, f"/health after an idle expert node died: {st} {data[:200]!r}")
            node = Node(node.port, key_file, name="expert node (restarted again)", model=model)
            node.start()
            t0 = time.time()
            while time.time() - t0 < 20 and request(port, "GET", "/health")[0] != 200:
                time.sleep(0.2)
            check(time.time() - t0 < 20, "the head did not recover from the idle kill within 20 s")
            check(outcome_lp(complete(port, prompts[1], 16)) == ref[1], "after the second rejoin the output changed")
            notes.append(f"idle kill: /health 503 after {idle_took:.1f} s, back after the restart")
            # Frozen: the dispatch in flight fails at --expert-timeout; thawed, it rejoins.
            results.clear()
            stop.clear()
            th = threading.Thread(target=hammer)
            th.start()
            time.sleep(0.5)
            t0 = time.time()
            node.kill(signal.SIGSTOP)
            th.join(timeout=20)
            took = time.time() - t0
            stop.set()
            failed = [d for st, d in results if st != 200]
            check(failed and b"expert worker 'far'" in failed[0] and b"no answer" in failed[0],
                  f"a frozen expert node: {results[-1] if results else None!r}")
            check(took < 2 * 3 + 1 + 4, f"the frozen expert node's request took {took:.1f} s to fail (timeout 3 s)")
            node.kill(signal.SIGCONT)
            t0 = time.time()
            while time.time() - t0 < 20 and request(port, "GET", "/health")[0] != 200:
                time.sleep(0.2)
            check(time.time() - t0 < 20, "the head did not recover within 20 s of the expert node's thaw")
            check(outcome_lp(complete(port, prompts[2], 16)) == ref[2], "after the thaw the output changed")
            notes.append(f"frozen expert node: its request failed after {took:.1f} s, rejoined when thawed")
            node.kill(signal.SIGTERM)
        # A placement that leaves an expert nowhere: the server refuses to start, naming it.
        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w") as f:
            json.dump({"workers": [{"name": "w", "experts": [0, 1, 2]}]}, f)
        r = subprocess.run([TROUPE, "serve", "--port", str(free_port()), "-t", "1", "-m", model, "--expert-placement", bad],
                           capture_output=True, timeout=60)
        check(r.returncode != 0 and b"expert 3 of layer 0 is on no worker" in r.stderr,
              f"a placement missing an expert: exit {r.returncode}, {r.stderr[-300:]!r}")
        notes.append("a placement missing an expert refused at start-up")
    finally:
        node.kill()
    return "; ".join(notes)


@register("metrics_health")
def t_metrics_health():
    with Server(name="metrics") as s:
        st, hdrs, data = request(s.port, "GET", "/health")
        check(st == 200, f"/health {st}")
        check(json.loads(data).get("status") == "ok", f"/health body {data!r}")
        st, hdrs, data = request(s.port, "GET", "/metrics")
        check(st == 200 and hdrs.get("content-type", "").startswith("text/plain"), f"/metrics {st} {hdrs}")
        m0 = Metrics(data.decode())
        missing = [n for n in SERIES if not m0.has(n)]
        check(not missing, f"missing series: {missing}")
        for h in HISTOGRAMS:
            check_histogram(m0, h)
        check(m0["troupe:kv_cache_free_blocks"] == 2048, f"free blocks {m0['troupe:kv_cache_free_blocks']}")
        prompt = "The quick brown fox jumps over the lazy dog."
        r = complete(s.port, prompt, 24)
        m1 = metrics(s.port)
        d = lambda n: m1[n] - m0[n]
        for h in HISTOGRAMS:
            check_histogram(m1, h)
        check(d("troupe:time_to_first_token_seconds_count") == 1, f"TTFT count +{d('troupe:time_to_first_token_seconds_count')}")
        check(d("troupe:e2e_request_latency_seconds_count") == 1, f"e2e count +{d('troupe:e2e_request_latency_seconds_count')}")
        check(d("troupe:request_queue_time_seconds_count") == 1, f"queue count +{d('troupe:request_queue_time_seconds_count')}")
        check(d("troupe:inter_token_latency_seconds_count") == 23, f"ITL count +{d('troupe:inter_token_latency_seconds_count')}")
        check(d("troupe:generation_tokens_total") == 24, f"generation tokens +{d('troupe:generation_tokens_total')}")
        check(d("troupe:prompt_tokens_total") == r["usage"]["prompt_tokens"],
              f"prompt tokens +{d('troupe:prompt_tokens_total')} vs usage {r['usage']['prompt_tokens']}")
        check(d("troupe:prompt_tokens_computed_total") == r["usage"]["prompt_tokens"], "computed prompt tokens")
        ttft = d("troupe:time_to_first_token_seconds_sum")
        e2e = d("troupe:e2e_request_latency_seconds_sum")
        check(0 < ttft <= e2e, f"TTFT {ttft} vs e2e {e2e}")
        check(m1["troupe:num_requests_running"] == 0 and m1["troupe:num_requests_waiting"] == 0, "not idle after the request")
        check(m1["troupe:kv_cache_free_blocks"] == 2048, f"free blocks {m1['troupe:kv_cache_free_blocks']} after the request")
        st, _, data = request(s.port, "GET", "/v1/models")
        check(st == 200 and json.loads(data)["data"], f"/v1/models {st}")
    return (f"{len(SERIES)} series + {len(HISTOGRAMS)} histograms present and consistent; one request: TTFT count +1 "
            f"({ttft * 1000:.0f} ms), e2e {e2e * 1000:.0f} ms, ITL +23, generation +24")


# ----------------------------------------------------------------------------------------------

SOAK = {"seconds": 45.0, "report": None}  # --soak-seconds, --soak-report

# Malformed requests of the soak: (label, method, path, raw body). Each must get a 4xx answer
# (the exact statuses are bad_requests' business) and leave the server as it was.
SOAK_BAD = [
    ("invalid JSON", "POST", "/v1/completions", b'{"prompt": "hi", '),
    ("body is a list", "POST", "/v1/completions", b'[1, 2, 3]'),
    ("temperature of the wrong type", "POST", "/v1/completions", b'{"prompt": "hi", "temperature": "hot"}'),
    ("NaN literal", "POST", "/v1/completions", b'{"prompt": "hi", "temperature": NaN}'),
    ("top_p 7", "POST", "/v1/completions", b'{"prompt": "hi", "top_p": 7}'),
    ("token id out of vocabulary", "POST", "/v1/completions", b'{"prompt": [1, 2, 99999999], "max_tokens": 2}'),
    ("max_tokens -1", "POST", "/v1/completions", b'{"prompt": "hi", "max_tokens": -1}'),
    ("n 0", "POST", "/v1/completions", b'{"prompt": "hi", "n": 0}'),
    ("logit_bias key out of vocabulary", "POST", "/v1/completions",
     b'{"prompt": "hi", "max_tokens": 2, "logit_bias": {"4000000": 5}}'),
    ("invalid UTF-8", "POST", "/v1/completions", b'{"prompt": "\xff\xfe\xc3", "max_tokens": 2}'),
    ("nesting 5000 deep", "POST", "/v1/completions", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("prompt over the context", "POST", "/v1/completions",
     json.dumps({"prompt": " ".join(["hello"] * 3000), "max_tokens": 2}).encode()),
    ("empty messages", "POST", "/v1/chat/completions", b'{"messages": []}'),
    ("unknown model", "POST", "/v1/completions", b'{"model": "../../etc/passwd", "prompt": "hi"}'),
    ("GET on a POST route", "GET", "/v1/completions", b""),
    ("unknown route", "POST", "/v1/nothing", b"{}"),
]


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise CheckFailed(f"no VmRSS for pid {pid}")


def slope_mb_per_hour(samples):
    """Least-squares slope of (seconds, kB) samples, in MB per hour."""
    n = len(samples)
    if n < 3:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    mr = sum(r for _, r in samples) / n
    den = sum((t - mt) ** 2 for t, _ in samples)
    return 0.0 if den == 0 else sum((t - mt) * (r - mr) for t, r in samples) / den * 3600 / 1024


@register("soak")
def t_soak():
    """Eight clients against ten sequence slots (80% of capacity) for --soak-seconds: normal
    requests of every shape read to the end, random early disconnects (FIN or RST) and
    malformed requests, mixed. Every normal request must succeed, every malformed one get a
    4xx; at idle the KV pool is back to its baseline, resident memory has not grown past the
    warm-up's peak (by more than 16 MB + 5%), and a fixed greedy completion gives the same
    tokens as before the soak."""
    seconds = SOAK["seconds"]
    workers = 8
    # A small KV pool (4096 tokens, 256 blocks) is touched whole during the warm-up, so its
    # pages do not read as growth; with prompts up to 300 words it also forces preemption.
    with Server("--max-num-seqs", 10, "--kv-cache-tokens", 4096, "-c", 2048, "--max-queue", 64, name="soak") as s:
        port = s.port
        pid = s.proc.pid
        m0, _ = wait_idle(port)
        baseline = m0["troupe:kv_cache_free_blocks"]
        probe = "The soak test asks: what is the capital of France? The answer"
        ref = outcome(complete(port, probe, 16))
        stop = threading.Event()
        lock = threading.Lock()
        counts = {"normal": 0, "streamed": 0, "disconnect": 0, "malformed": 0}
        failures = []
        samples = []  # (seconds since start, VmRSS kB)
        t_start = time.time()

        def fail(msg):
            with lock:
                if len(failures) < 20:
                    failures.append(msg)

        def sampler():
            while not stop.is_set():
                try:
                    samples.append((time.time() - t_start, rss_kb(pid)))
                except (OSError, CheckFailed):
                    return
                stop.wait(1.0)

        def normal(r):
            n = 1 if r.random() < 0.8 else 2
            chat = r.random() < 0.4
            stream = r.random() < 0.5
            body = gen_body(words(r, r.randint(3, 300)), n, stream, r.randint(4, 48), chat=chat)
            path = "/v1/chat/completions" if chat else "/v1/completions"
            st, _, data = request(port, "POST", path, body, timeout=300)
            if st != 200:
                fail(f"normal {path} n={n} stream={stream}: status {st} {data[:160]!r}")
                return
            try:
                texts = choice_texts(data)
            except (ValueError, KeyError) as e:
                fail(f"normal {path}: unreadable answer ({e!r}): {data[:160]!r}")
                return
            if sorted(texts) != list(range(n)):
                fail(f"normal {path}: choices {sorted(texts)} for n={n}")
            if stream and not data.rstrip().endswith(b"data: [DONE]"):
                fail(f"normal {path}: the stream did not end with [DONE]: {data[-80:]!r}")
            with lock:
                counts["normal"] += 1
                counts["streamed"] += stream

        def disconnect(r):
            c = new_counters()
            random_disconnects(port, r.randrange(1 << 30), 1, 2, c, prompt_len=(3, 300), delay=(0.0, 0.5))
            with lock:
                counts["disconnect"] += 1

        def malformed(r):
            label, method, path, body = r.choice(SOAK_BAD)
            if r.random() < 0.1:  # not HTTP at all
                label, raw = "garbage bytes", bytes(r.randrange(256) for _ in range(r.randint(1, 400))) + b"\r\n\r\n"
                try:
                    c = Raw(port, timeout=10)
                    c.send(raw)
                    c.closed_by_peer(timeout=3.0)
                    c.close()
                except OSError:
                    pass
            else:
                st, _, data = request(port, method, path, body if method == "POST" else None, timeout=60)
                if not 400 <= st < 500:
                    fail(f"malformed ({label}): status {st}, expected 4xx: {data[:160]!r}")
            with lock:
                counts["malformed"] += 1

        def worker(i):
            r = random.Random(1000 + i)
            while not stop.is_set():
                x = r.random()
                try:
                    if x < 0.7:
                        normal(r)
                    elif x < 0.85:
                        disconnect(r)
                    else:
                        malformed(r)
                except OSError as e:
                    fail(f"worker {i}: connection error {e!r}")

        threads = [threading.Thread(target=sampler, daemon=True)]
        threads += [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
        for t in threads:
            t.start()
        stop.wait(seconds)
        stop.set()
        for t in threads:
            t.join(timeout=330)
        elapsed = time.time() - t_start
        check(all(not t.is_alive() for t in threads), "a soak client did not finish within 330 s of the stop")
        m, waited = wait_idle(port, timeout=60)
        free = m["troupe:kv_cache_free_blocks"]
        after = outcome(complete(port, probe, 16))
        samples.append((time.time() - t_start, rss_kb(pid)))
        warm_end = max(10.0, 0.25 * seconds)
        warm = [r_ for t, r_ in samples if t <= warm_end]
        tail = sorted(r_ for t, r_ in samples if t >= elapsed - max(5.0, 0.1 * seconds))
        check(warm and tail, f"too few memory samples ({len(samples)})")
        warm_peak, end = max(warm), tail[len(tail) // 2]
        growth_mb = (end - warm_peak) / 1024
        slope = slope_mb_per_hour([(t, r_) for t, r_ in samples if t > warm_end])
        summary = (f"{elapsed:.0f} s, {counts['normal']} normal requests ({counts['streamed']} streamed), "
                   f"{counts['disconnect']} early disconnects, {counts['malformed']} malformed; RSS "
                   f"{samples[0][1] / 1024:.0f} MB at start, {warm_peak / 1024:.0f} MB warm-up peak "
                   f"(first {warm_end:.0f} s), {end / 1024:.0f} MB at the end ({growth_mb:+.1f} MB, slope after the "
                   f"warm-up {slope:+.1f} MB/h), {max(r_ for _, r_ in samples) / 1024:.0f} MB peak; KV free "
                   f"{free:.0f}/{baseline:.0f} {waited:.1f} s after the last client")
        if SOAK["report"]:
            with open(SOAK["report"], "w") as f:
                json.dump({"seconds": elapsed, "counts": counts, "failures": failures, "kv_free": free,
                           "kv_baseline": baseline, "rss_kb": samples, "warm_end_s": warm_end,
                           "slope_mb_per_hour": slope, "summary": summary}, f)
        check(not failures, f"{len(failures)} failure(s), first: " + "; ".join(failures[:5]) + f" ({summary})")
        check(counts["normal"] >= workers, f"only {counts['normal']} normal requests finished ({summary})")
        check(free == baseline, f"{baseline - free:.0f} KV blocks not back at idle ({summary})")
        check(after == ref, f"the probe's greedy output changed after the soak: {after} != {ref}")
        check(growth_mb <= 16 + 0.05 * warm_peak / 1024, f"resident memory grew {growth_mb:.1f} MB ({summary})")
        return summary


def split_names(values):
    out = []
    for v in values or []:
        out += [x for x in v.replace(",", " ").split() if x]
    return out


def main():
    global VERBOSE, TROUPE
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--troupe", default="build/bin/troupe", help="the troupe binary")
    p.add_argument("--only", action="append", help="checks to run (comma- or space-separated; repeatable)", nargs="+")
    p.add_argument("--skip", action="append", help="checks to skip", nargs="+")
    p.add_argument("--list", action="store_true", help="list the checks and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="sub-case lines, tracebacks, keep server logs")
    p.add_argument("--soak-seconds", type=float, default=SOAK["seconds"],
                   help="how long the soak check runs its clients (default %(default)s; the checklist's soak is 3600)")
    p.add_argument("--soak-report", help="write the soak's figures and memory samples to this JSON file")
    a = p.parse_args()
    VERBOSE = a.verbose
    SOAK["seconds"], SOAK["report"] = a.soak_seconds, a.soak_report
    names = [n for n, _ in CHECKS]
    if a.list:
        print("\n".join(names))
        return 0
    only = split_names(sum(a.only or [], []))
    skip = split_names(sum(a.skip or [], []))
    unknown = [n for n in only + skip if n not in names]
    if unknown:
        print(f"unknown check(s): {unknown}; known: {names}", file=sys.stderr)
        return 2
    TROUPE = os.path.abspath(a.troupe)
    if not os.access(TROUPE, os.X_OK):
        print(f"not an executable: {TROUPE}", file=sys.stderr)
        return 2

    def on_term(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, on_term)
    try:
        return run_checks(only, skip)
    except KeyboardInterrupt as e:
        print(f"interrupted ({e}); servers killed", flush=True)
        return 130
    finally:
        for srv in list(LIVE):  # only after an interruption: every check kills its own servers
            srv.kill()


def run_checks(only, skip):
    failed = 0
    t_all = time.time()
    for name, fn in CHECKS:
        if (only and name not in only) or name in skip:
            continue
        t0 = time.time()
        try:
            note = fn()
            print(f"PASS {name} ({time.time() - t0:.1f}s): {note}", flush=True)
        except CheckFailed as e:
            failed += 1
            print(f"FAIL {name} ({time.time() - t0:.1f}s): {e}", flush=True)
            if VERBOSE:
                traceback.print_exc()
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"FAIL {name} ({time.time() - t0:.1f}s): {type(e).__name__}: {e}", flush=True)
            traceback.print_exc()
    print(f"{'FAILED' if failed else 'OK'}: {failed} check(s) failed; {time.time() - t_all:.0f}s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
