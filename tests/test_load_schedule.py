"""The load schedule: arrival offsets, request bodies, routes, determinism, the run-directory entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from caseledger import datasets
from caseledger.case.model import Case
from caseledger.errors import CaseInvalid
from caseledger.load import Schedule, arrival_offsets, build_schedule, schedule_from_run_dir
from caseledger.workspace import Workspace
from tests.helpers import RUN_ID, make_run_dir


def draft(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "scenario": "plan-test",
        "target": {"endpoints": [{"base_url": "http://127.0.0.1:18080/v1", "model": "m0"}]},
        "dataset": {"source": "synthetic", "input_tokens": 24, "output_tokens": 6, "entries": 12},
        "load": {"requests": 10, "concurrency": 3},
    }
    for k, v in over.items():
        d[k] = {**d[k], **v} if isinstance(v, dict) and isinstance(d.get(k), dict) else v
    return d


@pytest.fixture(scope="module")
def mat(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Workspace, Case, list[datasets.Entry], datasets.DatasetIdentity]:
    ws = Workspace(tmp_path_factory.mktemp("plan") / "ws")
    case = Case.model_validate(draft()).filled()
    ident = datasets.materialize(ws, case)
    return ws, case, datasets.load_entries(ws, ident.dataset_id), ident


def plan_for(mat: Any, salt: str | None = "s1", **over: Any) -> tuple[Case, Schedule]:
    _, _, entries, ident = mat
    case = Case.model_validate(draft(**over)).filled()
    return case, build_schedule(case, entries, salt, ident)


def test_the_plan_carries_load_max_event_bytes(mat: Any) -> None:
    assert plan_for(mat)[1].max_event_bytes == 8 * 2**20
    assert plan_for(mat, load={"max_event_bytes": 2**20})[1].max_event_bytes == 2**20


def bodies(plan: Schedule) -> list[dict[str, Any]]:
    return [orjson.loads(s.body) for s in plan.specs]


# ---- arrivals ---------------------------------------------------------------------------------------


def test_constant_arrival_is_exact_spacing_and_unlimited_rate_sends_all_at_once() -> None:
    assert arrival_offsets(5, 4.0, "constant", 1.0, 0) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert arrival_offsets(4, None, "poisson", 1.0, 0) == [0.0] * 4


@pytest.mark.parametrize(("arrival", "shape", "cv"), [("poisson", 1.0, 1.0), ("gamma", 0.25, 2.0), ("gamma", 4.0, 0.5)])
def test_random_arrivals_have_mean_gap_one_over_rate_and_the_shape_variability(
    arrival: str, shape: float, cv: float
) -> None:
    rate = 50.0
    offsets = np.array(arrival_offsets(20001, rate, arrival, shape, seed=12345))
    gaps = np.diff(offsets)
    assert offsets[0] == 0.0 and (gaps >= 0).all()
    assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_same_run_reproduces_the_plan_and_another_salt_changes_bodies_and_random_offsets(mat: Any) -> None:
    over = {"load": {"requests": 10, "concurrency": 3, "rate": 20.0, "arrival": "poisson"}}
    _, a = plan_for(mat, "s1", **over)
    _, b = plan_for(mat, "s1", **over)
    _, c = plan_for(mat, "s2", **over)
    assert a == b and a.digest() == b.digest()
    assert [s.offset_s for s in a.specs] != [s.offset_s for s in c.specs]
    assert [s.body for s in a.specs] != [s.body for s in c.specs]
    const = {"load": {"requests": 10, "concurrency": 3, "rate": 20.0, "arrival": "constant"}}
    assert [s.offset_s for s in plan_for(mat, "s1", **const)[1].specs] == [k / 20 for k in range(10)]


# ---- bodies, routes, validation ---------------------------------------------------------------------


def test_chat_body_is_a_streaming_request_with_continuous_usage_and_the_rendered_prompt(mat: Any) -> None:
    _, _, entries, ident = mat
    load = {"requests": 10, "concurrency": 3, "max_tokens": 5, "ignore_eos": False}
    case, plan = plan_for(mat, "s1", load=load)
    assert plan.planned == 10 and plan.concurrency == 3 and plan.timeout_s == case.load.timeout_s
    for s, body in zip(plan.specs, bodies(plan), strict=True):
        assert s.url == "http://127.0.0.1:18080/v1/chat/completions"
        prompt = datasets.render_prompt(entries[s.i], "s1", ident)
        assert body == {
            "model": "m0",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 5,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "ignore_eos": False,
            "temperature": 0,
            "timings_per_token": True,  # the reference target streams draft counts per chunk
        }
        assert (s.entry, s.input_tokens_body, s.input_tokens_chat) == (
            entries[s.i]["i"],
            entries[s.i]["body_tokens"],
            entries[s.i]["chat_tokens"],
        )
        assert s.offset_s == 0.0


def test_completions_body_sends_a_prompt_and_max_tokens_defaults_to_dataset_output(mat: Any) -> None:
    _, _, entries, ident = mat
    # not filled: load.max_tokens stays null and falls back to dataset.output_tokens
    case = Case.model_validate(draft(target={"api": "completions"}))
    plan = build_schedule(case, entries, None, ident)
    body = bodies(plan)[3]
    assert plan.specs[3].url.endswith("/v1/completions")
    assert body["prompt"] == datasets.render_prompt(entries[3], None, ident) and "messages" not in body
    assert body["max_tokens"] == 6 and body["stream"] is True and body["ignore_eos"] is True


def test_requests_go_round_robin_over_endpoints_with_each_endpoints_model(mat: Any) -> None:
    eps = [{"base_url": f"http://10.0.0.{k}:8000/v1/", "model": f"m{k}"} for k in range(3)]
    _, plan = plan_for(mat, target={"endpoints": eps})
    assert [s.route for s in plan.specs] == [i % 3 for i in range(10)]
    for s, body in zip(plan.specs, bodies(plan), strict=True):
        assert s.url == f"http://10.0.0.{s.route}:8000/v1/chat/completions"
        assert body["model"] == f"m{s.route}"


def test_fewer_entries_than_requests_is_refused_naming_both_fields(mat: Any) -> None:
    _, _, entries, ident = mat
    case = Case.model_validate(draft()).filled()
    with pytest.raises(CaseInvalid) as err:
        build_schedule(case, entries[:4], None, ident)
    assert "load.requests" in str(err.value) and "dataset.entries" in str(err.value)


# ---- the run-directory entry point ------------------------------------------------------------------


def test_schedule_from_run_dir_uses_the_frozen_case_and_the_runs_salt(tmp_path: Path) -> None:
    ws = Workspace(tmp_path / "ws")
    paths = make_run_dir(ws, draft())
    plan = schedule_from_run_dir(paths.root)
    case = Case.model_validate(orjson.loads(paths.case.read_bytes()))
    ident = datasets.load_identity(ws, orjson.loads(paths.run_json.read_bytes())["dataset_id"])
    entries = datasets.load_entries(ws, ident.dataset_id)
    assert plan == build_schedule(case, entries, RUN_ID, ident)
    assert plan != build_schedule(case, entries, None, ident)  # the salt reached the bodies


@pytest.mark.integration
def test_plan_builds_in_a_fresh_process_with_files_and_sockets_forbidden(tmp_path: Path) -> None:
    """What preflight relies on: build_schedule itself does no I/O (everything it needs is passed in)."""
    ws = Workspace(tmp_path / "ws")
    paths = make_run_dir(ws, draft(load={"requests": 10, "concurrency": 3, "rate": 5.0, "arrival": "gamma"}))
    script = f"""
import sys
from caseledger.load.schedule import build_schedule
from caseledger.ledger.runs import read_run
from caseledger import datasets
run = read_run({str(paths.root)!r})
entries = datasets.load_entries(run.workspace, run.meta.dataset_id)
ident = datasets.load_identity(run.workspace, run.meta.dataset_id)
case = run.case  # read before the guard: build_schedule itself must do no I/O
import numpy.random  # the gamma draw's module, which plan.py imports on first use: code, not the plan's data
def guard(event, args):
    if event == "open" or event.startswith(("socket.", "subprocess.", "os.")):
        raise PermissionError(f"I/O during build_schedule: {{event}} {{args!r:.80}}")
sys.addaudithook(guard)
plan = build_schedule(case, entries, run.meta.salt, ident)
print(plan.planned, plan.digest())
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "10"
    assert out.stdout.split()[1] == schedule_from_run_dir(paths.root).digest()
