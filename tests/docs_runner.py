"""Runs one page's blocks in order, as a user following the page would, in the current
folder: `python docs_runner.py STEPS.json`, where each step is `{"name", "kind", "code"}`.

- `sh`: the block's lines through `bash -e -o pipefail`;
- `python`: executed in one namespace shared by the page's Python blocks (a page reads as
  one session: a later block uses what an earlier one imported), with `__name__` set to
  `"__main__"` as in a script;
- `sql`: through DuckDB.

A step that fails stops the page: its name and the error are printed, and the exit status
is 1. Its own process, so that what a page registers (a kind of output, a model family)
stays in it."""

from __future__ import annotations

import json
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any


def run_step(step: dict[str, str], namespace: dict[str, Any]) -> None:
    print(f"--- {step['name']} ({step['kind']})", flush=True)
    if step["kind"] == "sh":
        subprocess.run(["bash", "-e", "-o", "pipefail", "-c", step["code"]], check=True)
    elif step["kind"] == "python":
        exec(compile(step["code"], step["name"], "exec"), namespace)
    elif step["kind"] == "sql":
        import duckdb

        print(duckdb.sql(step["code"]).fetchall(), flush=True)
    else:
        raise ValueError(f"unknown kind of step: {step['kind']}")


def main() -> None:
    steps = json.loads(Path(sys.argv[1]).read_text())
    namespace: dict[str, Any] = {"__name__": "__main__"}
    for step in steps:
        try:
            run_step(step, namespace)
        except BaseException:
            print(f"FAILED: {step['name']}\n{traceback.format_exc()}", flush=True)
            sys.exit(1)


if __name__ == "__main__":
    main()
