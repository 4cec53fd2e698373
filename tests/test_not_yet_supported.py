"""The README's "Not yet supported" list, checked against the code: each limitation it names
is still refused or missing. A check that fails means the feature landed: take it off the
list (README.md and docs/index.md)."""

import re

import pytest
from helpers import ROOT

import bulkembed
from bulkembed.config import RunConfig
from bulkembed.engine.sync import syncs_in_place
from bulkembed.errors import ModelError, UsageError
from bulkembed.sinks import parse_output
from bulkembed.storage import StorageOptions

LIMITATIONS = {
    "`--since` naming a LanceDB table other than the `--output` one": "since_another_table",
    "an in-place LanceDB sync with `--engine ray`": "ray_in_place",
    "ColBERT query encoding (query marker and expansion) is not provided": "colbert_queries",
    "with several devices or Ray a signal stops the run at once": "signals_with_devices",
}


def _section(page):
    text = (ROOT / page).read_text()
    section = text.split("## Not yet supported", 1)[1].split("\n## ", 1)[0]
    return " ".join(section.split())


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_the_list_names_each_limitation_checked_here(page):
    section = _section(page)
    for phrase in LIMITATIONS:
        assert " ".join(phrase.split()) in section, phrase
    assert "unpadded (varlen) execution" not in section  # flat batches landed


def _sync(tmp_path, since, **settings):
    config = RunConfig(
        inputs=str(tmp_path), output=f"lancedb://{tmp_path}/db?table=docs", model="m",
        since=since, **settings,
    )  # fmt: skip
    return syncs_in_place(config, parse_output(config.output.target, None), StorageOptions())


def test_since_another_table(tmp_path):
    with pytest.raises(UsageError, match="can only be synced in place: pass the same URI"):
        _sync(tmp_path, f"lancedb://{tmp_path}/db?table=other")


def test_ray_in_place(tmp_path):
    with pytest.raises(UsageError, match="--engine ray cannot be combined with syncing"):
        _sync(tmp_path, f"lancedb://{tmp_path}/db?table=docs", engine="ray")


def test_colbert_queries(tiny_colbert):
    encoder = bulkembed.load(tiny_colbert, dtype="float32")
    with pytest.raises(ModelError, match="ColBERT queries take their own marker"):
        encoder.encode_query("a query")


def test_signals_with_devices():
    # Only the run's own process stops where it keeps its work: the multi-device and Ray
    # engines never ask for a graceful stop.
    local = (ROOT / "bulkembed" / "engine" / "local.py").read_text()
    ray = (ROOT / "bulkembed" / "engine" / "ray.py").read_text()
    devices = local.split("def _embed_on_devices", 1)[1]
    assert not re.search(r"\bgraceful\b|\bstop\.", devices) and "StopRequest" not in ray
