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
needs_matplotlib = pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib is not installed: pip install -e '.[test]'"
)


def _images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)]


@needs_matplotlib
@pytest.mark.parametrize("name", LAYOUTS)
def test_plan_report_renders(name, tmp_path, capsys):
    out = tmp_path / f"{name}.html"
    assert (
        main(
            [
                "plan",
                "--model",
                "llama3-8b",
                "--gpu",
                "h100",
                "--gpus",
                "16",
                "--seq-len",
                "2048",
                "--global-batch",
                "64",
                "--layout",
                LAYOUTS[name],
                "--report",
                str(out),
            ]
        )
        == 0
    )
    html = out.read_text()
    images = _images(html)
    # memory bars, scaling curve, and the pipeline timeline only for a layout with a pipeline
    assert len(images) == (3 if "pp=" in LAYOUTS[name] else 2)
    assert ("Pipeline schedule" in html) == ("pp=" in LAYOUTS[name])
    assert all(img.startswith(PNG) and len(img) > 5000 for img in images)
    assert "http://" not in html and "https://" not in html  # nothing fetched from the network
    assert "Explanation" in html and "1. One device?" in html
    assert not (tmp_path / f"{name}.html.tmp").exists()


@needs_matplotlib
def test_search_report_shows_top_layouts(tmp_path, capsys):
    out = tmp_path / "plan.html"
    assert main(["plan", "--model", "llama3-70b", "--gpus", "64", "--top", "4", "--report", str(out)]) == 0
    html = out.read_text()
    assert html.count("<tr>") >= 5 and len(_images(html)) == 2  # the chosen dp=32,zero=3,tp=2: no pipeline
    assert "Pipeline schedule" not in html


@needs_matplotlib
def test_plan_html_renders_in_headless_chromium(tmp_path, capsys):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, (
        "Debian's chromium package is needed (scripts/test.sh installs it as root): apt-get install chromium"
    )
    out = tmp_path / "plan.html"
    assert (
        main(
            ["plan", "--model", "llama3-70b", "--gpus", "64", "--layout", "dp=8,tp=4,pp=2,zero=1", "--report", str(out)]
        )
        == 0
    )
    # A probe, added to a copy only: records page errors and whether every image decoded.
    probe_head = (
        "<script>window.__errors=[];window.addEventListener('error',"
        "e=>window.__errors.push(String(e.message||(e.target&&e.target.src))),true);</script>"
    )
    probe_tail = (
        "<script>window.addEventListener('load',()=>{const imgs=[...document.images];"
        "const broken=imgs.filter(i=>!(i.complete&&i.naturalWidth>0)).length;"
        "const p=document.createElement('pre');p.id='probe';"
        "p.textContent=JSON.stringify({images:imgs.length,broken:broken,errors:window.__errors});"
        "document.body.appendChild(p);});</script>"
    )
    checked = tmp_path / "checked.html"
    checked.write_text(
        out.read_text().replace("<head>", "<head>" + probe_head, 1).replace("</body>", probe_tail + "</body>")
    )
    r = subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=5000",
            "--dump-dom",
            checked.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
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
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "meshwise.cli",
            "plan",
            "--model",
            "tiny",
            "--gpu",
            "cpu",
            "--gpus",
            "2",
            "--report",
            str(tmp_path / "x.html"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PYTHONPATH": str(tmp_path), "PATH": ""},
    )
    assert r.returncode == 2
    assert r.stderr.strip() == "meshwise: error: --report needs matplotlib: pip install 'meshwise[report]'"
    assert not (tmp_path / "x.html").exists()


@needs_matplotlib
def test_scaling_spans_the_fewest_that_fit_to_several_times_the_request(tmp_path, capsys):
    """Llama 3 70B at 4k on 64 H100: nothing fits 16 (1,129 GB of states), 32 does; the chart runs
    from 32 to SCALE_UP x 64, the request marked."""
    from meshwise.plan.planner import search
    from meshwise.report.plan_report import SCALE_UP, scaling_points
    from meshwise.spec import TrainSpec, load_cluster, load_model

    model, train = load_model("llama3-70b"), TrainSpec(512, 4096)
    points = scaling_points(model, load_cluster("h100", 64), train, 0.1)
    counts = [g for g, _ in points]
    assert counts == [32, 64, 128, 256] and counts[-1] == SCALE_UP * 64
    assert not search(model, load_cluster("h100", 16), train, 1, 0.1).best  # 16 would not fit


@needs_matplotlib
def test_report_text_never_overlaps_at_1280_px(tmp_path, capsys, monkeypatch):
    """The report of three plans (no pipeline; a 405B interleaved pipeline with long layout names; a
    MoE on cpu), each figure's texts checked for overlap with matplotlib's own extents as it is drawn,
    and the page opened in headless Chromium at 1,280 px: every image shown at its own size (its
    8-point labels stay legible) and no two text boxes of the page overlapping."""
    from meshwise.report import figures

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium package is needed: apt-get install chromium"
    drawn, png = [], figures._png

    def checked_png(fig):
        drawn.append(figures.overlapping_texts(fig))
        return png(fig)

    monkeypatch.setattr(figures, "_png", checked_png)
    plans = {
        "fsdp": ["--gpus", "64"],
        "pipeline": [
            "--model",
            "llama3-405b",
            "--gpus",
            "2048",
            "--seq-len",
            "8192",
            "--global-batch",
            "512",
            "--top",
            "5",
        ],
        "moe": ["--model", "tiny-moe", "--gpu", "cpu", "--gpus", "4", "--seq-len", "64", "--global-batch", "8"],
    }
    for name, args in plans.items():
        out = tmp_path / f"{name}.html"
        assert main(["plan", *args, "--report", str(out)]) == 0
        probe = (
            "<script>window.addEventListener('load',()=>{const r=e=>e.getBoundingClientRect();"
            "const imgs=[...document.images].map(i=>[r(i).width,i.naturalWidth]);"
            "const els=[...document.querySelectorAll('h1,h2,p,li,figcaption,th,td,img')]"
            ".filter(e=>!e.querySelector('img,li,p,td'));let bad=[];"
            "for(let i=0;i<els.length;i++)for(let j=i+1;j<els.length;j++){const a=r(els[i]),b=r(els[j]);"
            "if(Math.min(a.right,b.right)-Math.max(a.left,b.left)>1&&Math.min(a.bottom,b.bottom)-"
            "Math.max(a.top,b.top)>1&&!els[i].contains(els[j])&&!els[j].contains(els[i]))"
            "bad.push([els[i].tagName,els[j].tagName,els[i].textContent.slice(0,40)]);}"
            "const p=document.createElement('pre');p.id='probe';p.textContent=JSON.stringify({imgs,bad,"
            "width:document.documentElement.scrollWidth});document.body.appendChild(p);});</script>"
        )
        checked = tmp_path / f"{name}-checked.html"
        checked.write_text(out.read_text().replace("</body>", probe + "</body>"))
        r = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={tmp_path / 'profile'}",
                "--window-size=1280,2000",
                "--virtual-time-budget=5000",
                "--dump-dom",
                checked.as_uri(),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        found = re.search(r'<pre id="probe">([^<]*)</pre>', r.stdout)
        assert found, r.stderr[-2000:]
        page = json.loads(found.group(1).replace("&quot;", '"'))
        assert page["bad"] == [], (name, page["bad"])
        assert page["width"] <= 1280, name  # nothing wider than the window
        assert page["imgs"] and all(shown >= 0.95 * natural for shown, natural in page["imgs"]), (name, page["imgs"])
    assert drawn and all(pairs == [] for pairs in drawn), drawn
