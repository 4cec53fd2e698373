"""The version of bulkembed, recorded in every run directory's `config.json`."""

__version__ = "0.1.0"
