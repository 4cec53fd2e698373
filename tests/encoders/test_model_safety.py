"""A model folder is data, never code: custom code in it is not run, pickles are not
unpickled beyond plain tensors."""

import json
import pickle
import shutil

from helpers import run_cli, write_jsonl

# Python that leaves a file beside itself when it runs.
_PAYLOAD = "import pathlib\npathlib.Path(__file__).with_name('ran').write_text('code ran')\n"


class _Runs:
    """Pickled, it calls `exec` on the payload when unpickled."""

    def __init__(self, folder):
        self.code = _PAYLOAD.replace("__file__", repr(str(folder / "x")))

    def __reduce__(self):
        return (exec, (self.code,))


def _embed_one(tmp_path, model):
    """Embed one document with `model`, in float32."""
    corpus = write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "some text"}])
    return run_cli(corpus, model, tmp_path / "out", "--dtype", "float32")


def _with_auto_map(tiny_st, tmp_path, model_type):
    folder = tmp_path / "model"
    shutil.copytree(tiny_st("mean"), folder)
    (folder / "custom.py").write_text(_PAYLOAD)
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    config["auto_map"] = {"AutoConfig": "custom.Config", "AutoModel": "custom.Model"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_custom_code_of_a_known_architecture_is_not_run(tmp_path, tiny_st):
    folder = _with_auto_map(tiny_st, tmp_path, "bert")
    result = _embed_one(tmp_path, folder)
    assert result.exit_code == 0, result.output
    assert not (folder / "ran").exists()


def test_custom_code_of_an_unknown_architecture_is_refused_not_run(tmp_path, tiny_st):
    folder = _with_auto_map(tiny_st, tmp_path, "made-up-architecture")
    result = _embed_one(tmp_path, folder)
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.output
    assert not (folder / "ran").exists()


def test_pickled_weights_that_run_code_are_refused(tmp_path, tiny_st):
    folder = tmp_path / "model"
    shutil.copytree(tiny_st("mean"), folder)
    (folder / "model.safetensors").unlink()
    with open(folder / "pytorch_model.bin", "wb") as f:
        pickle.dump({"weights": _Runs(folder)}, f)
    result = _embed_one(tmp_path, folder)
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert line.startswith(f"error: cannot load the model {folder}")
    assert len(line.splitlines()) == 1
    assert not (folder / "ran").exists()


def test_a_pickled_bge_m3_head_that_runs_code_is_refused(tmp_path, tiny_bge_m3):
    folder = tmp_path / "model"
    shutil.copytree(tiny_bge_m3, folder)
    with open(folder / "sparse_linear.pt", "wb") as f:
        pickle.dump({"weight": _Runs(folder)}, f)
    result = _embed_one(tmp_path, folder)
    assert result.exit_code == 1
    assert result.stderr.strip().startswith(
        f"error: {folder / 'sparse_linear.pt'} is not a plain file of tensors"
    )
    assert not (folder / "ran").exists()
