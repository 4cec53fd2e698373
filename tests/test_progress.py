"""What a run prints: phases, recent rates, ETA, timestamped log lines, the closing summary."""

import calendar
import json
import os
import re
import subprocess
import sys

import pytest
from helpers import ROOT, records, write_jsonl
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.reporting.printing import summary_lines
from bulkembed.reporting.progress import LogReporter, RunStats
from bulkembed.reporting.rates import RunProgress

# 2026-11-25T10:41:07Z
WALL = calendar.timegm((2026, 11, 25, 10, 41, 7, 0, 0, 0))
STAMP = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


class FakeClock:
    """Monotonic seconds that move only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _stats(docs: int, tokens: int, carried: int = 0, seconds: float = 1.0) -> RunStats:
    """Counts of a run that has embedded for `seconds` (since its first batch)."""
    return RunStats(docs=docs, tokens=tokens, carried=carried, embedding=1.0, ended=1.0 + seconds)


def test_rates_leave_out_the_start_up_and_follow_the_last_half_minute():
    clock = FakeClock()
    progress = RunProgress(clock)
    progress.begin("loading the model")
    clock.now += 40  # loading and checking: no documents
    assert progress.describe() == "loading the model (40s)"
    progress.count(100, 5_000)  # the first batch
    assert progress.phase is None and progress.rates() == ""
    for _ in range(30):  # 100 docs/s for 30 s, 50 tokens each
        clock.now += 1
        progress.count(progress.done + 100, (progress.done + 100) * 50)
    assert progress.window.rates() == (100.0, 5_000.0)  # not 3,100 docs / 70 s
    for _ in range(40):  # slower: 20 docs/s for 40 s, beyond the window
        clock.now += 1
        progress.count(progress.done + 20, (progress.done + 20) * 50)
    assert progress.window.rates() == (20.0, 1_000.0)  # not 3,900 docs / 110 s
    # Shown: the run's own rates, as its summary gives them (the window's are the ETA's).
    progress.mean = (3_900 / 70, 3_900 * 50 / 70)
    assert progress.rates() == "56 docs/s  2,786 tok/s"


def test_eta_comes_from_the_total_once_it_is_known():
    clock = FakeClock()
    progress = RunProgress(clock)
    progress.begin(None)
    progress.count(200, 10_000)
    clock.now += 2
    progress.count(400, 20_000)
    progress.mean = (100.0, 5_000.0)
    assert progress.describe() == "400 docs  100 docs/s  5,000 tok/s"  # no total: no % or ETA
    progress.total = 10_000
    assert progress.percent == 4 and progress.eta == 96.0
    assert progress.describe() == "4%  400/10,000 docs  100 docs/s  5,000 tok/s  ETA 1m36s"


def test_log_lines_have_a_timestamp_percentage_counts_rates_and_eta(capsys):
    clock = FakeClock()
    reporter = LogReporter(clock=clock, wall=lambda: WALL)
    reporter.phase("listing the inputs")
    clock.now += 3
    reporter.tick()
    reporter.set_total(10_000)
    reporter.progress.begin(None)
    reporter.update(_stats(docs=1_000, tokens=40_000, carried=580))
    clock.now += 2
    reporter.update(_stats(docs=3_000, tokens=120_000, carried=1_200, seconds=2.5))
    reporter.tick()
    lines = capsys.readouterr().err.splitlines()
    reporter.close()
    # The documents carried over are done, not embedded: the rates are the embedded ones'.
    assert lines == [
        "2026-11-25T10:41:07Z  listing the inputs",
        "2026-11-25T10:41:07Z  listing the inputs (3s)",
        "2026-11-25T10:41:07Z  42%  4,200/10,000 docs (1,200 carried)  1,200 docs/s  "
        "48,000 tok/s  ETA 4s",
    ]
    pattern = (
        rf"{STAMP}  \d+%  [\d,]+/[\d,]+ docs \([\d,]+ carried\)  [\d,]+ docs/s  "
        r"[\d,]+ tok/s  ETA \w+"
    )
    assert re.fullmatch(pattern, lines[-1])


def test_the_closing_summary_fits_ten_lines_of_80_columns():
    summary = {
        "docs": 1_234_567,
        "new": 3,
        "changed": 5,
        "unchanged": 1_234_559,
        "deleted": 2,
        "tokens": 98_765_432,
        "padding_efficiency": 0.9312,
        "bad_records": 25,
        "truncated": 1_204,
        "docs_this_run": 8,
        "batches_this_run": 1,
        "seconds": 92.4,
        "docs_per_s": 1_310.5,
        "tokens_per_s": 402_118.2,
        "device_idle_fraction": 0.041,
        "stage_seconds": {"read": 1.0, "tokenize": 2.0, "model": 80.0},
        "model": "sentence-transformers/" + "very-long-model-name-" * 4,
        "device": "cuda:0,cuda:1,cuda:2,cuda:3",
        "dtype": "float16",
        "outputs": "dense,sparse,multivector",
        "max_length": 512,
        "output": "s3://bucket/" + "deeply/nested/" * 10 + "out",
    }
    lines = summary_lines(summary)
    # The output is named whole, to be pasted back; every other line fits 80 columns.
    output = summary["output"]
    assert lines[0] == f"done: 1,234,567 docs in {output}"
    assert lines[-1] == f"full figures: bulkembed status {output} (and its summary.json)"
    assert len(lines) <= 10 and max(map(len, lines[1:-1])) <= 80
    assert any("…" in line for line in lines[1:-1])  # the model's long name is cut
    assert lines[1] == "this run: 8 docs embedded in 1m32s: 1,310 docs/s, 402,118 tok/s"
    assert lines[2] == "padding efficiency 0.93, device idle 4%, 1 batch"
    assert "since the previous output: 3 new, 5 changed, 1,234,559 unchanged, 2 deleted" in lines
    assert "25 bad records set aside (bad_records.jsonl)" in lines
    assert "1,204 docs cut at 512 tokens (--max-length)" in lines
    held = {**summary, "deleted": 0, "kept_unread": 40, "deletes_withheld": 7}
    held["deletes_held_by"] = "--max-deletes"
    assert summary_lines(held)[4:6] == [
        "since the previous output: 3 new, 5 changed, 1,234,559 unchanged, 0 deleted",
        "not deleted: 7 gone (--max-deletes), 40 not read (bad_records.jsonl)",
    ]


def test_a_run_that_embeds_nothing_says_nothing_of_padding_or_idle_devices():
    summary = {"docs": 1000, "docs_this_run": 0, "batches_this_run": 0, "seconds": 4.2}
    summary |= {"device_idle_fraction": 1.0, "output": "lancedb:///data/db?table=docs"}
    lines = summary_lines(summary)
    assert lines[1] == "this run: 0 docs embedded in 4s: 0 docs/s, 0 tok/s"
    assert not [line for line in lines if "idle" in line or "padding" in line]
    assert lines[-1] == (
        "full figures: bulkembed status lancedb:///data/db?table=docs (and its summary.json)"
    )


def test_a_run_names_its_start_up_phases_and_ends_with_a_short_summary(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(40))
    out = tmp_path / "out"
    arguments = ["run", str(corpus), "--model", str(tiny_st("mean")), "--output", str(out)]
    result = CliRunner().invoke(app, [*arguments, "--tokenize-workers", "0"])
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    assert re.fullmatch(rf"{STAMP}  listing the inputs", lines[0])
    assert any(re.fullmatch(rf"{STAMP}  loading the model on cpu", x) for x in lines)
    closing = lines[lines.index(next(x for x in lines if x.startswith("done: "))) :]
    assert closing[0].startswith("done: 40 docs in /") and closing[0].endswith("/out")
    assert closing[-1] == f"full figures: bulkembed status {out} (and its summary.json)"
    assert len(closing) <= 10 and max(map(len, closing[1:-1])) <= 80
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    assert closing == summary_lines(summary)
    assert closing[1].startswith("this run: 40 docs embedded in ")
    assert 0 < summary["startup_seconds"] < summary["seconds"]


def test_the_command_s_start_up_counts_from_the_process_s_start(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(40))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bulkembed", "run", str(corpus), "--output", str(out)]
    options = ["--model", str(tiny_st("mean")), "--tokenize-workers", "0", "--quiet"]
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    subprocess.run([*command, *options], check=True, env=environment, timeout=300)
    summary = json.loads((out / "_bulkembed" / "summary.json").read_text())
    # The keys in this order, beside each other.
    keys = list(summary)
    assert keys[keys.index("seconds") + 1] == "startup_seconds"
    assert 0 < summary["startup_seconds"] < summary["seconds"]


def test_index_builds_are_named_while_they_run(tmp_path, tiny_st):
    pytest.importorskip("lancedb")
    texts = [{"id": r["id"], "text": r["text"]} for r in records(300)]
    corpus = write_jsonl(tmp_path / "c.jsonl", texts)
    out = f"lancedb://{tmp_path / 'db'}"
    arguments = ["run", str(corpus), "--model", str(tiny_st("mean")), "--output", out]
    extra = ["--tokenize-workers", "0", "--keep-columns", "text", "--index", "--fts"]
    result = CliRunner().invoke(app, [*arguments, *extra])
    assert result.exit_code == 0, result.output
    phases = [x.split("  ", 1)[1] for x in result.stderr.splitlines() if re.match(STAMP, x)]
    # Each phase once, however many lines a long one took.
    steps = list(dict.fromkeys(re.sub(r" \(\w+\)$", "", x) for x in phases if x[0].isalpha()))
    assert steps[-3:] == [
        f"compacting table 'embeddings' of LanceDB {tmp_path / 'db'}",
        "building the ivf_hnsw_sq index on vector (300 rows)",
        "building the full-text index on text",
    ]


def test_the_terminal_bar_shows_the_percentage_counts_rates_and_eta():
    import io

    from rich.console import Console

    from bulkembed.reporting.progress import BarReporter

    clock = FakeClock()
    reporter = BarReporter()
    reporter.progress = RunProgress(clock)
    reporter.console = Console(file=io.StringIO(), width=140)
    reporter.start(RunStats())
    reporter.set_total(1_000)
    reporter.update(_stats(docs=100, tokens=4_000))
    clock.now += 2
    reporter.update(_stats(docs=420, tokens=16_800, seconds=3.0))
    shown = Console(file=io.StringIO(), width=140)
    shown.print(reporter._bar.get_renderable())
    reporter.close()
    line = " ".join(shown.file.getvalue().split())
    assert line.endswith("42% 420/1,000 docs 140 docs/s 5,600 tok/s 2s ETA 4s")


def test_the_eta_a_quarter_into_the_demo_is_within_30_percent_of_the_time_left():
    """The demo's batches, replayed on a fake clock: the longest documents come first, so
    documents per second start low and rise."""
    recorded = json.loads((ROOT / "tests" / "data" / "demo_progress.json").read_text())
    counts = recorded["counts"]
    end = counts[-1][0]
    estimates = {}
    for reads in (True, False):
        clock = FakeClock()
        progress = RunProgress(clock)
        progress.total = recorded["total"]
        for seconds, done, tokens, read_docs, read_tokens in counts:
            clock.now = 1000.0 + seconds
            progress.count(done, tokens)
            if reads:
                progress.read(read_docs, read_tokens)
            if done >= recorded["total"] / 4:
                estimates[reads] = progress.eta / (end - seconds)
                break
    assert 0.7 <= estimates[True] <= 1.3
    # By documents alone, as before the reads were counted: several times too long.
    assert estimates[False] > 3


def test_the_last_progress_line_and_the_summary_give_the_same_rates(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(300))
    arguments = ["run", str(corpus), "--model", str(tiny_st("mean")), "--output"]
    arguments += [str(tmp_path / "out"), "--dtype", "float32", "--max-batch-tokens", "256"]
    ran = CliRunner().invoke(app, arguments)
    assert ran.exit_code == 0, ran.output
    lines = ran.stderr.splitlines()
    progress = [line for line in lines if re.match(rf"{STAMP}  100%  300/300 docs  ", line)]
    rates = re.search(r"  ([\d,]+) docs/s  ([\d,]+) tok/s", progress[-1]).groups()
    summary = next(line for line in lines if line.startswith("this run: 300 docs embedded"))
    assert summary.endswith(f": {rates[0]} docs/s, {rates[1]} tok/s")


def test_documents_carried_over_are_shown_as_carried_not_as_a_rate(tmp_path, tiny_st):
    from helpers import incremental_corpora

    model = str(tiny_st("mean"))
    incremental_corpora(tmp_path)
    first = ["run", str(tmp_path / "v1"), "--model", model, "--output", str(tmp_path / "v1-out")]
    assert CliRunner().invoke(app, [*first, "--dtype", "float32", "--quiet"]).exit_code == 0
    since = ["run", str(tmp_path / "v2"), "--model", model, "--output", str(tmp_path / "v2-out")]
    since += ["--since", str(tmp_path / "v1-out"), "--dtype", "float32"]
    ran = CliRunner().invoke(app, since)
    assert ran.exit_code == 0, ran.output
    last = [line for line in ran.stderr.splitlines() if "1,001/1,001 docs" in line][-1]
    embedded = json.loads((tmp_path / "v2-out" / "_bulkembed" / "summary.json").read_text())
    assert "1,001/1,001 docs (993 carried)" in last
    rate = float(re.search(r"  ([\d,]+) docs/s", last).group(1).replace(",", ""))
    assert rate == round(embedded["docs_per_s"])


def test_a_relative_model_path_is_echoed_as_given(tmp_path, tiny_st, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(tiny_st("mean"))
    write_jsonl(tmp_path / "c.jsonl", records(20))
    arguments = ["run", "c.jsonl", "--model", "models/tiny", "--output", "out"]
    ran = CliRunner().invoke(app, [*arguments, "--dtype", "float32"])
    assert ran.exit_code == 0, ran.output
    lines = ran.stderr.splitlines()
    assert any(line.startswith("models/tiny on cpu (float32): dense 32-d") for line in lines)
    assert any(line.startswith("model models/tiny on cpu (float32") for line in lines)
    assert str(tmp_path) not in ran.stderr
