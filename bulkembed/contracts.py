"""Names that every layer shares: the lowest floor, importing nothing of bulkembed."""

# The run directory inside an output (`OUT/_bulkembed/`, `DB/_bulkembed/TABLE/`).
RUN_DIRECTORY = "_bulkembed"
