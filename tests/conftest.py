"""Shared fixtures: temporary workspaces, free ports, case drafts on the reference target."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2
import orjson
import pytest

from caseledger.services import net
from caseledger.workspace import Workspace

if TYPE_CHECKING:
    from mcp import Client

    from tests.load_hosts import LoadHost


def tree_digest(root: Path) -> str:
    """Digest of every path and file content under root (lock and temp files included)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def stats(port: int, timeout: float = 5.0) -> dict[str, Any]:
    """The reference target's own counters (GET /stats): requests_total, by_phase (the x-caseledger-phase header
    of each request), its pid and config. What tests count "at the target"."""
    r = httpx2.get(f"http://127.0.0.1:{port}/stats", timeout=timeout, trust_env=False, verify=net.tls())
    return dict(r.json())


def wait_listening(url: str, server: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Until the HTTP server started as `server` answers at url (any status); AssertionError when it exits or
    does not listen in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx2.get(url, timeout=1)
            return
        except httpx2.TransportError:
            assert time.monotonic() < deadline and server.poll() is None, "the MCP server did not listen"
            time.sleep(0.1)


@asynccontextmanager
async def mcp_over_http(url: str, token: str) -> AsyncIterator[Client]:
    """An MCP client over streamable HTTP that sends a bearer token, on the SDK's own HTTP client and timeouts
    (30 s; 300 s to read a stream): httpx2's default of 5 s cuts a tool call that a contended host answers later."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with (
        create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}) as h,
        Client(streamable_http_client(url, http_client=h)) as c,
    ):
        yield c


T = TypeVar("T")


def once_per_session(tmp_path_factory: pytest.TempPathFactory, name: str, compute: Callable[[], T]) -> T:
    """compute() once for the whole test session: under pytest -n the first worker to ask computes it and the
    others wait for it and read it (a pickle under the session's temporary root, which is new each session)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return compute()
    root = tmp_path_factory.getbasetemp().parent
    path = root / f"{name}.pickle"
    with (root / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            value: T = pickle.loads(path.read_bytes())
            return value
        value = compute()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(pickle.dumps(value))
        tmp.replace(path)
        return value


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def anyio_backend() -> str:
    """The async tests (pytest.mark.anyio) run on asyncio."""
    return "asyncio"


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    w = Workspace(tmp_path / "ws")
    (w.root / "cases").mkdir(parents=True)
    from caseledger.ledger import authorization

    authorization.set_mode(w, "auto")
    return w


def ref_draft(port: int, **over: Any) -> dict[str, Any]:
    """A small reference-target case: fast enough for tests, real processes and sockets."""
    d: dict[str, Any] = {
        "scenario": "ref-test",
        "target": {"endpoints": [{"base_url": f"http://127.0.0.1:{port}/v1", "model": "ref-model"}]},
        "service": {
            "adapter": "reference",
            "reference": {
                "prefill_tokens_per_s": 200000,
                "decode_step_s": 0.002,
                "decode_step_per_seq_s": 0.0002,
                "slots": 8,
            },
        },
        "dataset": {"source": "synthetic", "input_tokens": 64, "output_tokens": 8},
        "load": {"requests": 8, "concurrency": 2},
        "warmup": {"requests": 2, "concurrency": 2, "max_tokens": 2},
    }
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(d.get(k), dict):
            d[k] = {**d[k], **v}
        else:
            d[k] = v
    return d


def write_draft(ws: Workspace, name: str, draft: dict[str, Any]) -> Path:
    p = ws.cases_dir / name
    p.write_bytes(orjson.dumps(draft, option=orjson.OPT_INDENT_2))
    return p


@pytest.fixture
def stop_services(ws: Workspace) -> Iterator[None]:
    yield
    from caseledger import services
    from caseledger.run.campaign_driver import stop_drivers

    # a failed campaign test must not leave its driver starting points (or waiting on a pause) for ever
    stop_drivers(ws)
    services.stop_all(ws)


@pytest.fixture(scope="module")
def load_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LoadHost]:
    """A load host (tests/load_hosts.py), one a test module."""
    from tests.load_hosts import namespace_host

    with namespace_host(tmp_path_factory.mktemp("loadhost")) as lh:
        yield lh


@pytest.fixture
def services_stopped(ws: Workspace, load_host: LoadHost) -> Iterator[None]:
    """After the test: the workspace's services stopped, the load host's link restored, its clients killed."""
    yield
    from caseledger import services

    services.stop_all(ws)
    with contextlib.suppress(subprocess.CalledProcessError):
        load_host.restore()
    for pid in load_host.clients():  # a test that failed half-way must not leave a load client running
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def chromium() -> str:
    """The headless browser the report tests open pages in: skipped when missing, failed under
    CASELEDGER_REQUIRE_BROWSER=1 (set by .ci/run, which installs it)."""
    return required_program(("chromium", "chromium-browser", "google-chrome"), "chromium", "CASELEDGER_REQUIRE_BROWSER")


def required_program(names: tuple[str, ...], package: str, require_env: str) -> str:
    """The first of `names` on PATH: skipped when missing, failed when `require_env` is 1 (.ci/run sets it)."""
    found = next((p for name in names if (p := shutil.which(name))), None)
    if found is None:
        msg = f"no {names[0]} on PATH (apt-get install {package})"
        if os.environ.get(require_env) == "1":
            pytest.fail(f"{require_env}=1 but {msg}")
        pytest.skip(msg)
    return found


def two_workspaces(root: Path, draft: dict[str, Any]) -> list[tuple[Workspace, str]]:
    """Workspaces root/a and root/b (authorization auto), each with the draft frozen: (workspace, case id)."""
    from caseledger.ledger import authorization
    from caseledger.tools import freeze_case  # lazy: the tools pull numpy; conftest stays light

    out = []
    for name in ("a", "b"):
        w = Workspace(root / name)
        (w.root / "cases").mkdir(parents=True)
        authorization.set_mode(w, "auto")
        out.append((w, freeze_case(w, draft=draft).case_id))
    return out


@pytest.fixture(scope="session", autouse=True)
def _host_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Target leases are host-wide; the suite keeps its own host directory (shared by every workspace and
    child process of the session, as on a real host), so a rerun never meets a previous run's leases."""
    # the same for leases kept on a lease host over SSH (the test sshd's "remote" host is this machine)
    # and the host policy (caseledger.run.admission.policy): a person's ~/.config/caseledger/policy.json is not the
    # suite's and no chart is drawn after each detached run (CASELEDGER_CHART_AFTER_RUN=0): few tests read it, and each
    # drawing is ~1.7 CPU-s beside the next test; tests/test_plot_cache.py sets 1 where it reads the controller's
    names = ("CASELEDGER_HOST_DIR", "CASELEDGER_LEASE_HOST_DIR", "XDG_CONFIG_HOME", "CASELEDGER_POLICY")
    names += ("CASELEDGER_CHART_AFTER_RUN",)
    old = {k: os.environ.get(k) for k in names}
    os.environ["CASELEDGER_CHART_AFTER_RUN"] = "0"
    os.environ["CASELEDGER_HOST_DIR"] = str(tmp_path_factory.mktemp("host"))
    os.environ["CASELEDGER_LEASE_HOST_DIR"] = str(tmp_path_factory.mktemp("lease-host"))
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("config"))
    os.environ.pop("CASELEDGER_POLICY", None)
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# ------------------------------------------------------------------------------------------------------ tiers
# fast (no marker): no child process, no socket beyond an in-process one; run in parallel (-n 2).
# integration: the reference target (a real server subprocess on loopback) and runs of it, inline or detached.
# engine, vllm, ssh, browser: a real llama-server, vLLM, sshd, chromium. A test of a heavier tier carries its mark.
HEAVY_TIERS = ("integration", "engine", "vllm", "ssh", "browser")
SPAWN_EVENTS = ("subprocess.Popen", "os.posix_spawn", "os.fork", "os.exec", "os.system")
_FAST_SPAWNED: list[str] = []
_IN_FAST_TEST = threading.Event()


# caseledger's own processes the suite started from its process (a detached controller starts its load client
# and collector itself: those are not seen here), by module: the session's summary prints them. Counted per test
# (_SPAWNED_NOW) and carried in each report's user_properties, so a pytest -n worker's count reaches the summary.
OWN_SPAWNS: dict[str, int] = {}
_SPAWNED_NOW: dict[str, int] = {}
_OWN = ("caseledger.run.controller", "caseledger.run.preflight", "caseledger.run.campaign_driver", "caseledger.load")


def _spawn_audit(event: str, args: tuple[Any, ...]) -> None:
    if event not in SPAWN_EVENTS:
        return
    if _IN_FAST_TEST.is_set():
        _FAST_SPAWNED.append(f"{event} {str(args[:2])[:160]}")
    argv = args[1] if len(args) > 1 and isinstance(args[1], list | tuple) else ()
    module = next((str(argv[k + 1]) for k, a in enumerate(argv[:-1]) if a == "-m"), "")
    if module in _OWN:
        _SPAWNED_NOW[module] = _SPAWNED_NOW.get(module, 0) + 1


sys.addaudithook(_spawn_audit)  # once per session: audit hooks cannot be removed


@pytest.fixture(autouse=True)
def _tier(request: pytest.FixtureRequest) -> Iterator[None]:
    """Runs are inline (procs.in_process: controller, preflight, load client and collector in this process)
    unless the test is marked `processes`: real detached processes are its point. A test of the fast tier (no
    heavy mark) fails when it starts a process: it belongs to `integration`."""
    from caseledger import procs

    fast = not any(request.node.get_closest_marker(t) for t in HEAVY_TIERS)
    inline = request.node.get_closest_marker("processes") is None
    _FAST_SPAWNED.clear()
    if fast:
        _IN_FAST_TEST.set()
    try:
        if inline:
            with procs.in_process():
                yield
        else:
            yield
    finally:
        _IN_FAST_TEST.clear()
    if _FAST_SPAWNED:
        pytest.fail(f"a fast-tier test started a process ({_FAST_SPAWNED[0]}): mark it integration", pytrace=False)


# The README's command runs every test but the `quiet` ones four at a time (pytest -n 4): there, the other workers'
# tests are a contended host. In that pass each case a test freezes accepts it (measurement.evidence.
# max_other_cpu_share 1, unless the draft sets its own), as a person measuring on a shared host would declare; the
# tests of the contention check itself, the engines and whatever freezes its case in another process (the CLI, the
# demo, an MCP server subprocess) are marked `quiet` and run in the serial pass, on the default threshold.
SHARED_HOST_SHARE = 1.0


def on_a_shared_host(draft: Any) -> Any:  # JSON: a case draft
    """The draft with measurement.evidence.max_other_cpu_share set to SHARED_HOST_SHARE when it sets none."""
    if not isinstance(draft, dict):
        return draft
    m = draft.get("measurement", {})
    if not isinstance(m, dict) or not isinstance(m.get("evidence", {}), dict):
        return draft
    ev = m.get("evidence", {})
    return {**draft, "measurement": {**m, "evidence": {"max_other_cpu_share": SHARED_HOST_SHARE, **ev}}}


_QUIET_TEST = threading.Event()  # the test running now is marked quiet: its cases keep the default threshold


@pytest.fixture(scope="session", autouse=True)
def _shared_host() -> Iterator[None]:
    """Under pytest -n (a worker), every draft validated in this process accepts the contended host, also in
    module fixtures; a `quiet` test's drafts do not (the pass without -n is the one meant for them)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import importlib

    with pytest.MonkeyPatch.context() as mp:
        for name in ("caseledger.tools.freeze_case", "caseledger.campaign.store"):  # where drafts are validated
            module = importlib.import_module(name)
            validate = module.validate
            mp.setattr(
                module,
                "validate",
                lambda obj, source, v=validate: v(obj if _QUIET_TEST.is_set() else on_a_shared_host(obj), source),
            )
        yield


@pytest.fixture(autouse=True)
def _quiet_test(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("quiet"):
        _QUIET_TEST.set()
    yield
    _QUIET_TEST.clear()


@pytest.fixture(autouse=True)
def _no_fault_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CASELEDGER_FAULT", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Served:
    """A reference target started as a real subprocess on loopback."""

    proc: subprocess.Popen[bytes]
    url: str
    config: dict[str, Any]
    stdout: Path
    stderr: Path

    @property
    def base(self) -> str:
        return self.url

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def client(self, timeout: float = 10.0) -> httpx2.Client:
        return net.client(base_url=self.url, timeout=timeout)


def _spawn_target(name: str, cfg: dict[str, Any], log_dir: Path, model: str) -> Served:
    port = free_port()
    so, se = log_dir / f"{name}.out", log_dir / f"{name}.err"
    from tests.helpers import target_argv  # lazy: tests.helpers imports this module

    argv = [*target_argv(port, "127.0.0.1", model), "--config-json", json.dumps(cfg)]
    with so.open("wb") as fo, se.open("wb") as fe:
        proc = subprocess.Popen(argv, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL)
    return Served(proc, f"http://127.0.0.1:{port}", cfg, so, se)


PORT_TAKEN = "address already in use"  # free_port's port was taken before the server bound it: pick another


@contextmanager
def reference_targets(
    configs: dict[str, dict[str, Any]], log_dir: Path, model: str = "ref-model"
) -> Iterator[dict[str, Served]]:
    """Start every configuration at once (start-up is mostly imports), wait for each, stop all at the end. A
    server that lost its port to another process between free_port and its bind is started again on a new one;
    it counts as up only when the server on its port reports its pid (the other process answers too)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out = {name: _spawn_target(name, cfg, log_dir, model) for name, cfg in configs.items()}
    try:
        for name in out:
            deadline, respawns = time.monotonic() + 30, 0
            while True:
                s = out[name]
                if s.proc.poll() is not None:
                    err = s.stderr.read_text()
                    assert PORT_TAKEN in err.lower() and respawns < 3, f"reference target {name} exited: {err[-500:]}"
                    out[name], respawns = _spawn_target(name, s.config, log_dir, model), respawns + 1
                    continue
                try:  # healthy, and ours: another test's server may hold the port ours then fails to bind
                    if stats(s.port, timeout=1).get("pid") == s.proc.pid:
                        break
                except (httpx2.TransportError, ValueError):
                    pass
                assert time.monotonic() < deadline, f"reference target {name} never became healthy"
                time.sleep(0.05)
        yield out
    finally:
        for s in out.values():
            if s.proc.poll() is None:
                s.proc.terminate()
                try:
                    s.proc.wait(5)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
                    s.proc.wait()


# ---------------------------------------------------------------------------------------------- the fault matrix
# tests/test_fault_matrix.py records every check of every cell here (cell -> check -> passed); the session's
# summary prints it as a table, so `.ci/run`'s output carries the matrix. Tests reach it through the
# `fault_matrix` fixture: this module is imported twice (as `conftest` by pytest, as `tests.conftest` by
# `from tests.conftest import ...`), and only the fixture is sure to hand out pytest's copy.
FAULT_MATRIX: dict[str, dict[str, bool]] = {}
_MATRIX_SENT: dict[str, dict[str, bool]] = {}  # what this process's reports already carried


@pytest.fixture
def fault_matrix() -> dict[str, dict[str, bool]]:
    return FAULT_MATRIX


def tier_of(item: pytest.Item) -> str:
    return next((t for t in reversed(HEAVY_TIERS) if item.get_closest_marker(t)), "fast")


def pytest_configure(config: pytest.Config) -> None:
    # Python keeps the bytecode it compiles (__pycache__) unless PYTHONDONTWRITEBYTECODE says not to, and some
    # hosts set that in every shell. The suite starts ~700 interpreters (controllers, preflights, load clients,
    # collectors, reference targets, MCP servers); without the cache each one compiles caseledger, pydantic and
    # httpx2 again from source: ~0.5 CPU-s more per process, about twice its import time. The suite and every
    # process it starts write the cache as a default Python does (pytest -n's workers inherit this environment).
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:  # `-m fast` selects the fast tier by name; `-m quiet` the serial pass
        if item.get_closest_marker("engine") or item.get_closest_marker("vllm"):
            item.add_marker(pytest.mark.quiet)  # a real engine's figures need the host to themselves
        if tier_of(item) == "fast":
            if item.get_closest_marker("processes"):  # real processes are never the fast tier
                item.add_marker(pytest.mark.integration)
            else:
                item.add_marker(pytest.mark.fast)
    # the heaviest modules first, each kept whole (its module fixtures start once per worker): under -n, a long
    # test taken last would leave the other worker idle (the longest, a campaign or a lease race, take 30-60 s)
    weight: dict[str, float] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        weight[module] = weight.get(module, 0.0) + _SLOW_TESTS.get(item.name, _EXPECTED_S[_tier_of(item)])
    order = {m: k for k, m in enumerate(weight)}
    items.sort(key=lambda i: (-weight[i.nodeid.split("::")[0]], order[i.nodeid.split("::")[0]]))


# a test's usual time by its tier on 2 cores (the suite's own summary per tier / tests): the order above
_EXPECTED_S = {
    "fast": 0.1,
    "integration": 1.6,
    "processes": 6.0,
    "ssh": 9.0,
    "browser": 12.0,
    "engine": 12.0,
    "vllm": 70.0,
}


# single tests far slower than their tier's usual: mypy --strict from a fresh clone has no cache (~30 CPU-s, ~80 s
# beside the other workers): started first, not last (CI runs it as a step of its own and the test skips)
_SLOW_TESTS = {"test_mypy_strict_is_clean": 80.0}


def _tier_of(item: pytest.Item) -> str:
    return next((t for t in reversed(REPORT_TIERS) if item.get_closest_marker(t)), "fast")


TIER_TIMES: dict[str, list[float]] = {}  # tier -> [tests, seconds (setup + call + teardown)]


REPORT_TIERS = ("fast", "integration", "processes", "engine", "vllm", "ssh", "browser")  # the summary's rows


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    if call.when != "teardown":
        return
    props = outcome.get_result().user_properties
    if _SPAWNED_NOW:
        props.append(("caseledger_spawns", dict(_SPAWNED_NOW)))
        _SPAWNED_NOW.clear()
    cells = {name: dict(checks) for name, checks in FAULT_MATRIX.items() if _MATRIX_SENT.get(name) != checks}
    if cells:  # the fault-matrix cells this test wrote, for a pytest -n controller's summary
        props.append(("caseledger_fault_matrix", cells))
        _MATRIX_SENT.update(cells)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    for key, value in report.user_properties:
        if key == "caseledger_spawns" and isinstance(value, dict) and os.environ.get("PYTEST_XDIST_WORKER") is None:
            for module, n in value.items():
                OWN_SPAWNS[module] = OWN_SPAWNS.get(module, 0) + int(n)
        if key == "caseledger_fault_matrix" and isinstance(value, dict):
            for name, checks in value.items():
                FAULT_MATRIX.setdefault(name, {}).update(checks)
    tier = next((t for t in reversed(REPORT_TIERS) if t in report.keywords), "fast")
    got = TIER_TIMES.setdefault(tier, [0, 0.0])
    got[0] += report.when == "call" or (report.when == "setup" and report.skipped)
    got[1] += report.duration


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    from tests.engine import ENGINE_NOTES  # the real-engine tests' measured figures (the module they import)

    if TIER_TIMES:  # with -n, the workers' reports reach the controller too: the sums are of test time
        terminalreporter.write_sep("=", "time per tier (tests, seconds of setup + call + teardown)")
        for tier in REPORT_TIERS:  # 'processes': integration tests whose runs keep real processes
            if tier in TIER_TIMES:
                n, secs = TIER_TIMES[tier]
                terminalreporter.write_line(f"{tier:<12} {int(n):>4} tests {secs:8.1f} s")

    if OWN_SPAWNS:
        said = ", ".join(f"{m} {n}" for m, n in sorted(OWN_SPAWNS.items()))
        terminalreporter.write_line(f"caseledger processes started by the tests' own process: {said}")
    if ENGINE_NOTES:
        terminalreporter.write_sep("=", "measured on the real engines")
        for note in ENGINE_NOTES:
            terminalreporter.write_line(note)
    if not FAULT_MATRIX:
        return
    cols: list[str] = []
    for checks in FAULT_MATRIX.values():
        cols += [c for c in checks if c not in cols]
    width = max(len(name) for name in FAULT_MATRIX)
    widths = [max(len(c), 4) for c in cols]
    tr = terminalreporter
    tr.write_sep("=", f"fault matrix: {len(FAULT_MATRIX)} cells, counted at the target")
    tr.write_line("cell".ljust(width) + " | " + " ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    tr.write_line("-" * width + "-+-" + "-".join("-" * w for w in widths))
    for name, checks in FAULT_MATRIX.items():
        marks = [
            ("-" if c not in checks else "pass" if checks[c] else "FAIL").ljust(w)
            for c, w in zip(cols, widths, strict=True)
        ]
        tr.write_line(name.ljust(width) + " | " + " ".join(marks))
    failed = sum(not ok for checks in FAULT_MATRIX.values() for ok in checks.values())
    total = sum(len(checks) for checks in FAULT_MATRIX.values())
    tr.write_line(f"{total - failed}/{total} checks pass ('-': not a check of that cell)")


# --------------------------------------------------------------------- a stub OpenAI-style endpoint (adapter
# 'external'): for answers the reference target never gives (a 4xx with a JSON message, a forged body, 401)

Answer = tuple[int, str, bytes]  # status, content type, body
ONE_TOKEN_STREAM = (
    b"".join(
        b"data: " + orjson.dumps(c) + b"\n\n"
        for c in (
            {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]},
            {
                "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                "usage": {"completion_tokens": 1},
            },  # no prompt_tokens: a canned answer cannot count the prompt
        )
    )
    + b"data: [DONE]\n\n"
)


@contextmanager
def stub_target(answer: Callable[[dict[str, str], dict[str, Any]], Answer]) -> Iterator[int]:
    """A real HTTP server on loopback: GET /health and /v1/models answer for 'ref-model'; every POST is
    answered by `answer(headers, json_body)`. Yields the port."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._send(
                (200, "application/json", b'{"data": [{"id": "ref-model"}]}' if "models" in self.path else b"ok")
            )

        def do_POST(self) -> None:
            body = orjson.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
            self._send(answer({k.lower(): v for k, v in self.headers.items()}, body))

        def _send(self, a: Answer) -> None:
            self.send_response(a[0])
            self.send_header("content-type", a[1])
            self.send_header("content-length", str(len(a[2])))
            self.end_headers()
            self.wfile.write(a[2])

        def log_message(self, *args: Any) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield int(srv.server_address[1])
    finally:
        srv.shutdown()
        srv.server_close()


def external_draft(port: int, **over: Any) -> dict[str, Any]:
    """ref_draft on an endpoint caseledger does not start (adapter 'external')."""
    d = ref_draft(port, **over)
    d["service"] = {"adapter": "external"}
    return d


def start_with_fault(monkeypatch: pytest.MonkeyPatch, fault: str, ws: Workspace, case_id: str, **kw: Any) -> Any:
    """start_run with CASELEDGER_FAULT set for the processes it starts (and unset again after)."""
    from caseledger.tools import start_run  # lazy: the tools pull numpy; conftest stays light

    monkeypatch.setenv("CASELEDGER_FAULT", fault)
    try:
        return start_run(ws, case_id, **kw)
    finally:
        monkeypatch.delenv("CASELEDGER_FAULT")


# The reference target of the campaign tests: TPOT ~ 4 + 1.5 (C - 1) ms, 64 slots, so a TPOT limit cuts C
KNEE_TARGET = {"prefill_tokens_per_s": 200000, "decode_step_s": 0.004, "decode_step_per_seq_s": 0.0015, "slots": 64}


def knee_base(port: int, scenario: str, requests: int) -> dict[str, Any]:
    """A campaign's base case on that target: 64 tokens in, 16 out, C=1."""
    return ref_draft(
        port,
        scenario=scenario,
        service={"reference": KNEE_TARGET},
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 16},
        load={"requests": requests, "concurrency": 1},
    )


def assert_one_answer(ws: Workspace, campaign_id: str) -> str:
    """Every view names the campaign's one answer, resting on the same runs: summarize of the campaign, of its
    scenario and of each point's runs, the scenario resource's rows and HANDOFF.md. Returns the answer."""
    from caseledger.campaign.view import campaign_view, scenario_answer
    from caseledger.tools import summarize
    from caseledger.views import handoff

    cv = campaign_view(ws, campaign_id)
    sv = summarize(ws, [], scenario=cv.scenario).scenario
    assert sv is not None and campaign_id in sv.campaigns, (sv, cv.text())
    across = scenario_answer(ws, cv.scenario)  # several campaigns of the scenario: their points ranked together
    answer, winner, tie = (across.answer, across.winner, across.tie) if across else (cv.answer, cv.winner, cv.tie)
    assert sv.answer == answer and sv.best_case == winner and sorted(sv.tie) == sorted(tie), (sv.text(), cv.text())
    assert [r.case_id for r in sv.rows if r.best] == ([winner] if winner else []), sv.text()
    points = {c: r for r in cv.rows for c in (r.case_id, *r.cases.values())}  # a pool's point: a case per target
    for row in sv.rows:
        p = points.get(row.case_id)
        if p is None:
            continue
        assert row.change == p.label and row.runs == p.runs and row.metric == p.metric_mean, (row, p)
        said = "winner" if p.case_id == winner else "tie" if p.case_id in tie else None
        assert said is None or row.campaign_verdict == said, (row, p)
        assert across is not None or row.campaign_verdict == p.verdict, (row, p)  # one word per point, every view
        for rid in p.run_ids[-1:]:  # a point's run read alone carries the campaign's verdict, not its own
            one = summarize(ws, [rid])
            assert one.runs[0].campaign == campaign_id and answer in (one.runs[0].campaign_verdict or ""), one
            assert f": {row.campaign_verdict}" in (one.runs[0].campaign_verdict or ""), one
            assert "freeze_case(next candidate" not in one.text() and campaign_id in one.next_call, one.text()
    # 'winner C=4', 'tie within noise: C=2 and C=4', ...; a long head is cut with its length, which HANDOFF's cut of
    # the whole answer states as the whole's: the words shown are the same
    head = handoff.short_answer(answer).split("… (")[0]
    text = handoff.refresh(ws)
    if f"scenario {cv.scenario}:" in text:  # the handoff shows the latest run's scenario
        assert head in text, (head, text)
        for row in sv.rows:  # each point it lists says the same word as every other view
            shown = [x for x in text.splitlines() if x.startswith(f"  {row.change}: {row.case_id} ")]
            assert all(f"-> {row.campaign_verdict}" in x for x in shown), (row.campaign_verdict, shown)
        assert "freeze_case(next candidate" not in text or not cv.complete, text
    return cv.answer
