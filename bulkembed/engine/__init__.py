"""The engine core both dispatchers share, and the dispatchers.

`plan.py` resolves a run into a frozen plan; `session.py` starts the model on a device and
settles its dtype; `stream.py` is the unit loop (windows, embed, output format, part
writer); `local.py` streams every pending unit through this machine's processes and
`ray.py` hands units to Ray Data actors; `run.py` opens the run directory, picks the
dispatcher and writes the summary. No dispatcher imports another.
"""
