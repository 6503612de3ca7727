"""The report tests' small run, a reader of a report's page, and a headless browser's screenshot."""
import base64
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

from engine.config.schema import load_config
from engine.run.api import run_experiment
from helpers import one_torch_thread

SMALL = [
    "dataset.name=digits", "model.name=mlp", "clients.num_clients=8", "clients.participation=0.5",
    "rounds=4",
]


def small_run(path: Path, *extra: str) -> Path:
    with one_torch_thread():
        return run_experiment(load_config(None, [*SMALL, *extra]), path)


class PageParser(HTMLParser):
    """Figure ids (with their image), table ids, omitted-panel notes and every src/href."""

    def __init__(self):
        super().__init__()
        self.figures: dict[str, str] = {}
        self.tables: set[str] = set()
        self.omitted: set[str] = set()
        self.links: list[str] = []
        self._figure = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("src", "href"):
            if key in a:
                self.links.append(a[key])
        if tag == "figure":
            self._figure = a.get("id")
        elif tag == "img" and self._figure:
            self.figures[self._figure] = a.get("src", "")
        elif tag == "table" and a.get("id"):
            self.tables.add(a["id"])
        elif tag == "p" and "omitted" in (a.get("class") or ""):
            self.omitted.add(a.get("data-figure"))

    def handle_endtag(self, tag):
        if tag == "figure":
            self._figure = None


def parse_page(path: Path) -> PageParser:
    text = Path(path).read_text(encoding="utf-8")
    p = PageParser()
    p.feed(text)
    # self-contained: no URL to fetch anything from (links, images, scripts, styles)
    assert not [u for u in p.links if not u.startswith("data:")], p.links
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text
    return p


def assert_figures(page: PageParser, html_path: Path, ids) -> None:
    fig_dir = html_path.with_name(html_path.stem + "_figures")
    for fig_id in ids:
        if fig_id.startswith("table-"):
            assert fig_id in page.tables, fig_id
            continue
        assert fig_id in page.figures, f"{fig_id} missing (omitted: {sorted(page.omitted)})"
        src = page.figures[fig_id]
        assert src.startswith("data:image/png;base64,")
        png = base64.b64decode(src.split(",", 1)[1])
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
        assert (fig_dir / f"{fig_id}.png").read_bytes() == png  # the same figure beside the page


BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# the last two: the screenshot waits until the page's images are decoded and drawn (on busy cores
# it was taken with a figure still blank)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--run-all-compositor-stages-before-draw", "--virtual-time-budget=10000"]


def screenshot(html: Path, png: Path, size=(1400, 2400)) -> None:
    browser = next(filter(None, map(shutil.which, BROWSERS)))
    profile = png.parent / "chromium-profile"
    subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                    f"--window-size={size[0]},{size[1]}", html.resolve().as_uri()],
                   check=True, timeout=180, capture_output=True)

