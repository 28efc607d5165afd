"""Load hosts for the tests of the load client on another host (load.host): a real sshd in a network namespace.

The "load host" is a network namespace with two veth pairs to this machine: a control link that carries only SSH
(10.A.1.1 here, 10.A.1.2 there) and a data link to the reference target (10.A.2.1 here, where the target listens).
Cutting the control link (`ip link set <veth> down`) is the seeds' lost link: the controller loses the load host
while the load host keeps reaching the serving target. The namespace shares this machine's filesystem and pid
space, so a test can look at what the load host wrote and which processes run there; the code under test never
does: it reads everything over SSH (procs.alive answers False for another host).

Needs root, iproute2 and openssh-server; skipped with the reason otherwise (CASELEDGER_REQUIRE_SSH=1: failed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import orjson
import pytest

from caseledger.tools import freeze_case, start_run
from caseledger.workspace import Workspace
from tests.conftest import ref_draft
from tests.helpers import wait_until
from tests.sshd import Sshd, running_sshd, sshd_binary


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@dataclass(frozen=True)
class LoadHost:
    ns: str | None  # the namespace; None: the loopback fallback (no namespaces on this machine)
    ctl: str | None  # this machine's end of the SSH link (cut it to lose the load host)
    here: str  # this machine's address on the data link (the reference target listens there)
    sshd: Sshd
    workdir: Path

    def cut(self) -> None:
        if self.ctl is not None:
            _sh("ip", "link", "set", self.ctl, "down")
            return
        # fallback: the listener stops answering and every SSH connection process is killed (the load client
        # runs in a session of its own and goes on)
        os.kill(self.sshd.pid, signal.SIGSTOP)
        for pid in _children(self.sshd.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def restore(self) -> None:
        if self.ctl is not None:
            _sh("ip", "link", "set", self.ctl, "up")
        else:
            os.kill(self.sshd.pid, signal.SIGCONT)
        deadline = time.monotonic() + 15
        while True:
            with contextlib.suppress(OSError), socket.create_connection((self.sshd.host, self.sshd.port), timeout=1):
                return
            assert time.monotonic() < deadline, "the control link did not come back"
            time.sleep(0.1)

    def block(self, **over: Any) -> dict[str, Any]:
        """The case's load.host for this namespace host."""
        return {**self.sshd.ssh(), "python": sys.executable, "workdir": str(self.workdir), "reconnect_s": 2.0, **over}

    def clients(self) -> list[int]:
        """Load clients of this load host's runs still running (a failed test must not leave one behind)."""
        out = []
        for d in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                cmd = (d / "cmdline").read_bytes()
                if d.name.isdigit() and b"caseledger.load" in cmd and str(self.workdir).encode() in cmd:
                    out.append(int(d.name))
        return out


def _children(pid: int) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = (d / "stat").read_bytes()
            if d.name.isdigit() and int(stat[stat.rfind(b")") + 2 :].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _skip(msg: str) -> None:
    if os.environ.get("CASELEDGER_REQUIRE_SSH") == "1":
        pytest.fail(f"CASELEDGER_REQUIRE_SSH=1 but {msg}")
    pytest.skip(msg)


NO_NETNS_ENV = "CASELEDGER_TEST_NO_NETNS"  # =1: use the loopback fallback even where namespaces work


def _no_netns() -> str | None:
    """Why namespaces cannot be used here, or None."""
    return (
        "network namespaces need root (ip netns add)"
        if os.geteuid() != 0
        else "iproute2 not installed (apt-get install -y iproute2)"
        if shutil.which("ip") is None
        else f"{NO_NETNS_ENV}=1"
        if os.environ.get(NO_NETNS_ENV) == "1"
        else None
    )


@contextlib.contextmanager
def namespace_host(
    root: Path, tag: str = "", nets: tuple[int, int] = (1, 2), target: str | None = None
) -> Iterator[LoadHost]:
    """A load host in a network namespace of its own (the loopback fallback where there is none): a control link
    (10.A.<nets[0]>.x) for SSH and a data link (10.A.<nets[1]>.x); target: an address of this machine on another
    host's data link that this one's clients must reach too (routed over its own data link)."""
    if sshd_binary() is None:
        _skip("sshd not installed (apt-get install -y openssh-server)")
    why = _no_netns()
    n = os.getpid() % 100_000
    a = 100 + os.getpid() % 100
    ns, ctl, ctl_ns, data, data_ns = (f"{x}{tag}{n}" for x in ("clns", "clc", "clcn", "cld", "cldn"))
    made: list[str] = []
    try:
        if why is None:
            try:
                _sh("ip", "netns", "add", ns)
                made.append("ns")
            except (subprocess.CalledProcessError, OSError) as e:
                why = f"cannot create a network namespace here ({e})"
        if why is not None:
            # said, not hidden: the link is then cut by stopping the loopback sshd and killing its connections
            print(f"\ntest_remote_load: no network namespace ({why}); load host = sshd on loopback", file=sys.stderr)
            with running_sshd(root / "sshd") as sshd:
                yield LoadHost(ns=None, ctl=None, here="127.0.0.1", sshd=sshd, workdir=root / "work")
            return
        for host_end, ns_end, net in ((ctl, ctl_ns, nets[0]), (data, data_ns, nets[1])):
            _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
            made.append(host_end)
            _sh("ip", "link", "set", ns_end, "netns", ns)
            _sh("ip", "addr", "add", f"10.{a}.{net}.1/24", "dev", host_end)
            _sh("ip", "link", "set", host_end, "up")
            _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.{a}.{net}.2/24", "dev", ns_end)
            _sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_end, "up")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        if target is not None and target != "127.0.0.1":
            _sh("ip", "netns", "exec", ns, "ip", "route", "add", f"{target}/32", "via", f"10.{a}.{nets[1]}.1")
        with running_sshd(root / "sshd", address=f"10.{a}.{nets[0]}.2", prefix=["ip", "netns", "exec", ns]) as sshd:
            yield LoadHost(ns=ns, ctl=ctl, here=target or f"10.{a}.{nets[1]}.1", sshd=sshd, workdir=root / "work")
    finally:
        for host_end in (ctl, data):
            if host_end in made:
                subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=30)
        if "ns" in made:
            _kill_in_namespace(ns)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _kill_in_namespace(ns: str) -> None:
    """Whatever still runs in the namespace (a load client a failed test left behind)."""
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30).stdout
    for pid in out.split():
        with contextlib.suppress(OSError):
            os.kill(int(pid), signal.SIGKILL)


def draft(lh: LoadHost, port: int, n: int, slow: bool = False, **host: Any) -> dict[str, Any]:
    ref = {
        "prefill_tokens_per_s": 200000,
        "decode_step_s": 0.02 if slow else 0.002,
        "decode_step_per_seq_s": 0.0,
        "slots": 8,
    }
    return ref_draft(
        port,
        target={"endpoints": [{"base_url": f"http://{lh.here}:{port}/v1", "model": "ref-model"}]},
        service={"adapter": "reference", "reference": ref},
        dataset={"source": "synthetic", "input_tokens": 64, "output_tokens": 16 if slow else 8},
        load={"requests": n, "concurrency": 2, "host": lh.block(**host)},
    )


def stats(lh: LoadHost, port: int) -> dict[str, Any]:
    return dict(httpx2.get(f"http://{lh.here}:{port}/stats", timeout=5).json())


def evidence(ws: Workspace, run_id: str, phase: str) -> dict[str, Any]:
    return dict(orjson.loads(ws.run(run_id).phase_file(phase).read_bytes()))


def raw_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def remote_load_dir(lh: LoadHost, run_id: str) -> Path:
    return lh.workdir / "ledger" / "runs" / run_id / "load"


def client_starts(lh: LoadHost, run_id: str) -> int:
    """How many load clients began this run's formal load on the load host (their log's start line)."""
    log = remote_load_dir(lh, run_id) / "client.log"
    return sum(f"load: run {run_id}:" in line for line in log.read_text().splitlines())


def start_slow(ws: Workspace, lh: LoadHost, port: int, n: int, records: int = 3) -> tuple[Any, Any]:
    """Start a slow n-request remote load and return (start result, run paths) once `records` records have
    been copied back from the load host."""
    case = freeze_case(ws, draft=draft(lh, port, n, slow=True))
    r = start_run(ws, case.case_id)
    paths = ws.run(r.run_id)
    wait_until(lambda: raw_lines(paths.raw) >= records, what="records arrive from the load host")
    return r, paths
