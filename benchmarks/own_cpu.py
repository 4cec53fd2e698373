"""`bulkembed` with the CPU seconds of its own process (not of its children) written to the
file named by BULKEMBED_OWN_CPU once it exits: what `host_ceiling.py --own-process` runs.

    BULKEMBED_OWN_CPU=cpu.json python benchmarks/own_cpu.py run corpus/ --model M ...
"""

from __future__ import annotations

import json
import os
import resource
import sys


def main() -> None:
    sys.argv = ["bulkembed", *sys.argv[1:]]
    from bulkembed import cli

    code: int | str | None = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code
    usage = resource.getrusage(resource.RUSAGE_SELF)
    with open(os.environ["BULKEMBED_OWN_CPU"], "w") as f:
        json.dump({"cpu_seconds": usage.ru_utime + usage.ru_stime, "module": cli.__file__}, f)
    sys.exit(code)


if __name__ == "__main__":
    main()
