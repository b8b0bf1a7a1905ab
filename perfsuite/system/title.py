"""A process's command line as ps shows it, rewritten in place.

A process forked from another shows its parent's command line; the zygote's
agents and ranks (perfsuite.launch.zygote, perfsuite.rank.forked) rewrite
theirs into the one a fresh interpreter would have had, within the room the
zygote's own arguments took (the launcher pads them: perfsuite.launch.agent).
"""

from __future__ import annotations


def set_title(args: list[str]) -> bool:
    """This process's /proc/<pid>/cmdline, as far as its room allows (Linux);
    False where there is no room or no /proc."""
    try:
        import ctypes

        with open("/proc/self/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end: fields 48 and 49
        data = b"\0".join(a.encode(errors="replace") for a in args)[: end - start - 1]
        ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)
        return True
    except (OSError, IndexError, ValueError):
        return False
