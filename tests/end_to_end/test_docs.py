import subprocess
import sys

from helpers import ROOT


def test_readme_option_reference_is_current():
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"], cwd=ROOT
    )
    assert result.returncode == 0, "README options are stale: run `make docs`"
