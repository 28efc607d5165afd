"""`--help` never acts: every command and subcommand of the CLI, found from its parser, prints its help and
exits 0 in a live workspace without changing a byte of it."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import pytest

from caseledger import cli
from caseledger.campaign.store import driver_events
from caseledger.campaign.view import campaign_view
from caseledger.ledger import authorization
from caseledger.tools import freeze_any, freeze_case, start_any, start_run
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace
from tests.conftest import free_port, knee_base, ref_draft, tree_digest


def command_paths(parser: argparse.ArgumentParser, above: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command path of a parser, its subcommands' too: ('target', 'stop'), from the parser itself; a
    positional with choices gives one path per choice ('authorize', 'paused'): a word that selects an action."""
    out = [above] if above else []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += command_paths(sub, (*above, name))
        elif not action.option_strings and action.choices and above:
            out += [(*above, str(c)) for c in action.choices]
    return out


def test_the_walk_finds_every_command_and_the_subcommands_of_target() -> None:
    paths = command_paths(cli._parser())
    assert ("target", "stop") in paths and ("target", "serve") in paths and ("target",) in paths
    assert ("authorize", "paused") in paths and ("import", "aisbench") in paths
    assert {p[0] for p in paths} == set(cli._COMMANDS)


@pytest.mark.processes  # a detached campaign driver waiting under a pause, a live service, a finished run
def test_help_on_every_command_changes_nothing_in_a_live_workspace(ws: Workspace, stop_services: None) -> None:
    port = free_port()
    case = freeze_case(ws, draft=ref_draft(port))
    done = start_run(ws, case.case_id, wait=True, timeout_s=120)
    assert done.state == "succeeded", done.text()  # its service stays up, warm for the next run
    authorization.set_mode(ws, "paused")
    f = freeze_any(ws, draft={"campaign": {
        "name": "help-c",
        "base": knee_base(port, "knee", 8),
        "axes": [{"path": "load.concurrency", "values": [1, 2]}],
        "search": {"kind": "grid"},
        "decision": {"primary_metric": "output_throughput"},
    }})  # fmt: skip
    assert isinstance(f, CampaignFrozen)
    start_any(ws, f.campaign_id)  # paused: its driver starts and waits
    deadline = time.monotonic() + 30
    while not any(e.type == "waiting" for e in driver_events(ws, f.campaign_id)):
        assert time.monotonic() < deadline, driver_events(ws, f.campaign_id)
        time.sleep(0.05)
    before = tree_digest(ws.root)
    env = {**os.environ, "CASELEDGER_WORKSPACE": str(ws.root)}
    failed = []
    for path in command_paths(cli._parser()):
        out = subprocess.run(
            [sys.executable, "-m", "caseledger", *path, "--help"], cwd=ws.root, env=env, capture_output=True, text=True
        )
        if out.returncode != 0 or "usage:" not in out.stdout:
            failed.append((path, out.returncode, out.stdout[-300:], out.stderr[-300:]))
        if (after := tree_digest(ws.root)) != before:
            failed.append((path, "changed the workspace"))
            before = after
    assert not failed, failed
    assert campaign_view(ws, f.campaign_id).driver_alive  # `target stop --help` stopped nothing
