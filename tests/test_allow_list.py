"""Allow by list (caseledger.run.admission.policy): a case's env names, the server variables it passes on and the
addresses its target is at are each allowed by name, never by a deny pattern; and a target's error body is kept as one
short line (caseledger.load.chunks.error_line), for every caller."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from caseledger.case.model import Case
from caseledger.errors import NotAuthorized
from caseledger.load.chunks import ERROR_LINE_CHARS, error_line
from caseledger.run.admission import policy
from caseledger.workspace import Workspace
from tests.conftest import free_port, mcp_over_http, ref_draft, tree_digest, wait_listening

# variables that load code and that a pattern of "loader" names (LD_*, PYTHON*, a fixed list) did not name
UNLISTED_LOADERS = ("OPENSSL_CONF", "OPENSSL_MODULES", "JAVA_TOOL_OPTIONS")
MCP_TOKEN = "t0ken-" + "a" * 20


def with_env(port: int, env: dict[str, str]) -> dict[str, Any]:
    d = ref_draft(port)
    d["service"] = {**d["service"], "env": env}
    return d


def external(base_url: str, **target: Any) -> dict[str, Any]:
    d = ref_draft(1)
    d["target"] = {"endpoints": [{"base_url": base_url, "model": "m"}], **target}
    d["service"] = {"adapter": "external"}
    return d


def refusal(d: dict[str, Any]) -> str:
    with pytest.raises(NotAuthorized) as e:
        policy.check(Case.model_validate(d))
    return e.value.message + " | fix: " + (e.value.fix or "")


@pytest.fixture
def http_caller(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The HTTP server's caller, with no policy file yet (its path returned, named by CASELEDGER_POLICY)."""
    monkeypatch.setenv(policy.CALLER_ENV, "http")
    path = tmp_path / "policy.json"
    monkeypatch.delenv(policy.POLICY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "none"))
    return path


def use_policy(monkeypatch: pytest.MonkeyPatch, path: Path, doc: dict[str, Any]) -> None:
    path.write_text(json.dumps(doc))
    monkeypatch.setenv(policy.POLICY_ENV, str(path))


def test_an_env_name_no_list_names_is_refused_and_the_safe_set_is_not(http_caller: Path) -> None:
    for name in (*UNLISTED_LOADERS, "LD_PRELOAD", "PYTHONSTARTUP", "NODE_OPTIONS", "ANYTHING_ELSE"):
        said = refusal(with_env(1, {name: "/tmp/x"}))
        assert f"service.env variable '{name}' is not allowed" in said and "default policy of an HTTP caller" in said
        assert "env in " in said and "no tool writes it" in said  # the fix names the list to extend
    policy.check(Case.model_validate(with_env(1, dict.fromkeys(sorted(policy.SAFE_ENV), "1"))))


def test_a_policy_lists_env_names_and_its_old_loader_env_list_still_counts(
    http_caller: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    use_policy(monkeypatch, http_caller, {"env": ["OPENSSL_CONF"], "loader_env": ["JAVA_TOOL_OPTIONS"]})
    policy.check(Case.model_validate(with_env(1, {"OPENSSL_CONF": "/etc/ssl/x.cnf", "JAVA_TOOL_OPTIONS": "-X"})))
    said = refusal(with_env(1, {"OPENSSL_MODULES": "/x"}))
    assert f"host policy {http_caller}" in said and "'OPENSSL_MODULES'" in said
    monkeypatch.setenv(policy.CALLER_ENV, "local")  # a policy file applies to every caller
    assert "'OPENSSL_MODULES' is not allowed" in refusal(with_env(1, {"OPENSSL_MODULES": "/x"}))


def test_a_server_variable_is_passed_on_only_when_the_policy_lists_it(
    http_caller: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key = external("http://10.0.0.7:8000/v1", api_key_env="CL_SERVER_TOKEN")
    ref = with_env(1, {"HF_HUB_OFFLINE": "${CL_SERVER_TOKEN}"})
    said = refusal(key)
    assert "target.api_key_env passes on the server's variable 'CL_SERVER_TOKEN' is not allowed" in said
    assert "secret_env" in said
    assert "service.env.HF_HUB_OFFLINE passes on the server's variable 'CL_SERVER_TOKEN'" in refusal(ref)
    use_policy(monkeypatch, http_caller, {"secret_env": ["CL_SERVER_TOKEN"], "target_hosts": ["10.0.0.7"]})
    policy.check(Case.model_validate(key))
    policy.check(Case.model_validate(ref))


def test_an_http_callers_target_is_only_at_an_address_the_policy_lists(
    http_caller: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy.check(Case.model_validate(ref_draft(8123)))  # the reference target it starts on loopback: its own
    for url in ("http://10.0.0.7:8000/v1", "http://127.0.0.1:9000/v1", "http://localhost:9000/v1"):
        said = refusal(external(url))
        assert "target.endpoints[0].base_url target address" in said and "target_hosts" in said, said
    side = ref_draft(8123)
    side["target"]["metrics_url"] = "http://127.0.0.1:6379/metrics"  # another local service, read back as counters
    assert "target.metrics_url target address 'loopback:6379' is not allowed" in refusal(side)
    use_policy(monkeypatch, http_caller, {"target_hosts": ["10.0.0.7", "loopback:9000"]})
    for url in ("http://10.0.0.7:8000/v1", "http://10.0.0.7/v1", "http://localhost:9000/v1"):
        policy.check(Case.model_validate(external(url)))
    assert "'10.0.0.8:8000'" in refusal(external("http://10.0.0.8:8000/v1"))
    assert "'loopback:9001'" in refusal(external("http://[::1]:9001/v1"))


def test_a_local_caller_without_a_policy_file_still_reaches_and_sets_what_it_declares(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(policy.CALLER_ENV, raising=False)
    monkeypatch.delenv(policy.POLICY_ENV, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    policy.check(Case.model_validate(external("http://10.0.0.7:8000/v1", api_key_env="OPENAI_API_KEY")))
    policy.check(Case.model_validate(with_env(1, {"OPENSSL_CONF": "/x"})))


def test_a_targets_error_body_is_kept_as_one_short_line() -> None:
    secret_page = "INTERNAL-SECRET-body-" + "x" * 5000 + "\nsecond line with more"
    line = error_line(secret_page)
    assert len(line) <= ERROR_LINE_CHARS + 1 and line.endswith("…") and "second line" not in line
    assert error_line('{"error": {"message": "max context 2048\\ntokens", "code": 400}}') == "max context 2048"
    assert error_line('{"object": "error", "message": "bad model"}') == "bad model"
    assert error_line('{"detail": "Not Found"}') == "Not Found"
    assert error_line("\n\n  <html>\x1b[31mboom</html>") == "<html> [31mboom</html>"


class _Spy(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:  # the name http.server calls
        _Spy.seen.append(dict(self.headers))
        self.send_response(500)
        self.end_headers()
        self.wfile.write(b"INTERNAL-SECRET-body")

    do_GET = do_POST

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def spy() -> Iterator[int]:
    """A server that records every request's headers: where a leaked key would arrive."""
    _Spy.seen = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Spy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv.server_address[1]
    srv.shutdown()


@pytest.mark.integration
def test_over_http_unlisted_loader_variables_and_a_server_key_are_refused_before_anything_starts(
    ws: Workspace, tmp_path: Path, spy: int
) -> None:
    """`caseledger mcp --http` with no policy file: OPENSSL_CONF and two more loader variables no deny list named,
    an api_key_env naming the server's own variable, and an external target at a local address are each refused
    at start_run; no process started, no run was written, nothing reached the address."""
    import anyio

    env = {**os.environ, "CL_TOKEN": MCP_TOKEN, "CL_SERVER_TOKEN": "server-secret-9f", "XDG_CONFIG_HOME": str(tmp_path)}
    env.pop(policy.POLICY_ENV, None)
    env.pop(policy.CALLER_ENV, None)
    mcp_port, port = free_port(), free_port()
    proof = tmp_path / "proof"
    cnf = tmp_path / "openssl.cnf"
    cnf.write_text(f"openssl_conf = init\n[init]\n.include {proof}\n")
    drafts = {name: with_env(port, {name: str(cnf)}) for name in UNLISTED_LOADERS}
    drafts["api_key_env"] = external(f"http://127.0.0.1:{spy}/v1", api_key_env="CL_SERVER_TOKEN")
    argv = [sys.executable, "-m", "caseledger", "mcp", "--workspace", str(ws.root)]
    argv += ["--http", f"127.0.0.1:{mcp_port}", "--token-env", "CL_TOKEN"]
    server = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{mcp_port}/mcp"

    async def session() -> dict[str, str]:
        said: dict[str, str] = {}
        async with mcp_over_http(url, MCP_TOKEN) as c:
            for name, d in drafts.items():
                frozen = await c.call_tool("freeze_case", {"draft": d})
                assert frozen.structured_content is not None, frozen
                before = tree_digest(ws.runs_dir) if ws.runs_dir.exists() else ""
                r = await c.call_tool("start_run", {"case_id": frozen.structured_content["case_id"]})
                assert r.is_error, r
                after = tree_digest(ws.runs_dir) if ws.runs_dir.exists() else ""
                assert before == after, name
                said[name] = "\n".join(getattr(x, "text", "") for x in r.content)
        return said

    try:
        wait_listening(url, server)
        said = anyio.run(session)
    finally:
        server.terminate()
        server.wait(10)
    for name in UNLISTED_LOADERS:
        assert f"service.env variable '{name}' is not allowed" in said[name], said[name]
    assert "target.api_key_env passes on the server's variable 'CL_SERVER_TOKEN'" in said["api_key_env"]
    assert f"target address 'loopback:{spy}' is not allowed" in said["api_key_env"]
    assert all("server-secret-9f" not in s for s in said.values())
    assert _Spy.seen == [] and not proof.exists()
    assert not ws.runs_dir.exists() or not any(ws.runs_dir.iterdir())
