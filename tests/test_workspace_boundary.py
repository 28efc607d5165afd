"""The workspace's boundary, through the CLI and an MCP client alike: run directories that are symlinks, a
read-only workspace, locks held by a stuck process; each refusal names the fix and writes nothing."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client

from caseledger.errors import LockTimeout, NotWritable, PathEscapes, Unexpected, unexpected
from caseledger.ledger import authorization, queue, read_events
from caseledger.ledger.event_types import StopAsked, StopAskedData
from caseledger.ledger.events import append_event
from caseledger.ledger.leases import host_dir
from caseledger.ledger.runs import load_run, read_run, scan_runs
from caseledger.server import build_server
from caseledger.tools import freeze_case, phase_status, reprocess_raw, resume
from caseledger.workspace import ENV_LOCK_TIMEOUT, Workspace, flocked
from tests.conftest import (
    free_port,
    ref_draft,
    start_with_fault,
    tree_digest,
    write_draft,
)
from tests.helpers import assert_refused, cli_call, fake_run, mcp_call, text_of

# ------------------------------------------------------------------------------ run directories as symlinks


def test_a_run_directory_that_is_a_symlink_is_not_listed_and_is_refused_over_cli_and_mcp(
    ws: Workspace, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outside = Workspace(tmp_path / "outside")
    fake_run(outside, "r-000000ee", "2026-02-01T00:00:00.000Z")  # newer: it would be the latest run if followed
    fake_run(ws, "r-000000aa", "2026-01-01T00:00:00.000Z")
    link = ws.runs_dir / "r-000000ee"
    link.symlink_to(outside.run("r-000000ee").root, target_is_directory=True)
    before, before_outside = tree_digest(ws.root), tree_digest(outside.root)

    rc, text = cli_call(ws, capsys, "status")
    assert rc == 0 and "r-000000aa" in text and "r-000000ee is a symbolic link" in text, text
    rc, text = cli_call(ws, capsys, "handoff")
    assert rc == 0 and "latest run: r-000000aa" in text, text
    before = tree_digest(ws.root)  # (handoff rewrote HANDOFF.md)
    needles = ("ledger/runs/r-000000ee is a symbolic link", "never followed", "remove the link")
    for argv in (
        ["status", "r-000000ee"],
        ["resume", "r-000000ee"],
        ["reprocess", "r-000000ee"],
        ["summarize", "r-000000ee"],
    ):
        rc, text = cli_call(ws, capsys, *argv)
        assert rc == 2, (argv, text)
        assert_refused(text, *needles)
    for tool, args in (
        ("phase_status", {"run_id": "r-000000ee"}),
        ("resume", {"run_id": "r-000000ee"}),
        ("reprocess_raw", {"run_id": "r-000000ee"}),
        ("summarize", {"run_ids": ["r-000000ee"]}),
    ):
        r = mcp_call(ws, tool, args)
        assert r.is_error, tool
        assert_refused(text_of(r), *needles)
    with pytest.raises(PathEscapes, match="symbolic link"):  # the controller's and the load client's entry
        read_run(link)
    assert tree_digest(outside.root) == before_outside and tree_digest(ws.root) == before
    assert link.is_symlink()


@pytest.mark.processes
@pytest.mark.integration
def test_a_run_directory_swapped_for_a_symlink_is_refused_and_works_again_once_restored(
    ws: Workspace, tmp_path: Path, stop_services: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = start_with_fault(
        monkeypatch, "postprocess:fail=import", ws, freeze_case(ws, draft=ref_draft(free_port())).case_id, wait=True
    )
    assert phase_status(ws, r.run_id).failure_class == "collect"
    real = ws.run(r.run_id).root
    moved = tmp_path / "elsewhere" / "ledger" / "runs" / r.run_id
    moved.parent.mkdir(parents=True)
    real.rename(moved)
    real.symlink_to(moved, target_is_directory=True)
    before = tree_digest(moved)
    for call in (lambda: resume(ws, r.run_id, wait=True), lambda: reprocess_raw(ws, r.run_id)):
        with pytest.raises(PathEscapes, match=f"ledger/runs/{r.run_id} is a symbolic link") as e:
            call()
        assert "lease" not in str(e.value)
    assert r.run_id not in [m.run_id for m in scan_runs(ws).metas]
    assert tree_digest(moved) == before  # nothing written through the link

    real.unlink()  # the fix the refusal names: the directory back in its place
    moved.rename(real)
    assert resume(ws, r.run_id, wait=True).state == "succeeded"
    assert load_run(ws, r.run_id).workspace == ws


# ------------------------------------------------------------------------------------ a read-only workspace


@contextmanager
def read_only(root: Path) -> Iterator[None]:
    """`root` read-only for this process. Root ignores permission bits, so as root the directory is bind-mounted
    onto itself read-only (unmounted after); otherwise write permission is taken away (given back after)."""
    if os.geteuid() != 0:
        paths = [root, *root.rglob("*")]
        modes = {p: p.stat().st_mode for p in paths if not p.is_symlink()}
        for p, m in modes.items():
            p.chmod(m & ~0o222)
        try:
            yield
        finally:
            for p, m in modes.items():
                p.chmod(m)
        return
    if not shutil.which("mount"):
        pytest.skip("running as root, and no mount(8) to make the workspace read-only")
    mounted = subprocess.run(["mount", "--bind", str(root), str(root)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"running as root, and a bind mount is not allowed here: {mounted.stderr.decode()[:200]}")
    try:
        ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(root)], capture_output=True)
        if ro.returncode != 0:
            pytest.skip(f"running as root, and a read-only remount is not allowed here: {ro.stderr.decode()[:200]}")
        yield
    finally:
        if subprocess.run(["umount", str(root)]).returncode != 0:
            subprocess.run(["umount", "-l", str(root)], check=False)


@pytest.mark.integration
def test_a_read_only_workspace_answers_not_writable_with_the_fix(
    ws: Workspace, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_run(ws, "r-000000aa", "2026-01-01T00:00:00.000Z")
    write_draft(ws, "new.json", ref_draft(1, load={"requests": 8, "concurrency": 4}))
    before = tree_digest(ws.root)
    needles = ("not writable: ", "writable copy")
    with read_only(ws.root):
        for argv in (["handoff"], ["freeze", "cases/new.json"], ["authorize", "paused"]):
            rc, text = cli_call(ws, capsys, *argv)
            assert rc == 2, (argv, text)
            assert_refused(text, *needles)
            assert str(ws.root) in text, text  # the path that could not be written
        r = mcp_call(ws, "freeze_case", {"path": "cases/new.json"})
        assert r.is_error
        assert_refused(text_of(r), *needles)
        # a reader writes nothing (issue 57): it answers from a read-only workspace too
        rc, text = cli_call(ws, capsys, "summarize")
        assert rc == 0 and "r-000000aa" in text, text
        for args in ({}, {"run_ids": ["r-000000aa"]}):
            r = mcp_call(ws, "summarize", args)
            assert not r.is_error and "r-000000aa" in text_of(r), text_of(r)

        async def handoff_resource() -> str:
            async with Client(build_server(ws)) as c:
                try:
                    await c.read_resource("caseledger://handoff")
                except Exception as e:  # the client raises the server's resource error
                    return str(e)
            return "read without error"

        text = anyio.run(handoff_resource)
        assert "not writable: " in text and "caseledger bug" not in text, text
    assert tree_digest(ws.root) == before


@pytest.mark.integration
def test_a_refused_write_is_told_apart_from_a_bug(tmp_path: Path) -> None:
    gone = tmp_path / "ro" / "sub" / ".x.tmp"
    (tmp_path / "ro").mkdir()
    with read_only(tmp_path / "ro"):
        err = unexpected(OSError(errno.EROFS, "Read-only file system", str(gone)))
        assert isinstance(err, NotWritable) and err.exit_code == 2
        assert err.message == f"not writable: {tmp_path / 'ro'} (Read-only file system)"  # the nearest existing path
    # a permission error on a path that is writable, or naming none, is no refused write: still a bug (exit 1)
    for e in (PermissionError(errno.EACCES, "Permission denied", str(tmp_path)), PermissionError(errno.EPERM, "x")):
        bug = unexpected(e)
        assert isinstance(bug, Unexpected) and bug.exit_code == 1 and "caseledger bug" in bug.fix


# ------------------------------------------------------------------------------------- bounded lock waits


@contextmanager
def stuck_holder(path: Path) -> Iterator[int]:
    """A process that takes an flock on `path` (a lock file or the ledger directory) and never lets go."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch()
    code = (
        "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDONLY)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\ntime.sleep(600)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.readline() == b"held\n"
    try:
        yield p.pid
    finally:
        p.kill()
        p.wait()


@pytest.mark.integration
def test_a_lock_held_by_a_stuck_process_is_not_waited_on_forever_and_names_its_holder(
    ws: Workspace, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, "0.2")
    fake_run(ws, "r-000000aa", "2026-01-01T00:00:00.000Z")
    lease_lock = host_dir() / "t-test.lock"
    with stuck_holder(lease_lock) as pid:
        before = tree_digest(ws.root)
        needles = (f"for the lock {lease_lock}, held by pid {pid}", f"kill {pid}")
        # a real command first, in its own process: before the bound it waited forever (the timeout here only
        # turns such a hang into a failure; it measures nothing)
        done = subprocess.run(
            [sys.executable, "-m", "caseledger", "-w", str(ws.root), "resume", "r-000000aa"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2
        assert_refused(done.stderr, *needles)
        with pytest.raises(LockTimeout) as e:
            resume(ws, "r-000000aa")
        assert_refused(f"{e.value.message}; fix: {e.value.fix}", *needles)
        rc, text = cli_call(ws, capsys, "resume", "r-000000aa")
        assert rc == 2
        assert_refused(text, *needles)
        r = mcp_call(ws, "resume", {"run_id": "r-000000aa"})
        assert r.is_error
        assert_refused(text_of(r), *needles)
        assert tree_digest(ws.root) == before

    authorization.set_mode(ws, "single")
    with stuck_holder(ws.ledger) as pid:  # the lock of authorization's claim is the ledger directory itself
        before = tree_digest(ws.root)
        rc, text = cli_call(ws, capsys, "resume", "r-000000aa")
        assert rc == 2
        assert_refused(text, f"for the lock {ws.ledger}, held by pid {pid}")
        assert tree_digest(ws.root) == before
    assert authorization.current_mode(ws) == "single"  # not used up by the refused resume

    paths = ws.run("r-000000aa")
    with stuck_holder(paths.events_lock) as pid:  # the events append, queue and dataset locks: the same bound
        with pytest.raises(LockTimeout, match=f"held by pid {pid}"):
            append_event(ws, paths, StopAsked(data=StopAskedData(by="test")))
        with pytest.raises(LockTimeout, match=f"held by pid {pid}"), flocked(paths.events_lock, timeout_s=0.05):
            pass
    assert read_events(paths).events == []
    with stuck_holder(ws.queue_dir / "t-q.lock") as pid, pytest.raises(LockTimeout, match=f"held by pid {pid}"):
        queue.push(ws, "t-q", "c-000000000001", behind=None)
    assert queue.entries(ws, "t-q") == []


@pytest.mark.integration
def test_a_lock_released_while_waiting_is_taken_as_before(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_LOCK_TIMEOUT, "60")
    fake_run(ws, "r-000000aa", "2026-01-01T00:00:00.000Z")
    paths = ws.run("r-000000aa")
    paths.events_lock.touch()
    code = (
        "import fcntl, sys, time\nf = open(sys.argv[1], 'a')\nfcntl.flock(f, fcntl.LOCK_EX)\n"
        "print('held', flush=True)\nsys.stdin.readline()\n"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", code, str(paths.events_lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert p.stdin is not None and p.stdout is not None and p.stdout.readline() == b"held\n"
    try:
        threading.Timer(0.3, lambda: (p.stdin.write(b"\n"), p.stdin.flush()) if p.stdin else None).start()
        ev = append_event(ws, paths, StopAsked(data=StopAskedData(by="test")))  # waits for the holder, then appends
    finally:
        p.wait(timeout=30)
    assert [e.seq for e in read_events(paths).events] == [ev.seq] == [1]
