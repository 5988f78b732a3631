"""Pictures of a plan and of a run: memory bars, pipeline timelines, scaling curves, in one HTML file.

matplotlib is an optional extra (``pip install 'meshwise[report]'``); ``require_matplotlib`` turns its
absence into a one-line error.

- ``plan_report`` and ``measure_report``: the two pages; ``figures``: each picture as PNG bytes;
  ``schedule``: the predicted pipeline timeline both pages draw; ``html``: one self-contained page.
"""

from meshwise.errors import MeshwiseError


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MeshwiseError("--report needs matplotlib: pip install 'meshwise[report]'") from None
