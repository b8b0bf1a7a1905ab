"""Judging: a cell's result against what its baselines expect (which checks
apply, the verdicts, on the statistics of perfsuite.stats), a run recorded as
baselines, and run B against run A. The step after the host side has turned
the ranks' records into a cell's result."""
