"""The errors of the history store."""


class HistoryError(RuntimeError):
    """A run refused (unfinished, no commit, not a results.json) or a store
    that cannot be opened or written; the message says why."""


class StoreNotWritten(HistoryError):
    """The store could not be opened or written (a full disk, a read-only
    file or folder, a database gone): the run itself was fine, and
    ``perfsuite history add`` can store it later."""


class NotMigrated(StoreNotWritten):
    """An older layout that could not be migrated in place (a read-only
    store): a reader reads it without writing (an SQLite copy in memory)."""
