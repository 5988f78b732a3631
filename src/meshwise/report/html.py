"""One self-contained HTML page: images inlined as data URIs, nothing fetched from the network."""

from __future__ import annotations

import base64
import html
from collections.abc import Sequence


def image(png: bytes, alt: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"><figcaption>{html.escape(alt)}</figcaption></figure>'


def page(title: str, sections: Sequence[tuple[str, str]]) -> str:
    """``sections``: (heading, HTML body) pairs."""
    body = "\n".join(f"<section><h2>{html.escape(h)}</h2>\n{b}\n</section>" for h, b in sections)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }}
img {{ max-width: 100%; }} figure {{ margin: 1rem 0; }} figcaption {{ font-size: 0.8rem; color: #666; }}
table {{ border-collapse: collapse; font-size: 0.85rem; }} td, th {{ border: 1px solid #ccc; padding: 2px 6px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }} li {{ margin: 0.3rem 0; }} .warn {{ color: #a15c00; }}
</style></head>
<body><h1>{html.escape(title)}</h1>
{body}
</body></html>
"""


def paragraphs(lines: Sequence[str], css_class: str = "") -> str:
    cls = f' class="{css_class}"' if css_class else ""
    return "<ul>" + "".join(f"<li{cls}>{html.escape(line)}</li>" for line in lines) + "</ul>"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"
