"""Who may start what: the host policy (caseledger.run.policy) over programs, SSH logins and loader environment,
for a local caller and for the HTTP server's (CASELEDGER_CALLER=http), checked before anything is written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from caseledger.case.model import Case
from caseledger.errors import NotAuthorized
from caseledger.run import policy
from caseledger.tools import freeze_case, start_run
from caseledger.workspace import Workspace
from tests.conftest import free_port, mcp_over_http, ref_draft, stats, tree_digest

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
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx2.get(url, timeout=1)
                break
            except httpx2.TransportError:
                assert time.monotonic() < deadline and server.poll() is None, "the MCP server did not listen"
                time.sleep(0.1)
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
