"""The peer suite: caseledger's load client beside aiperf, guidellm and AISBench on the same two streaming
servers, same cores, interleaved; writes bench/RESULTS.md. Run by hand, never in CI (see README.md here).

    .venv/bin/python bench/peers/run.py [--repeats 3] [--peers aiperf,guidellm,aisbench] [--out bench/RESULTS.md]

Each peer is installed on first use into its own venv under $CASELEDGER_PEERS_DIR (default
~/.cache/caseledger/peers/<peer>/); nothing goes into the project's venv.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(REPO / "bench"))

from bench_load_client import make_run  # noqa: E402  (bench/ is not a package)

from caseledger.importers.aisbench import read_aisbench  # noqa: E402
from caseledger.records import read_records  # noqa: E402
from caseledger.workspace import Workspace, read_json  # noqa: E402

SERVER_CPU, CLIENT_CPU = 0, 1
PORTS = range(18700, 18800)  # the suite's servers take the first free ports of this range
CACHE = Path(os.environ.get("CASELEDGER_PEERS_DIR") or Path.home() / ".cache" / "caseledger" / "peers")
TOKENIZER = REPO / "caseledger" / "data" / "tokenizer"  # a small local HF tokenizer: no hub needed
TORCH_CPU_WHEELS = Path("/opt/wheels")  # where this machine kind keeps the CPU torch wheel
INPUT_TOKENS = 32


@dataclass(frozen=True)
class Scenario:
    name: str
    step_ms: float
    concurrency: int
    requests: int
    tokens: int


SCENARIOS = (
    Scenario("zero", 0.0, 32, 256, 256),  # the client is the bottleneck: CPU per chunk, one-core ceiling
    Scenario("paced-c1", 10.0, 1, 4, 64),  # timestamp error with nothing else going on
    Scenario("paced-c64", 10.0, 64, 128, 128),  # 64 chunks leave together every 10 ms
)


@dataclass
class ClientRun:
    """One client's run: per server request (seq), the client's content-chunk times (monotonic ns)."""

    chunks: dict[int, list[int]]
    cpu_s: float = 0.0
    window_s: float = 0.0
    first_last_only: bool = False  # the client keeps only its first and last chunk times
    sends: list[int] = field(default_factory=list)  # the client's own send time of each request (monotonic ns)
    error: str | None = None
    errors: list[float] = field(default_factory=list)  # client receive - server send, µs


# ---- installs -------------------------------------------------------------------------------------------


def torch_cpu_wheel() -> list[str]:
    """The CPU torch wheel on disk, if any: without it pip pulls the CUDA build (several GB)."""
    found = sorted(TORCH_CPU_WHEELS.glob("torch-*+cpu-*.whl")) if TORCH_CPU_WHEELS.is_dir() else []
    return [str(found[-1])] if found else []


PEERS: dict[str, dict[str, Any]] = {
    "aiperf": {"dist": "aiperf", "exe": "aiperf", "steps": [["aiperf"]]},
    "guidellm": {"dist": "guidellm", "exe": "guidellm", "steps": [[*torch_cpu_wheel(), "guidellm"]]},
    # AISBench pins numpy<2, which needs pyarrow<21; torch first (the CPU wheel)
    "aisbench": {
        "dist": "ais-bench-benchmark",
        "exe": "ais_bench",
        "steps": [[*torch_cpu_wheel(), "pyarrow<21"], ["ais-bench-benchmark", "pyarrow<21"]],
    },
}


def install(peer: str) -> tuple[Path | None, str]:
    """The peer's venv (installing it on first use) and its version, or None and the install error."""
    venv = CACHE / peer
    spec = PEERS[peer]
    marker = venv / ".caseledger-installed"
    if not marker.exists():
        venv.parent.mkdir(parents=True, exist_ok=True)
        log = venv.parent / f"{peer}.install.log"
        print(f"installing {peer} into {venv} (log: {log}) ...", flush=True)
        with log.open("w") as lf:
            steps = [["python3", "-m", "venv", "--clear", str(venv)]]
            steps += [[str(venv / "bin" / "pip"), "install", "-q", *pkgs] for pkgs in spec["steps"]]
            for cmd in steps:
                lf.write(f"$ {shlex.join(cmd)}\n")
                lf.flush()
                if subprocess.run(cmd, stdout=lf, stderr=subprocess.STDOUT).returncode != 0:
                    tail = log.read_text().strip().splitlines()[-3:]
                    return None, f"install failed: {shlex.join(cmd)}: {' | '.join(tail)}"
        marker.touch()
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            f"from importlib.metadata import version; print(version({spec['dist']!r}))",
        ],
        capture_output=True,
        text=True,
    )
    return venv, out.stdout.strip() or "?"


# ---- servers and CPU ---------------------------------------------------------------------------------------


def free_port(taken: set[int]) -> int:
    for port in PORTS:
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise SystemExit(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)


def start_server(port: int, step_ms: float, log: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [
            sys.executable,
            str(HERE / "server.py"),
            "--port",
            str(port),
            "--step-ms",
            str(step_ms),
            "--cpu",
            str(SERVER_CPU),
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    for _ in range(200):
        try:
            get_json(f"http://127.0.0.1:{port}/health")
            return proc
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.05)
    raise SystemExit(f"peer server on port {port} did not start; see {log}")


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return out


class TreeCPU:
    """CPU seconds of a process and all its descendants, sampled every 20 ms (exited ones keep their last
    reading), so the CPU of a load window can be read off without counting start-up and shutdown."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[tuple[int, float]] = []
        self._last: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            for p in _tree(self.pid):
                with contextlib.suppress(OSError):
                    self._last[p] = _cpu_of(p)
            self.samples.append((time.monotonic_ns(), sum(self._last.values())))
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, t_ns: int) -> float:
        s = self.samples
        if not s:
            return 0.0
        for (t0, c0), (t1, c1) in itertools.pairwise(s):
            if t0 <= t_ns <= t1:
                return c0 + (c1 - c0) * (t_ns - t0) / max(t1 - t0, 1)
        return s[0][1] if t_ns < s[0][0] else s[-1][1]


def run_pinned(
    cmd: list[str], cwd: Path, log: Path, env: dict[str, str] | None = None, timeout: float = 900
) -> tuple[int, TreeCPU]:
    with log.open("wb") as lf:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=lf,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=lambda: os.sched_setaffinity(0, {CLIENT_CPU}),
            start_new_session=True,
        )
        cpu = TreeCPU(proc.pid)
        try:
            rc = proc.wait(timeout)
        except BaseException:  # a timeout, or this run interrupted: take the peer's whole process group down
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            rc = proc.wait()
            if not isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
                raise
        finally:
            cpu.stop()
    return rc, cpu


def tail(log: Path, n: int = 4) -> str:
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    return " | ".join(line.strip()[:200] for line in lines[-n:])


# ---- clients --------------------------------------------------------------------------------------------------


def run_caseledger(base: str, sc: Scenario, work: Path, venv: Path | None) -> tuple[ClientRun, TreeCPU]:
    port = int(base.rsplit(":", 1)[1])
    ws = Workspace(work / "ws")
    paths = make_run(ws, f"r-{time.monotonic_ns() & 0xFFFFFFFFFFFF:012x}", port, sc.requests, sc.tokens, sc.concurrency)
    rc, cpu = run_pinned([sys.executable, "-m", "caseledger.load", str(paths.root)], work, work / "client.log")
    if rc != 0:
        return ClientRun({}, error=f"exit {rc}: {tail(work / 'client.log')}"), cpu
    recs = read_records(paths.raw).records
    chunks = {int(r["prompt_tokens"] or 0): r["chunk_ns"] for r in recs if r["ok"]}
    end = read_json(paths.load_end)
    return ClientRun(
        chunks,
        error=None if end["ok"] == sc.requests else f"{end['failed']} failed",
        sends=[r["send_ns"] for r in recs],
    ), cpu


def run_aiperf(base: str, sc: Scenario, work: Path, venv: Path | None) -> tuple[ClientRun, TreeCPU]:
    assert venv is not None
    out = work / "artifacts"
    cmd = [
        str(venv / "bin" / "aiperf"),
        "profile",
        "--model",
        "peer-model",
        "--url",
        base,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--concurrency",
        str(sc.concurrency),
        "--request-count",
        str(sc.requests),
        "--synthetic-input-tokens-mean",
        str(INPUT_TOKENS),
        "--synthetic-input-tokens-stddev",
        "0",
        "--output-tokens-mean",
        str(sc.tokens),
        "--output-tokens-stddev",
        "0",
        "--tokenizer",
        str(TOKENIZER),
        "--use-server-token-count",
        "--export-level",
        "raw",
        "--artifact-dir",
        str(out),
        "--ui-type",
        "none",
    ]
    rc, cpu = run_pinned(cmd, work, work / "client.log")
    raw = out / "profile_export_raw.jsonl"
    if rc != 0 or not raw.exists():
        return ClientRun({}, error=f"exit {rc}: {tail(work / 'client.log')}"), cpu
    chunks: dict[int, list[int]] = {}
    sends = []
    for line in raw.read_text().splitlines():
        rec = json.loads(line)
        sends.append(int(rec["start_perf_ns"]))
        times, seq = [], 0
        for resp in rec.get("responses") or []:  # one per SSE event, perf_counter_ns (CLOCK_MONOTONIC)
            for packet in resp.get("packets") or []:
                if packet.get("name") != "data" or packet.get("value") == "[DONE]":
                    continue
                obj = json.loads(packet["value"])
                seq = int(obj["id"].split("-")[1])
                if obj.get("choices") and obj["choices"][0].get("delta", {}).get("content"):
                    times.append(int(resp["perf_ns"]))
        if seq:
            chunks[seq] = times
    return ClientRun(chunks, sends=sends), cpu


def run_guidellm(base: str, sc: Scenario, work: Path, venv: Path | None) -> tuple[ClientRun, TreeCPU]:
    assert venv is not None
    out = work / "benchmarks.json"
    cmd = [
        str(venv / "bin" / "guidellm"),
        "run",
        "--backend",
        f"kind=openai_http,target={base}",
        "--profile",
        f"kind=concurrent,streams={sc.concurrency}",
        "--constraint",
        f"kind=max_requests,count={sc.requests}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={INPUT_TOKENS},output_tokens={sc.tokens}",
        "--tokenizer",
        f"kind=huggingface_auto,model={TOKENIZER}",
        "--output",
        f"kind=json,path={out}",
        "--disable-console-interactive",
    ]
    mono0, wall0 = time.monotonic_ns(), time.time_ns()
    rc, cpu = run_pinned(cmd, work, work / "client.log")
    mono1, wall1 = time.monotonic_ns(), time.time_ns()
    if rc != 0 or not out.exists():
        return ClientRun({}, error=f"exit {rc}: {tail(work / 'client.log')}"), cpu
    offset = ((wall0 - mono0) + (wall1 - mono1)) // 2  # guidellm stamps with time.time(): map onto monotonic
    chunks: dict[int, list[int]] = {}
    sends = []
    for bench in json.loads(out.read_text())["benchmarks"]:
        for req in bench["requests"]["successful"]:
            t = req["info"]["timings"]
            if t.get("request_start"):
                sends.append(round(t["request_start"] * 1e9) - offset)
            rid = str(req.get("response_id") or "")
            if rid.startswith("r-") and t.get("first_token_iteration") and t.get("last_token_iteration"):
                chunks[int(rid[2:])] = [
                    round(t["first_token_iteration"] * 1e9) - offset,
                    round(t["last_token_iteration"] * 1e9) - offset,
                ]
    return ClientRun(chunks, first_last_only=True, sends=sends), cpu


AISBENCH_CONFIG = """
from ais_bench.benchmark.calculators import DefaultPerfMetricCalculator
from ais_bench.benchmark.datasets import MATHEvaluator, SyntheticDataset, math_postprocess_v2
from ais_bench.benchmark.models import VLLMCustomAPIChat
from ais_bench.benchmark.openicl.icl_inferencer import GenInferencer
from ais_bench.benchmark.openicl.icl_prompt_template import PromptTemplate
from ais_bench.benchmark.openicl.icl_retriever import ZeroRetriever
from ais_bench.benchmark.summarizers import DefaultPerfSummarizer

models = [dict(attr="service", type=VLLMCustomAPIChat, abbr="peer", path={tok!r}, model="peer-model", stream=True,
               request_rate=0, use_timestamp=False, retry=1, api_key="", host_ip="127.0.0.1", host_port={port},
               url="", max_out_len={tokens}, batch_size={c}, trust_remote_code=False,
               generation_kwargs=dict(temperature=0, ignore_eos=True))]
datasets = [dict(
    abbr="synthetic", type=SyntheticDataset,
    config={{"Type": "string", "RequestCount": {n}, "TrustRemoteCode": False, "StringConfig": {{
        "Input": {{"Method": "uniform", "Params": {{"MinValue": {inp}, "MaxValue": {inp}}}}},
        "Output": {{"Method": "uniform", "Params": {{"MinValue": {tokens}, "MaxValue": {tokens}}}}}}}}},
    reader_cfg=dict(input_columns=["question", "max_out_len"], output_column="answer"),
    infer_cfg=dict(prompt_template=dict(type=PromptTemplate, template="{{question}}"),
                   retriever=dict(type=ZeroRetriever), inferencer=dict(type=GenInferencer)),
    eval_cfg=dict(evaluator=dict(type=MATHEvaluator, version="v2"), pred_postprocessor=dict(type=math_postprocess_v2)),
)]
summarizer = dict(attr="performance", type=DefaultPerfSummarizer, calculator=dict(
    type=DefaultPerfMetricCalculator, stats_list=["Average", "Median", "P99"]))
"""


def run_aisbench(base: str, sc: Scenario, work: Path, venv: Path | None) -> tuple[ClientRun, TreeCPU]:
    assert venv is not None
    port = int(base.rsplit(":", 1)[1])
    (work / "perf_peer.py").write_text(
        AISBENCH_CONFIG.format(
            tok=str(TOKENIZER), port=port, tokens=sc.tokens, c=sc.concurrency, n=sc.requests, inp=INPUT_TOKENS
        )
    )
    cmd = [
        str(venv / "bin" / "ais_bench"),
        "perf_peer.py",
        "--mode",
        "perf",
        "--num-warmups",
        "0",
        "-w",
        str(work / "out"),
    ]
    rc, cpu = run_pinned(cmd, work, work / "client.log")
    details = sorted((work / "out").glob("**/performances/*/*_details.jsonl"))
    if rc != 0 or not details:
        return ClientRun({}, error=f"exit {rc}: {tail(work / 'client.log')}"), cpu
    imp = read_aisbench(details[0].parent)
    # time points: one per SSE data line after the send stamp; this server sends the content chunks first
    chunks = {int(r["prompt_tokens"] or 0): r["chunk_ns"][: sc.tokens] for r in imp.records if r["ok"]}
    return ClientRun(chunks, sends=[r["send_ns"] for r in imp.records]), cpu


CLIENTS: dict[str, Callable[[str, Scenario, Path, Path | None], tuple[ClientRun, TreeCPU]]] = {
    "caseledger": run_caseledger,
    "aiperf": run_aiperf,
    "guidellm": run_guidellm,
    "aisbench": run_aisbench,
}


# ---- measuring ---------------------------------------------------------------------------------------------


def measure(run: ClientRun, cpu: TreeCPU, log: dict[str, Any], sc: Scenario) -> ClientRun:
    """Match the client's records to the server's streams by seq; errors, CPU and window of the load."""
    streams = {int(k): v for k, v in log["streams"].items()}
    starts, ends, n_chunks = [], [], 0
    for seq, times in run.chunks.items():
        srv = streams.get(seq)
        if srv is None or not times:
            continue
        sent = srv["sent_ns"]
        pairs = (
            [(times[0], sent[0]), (times[-1], sent[-1])]
            if run.first_last_only
            else list(zip(times, sent, strict=False))
        )
        run.errors.extend((t - s) / 1000 for t, s in pairs)
        starts.append(srv["arrive_ns"])
        ends.append(times[-1])
        n_chunks += len(sent)
    if not starts:
        run.error = run.error or "no request matched the server's log"
        return run
    t0, t1 = min(starts), max(ends)
    run.window_s = (t1 - t0) / 1e9
    run.cpu_s = cpu.at(t1) - cpu.at(t0)
    run.chunks = {k: [0] * len(streams[k]["sent_ns"]) for k in run.chunks if k in streams}  # keep counts only
    if len(starts) < sc.requests and run.error is None:
        run.error = f"{len(starts)} of {sc.requests} requests matched"
    return run


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


@dataclass
class Cell:
    runs: list[ClientRun] = field(default_factory=list)

    def ok(self) -> list[ClientRun]:
        return [r for r in self.runs if r.window_s > 0]

    def chunks_per_s(self) -> float | None:
        ok = self.ok()
        return statistics.median(sum(len(v) for v in r.chunks.values()) / r.window_s for r in ok) if ok else None

    def us_per_chunk(self) -> float | None:
        ok = self.ok()
        return (
            statistics.median(r.cpu_s * 1e6 / max(sum(len(v) for v in r.chunks.values()), 1) for r in ok)
            if ok
            else None
        )

    def errors(self) -> list[float]:
        return [e for r in self.ok() for e in r.errors]

    def launch_spread_ms(self, c: int) -> float | None:
        """Median over runs of the spread of the first C send times (the first wave, sent at once)."""
        spreads = [(s[c - 1] - s[0]) / 1e6 for r in self.ok() if len(s := sorted(r.sends)) >= c]
        return statistics.median(spreads) if spreads else None


# ---- the report ----------------------------------------------------------------------------------------------


def ratio(ours: float | None, best: float | None) -> str:
    return "" if ours is None or not best else f" ({ours / best:.2f}×)"


def fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def write_results(
    out: Path,
    cells: dict[tuple[str, str], Cell],
    clients: list[str],
    versions: dict[str, str],
    failures: dict[str, str],
    notes: list[str],
    command: str,
    repeats: int,
    started: str,
    seconds: float,
) -> None:
    peers = [c for c in clients if c != "caseledger"]
    lines = [
        "# Load client vs peers: cost per chunk and timestamp error",
        "",
        f"Produced by `bench/peers/run.py` ({started}, {seconds / 60:.0f} min). Command:",
        "",
        f"    {command}",
        "",
        f"Machine: {os.cpu_count()} CPUs ({platform.processor() or platform.machine()}), Python "
        f"{platform.python_version()}, Linux {platform.release()}; **shared with other jobs during the run**, "
        "so absolute figures are noisy: the ratios (same run, same server, interleaved) are the result.",
        f"Server (`bench/peers/server.py`) on CPU {SERVER_CPU}, every client and its child processes on CPU "
        f"{CLIENT_CPU}; {repeats} interleaved repeats per scenario (client order rotates each repeat); "
        "medians of the repeats, error percentiles pooled over all chunks of all repeats.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()),
        "",
    ]
    if failures:
        lines += ["Not measured:", ""] + [f"- **{k}**: {v}" for k, v in failures.items()] + [""]
    if notes:
        lines += ["Runs measured with a gap (their matched requests are counted):", ""] + [f"- {n}" for n in notes]
        lines += [""]
    lines += [
        "Ratios in parentheses are to the best peer (aiperf, guidellm, AISBench) on that column: below 1× "
        "is better than every peer.",
        "",
    ]
    zero = next(s for s in SCENARIOS if s.name == "zero")
    lines += [
        f"## Cost: zero-delay server, C={zero.concurrency}, {zero.requests} requests × {zero.tokens} tokens",
        "",
        "CPU µs per chunk: CPU of the client's process tree (all its processes, sampled every 20 ms) over "
        "the load window (first request at the server → last chunk at the client) / content chunks. One-core "
        "ceiling: content chunks / load window with the client on one core and the server never the "
        "bottleneck.",
        "",
        "| client | CPU µs/chunk | one-core ceiling (chunks/s) | paced C=64 CPU µs/chunk |",
        "|---|---|---|---|",
    ]
    best_us = min((v for p in peers if (v := cells[(p, "zero")].us_per_chunk()) is not None), default=None)
    best_cps = max((v for p in peers if (v := cells[(p, "zero")].chunks_per_s()) is not None), default=None)
    best_p = min((v for p in peers if (v := cells[(p, "paced-c64")].us_per_chunk()) is not None), default=None)
    for c in clients:
        us, cps, pus = (
            cells[(c, "zero")].us_per_chunk(),
            cells[(c, "zero")].chunks_per_s(),
            cells[(c, "paced-c64")].us_per_chunk(),
        )
        cps_ratio = "" if cps is None or not best_cps else f" ({cps / best_cps:.2f}×)"
        lines.append(
            f"| {c} | {fmt(us, '.1f')}{ratio(us, best_us)} | {fmt(cps, ',.0f')}{cps_ratio} | "
            f"{fmt(pus, '.1f')}{ratio(pus, best_p)} |"
        )
    lines += [
        "",
        "## Timestamp error: client receive time − server send time, per content chunk (µs)",
        "",
        "The server logs `time.monotonic_ns()` right before writing each chunk; the clients' own stamps "
        "are CLOCK_MONOTONIC too (caseledger `monotonic_ns`, aiperf `perf_counter_ns`, AISBench "
        "`perf_counter`), except guidellm (`time.time()`, mapped onto the monotonic clock by one offset "
        "read around its run). Paced server: one chunk per stream every 10 ms, all streams on the same tick.",
        "",
    ]
    for name in ("paced-c1", "paced-c64"):
        sc = next(s for s in SCENARIOS if s.name == name)
        lines += [
            f"### C={sc.concurrency}: {sc.requests} requests × {sc.tokens} tokens",
            "",
            "| client | chunks | p50 | p99 | max |",
            "|---|---|---|---|---|",
        ]
        stats = {}
        for c in clients:
            e = cells[(c, name)].errors()
            stats[c] = (pct(e, 0.5), pct(e, 0.99), max(e), len(e)) if e else None
        best = [
            min((v[k] for p in peers if (v := stats[p]) is not None and not _first_last(cells, p)), default=None)
            for k in range(3)
        ]
        for c in clients:
            st = stats[c]
            if st is None:
                lines.append(f"| {c} | — | — | — | — |")
                continue
            note = " (first and last chunk only)" if _first_last(cells, c) else ""
            lines.append(
                f"| {c}{note} | {st[3]:,} | "
                + " | ".join(f"{st[k]:,.0f}{ratio(st[k], best[k])}" for k in range(3))
                + " |"
            )
        lines.append("")
    c64 = next(s for s in SCENARIOS if s.name == "paced-c64")
    lines += [
        f"## Launch spread of the first wave (paced, C={c64.concurrency})",
        "",
        f"The {c64.concurrency} requests of the first wave are due at once: max − min of the client's own "
        f"send times of the first {c64.concurrency} requests (aiperf `start_perf_ns`, AISBench `time_points"
        "[0]`, guidellm `request_start`, caseledger `send_ns`), median over the repeats.",
        "",
        "| client | launch spread (ms) |",
        "|---|---|",
    ]
    spreads = {c: cells[(c, "paced-c64")].launch_spread_ms(c64.concurrency) for c in clients}
    best_spread = min((v for p in peers if (v := spreads[p]) is not None), default=None)
    lines += [f"| {c} | {fmt(spreads[c], '.2f')}{ratio(spreads[c], best_spread)} |" for c in clients] + [""]
    lines += [
        "guidellm keeps only the first and last token time of each request (`first_token_iteration`, "
        "`last_token_iteration`), so its row covers those chunks only and is left out of the best-peer "
        "ratios. AISBench stamps every SSE `data:` line (`time_points`, read from its sqlite store); aiperf "
        "every SSE event (`profile_export_raw.jsonl`, `responses[].perf_ns`, written with "
        "`--export-level raw`). Requests are matched to the server's by a serial number the server returns "
        "as `usage.prompt_tokens` and in the response id.",
        "",
    ]
    out.write_text("\n".join(lines))


def _first_last(cells: dict[tuple[str, str], Cell], client: str) -> bool:
    return any(
        r.first_last_only for cell in (cells[(client, "paced-c64")], cells[(client, "paced-c1")]) for r in cell.runs
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--peers", default="aiperf,guidellm,aisbench")
    ap.add_argument("--scenarios", default=",".join(s.name for s in SCENARIOS))
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "RESULTS.md")
    a = ap.parse_args()
    if (os.cpu_count() or 1) < 2:
        print("needs 2 CPUs (server on CPU 0, clients on CPU 1)", file=sys.stderr)
        return 2
    started, t_start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), time.monotonic()
    command = "python bench/peers/run.py " + shlex.join(sys.argv[1:])
    versions = {
        "caseledger": subprocess.run(
            [sys.executable, "-c", "import caseledger; print(caseledger.__version__)"], capture_output=True, text=True
        ).stdout.strip()
        or "?"
    }
    venvs: dict[str, Path | None] = {"caseledger": None}
    failures: dict[str, str] = {}
    notes: list[str] = []
    for peer in [p for p in a.peers.split(",") if p]:
        venv, info = install(peer)
        if venv is None:
            failures[peer] = info
            print(f"{peer}: {info}", flush=True)
        else:
            venvs[peer], versions[peer] = venv, info
    clients = list(venvs)
    scenarios = [s for s in SCENARIOS if s.name in a.scenarios.split(",")]
    cells = {(c, s.name): Cell() for c in clients for s in SCENARIOS}
    taken: set[int] = set()
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        servers = {}
        try:
            for sc in scenarios:
                port = free_port(taken)
                taken.add(port)
                servers[sc.name] = (port, start_server(port, sc.step_ms, Path(tmp) / f"server-{sc.name}.log"))
            os.sched_setaffinity(0, {SERVER_CPU})  # this process only samples CPU: keep it off the client's core
            for k in range(a.repeats):
                for sc in scenarios:
                    port, _ = servers[sc.name]
                    base = f"http://127.0.0.1:{port}"
                    order = clients[k % len(clients) :] + clients[: k % len(clients)]
                    for c in order:
                        work = Path(tmp) / f"{sc.name}-{k}-{c}"
                        work.mkdir()
                        get_json(base + "/_log")  # drop what earlier runs left
                        run, cpu = CLIENTS[c](base, sc, work, venvs[c])
                        if run.error and not run.chunks:
                            print(f"  {sc.name} #{k} {c}: FAILED {run.error}", flush=True)
                            failures.setdefault(f"{c} ({sc.name})", run.error)
                            continue
                        run = measure(run, cpu, get_json(base + "/_log"), sc)
                        cells[(c, sc.name)].runs.append(run)
                        if run.error:
                            notes.append(f"{c}, {sc.name}, repeat {k}: {run.error}")
                        e = sorted(run.errors)
                        print(
                            f"  {sc.name} #{k} {c}: {sum(len(v) for v in run.chunks.values())} chunks, "
                            f"{run.cpu_s * 1e6 / max(sum(len(v) for v in run.chunks.values()), 1):.1f} µs/chunk, "
                            f"error p50 {pct(e, 0.5) if e else 0:.0f} p99 {pct(e, 0.99) if e else 0:.0f} µs"
                            + (f" [{run.error}]" if run.error else ""),
                            flush=True,
                        )
        finally:
            for _, proc in servers.values():
                proc.terminate()
                proc.wait(10)
    write_results(
        a.out, cells, clients, versions, failures, notes, command, a.repeats, started, time.monotonic() - t_start
    )
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
