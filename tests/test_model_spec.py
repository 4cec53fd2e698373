import json

import pytest

from bulkembed.config import Pooling, RunConfig
from bulkembed.errors import ModelError, UsageError
from bulkembed.models.model_spec import resolve_model
from bulkembed.models.recipes import list_recipes


def _config(model, **options) -> RunConfig:
    return RunConfig(inputs=("x",), output="out", model=str(model), **options)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [("cls", Pooling.CLS), ("mean", Pooling.MEAN), ("lasttoken", Pooling.LAST_TOKEN)],
)
def test_pooling_and_normalization_come_from_sentence_transformers_files(tiny_st, mode, expected):
    spec = resolve_model(_config(tiny_st(mode)))
    assert spec.pooling is expected
    assert spec.normalize is True
    assert spec.max_length == 64  # sentence_bert_config.json max_seq_length


def test_no_normalize_module_means_no_normalization(tiny_st):
    assert resolve_model(_config(tiny_st("mean", normalize=False))).normalize is False


def test_command_line_overrides_the_model(tiny_st):
    spec = resolve_model(
        _config(tiny_st("mean"), pooling=Pooling.CLS, normalize=False, max_length=20)
    )
    assert (spec.pooling, spec.normalize, spec.max_length) == (Pooling.CLS, False, 20)


def test_plain_model_without_pooling_asks_for_it(tiny_bert):
    with pytest.raises(ModelError, match="pass --pooling cls\\|mean\\|last-token or --recipe"):
        resolve_model(_config(tiny_bert))
    spec = resolve_model(_config(tiny_bert, pooling=Pooling.MEAN))
    assert spec.max_length == 128  # the tokenizer's model_max_length
    assert spec.normalize is False


def test_a_recipe_s_length_is_held_to_the_positions_of_the_model_it_is_applied_to(tiny_st):
    # The recipe says 256; the tiny BERT has 128 position embeddings, its tokenizer says 64.
    spec = resolve_model(_config(tiny_st("mean"), recipe="all-minilm-l6-v2"))
    assert spec.max_length == 128
    # The length a run recorded is taken again when its encoder is loaded from its output.
    again = _config(tiny_st("mean"), recipe="all-minilm-l6-v2", max_length=spec.max_length)
    assert resolve_model(again).max_length == 128


@pytest.mark.parametrize(
    ("config", "limit"),
    [
        ({"model_type": "bert", "max_position_embeddings": 512}, 512),
        ({"model_type": "xlm-roberta", "max_position_embeddings": 8194, "pad_token_id": 1}, 8192),
        ({"model_type": "mpnet", "max_position_embeddings": 514, "pad_token_id": None}, 512),
        ({"model_type": "nomic_bert"}, None),
    ],
)
def test_the_positions_a_model_takes(config, limit):
    from bulkembed.models.model_spec import _position_limit

    assert _position_limit(config) == limit


def test_max_length_beyond_the_model_is_refused(tiny_bert):
    with pytest.raises(UsageError, match="--max-length 500 exceeds the model's limit of 128"):
        resolve_model(_config(tiny_bert, pooling=Pooling.MEAN, max_length=500))


def test_recipe_settings_apply_to_local_weights(tiny_bert):
    spec = resolve_model(_config(tiny_bert, recipe="e5-base-v2", max_length=100))
    assert spec.recipe == "e5-base-v2"
    assert (spec.pooling, spec.normalize, spec.prompt) == (Pooling.MEAN, True, "passage: ")
    query = resolve_model(
        _config(tiny_bert, recipe="e5-base-v2", max_length=100, prompt_name="query")
    )
    assert query.prompt == "query: "
    literal = resolve_model(_config(tiny_bert, recipe="e5-base-v2", max_length=100, prompt="q> "))
    assert literal.prompt == "q> "


def test_unknown_prompt_name_lists_the_known_ones(tiny_bert):
    with pytest.raises(UsageError, match=r"unknown prompt name 'title' .*known: document, query"):
        resolve_model(_config(tiny_bert, recipe="e5-base-v2", max_length=100, prompt_name="title"))


def test_unknown_model_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError) as offline:
        resolve_model(_config("no-such/model"))
    assert str(offline.value) == (
        "model 'no-such/model' is not in the Hugging Face cache, and the Hub cannot be "
        "reached (offline): run `bulkembed pull no-such/model` where the Hub can be reached, "
        "or pass a local folder"
    )
    # A bundled recipe whose weights are not cached, offline: the recipe is known, the
    # weights are what is missing.
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(ModelError) as missing:
        resolve_model(_config("all-minilm-l6-v2"))
    assert str(missing.value).startswith(
        "the weights of recipe 'all-minilm-l6-v2' (sentence-transformers/all-MiniLM-L6-v2) are "
        "not in the Hugging Face cache and cannot be fetched from the Hub ("
    )
    assert str(missing.value).endswith(
        "run `bulkembed pull all-minilm-l6-v2` where the Hub can be reached, or pass a local "
        "copy: --model FOLDER --recipe all-minilm-l6-v2"
    )


@pytest.mark.parametrize(
    ("module", "message"),
    [
        ("LayerNorm", "module LayerNorm is not supported"),
        ("Dense", "a Dense module is supported only in PyLate ColBERT models"),
    ],
)
def test_unsupported_sentence_transformers_modules_are_refused(tiny_st, tmp_path, module, message):
    import shutil

    folder = tmp_path / "with-extra"
    shutil.copytree(tiny_st("mean"), folder)
    modules = json.loads((folder / "modules.json").read_text())
    kind = f"sentence_transformers.models.{module}"
    modules.append({"idx": 3, "name": "3", "path": "3_Extra", "type": kind})
    (folder / "modules.json").write_text(json.dumps(modules))
    with pytest.raises(ModelError, match=message):
        resolve_model(_config(folder))


def test_bundled_recipes_parse_and_name_hub_models():
    recipes = {r.name: r for r in list_recipes()}
    assert {
        "all-minilm-l6-v2",
        "bge-small-en-v1.5",
        "bge-base-en-v1.5",
        "e5-base-v2",
        "bge-m3",
    } <= set(recipes)
    assert recipes["all-minilm-l6-v2"].pooling is Pooling.MEAN
    assert recipes["bge-base-en-v1.5"].pooling is Pooling.CLS
    assert recipes["e5-base-v2"].prompts == {"query": "query: ", "document": "passage: "}
    assert recipes["bge-m3"].model == "BAAI/bge-m3"
    assert all(r.normalize for r in recipes.values() if "dense" in r.outputs)


def test_the_tokenizer_is_read_once_and_again_when_its_files_change(tiny_st, tmp_path, monkeypatch):
    import shutil

    from bulkembed.models import tokenizer_facts

    model = tmp_path / "model"
    shutil.copytree(tiny_st("mean"), model)
    reads = []
    fast_tokenizer = tokenizer_facts._fast_tokenizer

    def counted(*arguments):
        reads.append(1)
        return fast_tokenizer(*arguments)

    monkeypatch.setattr(tokenizer_facts, "_fast_tokenizer", counted)
    first = resolve_model(_config(model))
    assert len(reads) == 1
    again = resolve_model(_config(model))
    assert len(reads) == 1, "the facts come from the export cache"
    assert again == first
    # Another limit in the tokenizer's settings: the folder's digest changes, read again.
    settings = json.loads((model / "tokenizer_config.json").read_text())
    settings["model_max_length"] = 48
    (model / "tokenizer_config.json").write_text(json.dumps(settings))
    changed = resolve_model(_config(model, max_length=None))
    assert len(reads) == 2 and changed.version != first.version
    assert changed.tokenizer_json == first.tokenizer_json
