"""A rank's error that only says a peer went away: never the root cause.

Read by the rank (which then exits a little later, so that torchrun's agent
finds the peer's own failure first) and by the launcher's diagnosis
(perfsuite.launch.diagnose), which names the rank that failed first.
"""

from __future__ import annotations

import re

PEER_FAILURE = re.compile(r"Connection closed|Connection reset by peer|remote worker|"
                          r"remote process|communicator was aborted|Watchdog caught|"
                          r"NCCL error.*remote|Broken pipe", re.IGNORECASE)


def is_peer_failure(message: str) -> bool:
    """Whether a rank's error only says a peer went away (not the root cause)."""
    return bool(PEER_FAILURE.search(message or ""))
