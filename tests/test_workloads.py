"""Workloads users bring: length distributions, trace replay with shared prefixes, and their identity and checks."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from caseledger import datasets
from caseledger.case.model import Dataset, LengthDistribution
from caseledger.datasets import lengths
from caseledger.datasets.counting import open_tokenizer
from caseledger.datasets.trace import sample_jsonl
from caseledger.errors import CaseledgerError
from caseledger.ledger.runs import read_run
from caseledger.load.schedule import RECORD_BYTES, TOKEN_BYTES, raw_bytes_needed
from caseledger.metrics import Distribution, latest_result
from caseledger.tools import freeze_case, phase_status, reprocess_raw, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, ref_draft, stats

CASES = Path(__file__).resolve().parent.parent / "cases"
TRACE = "cases/trace-sample.jsonl"


def ks_statistic(xs: list[int], d: LengthDistribution) -> float:
    """Kolmogorov-Smirnov distance between the realized lengths and the declared CDF, written from the normal
    CDF with math.erf (not the code under test): the largest gap over every integer of [min, max]."""
    arr = np.sort(np.asarray(xs))

    def phi(z: float) -> float:
        return 0.5 * (1 + math.erf(z / math.sqrt(2)))

    def cont(x: float) -> float:
        assert d.mean is not None and d.stdev is not None
        if d.distribution == "normal":
            return phi((x - d.mean) / d.stdev)
        s2 = math.log(1 + (d.stdev / d.mean) ** 2)
        return 0.0 if x <= 0 else phi((math.log(x) - (math.log(d.mean) - s2 / 2)) / math.sqrt(s2))

    lo, hi = (0.0, 1.0) if d.distribution == "uniform" else (cont(d.min - 0.5), cont(d.max + 0.5))
    worst = 0.0
    for k in range(d.min, d.max + 1):
        declared = (
            (k - d.min + 1) / (d.max - d.min + 1) if d.distribution == "uniform" else (cont(k + 0.5) - lo) / (hi - lo)
        )
        empirical = np.searchsorted(arr, k, side="right") / arr.size
        worst = max(worst, abs(empirical - declared))
    return worst


def ks_critical(n: int) -> float:
    return 1.63 / math.sqrt(n)  # alpha 0.01 (conservative for a discrete distribution)


def dist_draft(port: int, inp: dict[str, Any], out: dict[str, Any], n: int) -> dict[str, Any]:
    return ref_draft(
        port,
        dataset={"source": "synthetic", "input_tokens": inp, "output_tokens": out, "entries": n, "seed": 11},
        load={"requests": 4, "concurrency": 2},
    )


@pytest.mark.parametrize(
    ("inp", "out"),
    [
        (
            {"distribution": "lognormal", "mean": 60, "stdev": 30, "min": 16, "max": 200},
            {"distribution": "normal", "mean": 24, "stdev": 6, "min": 8, "max": 40},
        ),
        ({"distribution": "uniform", "min": 20, "max": 90}, {"distribution": "fixed", "value": 12}),
    ],
)
def test_realized_lengths_pass_a_goodness_of_fit_test_against_the_declared_distribution(
    ws: Workspace, inp: dict[str, Any], out: dict[str, Any]
) -> None:
    n = 1500
    frozen = freeze_case(ws, draft=dist_draft(free_port(), inp, out, n))
    entries = datasets.load_entries(ws, frozen.dataset_id)
    ident = datasets.load_identity(ws, frozen.dataset_id)
    body = [e["body_tokens"] for e in entries]
    outs = [e["output_tokens"] for e in entries]
    di, do = LengthDistribution.model_validate(inp), LengthDistribution.model_validate(out)
    assert ks_statistic(body, di) < ks_critical(n)
    if do.distribution == "fixed":
        assert set(outs) == {do.value}
    else:
        assert ks_statistic(outs, do) < ks_critical(n)
        # the test has power: the same lengths against a distribution 15% off are rejected
        shifted = do.model_copy(update={"mean": (do.mean or 0) * 1.15})
        assert ks_statistic(outs, shifted) > ks_critical(n)
    assert min(body) >= di.min and max(body) <= di.max
    # realized lengths are the identity's and the entries' (exact, chat = body + the template)
    assert ident.input_lengths is not None and ident.output_lengths is not None
    assert (ident.input_lengths.min, ident.input_lengths.max, ident.input_lengths.count) == (min(body), max(body), n)
    assert (
        sum(ident.input_lengths.histogram.counts) == n
        and ident.input_lengths.declared["distribution"] == di.distribution
    )
    assert {e["chat_tokens"] - e["body_tokens"] for e in entries} == {entries[0]["chat_tokens"] - body[0]}
    # the module's own CDF is the declared one the KS test wrote independently
    if di.distribution != "uniform":
        assert abs(lengths.cdf(di, 50) - (1 - sum(b > 50 for b in body) / n)) < ks_critical(n)


def test_drawn_lengths_reach_the_requests_and_the_same_seed_draws_the_same(ws: Workspace) -> None:
    inp = {"distribution": "normal", "mean": 48, "stdev": 10, "min": 20, "max": 80}
    out = {"distribution": "uniform", "min": 2, "max": 9}
    a = freeze_case(ws, draft=dist_draft(free_port(), inp, out, 64))
    b = freeze_case(ws, draft={**dist_draft(free_port(), inp, out, 64), "scenario": "other"})
    assert a.dataset_id == b.dataset_id and a.case_id != b.case_id  # another case, the same data spec
    ea, eb = datasets.load_entries(ws, a.dataset_id), datasets.load_entries(ws, b.dataset_id)
    assert [e["body_tokens"] for e in ea] == [e["body_tokens"] for e in eb]
    reseeded = dist_draft(free_port(), inp, out, 64)
    reseeded["dataset"]["seed"] = 12
    c = freeze_case(ws, draft=reseeded)
    assert c.dataset_id != a.dataset_id
    assert [e["body_tokens"] for e in datasets.load_entries(ws, c.dataset_id)] != [e["body_tokens"] for e in ea]
    from caseledger.case.store import load_case
    from caseledger.load.schedule import build_schedule

    case = load_case(ws, a.case_id)
    plan = build_schedule(case, ea, None, datasets.load_identity(ws, a.dataset_id))
    assert [orjson.loads(s.body)["max_tokens"] for s in plan.specs] == [e["output_tokens"] for e in ea[:4]]
    assert case.load.max_tokens is None


@pytest.mark.parametrize(
    ("change", "field", "fix"),
    [
        ({"dataset": {"input_tokens": {"distribution": "normal", "mean": 50}}}, "mean and stdev", "stdev"),
        (
            {"dataset": {"input_tokens": {"distribution": "uniform", "min": 90, "max": 20}}},
            "min 90 > max 20",
            "min <= max",
        ),
        ({"dataset": {"input_tokens": {"distribution": "fixed"}}}, "'fixed' takes value", "'value': 256"),
        (
            {"dataset": {"output_tokens": {"distribution": "uniform", "min": 2, "max": 9}}, "load": {"max_tokens": 4}},
            "load.max_tokens must be null",
            "remove load.max_tokens",
        ),
        (
            {"dataset": {"input_tokens": {"distribution": "normal", "mean": 5000, "stdev": 10, "min": 10, "max": 100}}},
            "dataset.input_tokens",
            "move dataset.input_tokens.mean inside",
        ),
        ({"dataset": {"source": "trace"}}, "dataset.path is required", "relative to it"),
        (
            {"dataset": {"source": "trace", "path": TRACE}, "load": {"arrival": "trace", "rate": 4}},
            "load.rate must be null",
            "set rate null",
        ),
        ({"load": {"time_scale": 0.5}}, "load.time_scale", "set load.arrival 'trace'"),
        ({"load": {"arrival": "trace"}}, "needs dataset.source 'trace'", "timestamps"),
    ],
)
def test_bad_workload_fields_are_refused_naming_the_field_and_the_fix(
    ws: Workspace, change: dict[str, Any], field: str, fix: str
) -> None:
    (ws.root / TRACE).write_bytes(sample_jsonl())
    d = ref_draft(free_port())
    for k, v in change.items():
        d[k] = {**d[k], **v}
    with pytest.raises(CaseledgerError) as e:
        freeze_case(ws, draft=d)
    text = str(e.value) + " " + getattr(e.value, "fix", "")
    assert field in text and fix in text, text
    assert not ws.datasets_dir.exists() or not any(ws.datasets_dir.iterdir())


def trace_draft(port: int, **over: Any) -> dict[str, Any]:
    d = orjson.loads((CASES / "ref-trace.json").read_bytes())
    d["target"]["endpoints"][0]["base_url"] = f"http://127.0.0.1:{port}/v1"
    d["warmup"] = {"requests": 2, "concurrency": 2, "max_tokens": 2}
    for k, v in over.items():
        d[k] = {**d[k], **v}
    return d


def put_trace(ws: Workspace, text: bytes | None = None, name: str = TRACE) -> None:
    (ws.root / name).parent.mkdir(parents=True, exist_ok=True)
    (ws.root / name).write_bytes(sample_jsonl() if text is None else text)


def test_trace_blocks_are_shared_by_id_and_each_request_plans_what_earlier_rows_sent(ws: Workspace) -> None:
    put_trace(ws)
    frozen = freeze_case(ws, draft=trace_draft(free_port()))
    rows = [orjson.loads(x) for x in sample_jsonl().splitlines()]
    entries = datasets.load_entries(ws, frozen.dataset_id)
    ident = datasets.load_identity(ws, frozen.dataset_id)
    assert ident.source == "trace" and ident.trace is not None and ident.trace.rows == len(rows) == 24
    assert [e["trace_row"] for e in entries] == list(range(24))
    assert [e["body_tokens"] for e in entries] == [r["input_length"] for r in rows]
    assert [e["output_tokens"] for e in entries] == [r["output_length"] for r in rows]
    assert [e["arrival_s"] for e in entries] == [r["timestamp"] / 1000 for r in rows]
    block = 32
    # every prompt: one first word + the salt slot (the same for every request of a run) + blocks + a tail
    assert len({e["prefix"] + e["salt_slot"] for e in entries}) == 1
    tok = open_tokenizer("builtin", True)
    # the planned share: what an earlier row had as a prefix of whole blocks (recomputed here independently)
    seen: set[tuple[int, ...]] = set()
    head = 6  # '<|im_start|>user\n' under ChatML with the builtin tokenizer
    assert tok.count_batch([tok.head])[0] == head
    for i, (e, r) in enumerate(zip(entries, rows, strict=True)):
        nb = min(len(r["hash_ids"]), (r["input_length"] - 9) // block)
        ids = tuple(r["hash_ids"][:nb])
        j = max((k for k in range(nb + 1) if ids[:k] in seen or k == 0), default=0)
        assert e["shared_blocks"] == j
        assert e["expected_cached_tokens"] == (0 if i == 0 else head + 9 + j * block)
        seen.update(ids[:k] for k in range(1, nb + 1))
    # the same ids are the same tokens: rows 1 and 2 share their first 8 blocks, then differ
    one, two = tok.encode_batch([entries[1]["suffix"], entries[2]["suffix"]])
    assert rows[1]["hash_ids"][:8] == rows[2]["hash_ids"][:8] and rows[1]["hash_ids"][8] != rows[2]["hash_ids"][8]
    assert one[: 8 * block] == two[: 8 * block] and one[8 * block : 9 * block] != two[8 * block : 9 * block]
    assert entries[2]["shared_blocks"] == 8
    assert ident.trace.planned_shared_tokens == sum(e["expected_cached_tokens"] for e in entries)


def test_trace_id_covers_the_file_and_a_subset_is_its_own_dataset(ws: Workspace) -> None:
    put_trace(ws)
    port = free_port()
    full = freeze_case(ws, draft=trace_draft(port))
    sub = freeze_case(ws, draft=trace_draft(port, dataset={"entries": 10}, load={"requests": 10}))
    assert sub.dataset_id != full.dataset_id and sub.case_id != full.case_id
    assert len(datasets.load_entries(ws, sub.dataset_id)) == 10
    stored = orjson.loads(Path(full.path).read_bytes())
    assert stored["dataset"]["sha256"] == datasets.load_identity(ws, full.dataset_id).source_sha256
    # one changed row: another case and dataset, and the old case refuses the changed file
    rows = sample_jsonl().splitlines()
    rows[3] = rows[3].replace(b'"output_length":8', b'"output_length":9')
    put_trace(ws, b"\n".join(rows) + b"\n")
    changed = freeze_case(ws, draft=trace_draft(port))
    assert changed.case_id != full.case_id and changed.dataset_id != full.dataset_id
    pinned = trace_draft(port)
    pinned["dataset"]["sha256"] = stored["dataset"]["sha256"]
    with pytest.raises(CaseledgerError, match=r"dataset\.sha256 pins") as e:
        freeze_case(ws, draft=pinned)
    assert "restore the trace file" in e.value.fix


@pytest.mark.parametrize(
    ("path", "text", "message"),
    [
        ("../outside.jsonl", None, "resolves outside the workspace"),
        ("/etc/passwd", None, "resolves outside the workspace"),
        (TRACE, b'{"timestamp": 0, "input_length": 100, "output_length": 4}\n', "has no 'hash_ids'"),
        (
            TRACE,
            b'{"timestamp": 5, "input_length": 100, "output_length": 4, "hash_ids": [1]}\n'
            b'{"timestamp": 2, "input_length": 100, "output_length": 4, "hash_ids": [1]}\n',
            "sort the trace",
        ),
        (TRACE, b'{"timestamp": 0, "input_length": 100, "output_length": 0, "hash_ids": [1]}\n', "'output_length'"),
        (TRACE, b'{"timestamp": 0, "input_length": 100, "output_length": 4, "hash_ids": ["a"]}\n', "'hash_ids'"),
        (
            TRACE,
            b'{"timestamp": 0, "input_length": 5, "output_length": 4, "hash_ids": [1]}\n',
            "'input_length' must be an integer 10..",
        ),
        (TRACE, b'{"timestamp": 0, "input_length": 50, "output_length": 4, "hash_ids": [1]}\n', "has 1 requests"),
    ],
)
def test_a_bad_trace_is_refused_naming_the_field_and_writing_nothing(
    ws: Workspace, tmp_path: Path, path: str, text: bytes | None, message: str
) -> None:
    if text is not None:
        put_trace(ws, text)
    else:
        (tmp_path / "outside.jsonl").write_bytes(sample_jsonl())
    d = trace_draft(free_port(), dataset={"path": path})
    if "'input_length'" in message:
        d["dataset"]["entries"] = d["load"]["requests"] = 1
    if "has 1 requests" in message:
        d["load"]["requests"] = 2
    with pytest.raises(CaseledgerError) as e:
        freeze_case(ws, draft=d)
    assert message in str(e.value) and "dataset.path" in str(e.value), str(e.value)
    assert e.value.fix
    assert not ws.frozen_dir.exists() or not any(ws.frozen_dir.glob("c-*.json"))
    assert not ws.datasets_dir.exists() or not any(ws.datasets_dir.iterdir())


def test_preflight_refuses_a_request_longer_than_the_context(ws: Workspace, stop_services: None) -> None:
    put_trace(ws)
    d = trace_draft(free_port(), target={"context_tokens": 300})
    run = start_run(ws, freeze_case(ws, draft=d).case_id, wait=True, timeout_s=120)
    st = phase_status(ws, run.run_id)
    assert st.state == "failed" and st.failure_class == "before_model", st.text()
    assert "context of 300 tokens (target.context_tokens)" in (st.blocker or "") and "trace row" in (st.blocker or "")
    assert "ValueError" not in (st.blocker or "")  # a refusal reads as its sentence, not as an exception's type


@pytest.mark.integration
def test_trace_replays_on_the_reference_target_on_schedule_with_cached_beside_planned(
    ws: Workspace, stop_services: None
) -> None:
    put_trace(ws)
    port = free_port()
    d = trace_draft(port, load={"time_scale": 0.5})
    run = start_run(ws, freeze_case(ws, draft=d).case_id, wait=True, timeout_s=300)
    assert run.state == "succeeded", phase_status(ws, run.run_id).text()
    rd = ws.run(run.run_id)
    recs = [orjson.loads(x) for x in rd.raw.read_bytes().splitlines()]
    rows = [orjson.loads(x) for x in sample_jsonl().splitlines()]
    # the raw disk reserved before the first send covers each row's own output length, not dataset.output_tokens
    longest_row = max(x["output_length"] for x in rows)
    assert longest_row != Dataset.model_fields["output_tokens"].default  # the rows' own lengths, not the default
    assert raw_bytes_needed(read_run(rd.root)) == 24 * (RECORD_BYTES + TOKEN_BYTES * longest_row)
    recs.sort(key=lambda r: r["i"])
    assert [r["trace_row"] for r in recs] == list(range(24))
    # the schedule: send times follow the trace's timestamps x 0.5 from the first send
    t0 = recs[0]["sched_ns"]
    assert [round((r["sched_ns"] - t0) / 1e6, 3) for r in recs] == [round(x["timestamp"] * 0.5, 3) for x in rows]
    res = latest_result(rd.root)
    assert res is not None and res.schedule is not None and res.trace is not None
    assert res.schedule.requests == 24
    err = res.schedule.arrival_error
    # never early; on time as a rule, and no lateness that adds up (a host shared with three other test workers
    # delays sends by a few ms: p50 1.1 ms, max 11 ms seen there; the percentiles over repeated replays on a quiet
    # host are bench/bench_trace.py's, not a test's)
    assert isinstance(err, Distribution) and err.min >= 0 and err.p50 < 5.0 and err.max < 100.0, res.schedule.text
    # the reference target caches in blocks of 16 once a prompt's prefill is done: what the trace shares is
    # cached, down to whole blocks, for each request sent after every earlier one had its first token (row 1 is
    # due 22.5 ms after row 0: on a contended host row 0 may still be in its prefill then, and nothing is cached
    # yet, as on a real engine)
    tr = res.trace
    assert tr.requests == 24 and tr.with_cached_tokens == 24
    first = [r["chunk_ns"][0] for r in recs]
    ready = [r for r in tr.per_request if all(first[j] <= recs[r.i]["send_ns"] for j in range(r.i))]
    assert len(ready) >= 20, [(r.i, recs[r.i]["send_ns"] - t0, first[: r.i]) for r in tr.per_request]
    for r in ready:
        assert r.cached_tokens is not None and r.planned_shared_tokens - 15 <= r.cached_tokens, r
    assert sum(r.planned_shared_tokens for r in tr.per_request) == tr.planned_shared_tokens > 0
    # reprocessing the raw data gives the same figures
    before = res.model_dump(mode="json")
    served = stats(port)["requests_total"]
    rep = reprocess_raw(ws, run.run_id)
    assert rep.requests == 24 and stats(port)["requests_total"] == served  # none sent, counted at the target
    again = latest_result(rd.root)
    assert again is not None
    after = again.model_dump(mode="json")
    assert after["schedule"] == before["schedule"] and after["trace"] == before["trace"]
    assert after["windows"] == before["windows"]
    report = rd.report_md.read_text()
    assert "## Trace replay" in report and "## Schedule" in report and "input lengths" in report


@pytest.mark.integration
def test_a_file_line_asks_its_own_output_tokens_and_its_count_is_checked_against_it(
    ws: Workspace, stop_services: None
) -> None:
    rows: list[dict[str, Any]] = [
        {"prompt": "one line that asks five", "output_tokens": 5},
        {"prompt": "a line that takes the dataset's default"},
        {"prompt": "a line that asks twenty", "output_tokens": 20},
        {"prompt": "and one that asks three", "output_tokens": 3},
    ]
    (ws.root / "prompts.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    d = ref_draft(free_port(), dataset={"source": "file", "path": "prompts.jsonl"}, load={"requests": 4})
    frozen = freeze_case(ws, draft=d)
    from caseledger.case.store import load_case

    assert load_case(ws, frozen.case_id).load.max_tokens is None  # each line asks its own
    run = start_run(ws, frozen.case_id, wait=True, timeout_s=300)
    assert run.state == "succeeded", phase_status(ws, run.run_id).text()
    rd = ws.run(run.run_id)
    recs = sorted((orjson.loads(x) for x in rd.raw.read_bytes().splitlines()), key=lambda r: r["i"])
    asked = [5, ref_draft(0)["dataset"]["output_tokens"], 20, 3]
    # ignore_eos: the reference target answers exactly what was asked, so the counts show what each request asked
    assert [r["completion_tokens"] for r in recs] == asked
    assert [r["max_tokens"] for r in recs] == asked
    res = latest_result(rd.root)
    assert res is not None and res.checks is not None and res.checks.invalid == 0 and res.checks.checked == 4
