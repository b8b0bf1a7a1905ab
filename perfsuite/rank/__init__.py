"""Inside a rank: the worker that runs a cell's workload and writes
rank<N>.json, the step timer and its samples, work counters, injected faults,
the windows of a resident A/B session. The data flow's second floor, between
the cell to run and the launcher that reads the records; it imports nothing of
the host side."""
