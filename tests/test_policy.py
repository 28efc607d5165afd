"""Who may start what: the host policy (caseledger.run.admission.policy) over programs, SSH logins and loader
environment, for a local caller and for the HTTP server's (CASELEDGER_CALLER=http), checked before anything is
written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from caseledger.case.model import Case
from caseledger.errors import NotAuthorized
from caseledger.ledger.event_types import HostRefused
from caseledger.run.admission import policy
from caseledger.tools import freeze_case, start_run
from caseledger.tools.phase_status import StatusResult
from caseledger.workspace import Workspace
from tests.conftest import free_port, mcp_over_http, ref_draft, stats, tree_digest, wait_listening

LOGIN = {"user": "bench", "key_path": "/keys/id_ed25519", "known_hosts": "/keys/known_hosts"}


def shell_draft(port: int, marker: Path) -> dict[str, Any]:
    """A command-adapter case whose 'service' is a shell writing a marker file: what an attacker would send."""
    d = ref_draft(port)
    d["service"] = {"adapter": "command", "argv": ["sh", "-c", f"id > {marker}; sleep 30"]}
    return d


def preload_draft(port: int) -> dict[str, Any]:
    d = ref_draft(port)
    d["service"] = {**d["service"], "env": {"LD_PRELOAD": "/tmp/evil.so"}}
    return d


def ssh_draft(port: int) -> dict[str, Any]:
    d = ref_draft(port)
    d["load"] = {**d["load"], "host": {"host": "10.0.0.7", **LOGIN}}
    return d


@pytest.fixture
def host_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The policy file's path, named by CASELEDGER_POLICY (not yet written)."""
    path = tmp_path / "host" / "policy.json"
    monkeypatch.setenv(policy.POLICY_ENV, str(path))
    return path


def write(path: Path, doc: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))


def test_a_local_caller_without_a_policy_file_may_start_what_it_declares(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(policy.POLICY_ENV, raising=False)
    monkeypatch.delenv(policy.CALLER_ENV, raising=False)
    for d in (shell_draft(1, Path("/nonexistent/m")), preload_draft(1), ssh_draft(1)):
        policy.check(Case.model_validate(d))


def test_the_http_caller_without_a_policy_file_may_start_only_the_reference_target(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(policy.POLICY_ENV, raising=False)
    monkeypatch.setenv(policy.CALLER_ENV, "http")
    policy.check(Case.model_validate(ref_draft(1)))  # caseledger's own target: nothing of the case's to start
    want = {
        "sh": (shell_draft(1, Path("/x")), "service.argv[0] program 'sh' is not allowed"),
        "LD_PRELOAD": (preload_draft(1), "service.env variable 'LD_PRELOAD' is not allowed"),
        "ssh": (ssh_draft(1), "load.host ssh host 'bench@10.0.0.7' is not allowed"),
    }
    for d, said in want.values():
        with pytest.raises(NotAuthorized) as e:
            policy.check(Case.model_validate(d))
        assert said in e.value.message and "(the default policy of an HTTP caller: no policy file" in e.value.message, (
            e.value.message
        )
        assert "policy.json" in (e.value.fix or "") and "no tool writes it" in (e.value.fix or "")


def test_a_policy_file_allows_exactly_what_it_lists_for_every_caller(
    host_policy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sh = shutil.which("sh")
    assert sh is not None
    write(host_policy, {"programs": ["sh"], "ssh_hosts": ["10.0.0.7"], "loader_env": []})
    for who in ("local", "http"):
        monkeypatch.setenv(policy.CALLER_ENV, who)
        policy.check(Case.model_validate(shell_draft(1, Path("/x"))))  # 'sh' by name
        d = shell_draft(1, Path("/x"))
        d["service"]["argv"][0] = os.path.realpath(sh)  # the same program by its path: resolved, allowed
        policy.check(Case.model_validate(d))
        policy.check(Case.model_validate(ssh_draft(1)))  # 'host' allows any user on it
        with pytest.raises(
            NotAuthorized, match=f"service.env variable 'LD_PRELOAD' is not allowed \\(host policy {host_policy}\\)"
        ):
            policy.check(Case.model_validate(preload_draft(1)))
        other = ssh_draft(1)
        other["load"]["host"]["host"] = "10.0.0.8"
        with pytest.raises(NotAuthorized, match=r"'bench@10\.0\.0\.8' is not allowed"):
            policy.check(Case.model_validate(other))
        py = shell_draft(1, Path("/x"))
        py["service"]["argv"] = [sys.executable, "-c", "pass"]
        with pytest.raises(NotAuthorized, match=r"program '.*python.*' is not allowed"):
            policy.check(Case.model_validate(py))
    write(host_policy, {"programs": [], "ssh_hosts": ["alice@10.0.0.7"]})  # a user named: only that login
    with pytest.raises(NotAuthorized, match=r"'bench@10\.0\.0\.7' is not allowed"):
        policy.check(Case.model_validate(ssh_draft(1)))


def test_a_damaged_or_missing_named_policy_allows_nothing(host_policy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(policy.CALLER_ENV, raising=False)
    case = Case.model_validate(shell_draft(1, Path("/x")))
    with pytest.raises(NotAuthorized, match=f"CASELEDGER_POLICY={host_policy} names no file"):
        policy.check(case)
    for bad, said in (("{", "is damaged"), ('{"programs": "sh"}', "is damaged"), ('{"allow": ["sh"]}', "damaged")):
        host_policy.parent.mkdir(parents=True, exist_ok=True)
        host_policy.write_text(bad)
        with pytest.raises(NotAuthorized, match=said) as e:
            policy.check(case)
        assert '"programs"' in (e.value.fix or "")
    monkeypatch.setenv(policy.CALLER_ENV, "root")
    write(host_policy, {"programs": ["sh"]})
    with pytest.raises(NotAuthorized, match="CASELEDGER_CALLER='root' is not a known caller"):
        policy.check(case)


def test_start_run_refused_by_the_policy_writes_nothing(
    ws: Workspace, host_policy: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    write(host_policy, {"programs": []})
    cid = freeze_case(ws, draft=shell_draft(free_port(), marker)).case_id  # freezing starts nothing: allowed
    before = tree_digest(ws.root)
    with pytest.raises(
        NotAuthorized,
        match=f"refused: service.argv.0. program 'sh' is not allowed .host policy {host_policy}",
    ):
        start_run(ws, cid)
    assert tree_digest(ws.root) == before and not marker.exists()


MCP_TOKEN = "t0ken-" + "p" * 20


@pytest.mark.integration
def test_an_mcp_client_over_http_with_the_token_cannot_start_what_the_policy_does_not_allow(
    ws: Workspace, tmp_path: Path
) -> None:
    """`caseledger mcp --http` with no policy file: `sh`, LD_PRELOAD and an unlisted SSH login are refused at
    start_run, naming the policy; nothing ran, no run was created; the reference target still runs."""
    import anyio

    marker, port = tmp_path / "ran", free_port()
    env = {**os.environ, "CL_TOKEN": MCP_TOKEN, "XDG_CONFIG_HOME": str(tmp_path / "config")}
    env.pop(policy.POLICY_ENV, None)
    mcp_port = free_port()
    argv = [sys.executable, "-m", "caseledger", "mcp", "--workspace", str(ws.root)]
    argv += ["--http", f"127.0.0.1:{mcp_port}", "--token-env", "CL_TOKEN"]
    server = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{mcp_port}/mcp"

    async def session() -> dict[str, str]:
        said: dict[str, str] = {}
        async with mcp_over_http(url, MCP_TOKEN) as c:
            for name, d in (
                ("sh", shell_draft(port, marker)),
                ("LD_PRELOAD", preload_draft(port)),
                ("ssh", ssh_draft(port)),
            ):
                frozen = await c.call_tool("freeze_case", {"draft": d})
                assert not frozen.is_error, frozen
                assert frozen.structured_content is not None
                r = await c.call_tool("start_run", {"case_id": frozen.structured_content["case_id"]})
                assert r.is_error, r
                said[name] = "\n".join(getattr(x, "text", "") for x in r.content)
            ok = await c.call_tool("freeze_case", {"draft": ref_draft(port)})
            assert ok.structured_content is not None
            r = await c.call_tool("start_run", {"case_id": ok.structured_content["case_id"]})
            assert not r.is_error and r.structured_content is not None, r
            with anyio.fail_after(120):
                while True:
                    st = await c.call_tool("phase_status", {"run_id": r.structured_content["run_id"], "wait_s": 5})
                    assert st.structured_content is not None
                    if st.structured_content["state"] not in ("created", "running"):
                        break
            assert st.structured_content["state"] == "succeeded", st
            said["served"] = str(stats(port)["requests_total"])
        return said

    try:
        wait_listening(url, server)
        said = anyio.run(session)
    finally:
        from caseledger import services

        services.stop_all(ws)
        server.terminate()
        server.wait(10)
    assert "program 'sh' is not allowed" in said["sh"]
    assert "variable 'LD_PRELOAD' is not allowed" in said["LD_PRELOAD"]
    assert "ssh host 'bench@10.0.0.7' is not allowed" in said["ssh"]
    assert all("start_run refused: " in s and "an HTTP caller" in s for k, s in said.items() if k != "served")
    assert not marker.exists()
    runs = sorted(p.name for p in ws.runs_dir.iterdir()) if ws.runs_dir.exists() else []
    assert len(runs) == 1  # the reference case's run only
    assert int(said.pop("served")) > 0  # the reference target ran and was measured


# ------------------------------------------------------------------------------- a campaign's points, refused
def refused_campaign(port: int, marker: Path, shape: str) -> dict[str, Any]:
    """A campaign one of whose points would run `sh` (the command adapter's argv), the others caseledger's own
    reference target: by an axis value, by a proposing search's axis value, or on one target of a pool."""
    base = ref_draft(port)
    base["service"] = {**base["service"], "argv": ["sh", "-c", f"id > {marker}; sleep 30"]}  # used by 'command'
    adapter = {"path": "service.adapter", "values": ["reference", "command"]}
    body: dict[str, Any] = {
        "name": f"refused-{shape}",
        "base": base,
        "axes": [adapter],
        "search": {"kind": "grid"},
        "repeats": {"runs": 1, "settle_runs": 1, "budget": 0},
        "decision": {"primary_metric": "output_throughput"},
    }
    if shape == "tpe":
        body["search"] = {"kind": "tpe", "max_points": 2}
    if shape == "pool":
        url = "target.endpoints.0.base_url"
        body["axes"] = [{"path": "load.concurrency", "values": [1, 2]}]
        body["pool"] = [
            {"name": "a", "set": {url: f"http://127.0.0.1:{port}/v1"}},
            {"name": "b", "set": {url: f"http://127.0.0.1:{free_port()}/v1", "service.adapter": "command"}},
        ]
    return {"campaign": body}


REFUSED_AS = {
    "grid": "point 'adapter=command'",
    "tpe": "axis value 'adapter=command'",
    "pool": "point 'C=1' on pool target 'b'",
}


@pytest.mark.parametrize("shape", sorted(REFUSED_AS))
def test_a_campaign_whose_point_the_policy_refuses_is_refused_at_its_start_naming_the_point_and_writes_nothing(
    ws: Workspace, host_policy: Path, tmp_path: Path, shape: str
) -> None:
    from caseledger.tools import freeze_any, resume_any, start_any
    from caseledger.tools.campaigns import CampaignFrozen

    marker = tmp_path / "ran"
    write(host_policy, {"programs": []})
    f = freeze_any(ws, draft=refused_campaign(free_port(), marker, shape))  # freezing starts nothing: allowed
    assert isinstance(f, CampaignFrozen)
    before = tree_digest(ws.root)
    for start in (start_any, resume_any):
        with pytest.raises(NotAuthorized) as e:
            start(ws, f.campaign_id)
        said = f"campaign {f.campaign_id} {REFUSED_AS[shape]} refused: service.argv[0] program 'sh' is not allowed"
        assert e.value.message.startswith(said) and f"(host policy {host_policy})" in e.value.message, e.value
        assert f"adds it to programs in {host_policy}" in e.value.fix and "no tool writes it" in e.value.fix
    assert tree_digest(ws.root) == before and not marker.exists()  # no driver, event, run or HANDOFF.md


@pytest.mark.integration
def test_a_point_the_policy_refuses_once_the_campaign_runs_fails_at_once_and_every_view_says_why(
    ws: Workspace, host_policy: Path, tmp_path: Path, stop_services: None
) -> None:
    """The policy file changed after the campaign's start (its driver spawned as a start would, past the start's
    check): the refused point is recorded once, never tried again, the other point is measured and the campaign
    completes; its row, status, summarize and the next call carry the policy's words and fix."""
    from caseledger.campaign.store import driver_events
    from caseledger.campaign.view import campaign_view
    from caseledger.ledger import authorization
    from caseledger.run.campaign_driver import spawn
    from caseledger.tools import freeze_any, status_any, summarize
    from caseledger.tools.campaigns import CampaignFrozen

    marker = tmp_path / "ran"
    authorization.set_mode(ws, "auto")
    f = freeze_any(ws, draft=refused_campaign(free_port(), marker, "grid"))
    assert isinstance(f, CampaignFrozen)
    write(host_policy, {"programs": []})
    spawn(ws, f.campaign_id, set())  # inline (the suite's tier): returns once the campaign is complete
    view = campaign_view(ws, f.campaign_id)
    rows = {r.label: r for r in view.rows}
    bad, good = rows["adapter=command"], rows["adapter=reference"]
    said = f"campaign {f.campaign_id} point 'adapter=command' refused: service.argv[0] program 'sh' is not allowed"
    assert bad.status == "refused" and good.status == "measured" and view.complete, view.text()
    assert bad.why is not None and bad.why.startswith(said), bad.why
    assert f"fix: a person on this host adds it to programs in {host_policy}" in bad.why
    assert bad.run_ids == [] and not marker.exists()
    kinds = [e.type for e in driver_events(ws, f.campaign_id)]
    assert kinds.count("host_refused") == 1 and "point_refused" not in kinds and "waiting" not in kinds, kinds
    assert view.next_call.startswith("the host refused 1 point(s)") and f"start_run(case_id='{f.campaign_id}')" in (
        view.next_call
    )
    status = status_any(ws, f.campaign_id)
    assert not isinstance(status, StatusResult)
    for text in (view.text(), status.text(), summarize(ws, [f.campaign_id]).text()):
        assert said in text and f"adds it to programs in {host_policy}" in text and "1 refused by the host" in text


@pytest.mark.integration
def test_a_pool_target_the_policy_refuses_once_the_campaign_runs_names_the_policy_and_the_others_measure_every_point(
    ws: Workspace, host_policy: Path, tmp_path: Path, stop_services: None
) -> None:
    from caseledger.campaign.store import driver_events
    from caseledger.campaign.view import campaign_view
    from caseledger.ledger import authorization
    from caseledger.run.campaign_driver import spawn
    from caseledger.tools import freeze_any
    from caseledger.tools.campaigns import CampaignFrozen

    marker = tmp_path / "ran"
    authorization.set_mode(ws, "auto")
    f = freeze_any(ws, draft=refused_campaign(free_port(), marker, "pool"))
    assert isinstance(f, CampaignFrozen)
    write(host_policy, {"programs": []})
    spawn(ws, f.campaign_id, set())
    view = campaign_view(ws, f.campaign_id)
    assert view.complete and [r.status for r in view.rows] == ["measured", "measured"], view.text()
    assert all(set(r.on) == {"a"} for r in view.rows), view.text()  # every run on the target allowed
    line = next(x for x in view.pool if x.startswith("b: "))
    assert "the host refused" in line and "on pool target 'b' refused: service.argv[0] program 'sh'" in line, line
    assert f"adds it to programs in {host_policy}" in line and not marker.exists()
    refusals = [e for e in driver_events(ws, f.campaign_id) if isinstance(e, HostRefused)]
    assert {e.target for e in refusals} == {"b"} and len(refusals) <= 2, refusals  # once per point, at most
