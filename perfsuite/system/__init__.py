"""What every floor shares of the operating system: files written whole,
folder locks, whether a file can be written where it is to go (folders.py),
processes that end with their parent, a process's title in ps, and the
registry of ``PERFSUITE_*`` environment variables (envvars.py). The first
floor of the data flow, beside the cells and options it describes."""
