"""Imported first by `serve`'s fork server: it blocks SIGTERM there.

`serve` runs in a process group with its fork server and workers, and whoever stops the
group as a whole (`kill -TERM -<pgid>`, a service manager's control-group stop, the
tests' `children.stop`) signals every member at once. The fork server has no handler
for SIGTERM, so it died at once; a worker's exit status, which reaches the supervisor
through the fork server, then read 255 and a clean stop exited 1. Blocked, the signal
stays pending in the fork server (which ends when the supervisor does), and each worker
inherits the mask, so a SIGTERM that reaches a worker before it has its own handler is
kept, not lost: the worker unblocks it once the handler is set (`supervisor._worker`).
"""

import signal

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
