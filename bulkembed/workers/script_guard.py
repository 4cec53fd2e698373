"""Whether worker processes can be started from here without running the main script again.

bulkembed starts its worker processes with `spawn`: each one imports the main module anew
(as `__mp_main__`) before it runs. For a script whose call into bulkembed sits at module
level, outside an `if __name__ == "__main__":` block, that import runs the call again in the
worker, which then dies starting workers of its own; a script read from stdin
(`python - <<EOF`) cannot be imported at all. `script_reruns` tells both apart from safe
callers, so that the caller tokenizes in its own process or refuses with a clear message
instead.
"""

from __future__ import annotations

import ast
import os
import sys
from functools import lru_cache
from types import FrameType, ModuleType

MAIN_GUARD_ADVICE = 'put the call under `if __name__ == "__main__":` in a script file'


def _main_path(main: ModuleType) -> str | None:
    """The file a spawned worker imports the main module from; None when it imports none
    (an interactive session, `python -c`, `python -m pkg` whose main is `pkg.__main__`)."""
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if name is not None:
        if name == "__main__" or name.endswith(".__main__"):
            return None
        return getattr(spec, "origin", None)
    return getattr(main, "__file__", None)


def _is_main_test(test: ast.expr) -> bool:
    """Whether `test` reads `__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return False
    if not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    constants = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(constants) == 1


@lru_cache(maxsize=8)
def _guarded_lines(path: str, modified: float) -> tuple[tuple[int, int], ...] | None:
    """The line ranges of the `if __name__ == "__main__":` blocks of the script at `path`
    (None: it cannot be read or parsed)."""
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    ranges = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_main_test(node.test):
            ranges.append((node.body[0].lineno, node.body[-1].end_lineno or node.lineno))
    return tuple(ranges)


def _main_frame(main: ModuleType) -> FrameType | None:
    """The frame of the main module's own code on this thread's stack: present while the
    module's top-level statements run, and stopped at the one that called in here."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is vars(main):
            return frame
        frame = frame.f_back
    return None


def script_reruns() -> str | None:
    """Why a spawned worker would run the main script again or fail to import it, in a
    few words; None when spawning is safe.

    Unsafe: a script read from stdin, and a script file whose module-level code is running
    a statement outside its `if __name__ == "__main__":` block (what called in here) right
    now. A call from a guarded block, from an interactive session, from a function called
    once the script has run, or from another thread is safe."""
    main = sys.modules.get("__main__")
    if main is None:
        return None
    path = _main_path(main)
    if path is None:
        return None
    if not os.path.isfile(path):
        return f"the main script ({path}) is no file a worker process can import"
    frame = _main_frame(main)
    if frame is None:
        return None
    guarded = _guarded_lines(path, os.path.getmtime(path))
    if guarded is None:
        return None
    if any(first <= frame.f_lineno <= last for first, last in guarded):
        return None
    name = os.path.basename(path)
    return (
        f'{name} calls bulkembed outside an `if __name__ == "__main__":` block, which a '
        "worker process would run again"
    )
