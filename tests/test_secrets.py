"""Secrets are referenced, never copied: API keys and service env values stay out of the workspace."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio
import httpx2
import orjson
import pytest
from mcp import Client

from caseledger import procs, redact, services
from caseledger.case.store import load_case
from caseledger.cli import main
from caseledger.errors import CaseledgerError, quoted
from caseledger.ledger.leases import target_key
from caseledger.load import RequestSpec, run_requests
from caseledger.procs import INHERITED_ENV
from caseledger.records import PHASE_HEADER, RawRecord
from caseledger.redact import MASK, MIN_SECRET_CHARS, Secrets
from caseledger.server import build_server
from caseledger.tools import freeze_case, phase_status, resume, start_run, summarize
from caseledger.views import handoff
from caseledger.workspace import Workspace
from tests.conftest import (
    ONE_TOKEN_STREAM,
    Answer,
    external_draft,
    free_port,
    ref_draft,
    reference_targets,
    stub_target,
)
from tests.helpers import slow_draft, target_argv, wait_state

SECRET = "sk-test-7f3a9c1e5b2d4f6a8c0e"


@pytest.mark.integration
def test_api_key_and_service_env_values_never_reach_the_ledger(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None
) -> None:
    monkeypatch.setenv("CASELEDGER_TEST_API_KEY", SECRET)
    draft = ref_draft(
        free_port(),
        target={"api_key_env": "CASELEDGER_TEST_API_KEY"},
        service={"env": {"ENGINE_TOKEN": "${CASELEDGER_TEST_API_KEY}", "LOG_LEVEL": "info"}},
    )
    case = freeze_case(ws, draft=draft)
    r = start_run(ws, case.case_id, wait=True)
    assert r.state == "succeeded", r.text()
    summarize(ws, [r.run_id])
    hits = [p for p in ws.root.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert hits == []
    # the reference is recorded, so a reader knows where the value came from
    svc = next((ws.services_dir).glob("*.json")).read_text()
    assert "${CASELEDGER_TEST_API_KEY}" in svc


def test_missing_secret_reference_fails_in_service_naming_the_variable(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None
) -> None:
    monkeypatch.delenv("CASELEDGER_NOT_SET", raising=False)
    draft = ref_draft(free_port(), service={"env": {"TOKEN": "${CASELEDGER_NOT_SET}"}})
    case = freeze_case(ws, draft=draft)
    r = start_run(ws, case.case_id, wait=True)
    assert r.state == "failed"
    s = phase_status(ws, r.run_id)
    assert s.phase == "service" and "CASELEDGER_NOT_SET" in (s.blocker or "")
    assert Path(ws.root).exists()


# ---- the launched service's environment: the harmless basics plus exactly the declared service.env --------------

UNDECLARED = "sk-undeclared-" + "5e1f" * 6  # a secret of the agent's shell that no case mentions
DECLARED = "declared-" + "a7c3" * 6  # the value a case's ${NAME} reference resolves to


def _plant(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CASELEDGER_TEST_UNDECLARED_SECRET", UNDECLARED)
    monkeypatch.setenv("OPENAI_API_KEY", UNDECLARED)
    monkeypatch.setenv("LD_LIBRARY_PATH", "/caller/lib")  # identity-relevant: declared in the case, or absent
    monkeypatch.setenv("CASELEDGER_TEST_DECLARED", DECLARED)
    monkeypatch.setenv("LC_TEST_LOCALE", "C")  # harmless: LC_* is inherited


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    assert UNDECLARED.encode() not in raw
    return dict(kv.decode().split("=", 1) for kv in raw.split(b"\0") if kv)


@pytest.mark.integration
@pytest.mark.parametrize("adapter", ["command", "reference"])
def test_launched_service_gets_only_the_basics_and_its_declared_env(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None, adapter: str
) -> None:
    _plant(monkeypatch)
    service: dict[str, Any] = {
        "adapter": adapter,
        "env": {"ENGINE_TOKEN": "${CASELEDGER_TEST_DECLARED}", "LOG_LEVEL": "info"},
    }
    if adapter == "command":
        service["argv"] = target_argv()
    cid = freeze_case(ws, draft=ref_draft(free_port(), service=service)).case_id
    case = load_case(ws, cid)
    ev = services.ensure(ws, case, target_key(case.canonical()), cid, allow_start=True).evidence()
    assert ev["outcome"] == "done"
    env = _environ(int(ev["pid"]))
    assert env["ENGINE_TOKEN"] == DECLARED and env["LOG_LEVEL"] == "info"  # the declared env, resolved
    assert env["PATH"] and env["LC_TEST_LOCALE"] == "C"  # what any command needs to run
    assert "CASELEDGER_TEST_UNDECLARED_SECRET" not in env and "OPENAI_API_KEY" not in env
    assert "CASELEDGER_TEST_DECLARED" not in env and "LD_LIBRARY_PATH" not in env
    extra = {"PYTHONPATH": procs.PKG_PARENT} if adapter == "reference" else {}
    assert env.get("PYTHONPATH") == extra.get("PYTHONPATH")  # the reference target: this checkout, not the caller's
    allowed = set(INHERITED_ENV) | {"ENGINE_TOKEN", "LOG_LEVEL"} | set(extra)
    assert {k for k in env if not k.startswith("LC_")} <= allowed


@pytest.mark.integration
def test_identity_command_runs_with_the_same_minimal_env(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _plant(monkeypatch)
    show = "import os, sys; sys.stdout.write(' '.join(f'{k}={v}' for k, v in sorted(os.environ.items())))"
    with reference_targets({"ext": {}}, tmp_path / "logs") as served:
        draft = ref_draft(
            0,
            target={"endpoints": [{"base_url": served["ext"].url + "/v1", "model": "ref-model"}]},
            service={
                "adapter": "external",
                "identity_command": [sys.executable, "-c", show],
                "env": {"ENGINE_TOKEN": "${CASELEDGER_TEST_DECLARED}"},
            },
        )
        cid = freeze_case(ws, draft=draft).case_id
        case = load_case(ws, cid)
        ev = services.ensure(ws, case, target_key(case.canonical()), cid, allow_start=False).evidence()
    out = ev["identity_output"]
    # the command saw the declared value (that is what is masked) and the evidence does not keep it
    assert "ENGINE_TOKEN=***" in out and DECLARED not in out and "LC_TEST_LOCALE=C" in out
    assert UNDECLARED not in out and "LD_LIBRARY_PATH" not in out


@pytest.mark.processes  # the environ of each process started
@pytest.mark.integration
def test_no_process_caseledger_starts_inherits_the_callers_secrets(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, stop_services: None
) -> None:
    """Controller, load client and service: the basics and what the case names (its API key variable), never
    the rest of the agent's shell."""
    from caseledger.workspace import read_json_or_none

    monkeypatch.setenv("AGENT_SHELL_SECRET", UNDECLARED)
    monkeypatch.setenv("OPENAI_API_KEY", UNDECLARED)
    monkeypatch.setenv("CASELEDGER_TEST_KEY", SECRET)  # the key the case names: its load client needs it
    port = free_port()
    cid = freeze_case(
        ws,
        draft=slow_draft(
            port,
            target={
                "endpoints": [{"base_url": f"http://127.0.0.1:{port}/v1", "model": "ref-model"}],
                "api_key_env": "CASELEDGER_TEST_KEY",
            },
        ),
    ).case_id
    r = start_run(ws, cid)
    paths = ws.run(r.run_id)
    wait_state(ws, r.run_id, lambda s: s.sent > 0)
    case = load_case(ws, cid)
    service = read_json_or_none(ws.services_dir / f"{target_key(case.canonical())}.json") or {}
    pids = {
        "controller": read_json_or_none(paths.controller_pid),
        "load client": read_json_or_none(paths.load_pid),
        "service": service.get("proc"),
    }
    for name, ref in pids.items():
        assert ref is not None, name
        env = _environ(int(ref["pid"]))  # the undeclared secret is absent from the raw environ
        assert "AGENT_SHELL_SECRET" not in env and "OPENAI_API_KEY" not in env, name
        assert (env.get("CASELEDGER_TEST_KEY") == SECRET) == (name != "service"), name
        # one BLAS thread and no pydantic plugin for caseledger's own processes; an engine's are its own to set
        own = [env.get(k) == v for k, v in procs.OWN_PROCESS_ENV.items()]
        assert all(own) if name != "service" else not any(own), (name, env)
    wait_state(ws, r.run_id, lambda s: s.state == "succeeded", timeout=90)


# ---- a server that echoes the key: masked where the text is recorded and where it is shown ----------------------

ECHO_ENV = "CASELEDGER_TEST_ECHO_KEY"
# characters a JSON body escapes (a quote, a backslash) and a slash some servers escape: the key then appears in
# the server's body and in the ledger's JSON files in another spelling than its own
ECHOED = 'sk-echo"7f3a\\9c1e/5b2d-4f6a8c0e'


def spellings(value: str) -> list[bytes]:
    """The key as bytes in a file or an answer: as is, and JSON-escaped (a JSON file or answer quoting it)."""
    js = json.dumps(value)[1:-1]
    return [value.encode(), js.encode(), js.replace("/", "\\/").encode()]


def leaks(text: str | bytes, value: str = ECHOED) -> bool:
    data = text.encode() if isinstance(text, str) else text
    return any(s in data for s in spellings(value))


def echo_key(headers: dict[str, str], body: dict[str, Any]) -> Answer:
    """Warmup and route checks are served; every formal request is rejected with the bearer header it carried
    quoted in the message, as a misconfigured gateway does."""
    if headers.get(PHASE_HEADER.lower()) == "load":
        msg = f"invalid request: got auth {headers.get('authorization')}"
        return 400, "application/json", json.dumps({"error": {"code": 400, "message": msg}}).encode()
    return 200, "text/event-stream", ONE_TOKEN_STREAM


def _cli(ws: Workspace, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    main([*argv, "--workspace", str(ws.root)])
    out = capsys.readouterr()
    return out.out + out.err


def _mcp_answers(ws: Workspace, run_id: str) -> list[str]:
    """phase_status and summarize as an MCP client gets them (text and structured content), and the handoff."""

    async def go() -> list[str]:
        out: list[str] = []
        async with Client(build_server(ws)) as c:
            for name, args in (("phase_status", {"run_id": run_id}), ("summarize", {"run_ids": [run_id]})):
                r = await c.call_tool(name, args)
                out += [getattr(x, "text", "") for x in r.content]
                out.append(json.dumps(r.structured_content))
            res = await c.read_resource("caseledger://handoff")
            out += [getattr(x, "text", "") for x in res.contents]
        return out

    return anyio.run(go)


def _files_with_the_key(ws: Workspace) -> list[str]:
    return [str(p.relative_to(ws.root)) for p in sorted(ws.root.rglob("*")) if p.is_file() and leaks(p.read_bytes())]


@pytest.mark.integration
def test_a_key_the_server_echoes_is_masked_in_every_file_and_every_answer(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ECHO_ENV, ECHOED)
    with stub_target(echo_key) as port:
        cid = freeze_case(ws, draft=external_draft(port, target={"api_key_env": ECHO_ENV})).case_id
        r = start_run(ws, cid, wait=True, timeout_s=120)
        s = phase_status(ws, r.run_id)
        assert s.failure_class == "hot_entry", s.text()
        answers = [r.text(), s.text(), s.model_dump_json()]
        # where the message was, the mask: the server's own words survive around it
        assert "got auth Bearer ***" in (s.blocker or ""), s.blocker
        summary = summarize(ws, [r.run_id])
        answers += [summary.text(), summary.model_dump_json(), handoff.refresh(ws)]
        again = resume(ws, r.run_id, wait=True, timeout_s=120)  # re-sends the rejected load: a second attempt
        answers += [again.text(), again.model_dump_json(), phase_status(ws, r.run_id).text()]
        answers += [
            _cli(ws, capsys, *cmd)
            for cmd in (
                ["status", r.run_id],
                ["status", r.run_id, "--json"],
                ["handoff"],
                ["handoff", "--json"],
                ["summarize", r.run_id],
                ["summarize", r.run_id, "--json"],
            )
        ]
        answers += _mcp_answers(ws, r.run_id)
    paths = ws.run(r.run_id)
    recorded = [paths.raw, paths.events, paths.phase_file("load"), ws.handoff]
    assert all(b"got auth Bearer ***" in p.read_bytes() for p in recorded), recorded
    assert list(paths.root.glob("load.attempt-*/superseded.json"))  # the first attempt, kept aside
    assert _files_with_the_key(ws) == []
    assert [a for a in answers if leaks(a)] == []
    assert any("got auth Bearer ***" in a for a in answers[-8:])

    # text an older version recorded unmasked: masked again wherever it is shown, also by a fresh process that
    # learns the secret variables from the workspace's frozen cases (a status reads no case)
    events = paths.events.read_bytes()
    paths.events.write_bytes(events.replace(b"Bearer ***", b"Bearer " + spellings(ECHOED)[1]))
    assert leaks(paths.events.read_bytes())
    shown = [
        subprocess.run(
            [sys.executable, "-m", "caseledger", *cmd, "--workspace", str(ws.root)],
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout
        for cmd in (["status", r.run_id], ["status", r.run_id, "--json"], ["handoff"])
    ]
    shown += _mcp_answers(ws, r.run_id)
    assert [a for a in shown if leaks(a)] == []
    assert all("got auth Bearer ***" in a for a in shown[:3]), shown[:3]
    assert not leaks(ws.handoff.read_bytes())


# ---- the load client: its record's error text is masked before raw.jsonl ---------------------------------------

RECORD_KEY = "sk-record-" + "3b8d" * 5


def _one_request(monkeypatch: pytest.MonkeyPatch, transport: httpx2.MockTransport) -> RawRecord:
    monkeypatch.setenv("CASELEDGER_TEST_RECORD_KEY", RECORD_KEY)
    redact.remember(["CASELEDGER_TEST_RECORD_KEY"])  # as reading the run's case does
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    spec = RequestSpec(
        i=0,
        entry=0,
        route=0,
        offset_s=0.0,
        url="http://target.test/v1/chat/completions",
        body=body,
        input_tokens_body=1,
        input_tokens_chat=1,
    )
    (rec,) = anyio.run(lambda: run_requests([spec], 1, "load", transport=transport, api_key=RECORD_KEY, timeout_s=5.0))
    return rec


def test_an_http_error_body_quoting_the_key_is_recorded_masked_even_across_the_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        # the key straddles the 120 characters of the body's line the record keeps
        return httpx2.Response(400, text="x" * 110 + request.headers["authorization"] + " trailing")

    rec = _one_request(monkeypatch, httpx2.MockTransport(handler))
    assert rec["status"] == 400 and rec["error"] is not None
    assert RECORD_KEY[:4] not in rec["error"] and rec["error"].endswith("Bearer ***…"), rec["error"]


def test_a_stream_error_quoting_the_key_is_recorded_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    def handler(request: httpx2.Request) -> httpx2.Response:
        err = {"error": {"message": f"bad key {request.headers['authorization']}"}}

        async def body() -> AsyncIterator[bytes]:  # streamed, as the load client reads a 200
            yield b"data: " + orjson.dumps(err) + b"\n\n"

        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    rec = _one_request(monkeypatch, httpx2.MockTransport(handler))
    assert rec["error_class"] == "stream" and rec["error"] is not None
    assert RECORD_KEY not in rec["error"] and "bad key Bearer ***" in rec["error"], rec["error"]


# ---- the masker ---------------------------------------------------------------------------------------------------


def test_every_occurrence_becomes_the_mask_and_overlapping_ones_leave_no_piece() -> None:
    s = Secrets(["abcabcab"])
    assert s.mask("key abcabcab, again abcabcab.") == "key ***, again ***."
    # two occurrences sharing 'ab' (at 0 and 3): masked as one, no 'cab' left between two masks
    assert s.mask("<abcabcabcab>") == "<***>"
    two = Secrets(["secret-one", "one-two-three"])  # different secrets that overlap or touch
    assert two.mask("[secret-one-two-three]") == "[***]"
    assert two.mask("secret-onesecret-one") == "***"


def test_a_key_is_masked_in_its_json_escaped_repr_and_url_spellings() -> None:
    key = 'sk-"q\\7/é-5b2d4f6a'
    s = Secrets([key])
    for body in (
        json.dumps({"error": {"message": f"got auth Bearer {key}"}}),
        json.dumps({"error": {"message": f"got auth Bearer {key}"}}, ensure_ascii=False),
        json.dumps({"error": {"message": f"got auth Bearer {key}"}}).replace("/", "\\/"),
    ):
        masked = s.mask(body)
        assert json.loads(masked) == {"error": {"message": "got auth Bearer ***"}}, masked  # still JSON
    assert s.mask(f"KeyError({key!r})") == "KeyError('***')"
    assert s.mask(repr(key.encode())) == "b'***'"
    assert s.mask("https://x.test/?key=" + quote(key, safe="")) == "https://x.test/?key=***"


def test_short_and_empty_values_are_not_masked() -> None:
    s = Secrets(["", "info", "EMPTY", "0,1,2,3"])  # shorter than MIN_SECRET_CHARS: common words of any text
    assert not s and s.mask("info: EMPTY on 0,1,2,3") == "info: EMPTY on 0,1,2,3"
    assert len("0,1,2,3") < MIN_SECRET_CHARS <= len(RECORD_KEY)


def test_cut_never_keeps_the_first_characters_of_a_key() -> None:
    key = "sk-cut-" + "9e4a" * 4
    s = Secrets([key])
    text = "A" * 10 + key + "B" * 10
    for n in range(len(text) + 2):
        out = s.cut(text, n)
        assert out == text[:n] if n <= 10 else out.startswith("A" * 10 + MASK), (n, out)
        assert "sk" not in out, (n, out)
    assert s.cut(text, 10 + len(key) + 3) == "A" * 10 + MASK + "BBB"


def test_mask_obj_masks_strings_and_keys_and_keeps_the_structure() -> None:
    key = "sk-obj-" + "c0de" * 4
    s = Secrets([key])
    obj = {"error": f"HTTP 400: {key}", "n": 3, "ok": False, "list": [key, {f"by {key}": (key, 1.5, None)}]}
    assert s.mask_obj(obj) == {
        "error": "HTTP 400: ***",
        "n": 3,
        "ok": False,
        "list": ["***", {"by ***": ("***", 1.5, None)}],
    }
    assert Secrets([]).mask_obj(obj) is obj
    assert s.mask_bytes(b"\xff\xfe " + key.encode() + b" \xff") == b"\xff\xfe *** \xff"  # non-UTF-8 bytes kept


def test_quoted_and_shown_mask_the_secrets_this_process_knows(monkeypatch: pytest.MonkeyPatch) -> None:
    key = "sk-shown-" + "4d2c" * 4
    monkeypatch.setenv("CASELEDGER_TEST_SHOWN_KEY", key)
    assert quoted(f"auth {key}") == f"auth {key}"  # not a referenced variable (yet): nothing to mask
    redact.remember(["CASELEDGER_TEST_SHOWN_KEY"])
    assert quoted(f"auth {key}") == "auth ***"
    long = "y" * 70 + " " + key + " " + "z" * 50  # the key crosses the cut at 80 characters
    assert "sk-" not in quoted(long) and "sk-" not in quoted(long.replace(" ", ""))
    e = CaseledgerError(f"server said: {key}", f"check {key}")
    assert e.shown() == ("server said: ***", "check ***")
    assert key not in repr(redact.current())
    monkeypatch.delenv("CASELEDGER_TEST_SHOWN_KEY")
    assert quoted(f"auth {key}") == f"auth {key}"  # a process without the value cannot have echoed it
