"""Models found offline: the recipes in the cache, `bulkembed pull`, and a distinct one-line
message for each way a model is not found."""

import hashlib
import json

import pytest
from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError
from typer.testing import CliRunner

import bulkembed
from bulkembed.cli import app
from bulkembed.errors import ModelError
from bulkembed.models import hub

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, tiny_st):
    """A Hugging Face cache holding the tiny model as all-MiniLM-L6-v2, the way the Hub's
    own download leaves it; offline."""
    cache = tmp_path / "hub"
    repo = cache / f"models--{MINILM.replace('/', '--')}"
    commit = hashlib.sha1(MINILM.encode()).hexdigest()
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    model = tiny_st("mean")
    for file in model.rglob("*"):
        if file.is_file():
            link = repo / "snapshots" / commit / file.relative_to(model)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(file)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    return repo / "snapshots" / commit


def _hub_error(kind):
    """An error of `kind` as the Hub client raises it for a 404 (made without a response:
    its constructor's arguments differ between huggingface_hub versions)."""
    error = kind.__new__(kind)
    Exception.__init__(error, "404 Client Error")
    return error


def test_recipes_say_which_are_cached_and_where(hub_cache):
    shown = CliRunner().invoke(app, ["recipes"])
    assert shown.exit_code == 0, shown.output
    lines = {line.split()[0]: line for line in shown.stdout.splitlines() if line.strip()}
    assert lines["all-minilm-l6-v2"].split()[2] == "cached"
    assert lines["bge-m3"].split()[2] == "-"
    assert shown.stdout.splitlines()[-1] == (
        f"cached: in {hub_cache.parents[2]} (bulkembed pull RECIPE downloads one)"
    )
    listed = json.loads(CliRunner().invoke(app, ["recipes", "--json"]).stdout)
    found = {r["name"]: r["cached"] for r in listed}
    assert found["all-minilm-l6-v2"] == str(hub_cache) and found["bge-m3"] is None


def test_pull_offline_finds_a_cached_model_and_names_one_that_is_not(hub_cache):
    pulled = CliRunner().invoke(app, ["pull", "all-minilm-l6-v2"])
    assert pulled.exit_code == 0, pulled.output
    assert pulled.stdout.strip() == f"all-minilm-l6-v2 ({MINILM}) is in {hub_cache}"
    missing = CliRunner().invoke(app, ["pull", "BAAI/bge-m3"])
    assert missing.exit_code == 1
    assert missing.stderr.strip() == (
        "error: model 'BAAI/bge-m3' is not in the Hugging Face cache, and the Hub cannot be "
        "reached (offline): run `bulkembed pull BAAI/bge-m3` where the Hub can be reached, "
        "or pass a local folder"
    )
    path = CliRunner().invoke(app, ["pull", "./models/e5"])
    assert path.exit_code == 2 and "is a path; pull takes a recipe or a hub id" in path.stderr


def test_each_way_a_model_is_not_found_has_its_own_line(hub_cache, tmp_path):
    with pytest.raises(ModelError) as typo:
        bulkembed.load("all-minilm-l6-v3")
    assert str(typo.value) == (
        "model 'all-minilm-l6-v3' is not in the Hugging Face cache, and the Hub cannot be "
        "reached (offline); did you mean all-minilm-l6-v2?: run `bulkembed pull "
        "all-minilm-l6-v3` where the Hub can be reached, or pass a local folder"
    )
    with pytest.raises(ModelError) as folder:
        bulkembed.load(str(tmp_path / "nosuch") + "/")
    assert str(folder.value) == (
        f"no such folder: {tmp_path / 'nosuch'}/ (a model folder holds config.json); pass a "
        "folder that exists, a recipe or a hub id"
    )
    gone = hub.not_found("someone/nosuch-model", None, _hub_error(RepositoryNotFoundError))
    assert str(gone) == (
        "unknown model 'someone/nosuch-model': not a bundled recipe, not a local folder, and "
        "not on the Hugging Face Hub (or private: log in with `hf auth login`)"
    )
    revision = hub.not_found(MINILM, "v9", _hub_error(RevisionNotFoundError))
    assert str(revision) == (
        f"model '{MINILM}' on the Hugging Face Hub has no revision 'v9': name a branch, tag "
        "or commit it has"
    )
    assert hub.close_recipes("bge-m") == ["bge-m3"]
    assert hub.close_recipes("an-unrelated-name") == []


def test_an_unknown_recipe_gets_the_close_names(hub_cache):
    shown = CliRunner().invoke(app, ["recipes", "show", "e5-base-v3"])
    assert shown.exit_code == 2
    assert shown.stderr.strip() == (
        "error: unknown recipe 'e5-base-v3': see `bulkembed recipes`; did you mean e5-base-v2?"
    )
