"""The history of runs: each run per commit in an SQLite or PostgreSQL store,
the series it makes, and the change points in them. The step after judging:
the runner adds every judged run here, and ``perfsuite history`` reads it."""
