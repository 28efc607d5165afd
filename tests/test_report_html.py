"""HTML reports as a person opens them: one self-contained page (no script, no network), every ledger text masked
and escaped, and a campaign's page rendered by a real headless Chromium with its charts and Pareto frontier."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from caseledger import cli, redact
from caseledger.campaign.html import render_campaign
from caseledger.campaign.view import CampaignView, PointRow
from caseledger.ledger import authorization
from caseledger.outcome.flags import Flag
from caseledger.outcome.html import Chart
from caseledger.tools import freeze_any, start_any
from caseledger.tools.campaigns import CampaignFrozen
from caseledger.workspace import Workspace
from tests.conftest import free_port
from tests.helpers import knee_campaign, until_complete

SECRET = "sk-live-0123456789abcdef"
HOSTILE = "<script>alert('x')</script>"
# what would make a page fetch something: a source or link that is not a reference inside the page (the SVGs'
# own "#id" glyph and clip references), a CSS import or url()
FETCHES = r"""(src|href)\s*=\s*["']?[^#"'\s]|@import|url\((?!#)"""


def _row(label: str, **over: Any) -> PointRow:
    base: dict[str, Any] = {
        "label": label,
        "case_id": "c-0000000000a1",
        "status": "measured",
        "runs": 1,
        "metric_mean": 100.0,
        "noise_rel": 0.01,
        "run_to_run": "unknown (1 run)",
        "limits": {},
        "meets": True,
        "requests": 32,
        "per_user_tok_s": 50.0,
        "per_card_tok_s": 100.0,
        "pareto": True,
    }
    return PointRow(**{**base, **over})


def test_every_ledger_text_is_masked_then_escaped_and_the_page_loads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CL_TEST_KEY", SECRET)
    redact.remember(["CL_TEST_KEY"])
    view = CampaignView(
        campaign_id="g-0123456789ab",
        name="knee",
        scenario="s",
        objective="output_throughput on whole",
        limits=["tpot_p99_ms<=11"],
        search="grid over 1 points",
        rows=[_row(f"C=1 {HOSTILE}", why=f"refused with key {SECRET} & more")],
        complete=True,
        answer=f"winner {HOSTILE} key={SECRET}",
        winner="c-0000000000a1",
        pareto=["C=1"],
        progress={
            "measured": 1,
            "running": 0,
            "queued": 0,
            "pending": 0,
            "skipped": 0,
            "given_up": 0,
            "runs": 1,
            "service_starts": 1,
            "elapsed_s": 3.0,
        },
        driver_alive=False,
        next_call="nothing",
    )
    flags = {"C=1 (r-1)": [Flag(f"server said {HOSTILE} {SECRET}", warn=True, details=(f"<b>{SECRET}</b>",))]}
    page = render_campaign(view, flags, [Chart(f"caption {HOSTILE}", "<svg></svg>")])
    assert SECRET not in page and "***" in page
    assert "<script" not in page and "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "<b>" not in page and "&amp; more" in page
    # self-contained: nothing fetched at view time
    assert not re.search(FETCHES, page), page
    assert page.count("<svg") == 1 and "Pareto frontier" in page


# ------------------------------------------------------------------------------------- in a real browser


def _chromium(binary: str, page: Path, out: Path, *mode: str) -> tuple[str, str]:
    """(stdout, stderr) of a headless Chromium opening the page with name resolution switched off, so a page
    that fetched anything would log a failed load."""
    p = subprocess.run(
        [
            binary,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={out / 'profile'}",
            *mode,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=out,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stdout, p.stderr


def _console(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line or "Failed to load resource" in line]


def _not_blank(png: Path) -> tuple[int, float]:
    """(distinct colours, share of non-white pixels) of a screenshot."""
    from PIL import Image  # lazy: pillow comes with matplotlib

    with Image.open(png) as im:
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=1 << 20) or []
        total = rgb.width * rgb.height
        white = sum(n for n, c in colours if min(c) >= 250)
    return len(colours), 1 - white / total


@pytest.mark.integration
@pytest.mark.browser
def test_a_campaign_report_opens_in_chromium_with_its_charts_and_pareto_frontier_and_no_console_error(
    ws: Workspace, stop_services: None, chromium: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    authorization.set_mode(ws, "auto")
    draft = knee_campaign(
        free_port(), [1, 4, 8], search={"kind": "grid"}, repeats={"runs": 1, "settle_runs": 1, "budget": 0}
    )
    f = freeze_any(ws, draft=draft)
    assert isinstance(f, CampaignFrozen)
    start_any(ws, f.campaign_id)
    view = until_complete(ws, f.campaign_id)
    assert view.pareto, view.text()  # TPOT ~ 4 + 1.5 (C - 1) ms: C=8 breaks 11 ms, C=1 and C=4 are the frontier

    assert cli.main(["-w", str(ws.root), "report", f.campaign_id, "--html", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    page = Path(answer["paths"][0])
    assert page.parent == ws.reports_dir and answer["charts"] == 2, answer
    body = page.read_text()
    assert not re.search(FETCHES, body), re.search(FETCHES, body)

    shot = tmp_path / "shot.png"
    _, err = _chromium(chromium, page, tmp_path, f"--screenshot={shot}", "--window-size=1400,2600")
    assert _console(err) == [], _console(err)
    colours, inked = _not_blank(shot)
    assert colours > 16 and inked > 0.02, (colours, inked)

    dom, err = _chromium(chromium, page, tmp_path, "--dump-dom")
    assert _console(err) == [], _console(err)
    # both charts parsed into the DOM as SVG with their drawn paths
    svgs = re.findall(r"<svg\b.*?</svg>", dom, flags=re.S)
    assert len(svgs) == 2 and all(s.count("<path") > 20 for s in svgs), [s[:200] for s in svgs]
    frontier = dom[dom.index("<h2>Pareto frontier</h2>") :]
    assert all(label in frontier.split("</p>")[0] for label in view.pareto), frontier[:400]
    assert dom.count('<tr class="best">') == len(view.pareto)
    assert "C=8" in dom and '<tr class="breaks">' in dom  # the point above the limit is shown, marked

    # the control: the same check sees a console error when there is one
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><html><body><script>console.error('seen')</script></body></html>")
    _, err = _chromium(chromium, bad, tmp_path, "--dump-dom")
    assert any("seen" in line for line in _console(err)), err[-1000:]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_html_reports_are_mcp_resources_and_a_missing_run_names_the_fix(
    ws: Workspace, anyio_backend: str
) -> None:
    from mcp import Client, MCPError

    from caseledger.server import build_server

    async with Client(build_server(ws)) as c:
        templates = {t.uri_template: t.mime_type for t in (await c.list_resource_templates()).resource_templates}
        with pytest.raises(MCPError, match=r"r-0123abcd.*fix:"):
            await c.read_resource("caseledger://runs/r-0123abcd/report.html")
        with pytest.raises(MCPError, match="fix:"):
            await c.read_resource("caseledger://campaigns/g-0123456789ab/report.html")
    for uri in (
        "caseledger://runs/{run_id}/report.html",
        "caseledger://scenarios/{name}/report.html",
        "caseledger://campaigns/{campaign_id}/report.html",
    ):
        assert templates.get(uri) == "text/html", templates
