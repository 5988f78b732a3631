"""A worker's watch over itself: preemption signals, a launcher that died, a peer that stalled.

One thread per worker, started before torch makes its own threads:

- **Signals.** SIGTERM (how Slurm and Kubernetes preempt) and SIGINT are blocked in every thread
  and received here with ``sigtimedwait``, so they are seen even while the main thread waits inside
  a collective. The first one sets :attr:`Guard.signal`: the training loop finishes its step, saves
  and stops (:func:`meshwise.train.loop` agrees on it over all ranks). A second one, at least
  ``REPEAT_S`` later, ends the process at once with status 128 + signal. (A copy arriving sooner is
  the same request twice: a batch system signals every process and the launcher forwards its own.)
- **Orphans.** When the parent process (the launcher) is gone, the worker acts as on SIGTERM.
- **Heartbeat.** Every ``BEAT_S`` the worker touches ``RUN_DIR/alive-<rank>`` (holding its pid).
  When a collective times out, :func:`stalled_ranks` names the ranks whose heartbeat stopped (a
  SIGSTOPped process beats no more), and those are ended so that the launcher need not wait.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

from meshwise.launch import RUN_DIR_ENV, report

BEAT_S = 1.0
REPEAT_S = 1.0
STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT}


class Guard:
    """Start with :meth:`start` in the main thread; :meth:`stop` restores what it changed."""

    def __init__(self, watch_parent: bool) -> None:
        self.signal: int = 0  # the first stop request (signal number), 0 while none
        self._first_at = 0.0
        self._parent = os.getppid() if watch_parent else None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._saved: dict = {}
        run_dir = os.environ.get(RUN_DIR_ENV)
        self._beat = Path(run_dir) / f"alive-{os.environ.get('RANK', '0')}" if run_dir else None

    def start(self) -> Guard:
        self._saved = {s: signal.getsignal(s) for s in STOP_SIGNALS}
        for s in STOP_SIGNALS:  # a thread started before the mask still hands the signal over
            signal.signal(s, lambda signum, frame: self._request(signum))
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        if self._beat is not None:
            self._beat.write_text(str(os.getpid()))
        self._thread = threading.Thread(target=self._watch, name="meshwise-guard", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * BEAT_S)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        for s, h in self._saved.items():
            signal.signal(s, h)

    def signal_age_s(self) -> float:
        """Seconds since the first stop request (0 while none): what is spent of the launcher's grace."""
        return time.monotonic() - self._first_at if self.signal else 0.0

    def _request(self, signum: int) -> None:
        now = time.monotonic()
        if not self.signal:
            self.signal, self._first_at = signum, now
        elif now - self._first_at >= REPEAT_S:  # the second request: stop at once
            message = f"second {signal.Signals(signum).name}: stopped at once, without saving"
            try:
                told = report(128 + signum, message)
            except OSError:
                told = False
            if not told and int(os.environ.get("RANK", "0")) == 0:
                os.write(2, f"meshwise: error: {message}\n".encode())
            os._exit(128 + signum)

    def _watch(self) -> None:
        while not self._done.is_set():
            info = signal.sigtimedwait(STOP_SIGNALS, BEAT_S)
            if info is not None:
                self._request(info.si_signo)
            if self._parent is not None and os.getppid() != self._parent and not self.signal:
                self.signal, self._first_at = signal.SIGTERM, time.monotonic()  # the launcher died
            if self._beat is not None:
                try:
                    os.utime(self._beat)
                except OSError:
                    pass


def stalled_ranks(older_than_s: float = 3 * BEAT_S, end_them: bool = True) -> list[int]:
    """Ranks of this run whose heartbeat is older than ``older_than_s`` (ended with SIGKILL when
    ``end_them``: a stopped process would otherwise hold the launcher for its shutdown grace)."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    if not run_dir:
        return []
    now, found = time.time(), []
    for p in Path(run_dir).glob("alive-*"):
        try:
            age_s, pid = now - p.stat().st_mtime, int(p.read_text())
        except (OSError, ValueError):
            continue
        if age_s > older_than_s:
            found.append(int(p.name.split("-")[1]))
            if end_them:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
    return sorted(found)
