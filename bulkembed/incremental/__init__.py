"""Incremental runs (`--since`): the previous output, the rows carried over from it, the lookup
tokenizers ask, and the deletes."""
