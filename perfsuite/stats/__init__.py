"""Statistics: pure functions of numbers, the verdicts' arithmetic.
samples.py: over the samples of one run (medians, intervals, the verdicts);
launches.py: over launches (what one contributes, how identical ones
scatter, a verdict between launches made at different times); windows.py:
over the interleaved windows of a resident A/B session.

Imports nothing: a rank imports samples.py to summarise its record and must
not pay for scipy, which launches.py and windows.py import at once."""
