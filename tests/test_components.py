"""Multi-process services (service.components) on real llama-server processes: two routes of one target, one
engine each. Each process is started, verified, reused and repaired on its own; the dataset's planned chat
tokens are checked against the tokens the server counts; a process holding other weights than the case
declares is refused with the diff.

Two llama-server processes share the 2 cores here: one thread and two slots each, a handful of short requests.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from caseledger import services
from caseledger.case.model import Case
from caseledger.ledger import authorization
from caseledger.metrics import latest_result
from caseledger.tools import freeze_case, phase_status, resume, start_run
from caseledger.workspace import Workspace, read_json, sha256_file
from tests.conftest import free_port, start_with_fault
from tests.engine import MODEL_ALIAS, llama_paths, work

pytestmark = [pytest.mark.engine, pytest.mark.integration]

TIMEOUT = 420.0


def engine_argv(server: str, model: str) -> list[str]:
    return [
        server,
        "-m",
        model,
        "--host",
        "{host}",
        "--port",
        "{port}",
        "-c",
        "2048",
        "-np",
        "2",
        "-t",
        "1",
        "--metrics",
        "-a",
        "{model}",
    ]


def two_route_draft(ports: tuple[int, int], server: str, model: str, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "scenario": "llamacpp-two-routes",
        "target": {"endpoints": [{"base_url": f"http://127.0.0.1:{p}/v1", "model": MODEL_ALIAS} for p in ports]},
        "service": {
            "adapter": "command",
            "components": [
                {
                    "name": f"r{k}",
                    "role": "worker",
                    "argv": engine_argv(server, model),
                    "routes": [k],
                    "health_timeout_s": 120,
                    "files": [{"path": model, "held": True}],
                }
                for k in range(2)
            ],
        },
        "dataset": {"source": "synthetic", "input_tokens": 48, "output_tokens": 4, "tokenizer": model},
        "load": {"requests": 6, "concurrency": 2, "timeout_s": 300},
        "warmup": {"requests": 2, "concurrency": 2, "max_tokens": 2},
        "measurement": {"spec_decode": "none"},
    }
    d.update(over)
    return d


class Engine:
    def __init__(self, ws: Workspace, server: str, model: str) -> None:
        self.ws, self.server, self.model = ws, server, model
        self.ports = (free_port(), free_port())


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    server, model = llama_paths()
    ws = Workspace(tmp_path_factory.mktemp("components") / "ws")
    (ws.root / "cases").mkdir(parents=True)
    authorization.set_mode(ws, "auto")
    try:
        yield Engine(ws, server, model)
    finally:
        services.stop_all(ws)


def service_ev(ws: Workspace, run_id: str) -> dict[str, Any]:
    return dict(read_json(ws.run(run_id).phase_file("service")))


def pids(ev: dict[str, Any]) -> dict[str, int]:
    return {c["name"]: c["pid"] for c in ev["components"]}


def records(ws: Workspace, run_id: str) -> list[dict[str, Any]]:
    return [orjson.loads(x) for x in ws.run(run_id).raw.read_bytes().splitlines()]


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@pytest.mark.processes
def test_two_routes_kill_one_resume_restarts_only_it(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    ws = engine.ws
    case = freeze_case(ws, draft=two_route_draft(engine.ports, engine.server, engine.model))
    r = start_with_fault(monkeypatch, "controller:exit_before=load", ws, case.case_id, wait=True, timeout_s=TIMEOUT)
    deadline = time.monotonic() + TIMEOUT
    while (s := phase_status(ws, r.run_id)).owner_alive and time.monotonic() < deadline:
        time.sleep(0.1)
    ev1 = service_ev(ws, r.run_id)
    before = pids(ev1)
    assert ev1["restarted"] == ["r0", "r1"] and len(set(before.values())) == 2, ev1
    # the effective identity read back: the weights file held by each process, its hash, the engine's version
    for c in ev1["components"]:
        assert c["files"] == [{"path": engine.model, "sha256": sha256_file(Path(engine.model)), "held": True}]
        assert "(/props)" in c["engine_version"]
    # route_verify checked each route's prompt tokens against the plan (the GGUF's own tokenizer: equal)
    routes = read_json(ws.run(r.run_id).phase_file("route_verify"))["routes"]
    assert [x["tokens"]["compared"] for x in routes] == ["equal", "equal"], routes

    os.kill(before["r1"], signal.SIGKILL)  # route 1's engine dies while the run waits for its load
    wait_gone(before["r1"])
    s = phase_status(ws, r.run_id)
    assert s.service_alive is False and s.resume_runs[:1] == ["service"], s.text()
    assert f"r1 pid {before['r1']}" in s.text() and f"r0 pid {before['r0']}" not in s.text(), s.text()
    work0 = work(engine.ports[0])

    res = resume(ws, r.run_id, wait=True, timeout_s=TIMEOUT)
    assert res.state == "succeeded", phase_status(ws, r.run_id).text()
    ev2 = service_ev(ws, r.run_id)
    after = pids(ev2)
    assert after["r0"] == before["r0"] and after["r1"] != before["r1"], (before, after)
    assert ev2["reused"] == ["r0"] and ev2["restarted"] == ["r1"] and ev2["changed_routes"] == [1]
    # warmup and route verification ran on route 1 only: route 0's engine did only its formal requests' work
    assert read_json(ws.run(r.run_id).phase_file("warmup"))["routes"] == [1]
    recs = records(ws, r.run_id)
    on0 = [x for x in recs if x["route"] == 0]
    assert len(recs) == 6 and all(x["ok"] for x in recs) and on0
    moved = work(engine.ports[0])["llamacpp:tokens_predicted_total"] - work0["llamacpp:tokens_predicted_total"]
    assert moved == sum(x["completion_tokens"] for x in on0) == 4 * len(on0)
    # planned chat tokens = server prompt tokens on every request, and the report says so
    assert [x["prompt_tokens"] for x in recs] == [x["input_tokens_chat"] for x in recs]
    result = latest_result(ws.run(r.run_id).root)
    assert result is not None
    agree = result.windows.whole.tokens.prompt_vs_planned
    assert (agree.compared, agree.equal) == (6, 6), agree  # type: ignore[union-attr]
    report = ws.run(r.run_id).report_md.read_text()
    assert "Server prompt tokens = planned chat tokens on 6 of 6 requests." in report


def test_child_changing_one_component_restarts_only_it(engine: Engine) -> None:
    ws = engine.ws
    base = freeze_case(ws, draft=two_route_draft(engine.ports, engine.server, engine.model))
    r1 = start_run(ws, base.case_id, wait=True, timeout_s=TIMEOUT)
    assert r1.state == "succeeded", phase_status(ws, r1.run_id).text()
    p1 = pids(service_ev(ws, r1.run_id))
    d = two_route_draft(engine.ports, engine.server, engine.model)
    d["service"]["components"][1]["argv"] = [*engine_argv(engine.server, engine.model), "--temp", "0.5"]
    child = freeze_case(ws, draft=d, parent=base.case_id)
    assert [x.path for x in child.delta] == ["service.components.r1.argv"]
    r2 = start_run(ws, child.case_id, wait=True, timeout_s=TIMEOUT)
    assert r2.state == "succeeded", phase_status(ws, r2.run_id).text()
    ev = service_ev(ws, r2.run_id)
    p2 = pids(ev)
    assert p2["r0"] == p1["r0"] and p2["r1"] != p1["r1"], (p1, p2)
    assert ev["restarted"] == ["r1"] and ev["changed_routes"] == [1]
    eff = next(c for c in ev["components"] if c["name"] == "r1")["effective_argv"]
    assert eff[-2:] == ["--temp", "0.5"]


def test_builtin_tokenizer_is_refused_before_the_formal_load(engine: Engine) -> None:
    ws = engine.ws
    d = two_route_draft(engine.ports, engine.server, engine.model, scenario="llamacpp-builtin")
    d["dataset"] = {**d["dataset"], "tokenizer": "builtin"}
    case = freeze_case(ws, draft=d)
    before = [work(p) for p in engine.ports]
    r = start_run(ws, case.case_id, wait=True, timeout_s=TIMEOUT)
    s = phase_status(ws, r.run_id)
    assert s.state == "failed" and s.failure_class == "dataset" and s.phase == "route_verify", s.text()
    err = read_json(ws.run(r.run_id).phase_file("route_verify"))
    assert "dataset tokenizer ≠ server tokenizer on route" in err["error"], err
    planned, counted = (int(x) for x in re.findall(r"planned (\d+) chat tokens, server counted (\d+)", err["error"])[0])
    assert counted > planned > 48, err["error"]  # the builtin BPE splits these words into fewer tokens than Gemma
    assert "dataset.tokenizer" in err["fix"] and "freeze_case" in s.next_call, (err, s.next_call)
    raw = ws.run(r.run_id).raw
    assert s.sent == 0 and (not raw.exists() or records(ws, r.run_id) == [])  # an armed client sent nothing
    # no formal request: the engines did only warmup and the route checks' work (1 output token each)
    after = [work(p) for p in engine.ports]
    predicted = sum(
        a["llamacpp:tokens_predicted_total"] - b["llamacpp:tokens_predicted_total"]
        for a, b in zip(after, before, strict=True)
    )
    assert predicted <= 2 * 2 + 2, predicted  # at most warmup (2 x 2 tokens) + one verify token per route


def test_process_holding_other_weights_than_declared_is_refused_with_the_diff(engine: Engine, tmp_path: Path) -> None:
    ws = engine.ws
    declared = tmp_path / "declared.gguf"  # what the case says the engine serves: another file, another hash
    shutil.copyfile(engine.model, declared)
    with declared.open("ab") as f:
        f.write(b"another layout")
    port = free_port()
    d: dict[str, Any] = two_route_draft((port, free_port()), engine.server, engine.model, scenario="llamacpp-files")
    d["target"]["endpoints"] = d["target"]["endpoints"][:1]
    d["service"]["components"] = [
        {
            "name": "solo",
            "argv": engine_argv(engine.server, engine.model),
            "routes": [0],
            "health_timeout_s": 120,
            "files": [{"path": str(declared), "held": True}],
        }
    ]
    case = freeze_case(ws, draft=d)
    assert Case.model_validate(d).service.components[0].files[0].held
    r = start_run(ws, case.case_id, wait=True, timeout_s=TIMEOUT)
    s = phase_status(ws, r.run_id)
    assert s.state == "failed" and s.failure_class == "service" and s.phase == "service", s.text()
    err = read_json(ws.run(r.run_id).phase_file("service"))["error"]
    want, have = sha256_file(declared)[:16], sha256_file(Path(engine.model))[:16]
    assert "component 'solo'" in err and "differs from its intended identity" in err, err
    assert f"files {declared}: intended sha256 {want}" in err and "not open or mapped" in err, err
    assert f"it holds {engine.model} (sha256 {have}" in err, err
    assert s.sent == 0
    # the process that loaded other weights was stopped: nothing is left on its port
    st = read_json(next(ws.services_dir.glob("*.solo.json")))
    wait_gone(st["proc"]["pid"])
    assert not Path(f"/proc/{st['proc']['pid']}").exists()
