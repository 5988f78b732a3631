"""gloo's TCP transport between local workers occasionally drops a connection ("Connection reset
by peer" inside a collective; the worker whose gloo thread notices aborts with SIGABRT). That says
nothing about what a test checks, so multi-process tests run such a launch once more; a wrong
result or any other error is never retried."""

from __future__ import annotations

from typing import Callable, TypeVar

TRANSPORT_ERRORS = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Signal 6 (SIGABRT)")

T = TypeVar("T")


def is_transport_error(text: str) -> bool:
    return any(marker in text for marker in TRANSPORT_ERRORS)


def once_more_on_transport_error(launch: Callable[[], T]) -> T:
    """``launch()``, run a second time if the first raised with a transport error in its message."""
    try:
        return launch()
    except RuntimeError as e:
        if not is_transport_error(str(e)):
            raise
    return launch()
