"""A real OpenSSH sshd on loopback for the SSH tests: generated host and user keys, one authorized key.

The sshd runs as a subprocess on 127.0.0.1:<free port> with its own config in a temporary directory (never the
workspace): only the generated user key may log in, as the current user. `running_sshd` yields the login and the
paths a case needs (key file, known_hosts written from the host key).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncssh
import pytest

from tests.conftest import free_port


def sshd_binary() -> str | None:
    """Absolute path of sshd (it refuses to re-exec itself from a relative path), or None."""
    found = shutil.which("sshd") or ("/usr/sbin/sshd" if os.access("/usr/sbin/sshd", os.X_OK) else None)
    return str(Path(found).resolve()) if found else None


@dataclass(frozen=True)
class Sshd:
    host: str
    port: int
    user: str
    key_path: Path  # the authorized user's private key
    known_hosts: Path  # "[127.0.0.1]:<port> <host key>"
    root: Path  # config, keys and sshd's log
    pid: int

    def ssh(self, **over: Any) -> dict[str, Any]:
        """The case's service.ssh block for this sshd (fields in `over` replace the defaults)."""
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "key_path": str(self.key_path),
            "known_hosts": str(self.known_hosts),
            **over,
        }

    def log(self) -> str:
        return (self.root / "sshd.log").read_text(errors="replace")


def _write_key(path: Path, key: asyncssh.SSHKey) -> None:
    path.write_bytes(key.export_private_key("openssh"))
    path.chmod(0o600)  # sshd refuses a host key others can read


def generate_key(path: Path) -> str:
    """Write a new ed25519 private key to `path`; return its public key line."""
    key = asyncssh.generate_private_key("ssh-ed25519", comment="caseledger-test")
    _write_key(path, key)
    return bytes(key.export_public_key("openssh")).decode().strip()


@contextlib.contextmanager
def running_sshd(
    root: Path,
    startup_timeout_s: float = 15.0,
    address: str = "127.0.0.1",
    prefix: Sequence[str] = (),
    setenv: Mapping[str, str] | None = None,
) -> Iterator[Sshd]:
    """sshd listening on `address` (default loopback), started under `prefix` (e.g. `ip netns exec NS`), with
    `setenv` in its sessions' environment (e.g. PATH: what that "host" finds).

    Every session has SHLVL=1: bash, the login shell sshd runs each command with, then reads no ~/.bashrc (it
    does for a command over SSH only at shell level 1). This host's root ~/.bashrc runs `pyenv init`, ~60
    processes per command: ~50 CPU-s of the suite's ~1,400 SSH commands, none of it caseledger's."""
    binary = sshd_binary()
    if binary is None:
        raise FileNotFoundError("sshd not installed (apt-get install -y openssh-server)")
    root.mkdir(parents=True, exist_ok=True)
    host_key = root / "ssh_host_ed25519_key"
    host_pub = generate_key(host_key)
    user_key = root / "id_ed25519"
    (root / "authorized_keys").write_text(generate_key(user_key) + "\n")
    user = getpass.getuser()
    port = free_port()
    known_hosts = root / "known_hosts"
    known_hosts.write_text(f"[{address}]:{port} {host_pub}\n")
    config = root / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                f"ListenAddress {address}",
                f"HostKey {host_key}",
                f"PidFile {root / 'sshd.pid'}",
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                f"AllowUsers {user}",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PermitRootLogin prohibit-password",
                "StrictModes no",
                "UsePAM no",
                "LogLevel VERBOSE",
                # sshd takes the first SetEnv line only: every variable on it
                "SetEnv " + " ".join(f"{k}={v}" for k, v in {"SHLVL": "1", **(setenv or {})}.items()),
                "",
            ]
        )
    )
    if os.geteuid() == 0:
        # privilege separation directory; packages create it only when the system sshd starts
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    log = (root / "sshd.log").open("ab")
    proc = subprocess.Popen(
        [*prefix, binary, "-D", "-e", "-f", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"sshd exited with code {proc.returncode}: "
                    f"{(root / 'sshd.log').read_text(errors='replace')[-1000:]}"
                )
            with contextlib.suppress(OSError), socket.create_connection((address, port), timeout=0.5):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not listen on {address}:{port} within {startup_timeout_s}s")
            time.sleep(0.05)
        yield Sshd(
            host=address, port=port, user=user, key_path=user_key, known_hosts=known_hosts, root=root, pid=proc.pid
        )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        log.close()


def require_sshd() -> None:
    """Skip the test without an sshd binary, unless CASELEDGER_REQUIRE_SSH=1 makes that a failure."""
    if sshd_binary() is None:
        msg = "sshd not installed (apt-get install -y openssh-server)"
        if os.environ.get("CASELEDGER_REQUIRE_SSH") == "1":
            pytest.fail(f"CASELEDGER_REQUIRE_SSH=1 but {msg}")
        pytest.skip(msg)


def loopback_sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A module's sshd on loopback (the body of its `sshd` fixture): skipped without an sshd binary, unless
    CASELEDGER_REQUIRE_SSH=1 makes that a failure."""
    require_sshd()
    with running_sshd(tmp_path_factory.mktemp("sshd")) as s:
        yield s
