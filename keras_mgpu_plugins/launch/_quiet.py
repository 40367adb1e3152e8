"""Which of a worker's output lines are the backends' runtime logs: `RuntimeLines`.

By default the launcher shows worker 0's output without them (they stay in every worker's
log file): TensorFlow's C++ logs (absl/glog lines such as ``I0000 00:00:1795925446.148864
8856 coordination_service.cc:502] Waiting for 1/2 tasks to connect.``, with the lines they
continue, e.g. the straggler's task name), absl's "before absl::InitializeLog()" notice, and
the collectives' own lines (``[Gloo] Rank 0 is connected to 1 peer ranks...``). A fatal C++
log line (``F...``) is always shown: it says why a worker died. `kmp-launch --verbose`
shows them all (and `--all-output`, every worker's, everything).
"""

from __future__ import annotations

import re

#: absl/glog's prefix: severity, date, time, thread id, file:line].
_GLOG = re.compile(r"^(?P<severity>[IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+\s+[\w./+-]+:\d+\] ")
#: Lines that only ever come from the runtimes.
_RUNTIME = (
    re.compile(r"^WARNING: All log messages before absl::InitializeLog\(\) is called"),
    re.compile(r"^\[Gloo\] "),
)
#: Lines that continue the C++ log line before them (a multi-line message): only these, so
#: that nothing of the user's is ever hidden.
_CONTINUATIONS = (
    re.compile(r"^/job:[\w-]+/replica:\d+/task:\d+\S*$"),  # "Example stragglers:" names
    re.compile(r"^To enable the following instructions: "),  # cpu_feature_guard.cc
)


class RuntimeLines:
    """Classifies one stream's lines in order (a continuation needs the line before it)."""

    def __init__(self) -> None:
        self._after_runtime_line = False

    def hides(self, line: str) -> bool:
        """Whether `line` is a runtime log line that the default output leaves out."""
        match = _GLOG.match(line)
        if match is not None:
            self._after_runtime_line = match.group("severity") != "F"
            return self._after_runtime_line
        if any(pattern.match(line) for pattern in _RUNTIME):
            self._after_runtime_line = True
            return True
        if self._after_runtime_line and any(p.match(line) for p in _CONTINUATIONS):
            return True
        self._after_runtime_line = False
        return False
