"""CLI conventions: options from the environment, --version, help that survives pipes and
narrow terminals, shell completion, and JSON lines on stdin."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import typer.main
from helpers import read_output, records, run_cli, write_jsonl
from typer.testing import CliRunner

from bulkembed.cli import app
from bulkembed.version import __version__

FLOAT32 = ("--dtype", "float32", "--records-per-unit", "10")


def _run_options() -> list[str]:
    """Every long option name of `bulkembed run`."""
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    return [o for p in command.params for o in p.opts + p.secondary_opts if o.startswith("--")]


def _bulkembed(*arguments: str, env: dict[str, str] | None = None, stdin: str | None = None):
    """`python -m bulkembed ARGUMENTS`, its output piped."""
    return subprocess.run(
        [sys.executable, "-m", "bulkembed", *arguments],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def _summary(out) -> dict:
    return json.loads((out / "_bulkembed" / "summary.json").read_text())


def test_an_option_from_the_environment_takes_effect_and_a_flag_wins(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(20))
    env = {"BULKEMBED_MAX_BATCH_TOKENS": "4096", "BULKEMBED_DTYPE": "float32"}
    arguments = ["run", str(corpus), "--tokenize-workers", "0", "--quiet"]
    from_env = CliRunner().invoke(
        app,
        arguments,
        env={
            **env,
            "BULKEMBED_MODEL": str(tiny_st("mean")),
            "BULKEMBED_OUTPUT": str(tmp_path / "a"),
        },
    )
    assert from_env.exit_code == 0, from_env.output
    assert (_summary(tmp_path / "a")["max_batch_tokens"], _summary(tmp_path / "a")["dtype"]) == (
        4096,
        "float32",
    )
    flag = run_cli(corpus, tiny_st("mean"), tmp_path / "b", "--max-batch-tokens", "2048")
    assert flag.exit_code == 0
    flagged = CliRunner().invoke(
        app,
        [
            *arguments,
            "-m",
            str(tiny_st("mean")),
            "-o",
            str(tmp_path / "c"),
            "--max-batch-tokens",
            "2048",
        ],
        env=env,
    )
    assert flagged.exit_code == 0, flagged.output
    assert _summary(tmp_path / "c")["max_batch_tokens"] == 2048


def test_boolean_and_list_options_from_the_environment(tmp_path, tiny_st):
    corpus = write_jsonl(tmp_path / "c.jsonl", records(20))
    model = str(tiny_st("mean"))
    arguments = ["run", str(corpus), "-m", model, "--tokenize-workers", "0", *FLOAT32]
    quiet = CliRunner().invoke(
        app, [*arguments, "-o", str(tmp_path / "a")], env={"BULKEMBED_QUIET": "true"}
    )
    assert (quiet.exit_code, quiet.stderr) == (0, "")
    loud = CliRunner().invoke(
        app, [*arguments, "-o", str(tmp_path / "b")], env={"BULKEMBED_QUIET": "0"}
    )
    assert loud.exit_code == 0 and "input file" in loud.stderr
    bad = CliRunner().invoke(
        app,
        [*arguments, "-o", str(tmp_path / "c")],
        env={"BULKEMBED_STORAGE_OPTION": "region=eu colour=blue"},
    )
    assert bad.exit_code == 2
    assert bad.stderr.splitlines()[-1].startswith(
        "error: --storage-option colour=blue: write KEY=VALUE"
    )
    unnormalized = CliRunner().invoke(
        app,
        [*arguments, "-o", str(tmp_path / "d"), "--quiet"],
        env={"BULKEMBED_NORMALIZE": "false"},
    )
    assert unnormalized.exit_code == 0 and _summary(tmp_path / "d")["normalize"] is False


def test_version():
    result = CliRunner().invoke(app, ["--version"])
    assert (result.exit_code, result.stdout) == (0, f"bulkembed {__version__}\n")


@pytest.mark.parametrize("columns", ["80", "60"])
def test_help_piped_at_narrow_widths_shows_every_option_and_the_extras(columns):
    result = _bulkembed("run", "--help", env={"COLUMNS": columns})
    assert result.returncode == 0, result.stderr
    words = set(result.stdout.replace(",", " ").split())
    assert not [o for o in _run_options() if o not in words]
    text = " ".join(result.stdout.split())
    assert "needs bulkembed[lance])" in text and "needs bulkembed[ray])" in text
    assert "[env var: BULKEMBED_MODEL;" in text
    assert "Exit status: 0 done; 1 the run failed" in text
    assert max(len(line) for line in result.stdout.splitlines()) <= int(columns)


def test_completion_is_offered_without_importing_torch():
    code = (
        "import sys\n"
        "from bulkembed.cli import main\n"
        "sys.argv = ['bulkembed', '--show-completion', 'bash']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('HEAVY:', sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    # The shell named, not detected from the parent process (sh under CI runners).
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert "_BULKEMBED_COMPLETE=complete_bash" in result.stdout and "HEAVY: []" in result.stdout
    listed = _bulkembed("--help", env={"COLUMNS": "80"}).stdout
    assert "--install-completion" in listed and "--show-completion" in listed


def test_stdin_input_is_read_once_with_ids_from_its_rows(tmp_path, tiny_st):
    texts = [r["text"] for r in records(12)]
    lines = "".join(json.dumps({"text": t}) + "\n" for t in texts)
    out, model = tmp_path / "out", str(tiny_st("mean"))
    arguments = ("run", "-", "-m", model, "-o", str(out), "--quiet", *FLOAT32)
    result = _bulkembed(*arguments, stdin=lines)
    assert result.returncode == 0, result.stderr
    vectors = read_output(out)
    assert sorted(vectors) == sorted(f"-:{i}" for i in range(12))
    reference = tmp_path / "c.jsonl"
    reference.write_text(lines)
    assert run_cli(reference, model, tmp_path / "ref", *FLOAT32).exit_code == 0
    expected = {k.replace("c.jsonl:", "-:"): v for k, v in read_output(tmp_path / "ref").items()}
    assert expected.keys() == vectors.keys()
    assert all(np.array_equal(vectors[k], expected[k]) for k in expected)

    again = _bulkembed(*arguments, stdin=lines)
    assert again.returncode == 2
    assert again.stderr == (
        f"error: {out} holds an earlier run, and input from stdin (-) cannot be resumed: pass "
        "--overwrite to start over, or choose another --output\n"
    )
    over = _bulkembed(*arguments, "--overwrite", stdin="".join(lines.splitlines(True)[:3]))
    assert over.returncode == 0, over.stderr
    assert pq.read_table(out).num_rows == 3


def test_stdin_with_ids_into_a_stream_and_the_options_it_refuses(tmp_path, tiny_st):
    lines = "".join(
        json.dumps({"id": f"q{i}", "text": t}) + "\n" for i, t in enumerate(["a", "b c"])
    )
    model = str(tiny_st("mean"))
    streamed = _bulkembed("run", "-", "-m", model, "-o", "-", "--quiet", *FLOAT32, stdin=lines)
    assert streamed.returncode == 0, streamed.stderr
    assert [json.loads(line)["id"] for line in streamed.stdout.splitlines()] == ["q0", "q1"]
    for extra in (("--shard", "0/2"), ("--since", str(tmp_path))):
        refused = run_cli("-", model, tmp_path / "o", *extra)
        assert refused.exit_code == 2
        assert refused.stderr.startswith("error: input from stdin (-) is read once, by one process")
