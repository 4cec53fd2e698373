"""`python -m bulkembed`: the same as the `bulkembed` command."""

from bulkembed.cli import main

main()
