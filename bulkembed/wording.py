"""How messages word a count: "1 input file", "2 input files"."""

from __future__ import annotations

import math


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` with `noun`, in the plural (`noun` + "s" unless given) for any count but 1:
    `counted(2, "input file")` is "2 input files", `counted(1, "process", "processes")`
    "1 process"."""
    word = noun if count == 1 else plural or f"{noun}s"
    return f"{count:,} {word}"


def percent(part: int, whole: int) -> str:
    """`part` of `whole` as a percentage, whole from 1% up, else with the digits it takes
    to show one that is not 0: a share is never shown as 0% unless it is none.

    >>> percent(30, 300), percent(1, 300), percent(1, 1_000_000), percent(0, 300)
    ('10%', '0.3%', '0.0001%', '0%')
    """
    share = 100 * part / whole
    if share == 0 or share >= 1:
        return f"{share:.0f}%"
    return f"{share:.{-math.floor(math.log10(share))}f}%"
