"""SIGINT and SIGTERM keep the work: documents embedded before the signal are not embedded
again by the rerun, and the rerun's output is the uninterrupted one."""

import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from fault_harness import run_forked
from helpers import read_output, sample_texts, write_jsonl
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.run_dir import RunDirectory

DOCUMENTS = 1000


def _arguments(corpus, model, out, *extra):
    return [
        "run", str(corpus), "--model", str(model), "--output", str(out), "--quiet",
        "--records-per-unit", "200", "--tokenize-workers", "1",
        "--dtype", "float32", *extra,
    ]  # fmt: skip


def _summary(out):
    return json.loads((out / "_bulkembed" / "summary.json").read_text())


@pytest.fixture
def corpus(tmp_path):
    texts = sample_texts(DOCUMENTS)
    records = [{"id": f"doc-{i}", "text": t} for i, t in enumerate(texts)]
    return write_jsonl(tmp_path / "corpus" / "docs.jsonl", records)


@pytest.mark.slow
@pytest.mark.parametrize(("signal_name", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_at_45_percent_keeps_what_was_embedded(
    tmp_path, tiny_st, corpus, signal_name, code
):
    model = tiny_st("mean")
    reference = tmp_path / "reference"
    assert CliRunner().invoke(app, _arguments(corpus, model, reference)).exit_code == 0
    batches = _summary(reference)["batches_this_run"]
    expected = read_output(reference)

    out = tmp_path / "out"
    stopped = run_forked("encode", int(batches * 0.45), signal_name, _arguments(corpus, model, out))
    assert stopped.returncode == code, stopped.stderr
    status = json.loads(CliRunner().invoke(app, ["status", str(out), "--json"]).output)
    done, saved, remaining = status["docs"], status["docs_saved"], status["docs_remaining"]
    assert status["state"] == "stopped" and saved > 0
    assert done == sum(r.rows for r in RunDirectory(out).done_units().values())
    assert remaining == DOCUMENTS - done - saved
    # The signal came at 45% of the batches: what was embedded by then is kept.
    assert done + saved >= 0.3 * DOCUMENTS
    assert stopped.stderr.strip().splitlines()[-2:] == [
        f"warning: {signal_name}: stopping after the batches in flight and keeping every "
        f"vector embedded; send {signal_name} again to stop at once",
        f"error: stopped by {signal_name}: {done + saved} documents kept ({done} in units "
        f"done, {saved} saved for the next run), {remaining} remain; run the same command "
        "again to resume",
    ]

    resumed = CliRunner().invoke(app, _arguments(corpus, model, out))
    assert resumed.exit_code == 0, resumed.output
    summary = _summary(out)
    assert summary["saved_this_run"] == saved
    assert summary["docs_this_run"] == remaining
    assert summary["docs"] == DOCUMENTS
    output = read_output(out)
    assert set(output) == set(expected)
    cosines = [float(np.dot(expected[k], output[k])) for k in expected]
    assert min(cosines) >= 0.9999
    assert not list((out / "_bulkembed").glob("saved-*"))


def _signal(number):
    """What the process does on signal `number`: its handler, called here rather than sent
    (a real signal to the test process could reach any of the threads its libraries run)."""
    import signal

    signal.getsignal(number)(number, None)


def test_a_second_signal_stops_at_once():
    import signal

    from bulkembed.engine.run import _stop_on_signals
    from bulkembed.errors import Interrupted

    told = []
    with _stop_on_signals() as stop, stop.graceful(told.append):
        _signal(signal.SIGINT)
        assert stop.requested and stop.name == "SIGINT"
        assert stop.check() and stop.check()
        with pytest.raises(Interrupted, match="^stopped by SIGINT: committed parts are kept"):
            _signal(signal.SIGINT)
    assert told == [
        "SIGINT: stopping after the batches in flight and keeping every vector embedded; "
        "send SIGINT again to stop at once"
    ]


def test_a_signal_outside_the_embedding_loop_stops_at_once():
    import signal

    from bulkembed.engine.run import _stop_on_signals
    from bulkembed.errors import Interrupted

    with _stop_on_signals() as stop, pytest.raises(Interrupted, match="stopped by SIGTERM"):
        _signal(signal.SIGTERM)
    assert not stop.requested


def _table(folder):
    """The rows of an output (or change set) folder, sorted by id."""
    table = pq.read_table(sorted(folder.glob("*.parquet")))
    return table.sort_by("id")


def _interrupt_and_rerun(arguments, out, batches):
    """Stop a run into `out` with SIGINT at 45% of its `batches`, then run it again; the
    rerun's summary."""
    stopped = run_forked("encode", int(batches * 0.45), "SIGINT", arguments(out))
    assert stopped.returncode == 130, stopped.stderr
    status = json.loads(CliRunner().invoke(app, ["status", str(out), "--json"]).output)
    assert status["docs_saved"] > 0
    resumed = CliRunner().invoke(app, arguments(out))
    assert resumed.exit_code == 0, resumed.output
    summary = _summary(out)
    # The rerun embeds what remained (carrying over, with --since, what did not change),
    # and takes what was saved.
    assert summary["docs_this_run"] <= status["docs_remaining"]
    if "--since" not in arguments(out):
        assert summary["docs_this_run"] == status["docs_remaining"]
    assert summary["saved_this_run"] == status["docs_saved"]
    return summary


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model_name", "options"),
    [
        ("tiny_bge_m3", ("--outputs", "dense,sparse,multivector")),
        # Ranges are calibrated on the first window: the run is stopped after it.
        ("tiny_st", ("--quantize", "int8", "--max-batch-tokens", "512")),
        ("tiny_st", ("--quantize", "binary")),
    ],
)
def test_saved_vectors_are_the_uninterrupted_ones_in_every_output_kind(
    tmp_path, request, corpus, model_name, options
):
    model = request.getfixturevalue(model_name)
    model = model("mean") if model_name == "tiny_st" else model

    def arguments(out):
        return _arguments(corpus, model, out, *options)

    reference = tmp_path / "reference"
    assert CliRunner().invoke(app, arguments(reference)).exit_code == 0
    summary = _interrupt_and_rerun(
        arguments, tmp_path / "out", _summary(reference)["batches_this_run"]
    )
    assert summary["docs"] == DOCUMENTS
    expected, found = _table(reference), _table(tmp_path / "out")
    assert found.column("id").equals(expected.column("id"))
    assert found.column("content_hash").equals(expected.column("content_hash"))
    for name in ("dense", "sparse", "multivector"):
        if name not in expected.column_names:
            continue
        for a, b in zip(
            found.column(name).to_pylist(), expected.column(name).to_pylist(), strict=True
        ):
            if name == "sparse":
                assert a["indices"] == b["indices"]
                np.testing.assert_allclose(a["values"], b["values"], atol=1e-5)
            elif "--quantize" in options:
                np.testing.assert_allclose(np.array(a), np.array(b), atol=1)
            else:
                np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-5)


@pytest.mark.slow
def test_saved_documents_of_a_since_run_are_in_its_upserts(tmp_path, tiny_st, corpus):
    """Every document changed since the previous output is upserted once, also those an
    interrupted run saved."""
    model = tiny_st("mean")
    old = tmp_path / "old"
    assert CliRunner().invoke(app, _arguments(corpus, model, old)).exit_code == 0
    records = [json.loads(line) for line in corpus.read_text().splitlines()]
    # Every other document changes: nearly every chunk carries records over, beside those
    # an interrupted run saved.
    for record in records[::2]:
        record["text"] += " (edited)"
    edited = write_jsonl(tmp_path / "edited" / "docs.jsonl", records)

    def arguments(out):
        return _arguments(edited, model, out, "--since", str(old))

    reference = tmp_path / "reference"
    assert CliRunner().invoke(app, arguments(reference)).exit_code == 0
    summary = _interrupt_and_rerun(
        arguments, tmp_path / "out", _summary(reference)["batches_this_run"]
    )
    assert summary["changed"] == DOCUMENTS // 2 and summary["saved_this_run"] > 0
    upserts = _table(tmp_path / "out" / "_bulkembed" / "changes" / "upserts")
    expected = _table(reference / "_bulkembed" / "changes" / "upserts")
    assert upserts.column("id").equals(expected.column("id"))
    assert upserts.num_rows == DOCUMENTS // 2
    assert _table(tmp_path / "out").column("id").equals(_table(reference).column("id"))
    np.testing.assert_allclose(
        np.array(upserts.column("dense").to_pylist()),
        np.array(expected.column("dense").to_pylist()),
        atol=1e-6,
    )


@pytest.mark.slow
def test_two_interrupts_count_what_is_saved_once_and_a_damaged_saved_file_is_set_aside(
    tmp_path, tiny_st, corpus
):
    model = tiny_st("mean")

    def arguments(out):
        return _arguments(corpus, model, out, "--max-batch-tokens", "256")

    reference = tmp_path / "reference"
    assert CliRunner().invoke(app, arguments(reference)).exit_code == 0
    batches = _summary(reference)["batches_this_run"]
    out = tmp_path / "out"
    assert run_forked("encode", int(batches * 0.45), "SIGINT", arguments(out)).returncode == 130
    assert run_forked("encode", int(batches * 0.35), "SIGINT", arguments(out)).returncode == 130
    status = json.loads(CliRunner().invoke(app, ["status", str(out), "--json"]).output)
    # The second run committed units that the first had saved rows of: counted once.
    units = RunDirectory(out).done_units()
    saved = pq.read_table(sorted((out / "_bulkembed").glob("saved-*.parquet")))
    pending = {
        (f, p)
        for part, f, p in zip(
            *(saved.column(c).to_pylist() for c in ("_part", "_file", "_position")), strict=True
        )
        if part not in units
    }
    assert status["docs_saved"] == len(pending) > 0
    assert status["docs_remaining"] == DOCUMENTS - status["docs"] - len(pending)
    # A saved file cut short (a crash while it was written elsewhere) is set aside.
    damaged = sorted((out / "_bulkembed").glob("saved-*.parquet"))[0]
    damaged.write_bytes(damaged.read_bytes()[:100])
    resumed = CliRunner().invoke(app, arguments(out))
    assert resumed.exit_code == 0, resumed.output
    assert f"warning: {damaged} cannot be read (" in resumed.stderr
    assert "removed; its documents are embedded again" in resumed.stderr
    summary = _summary(out)
    assert summary["docs"] == DOCUMENTS and summary["cut"] == _summary(reference)["cut"]
    output = read_output(out)
    expected = read_output(reference)
    assert output.keys() == expected.keys()
    assert min(float(np.dot(expected[k], output[k])) for k in expected) >= 0.9999
