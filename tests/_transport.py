"""A multi-process launch that fails with a transport error ("Connection reset by peer", or a
worker's SIGABRT) runs once more; a wrong result or any other error is never retried.

The one cause found is torch 2.13's gloo teardown (a worker aborting during interpreter shutdown,
its peers then seeing their connection reset), which ``meshwise.runtime.mesh.end_process_group``
and ``exit_worker`` now avoid (docs/runtime.md); the retry stays for what a shared 2-core machine
can still do to local TCP, which says nothing about what a test checks."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

TRANSPORT_ERRORS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Signal 6 (SIGABRT)")

T = TypeVar("T")


def is_transport_error(text: str) -> bool:
    return any(marker in text for marker in TRANSPORT_ERRORS)


def once_more_on_transport_error(launch: Callable[[], T]) -> T:
    """``launch()``, run a second time if the first raised with a transport error in its message
    (a warning in pytest's summary says so)."""
    try:
        return launch()
    except RuntimeError as e:
        if not is_transport_error(str(e)):
            raise
        marker = next(m for m in TRANSPORT_ERRORS if m in str(e))
        warnings.warn(f"transport error ({marker}): running the launch once more", stacklevel=2)
    return launch()
