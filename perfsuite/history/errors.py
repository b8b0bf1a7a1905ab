"""The one error of the history store."""


class HistoryError(RuntimeError):
    """A run refused (unfinished, no commit, not a results.json) or a store
    that cannot be opened or written; the message says why."""
