"""An external service on this host: its process (found by the socket listening on the endpoint's port) is the
service, so its CPU never distorts a window; a real neighbour still does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from caseledger import procs
from caseledger.ledger.evidence import ServiceRecord
from caseledger.metrics import latest_result
from caseledger.records import read_records
from caseledger.services.external import on_this_host
from caseledger.tools import freeze_case, start_run
from caseledger.workspace import Workspace
from tests.conftest import external_draft, free_port, stats
from tests.helpers import target_argv

# no step time: the target streams its tokens as fast as its process runs, about one core of real CPU
BUSY_TARGET = {"prefill_tokens_per_s": 1e9, "decode_step_s": 0.0, "decode_step_per_seq_s": 0.0, "slots": 8}


@contextmanager
def served_outside(log: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """The reference target as a user starts a server: by hand, in a session of its own, not by caseledger."""
    port = free_port()
    argv = target_argv(port, host=None)
    with log.open("wb") as f:
        p = subprocess.Popen(
            [*argv, "--config-json", json.dumps(BUSY_TARGET)], stdout=f, stderr=f, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if stats(port, timeout=1).get("pid") == p.pid:
                    break
            except Exception:  # not up yet
                pass
            assert p.poll() is None and time.monotonic() < deadline, log.read_text()[-500:]
            time.sleep(0.05)
        yield p, port
    finally:
        p.terminate()
        p.wait(10)


def _case(ws: Workspace, port: int) -> str:
    draft = external_draft(
        port,
        dataset={"source": "synthetic", "input_tokens": 32, "output_tokens": 2048},  # a window of seconds, not one
        load={"requests": 160, "concurrency": 4},
        warmup={"requests": 2, "concurrency": 2, "max_tokens": 2},
    )
    return freeze_case(ws, draft=draft).case_id


def _window(ws: Workspace, run_id: str) -> tuple[list[str], dict[str, Any]]:
    """The whole window's distortions and its host CPU evidence."""
    res = latest_result(ws.run(run_id).root)
    assert res is not None
    return list(res.windows.whole.distorted), res.host.model_dump()


@pytest.mark.processes  # a detached controller: its session is not the test's (nor the target's)
@pytest.mark.quiet  # the target's own CPU is what is measured: another test's would be named too
def test_an_external_server_on_this_host_is_the_service_and_a_hog_beside_it_still_distorts(
    ws: Workspace, tmp_path: Path
) -> None:
    with served_outside(tmp_path / "target.log") as (target, port):
        case_id = _case(ws, port)
        before = _ticks(target.pid)
        r = start_run(ws, case_id, wait=True, timeout_s=180)
        took = _ticks(target.pid) - before  # the target's CPU over the whole run (its load is nearly all of it)
        assert r.run_id is not None and r.state == "succeeded", r.text()
        rec = ServiceRecord.read(ws.run(r.run_id).phase_file("service"))
        assert rec is not None and rec.listeners is not None, rec
        (found,) = rec.listeners
        assert (found.pid, found.port, found.start_time) == (target.pid, port, procs.start_time(target.pid))
        assert found.command == f"{os.path.basename(sys.executable)} -m caseledger.target", found
        assert f"service: pid {target.pid} {found.command}, found listening on :{port}" in (rec.verified_by or "")
        distorted, host = _window(ws, r.run_id)
        samples = read_records(ws.run(r.run_id).load_host).records
        assert len(samples) >= 4, samples  # a window long enough to be judged
        service = sum(x["ours"] - x["client"] for x in samples)  # ours but the load client's: controller, service
        assert service >= 0.7 * took, (service, took, samples)  # the target's CPU is counted as the service's
        assert not any(f"pid {target.pid} " in t for t in host["top"]), host  # never named as another process
        assert not any(f"pid {target.pid} " in d for d in distorted), distorted
        # what distorts a window is the neighbours alone: on a quiet host (the quiet tier) the window is clean
        assert bool(distorted) == (host["other_share"] > 0.25), (distorted, host)

        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(os.cpu_count() or 2)
        ]
        try:
            busy = start_run(ws, case_id, wait=True, timeout_s=180)
        finally:
            for h in hogs:
                h.kill()
                h.wait()
        assert busy.run_id is not None, busy.text()
        distorted, host = _window(ws, busy.run_id)
        assert any("contended host" in d for d in distorted), (distorted, host)
        assert any(f"pid {h.pid} python" in d for h in hogs for d in distorted), distorted
        assert not any(f"pid {target.pid} " in d for d in distorted), distorted


@pytest.mark.integration  # real sockets on this host
def test_a_server_elsewhere_is_not_observed_and_a_port_nobody_listens_on_is_said() -> None:
    from caseledger.case.model import Case

    def case(url: str) -> Case:
        d = external_draft(1)
        d["target"] = {"endpoints": [{"base_url": url, "model": "m"}]}
        return Case.model_validate(d)

    from caseledger.services.external import listeners

    assert on_this_host("127.0.0.1") and on_this_host("localhost") and not on_this_host("192.0.2.1")
    found, note = listeners(case("http://192.0.2.1:8080/v1"))  # TEST-NET-1: never this host
    assert found == [] and note == "192.0.2.1 is not this host: the service's CPU is NOT_OBSERVED"
    port = free_port()
    found, note = listeners(case(f"http://127.0.0.1:{port}/v1"))
    assert found == [] and note == f"no process on this host was found listening on :{port}"


def _session(sid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if os.getsid(int(d.name)) == sid:
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def _ticks(pid: int) -> int:
    f = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return int(f[11]) + int(f[12])


@pytest.mark.integration  # real processes on this host, sampled from /proc
@pytest.mark.quiet
def test_a_service_tree_is_ours_with_the_children_it_forks() -> None:
    """A process counted as the service (pid and start time) is ours with the child it forks after the sampler
    began: none of their CPU is another process's."""
    spin = "while True: pass"
    fork = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {spin!r}])\n{spin}"
    svc = subprocess.Popen([sys.executable, "-c", fork], start_new_session=True)
    try:
        start = procs.start_time(svc.pid)
        assert start is not None
        sampler = procs.CpuSampler(set(), {(svc.pid, start)})
        sampler.sample(set(), None)
        deadline = time.monotonic() + 10
        while not (kids := [p for p in _session(svc.pid) if p != svc.pid]):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        tree = [svc.pid, *kids]
        before = sum(_ticks(p) for p in tree)
        sampler.sample(set(), None)
        time.sleep(1.0)
        x = sampler.sample(set(), None)
        took = sum(_ticks(p) for p in tree) - before
        assert x is not None and took > 0
        assert not any(pid in tree for pid, _, _ in x["top"]), x
        assert x["ours"] >= took - 2 * len(tree), (x, took)  # all of the tree's CPU (a tick of reading skew each)
    finally:
        for p in _session(svc.pid):
            os.kill(p, 9)
        svc.wait()
