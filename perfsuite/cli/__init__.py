"""The ``perfsuite`` command: its parsers, subcommands and exit codes, and
docs/reference/cli.md made from them. A front door, the last step of the data
flow beside the pytest plugin: it drives the floors below it."""
