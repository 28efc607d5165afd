"""Fault points for tests: `CASELEDGER_FAULT=component:action[=value],...` in the environment.

Production code marks each point with one call: `checkpoint(component, when, at)` where a test may make the
process die like a kill or fill the disk, and `fault(component, action)` where a test changes what happens
(e.g. a collector without site-packages). Examples: `load:exit_after=3` (the load client calls
`os._exit(137)` right after the third record is written), `controller:exit_before=load`,
`controller:exit_during=load`, `postprocess:fail=import`, `postprocess:stop` (the collector stops itself),
`load:fill_disk_after=3` and
`controller:fill_disk_before=confirm_end` (fill the filesystem of the run directory up to the last block;
tests run them on a small tmpfs only). The variable is read at every call, so a test can set it per
subprocess; production never sets it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Literal

from caseledger import procs

FAULT_ENV = "CASELEDGER_FAULT"
KILL_EXIT_CODE = 137  # what a shell reports for SIGKILL: the fault looks like a kill to whoever waits


def parse_faults(spec: str) -> dict[tuple[str, str], str]:
    """{(component, action): value} from a comma list; a bare action has the value ''; last one wins."""
    out: dict[tuple[str, str], str] = {}
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            continue
        component, sep, rest = item.partition(":")
        if not sep or not component or not rest:
            raise ValueError(f"{FAULT_ENV} item '{item}' is not 'component:action[=value]'")
        action, _, value = rest.partition("=")
        out[(component.strip(), action.strip())] = value.strip()
    return out


def fault(component: str, action: str, env: Mapping[str, str] | None = None) -> str | None:
    """The value of fault `component:action` if it is set ('' for a bare action), else None.

    Test with `is not None`: a bare action such as `postprocess:fail` returns ''.
    """
    spec = (os.environ if env is None else env).get(FAULT_ENV, "")
    if not spec:
        return None
    return parse_faults(spec).get((component, action))


def checkpoint(
    component: str,
    when: Literal["before", "during", "after"],
    at: str | int,
    *,
    run_dir: str | os.PathLike[str] | None = None,
    delay_s: float = 0.0,
) -> None:
    """A fault point: `component:fill_disk_<when>=<at>` fills the filesystem of run_dir, then
    `component:exit_<when>=<at>` exits at once like a kill (after delay_s). Nothing when neither is set."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    faults = parse_faults(spec)
    if run_dir is not None and faults.get((component, f"fill_disk_{when}")) == str(at):
        fill_disk(run_dir)
    if faults.get((component, f"exit_{when}")) == str(at):
        time.sleep(delay_s)
        die()


FILLER = "fault-filler.bin"  # the file fill_disk writes in the run directory; delete it to free the space


def fill_disk(run_dir: str | os.PathLike[str]) -> None:
    """Write zeros into run_dir/FILLER until the filesystem is full (halving the block down to 512 bytes)."""
    block = 1 << 20
    fd = os.open(os.path.join(run_dir, FILLER), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while block >= 512:
            try:
                os.write(fd, b"\0" * block)
            except OSError:
                block //= 2
    finally:
        os.close(fd)


def die(code: int = KILL_EXIT_CODE) -> None:
    """Exit at once without cleanup, flushing nothing, like a kill. Refused when the part runs in the caller's
    process (procs.InProcess): the process that would die is the caller's, so such a test needs real processes."""
    procs.launcher().own_process(f"{FAULT_ENV} asks for a kill inside an inline run: the test needs real processes")
    os._exit(code)
