"""A/B and bisect: ``perfsuite ab``'s sessions between two sides and their
sequential verdict (session.py; resident sides measured in interleaved
windows, resident.py; the sides themselves, sides.py), and a git bisect of a
regressed cell (bisect.py). The step after a single session is judged and
reported: it runs many."""
