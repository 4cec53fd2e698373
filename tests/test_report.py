"""`bulkembed report`: one self-contained HTML page about a run, opened in a real headless
browser (Chromium) with no console message and its charts drawn."""

import re
import shutil
import subprocess

import pytest
from helpers import ROOT, records, run_cli, write_jsonl
from typer.testing import CliRunner

from bulkembed.cli import app

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="needs Chromium (.ci/run installs it: apt-get install chromium)"
)


def _open(page):
    """The DOM of `page` once Chromium loaded it, and the console messages it logged."""
    ran = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
         "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout, re.findall(r":CONSOLE[^\]]*\] (.*)", ran.stderr)


@pytest.fixture
def finished(tmp_path, tiny_st):
    rows = records(200)
    for row in rows[5:40:10]:
        row["text"] = None
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    out = tmp_path / "out"
    extra = ("--records-per-unit", "20", "--max-batch-tokens", "256", "--dtype", "float32")
    assert run_cli(corpus, tiny_st("mean"), out, *extra).exit_code == 0
    return out


@pytest.mark.slow
@needs_chromium
def test_the_report_of_the_demo_run_opens_with_its_charts(tmp_path, minilm):
    """`make demo`'s run (the bundled sample, all-MiniLM-L6-v2), then its report."""
    out = tmp_path / "demo-out"
    assert run_cli(ROOT / "samples" / "python-docs.jsonl", minilm, out, workers=None).exit_code == 0
    assert CliRunner().invoke(app, ["report", str(out)]).exit_code == 0
    dom, console = _open(out / "_bulkembed" / "report.html")
    assert console == []
    drawn = re.findall(r"<svg[^>]*>.*?</svg>", dom, re.S)
    assert len([svg for svg in drawn if re.search(r"<(polyline|rect) ", svg)]) >= 4
    assert "<td>docs</td><td>1000</td>" in dom and "<h2>Encoder</h2>" in dom


@needs_chromium
def test_the_report_opens_in_a_browser_with_its_charts_and_no_console_message(finished):
    shown = CliRunner().invoke(app, ["report", str(finished)])
    assert shown.exit_code == 0, shown.output
    page = finished / "_bulkembed" / "report.html"
    assert shown.stdout.strip() == f"report: {page}"
    dom, console = _open(page)
    assert console == []
    charts = re.findall(r"<svg[^>]*aria-label=\"([^\"]+)\"", dom)
    assert charts[:5] == [
        "tokens per second over time",
        "document lengths in tokens",
        "padding efficiency by unit",
        "busy seconds of each stage",
        "share of the embedding time",
    ]
    assert "bad records by reason" in charts
    assert len(re.findall(r"<(?:polyline|rect) ", dom)) >= 10  # drawn, not empty
    assert "text is null</text>" in dom and ">4 records</text>" in dom
    # Nothing is fetched: no script, no link, no remote resource.
    assert not re.search(r"<script|<link|src=\"http", dom)


@needs_chromium
def test_the_console_check_sees_what_a_page_logs(tmp_path):
    page = tmp_path / "logs.html"
    page.write_text('<!DOCTYPE html><body><script>console.error("broken")</script></body>')
    assert _open(page)[1] == ['"broken", source: ' + page.as_uri() + " (1)"]


def test_a_file_bulkembed_did_not_write_is_not_overwritten(finished, tmp_path):
    mine = tmp_path / "notes.html"
    mine.write_text("my notes")
    refused = CliRunner().invoke(app, ["report", str(finished), "--to", str(mine)])
    assert refused.exit_code == 1
    assert refused.stderr.strip() == (
        f"error: {mine} exists and is not a bulkembed report: choose another --to"
    )
    assert mine.read_text() == "my notes"
    again = tmp_path / "again.html"
    for _ in range(2):  # a report may be written over by the next
        assert CliRunner().invoke(app, ["report", str(finished), "--to", str(again)]).exit_code == 0
    nothing = CliRunner().invoke(app, ["report", str(tmp_path / "nothing")])
    assert nothing.exit_code == 2 and "holds no bulkembed run" in nothing.stderr
