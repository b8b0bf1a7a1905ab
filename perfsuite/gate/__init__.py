"""Sequences of sessions: ``perfsuite ab``'s A/B sessions and their
sequential verdict (resident sides measured in interleaved windows), a git
bisect of a regressed cell, and the measured power and cost of perfsuite's
own verdicts. The step after a single session is judged and reported: it runs
many."""
