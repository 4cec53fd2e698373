"""`benchmarks/gpu_check.py --smoke`: the GPU check's own code, run on the CPU with tiny
shapes, passes its eight checks and writes them as JSON."""

import json
import subprocess
import sys

import pytest
from helpers import ROOT

from bulkembed.config import DType
from bulkembed.models.devices import dtype_choice


@pytest.mark.slow
def test_the_gpu_check_runs_its_eight_checks_on_the_cpu(tmp_path):
    script = ROOT / "benchmarks" / "gpu_check.py"
    report = tmp_path / "check.json"
    result = subprocess.run(
        [sys.executable, str(script), "--smoke", "--json", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    checks = json.loads(report.read_text())["checks"]
    assert [(c["name"], c["result"]) for c in checks] == [
        (name, "pass")
        for name in (
            "stream",
            "varlen",
            "attention",
            "devices",
            "memory",
            "compile",
            "families",
            "startup",
        )
    ]
    figures = {c["name"]: c["figures"] for c in checks}
    assert figures["stream"]["largest_difference_to_one_by_one"] == 0.0
    assert figures["varlen"]["layouts_ran"] == ["padded", "flat"]
    assert figures["memory"]["first_calls"][0] == figures["memory"]["batch_documents"]
    assert figures["compile"]["graph_breaks"] == 0
    # On the CPU the reference and the padded call with a mask run, and agree exactly.
    assert figures["attention"]["flat_path_runs"] == "reference"
    assert figures["attention"]["padded_mask"]["error"] < 1e-6
    assert figures["attention"]["tokens"] > 0
    families = figures["families"]
    assert {k for k in families if k != "kernel"} == {
        "bert", "modernbert", "nomic_bert", "qwen3", "qwen2-sliding", "mistral-sliding", "llama"
    }  # fmt: skip
    assert all(f["runs_flat"] and f["of_bert"] > 0 for k, f in families.items() if k != "kernel")
    # Each start-up step timed; the second run replays what the first recorded (here the
    # OpenVINO conversion of the first run, from the cache folder both share).
    startup = figures["startup"]
    # `--dtype auto` on a CPU: bfloat16 where it accelerates it and the check keeps it.
    assert startup["run_dtype"] in {"float32", dtype_choice(DType.AUTO, "cpu")}
    assert startup["probe_first_s"] is None
    assert 0 < startup["run_second_startup_s"] < startup["run_first_startup_s"]
    assert "stream     pass" in result.stdout
