"""Judging: a cell's result against what its baselines expect (statistics
over launches and over interleaved windows, which checks apply, the
verdicts), a run recorded as baselines, and run B against run A. The step
after the host side has turned the ranks' records into a cell's result."""
