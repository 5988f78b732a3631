"""Pictures: the plan report renders for every kind of layout, opens cleanly in headless Chromium, and
says how to install matplotlib when it is missing."""

import base64
import importlib.util
import json
import re
import shutil
import subprocess
import sys

import pytest

from meshwise.cli import main

LAYOUTS = {
    "pure-dp": "dp=16",
    "fsdp": "dp=16,zero=3",
    "tp": "dp=4,tp=4",
    "pp-1f1b": "dp=4,pp=4,schedule=1f1b",
    "interleaved": "dp=4,pp=4,vpp=2",
    "3d": "dp=2,tp=4,pp=2,zero=1",
}
PNG = b"\x89PNG\r\n\x1a\n"
# matplotlib is in the test extra (scripts/test.sh installs it); without it only the drawing tests skip.
needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                                      reason="matplotlib is not installed: pip install -e '.[test]'")


def _images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


@needs_matplotlib
@pytest.mark.parametrize("name", LAYOUTS)
def test_plan_report_renders(name, tmp_path, capsys):
    out = tmp_path / f"{name}.html"
    assert main(["plan", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--seq-len", "2048",
                 "--global-batch", "64", "--layout", LAYOUTS[name], "--report", str(out)]) == 0
    html = out.read_text()
    images = _images(html)
    assert len(images) == 3  # memory bars, pipeline timeline, scaling curve
    assert all(img.startswith(PNG) and len(img) > 5000 for img in images)
    assert "http://" not in html and "https://" not in html  # nothing fetched from the network
    assert "Explanation" in html and "1. One device?" in html
    assert not (tmp_path / f"{name}.html.tmp").exists()


@needs_matplotlib
def test_search_report_shows_top_layouts(tmp_path, capsys):
    out = tmp_path / "plan.html"
    assert main(["plan", "--model", "llama3-70b", "--gpus", "64", "--top", "4", "--report", str(out)]) == 0
    html = out.read_text()
    assert html.count("<tr>") >= 5 and len(_images(html)) == 3


@needs_matplotlib
def test_plan_html_renders_in_headless_chromium(tmp_path, capsys):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium package is needed (scripts/test.sh installs it as root): apt-get install chromium"
    out = tmp_path / "plan.html"
    assert main(["plan", "--model", "llama3-70b", "--gpus", "64", "--layout", "dp=8,tp=4,pp=2,zero=1",
                 "--report", str(out)]) == 0
    # A probe, added to a copy only: records page errors and whether every image decoded.
    probe_head = ("<script>window.__errors=[];window.addEventListener('error',"
                  "e=>window.__errors.push(String(e.message||(e.target&&e.target.src))),true);</script>")
    probe_tail = ("<script>window.addEventListener('load',()=>{const imgs=[...document.images];"
                  "const broken=imgs.filter(i=>!(i.complete&&i.naturalWidth>0)).length;"
                  "const p=document.createElement('pre');p.id='probe';"
                  "p.textContent=JSON.stringify({images:imgs.length,broken:broken,errors:window.__errors});"
                  "document.body.appendChild(p);});</script>")
    checked = tmp_path / "checked.html"
    checked.write_text(out.read_text().replace("<head>", "<head>" + probe_head, 1).replace("</body>", probe_tail + "</body>"))
    r = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
                        "--virtual-time-budget=5000", "--dump-dom", checked.as_uri()],
                       capture_output=True, text=True, timeout=120)
    found = re.search(r'<pre id="probe">([^<]*)</pre>', r.stdout)
    assert found, f"the page did not finish loading: {r.stderr[-2000:]}"
    probe = json.loads(found.group(1).replace("&quot;", '"'))
    assert probe == {"images": 3, "broken": 0, "errors": []}
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console


def test_without_matplotlib_one_line_says_how_to_install(tmp_path):
    fake = tmp_path / "matplotlib"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    r = subprocess.run([sys.executable, "-m", "meshwise.cli", "plan", "--model", "tiny", "--gpu", "cpu", "--gpus", "2",
                        "--report", str(tmp_path / "x.html")], capture_output=True, text=True, timeout=60,
                       env={"PYTHONPATH": str(tmp_path), "PATH": ""})
    assert r.returncode == 2
    assert r.stderr.strip() == "meshwise: error: --report needs matplotlib: pip install 'meshwise[report]'"
    assert not (tmp_path / "x.html").exists()
