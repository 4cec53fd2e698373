"""How messages word a count: "1 input file", "2 input files"."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """`count` with `noun`, in the plural (`noun` + "s" unless given) for any count but 1:
    `counted(2, "input file")` is "2 input files", `counted(1, "process", "processes")`
    "1 process"."""
    word = noun if count == 1 else plural or f"{noun}s"
    return f"{count:,} {word}"
