"""`python -m bulkembed`: the same as the `bulkembed` command."""

from bulkembed.cli import main

if __name__ == "__main__":
    main()
