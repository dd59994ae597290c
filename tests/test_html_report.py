"""The run report as a person sees it: a tiny quick start search, its HTML page parsed, its console trees."""

from __future__ import annotations

import base64
import html
import math
import shutil
import subprocess
import xml.etree.ElementTree as ET
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from einspace.cli import main
from einspace.evaluators.base import Cost
from einspace.search.config import parse_experiment
from einspace.search.html_report import diversity, operation_shares, write_html_report
from einspace.search.loop import STORE_NAME, open_store, run_search
from einspace.search.store import Record, SQLiteStore

QUICKSTART = Path(__file__).resolve().parent.parent / "experiments" / "quickstart.yaml"


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    """The quick start experiment made tiny: in-process, 6 evaluations of 1 epoch; a FLOPs budget
    just above the seed's makes its larger mutations fail, so the page has failures to show."""
    raw = yaml.safe_load(QUICKSTART.read_text())
    run_dir = tmp_path_factory.mktemp("quickstart")
    raw.update(run_dir=str(run_dir), executor={"kind": "in_process"})
    raw["strategy"]["settings"].update(evaluations=6, population=3, tournament=2)
    # on the CPU even where a GPU is present: the page is then expected to count CPU seconds
    raw["evaluator"]["settings"].update(epochs=1, max_flops=1_097_000, device="cpu")
    experiment = parse_experiment(raw, str(QUICKSTART))
    store = open_store(experiment)
    try:
        assert run_search(experiment, experiment.make_executor(), store).finished
        history = store.history()
    finally:
        store.close()
    assert {r.status for r in history} >= {"ok", "failed"}
    return run_dir, history


class _Page(HTMLParser):
    """The page's title, headings and images, as a browser would find them."""

    def __init__(self):
        super().__init__()
        self.title = ""
        self.headings: list[str] = []
        self.images: list[dict[str, str]] = []
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))
        self._in = tag

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        if self._in == "title":
            self.title += data
        elif self._in in ("h1", "h2", "h3"):
            self.headings.append(data)


def _decode(src: str) -> tuple[str, bytes]:
    head, _, payload = src.partition(",")
    assert head.startswith("data:image/") and head.endswith(";base64"), head[:40]
    return head[len("data:image/") : -len(";base64")], base64.b64decode(payload, validate=True)


def test_html_report_embeds_every_image_and_names_the_run(quickstart_run, capsys):
    run_dir, history = quickstart_run
    assert main(["report", str(run_dir), "--top", "1", "--html"]) == 0
    out = capsys.readouterr().out
    assert f"wrote {run_dir / 'report.html'}" in out
    page = _Page()
    page.feed((run_dir / "report.html").read_text())
    assert page.title == "einspace run quickstart" and "einspace run quickstart" in page.headings
    sections = ("Fitness over evaluations", "Best so far against compute", "Failures by reason")
    for section in (*sections, "Sizes of the evaluated trees"):
        assert section in page.headings
    assert any(h.startswith("Operations in the top 1 ") for h in page.headings)
    assert "Population diversity over time" in page.headings
    assert sum(h.startswith("#") for h in page.headings) == 1
    # fitness, compute, failures, sizes, operations, diversity; then a tree and a graph per architecture
    assert len(page.images) == 6 + 2
    assert "best so far against compute" in [image["alt"] for image in page.images]
    spent = sum(Cost.from_json(r.cost).compute_seconds for r in history if r.status != "cached")
    assert f"<tr><th>total</th><td>{spent:.1f} s (CPU), " in (run_dir / "report.html").read_text()
    for image in page.images:
        kind, data = _decode(image["src"])
        assert image["alt"] and len(data) > 1000
        if kind == "png":
            assert data[:8] == b"\x89PNG\r\n\x1a\n"
        else:
            assert kind == "svg+xml" and ET.fromstring(data).tag.endswith("svg")


def test_console_report_prints_folded_trees_and_full_text_on_request(quickstart_run, capsys):
    run_dir, history = quickstart_run
    assert main(["report", str(run_dir), "--top", "1", "--no-plot"]) == 0
    folded = capsys.readouterr().out
    assert "    (S\n" in folded and "# folded: " in folded
    assert all(r.tree not in folded for r in history)  # no one-line wall of text
    assert main(["report", str(run_dir), "--top", "1", "--no-plot", "--full"]) == 0
    full = capsys.readouterr().out
    best = max((r for r in history if r.status == "ok"), key=lambda r: (r.fitness, -r.id))
    assert f"    {best.tree}\n" in full


def test_html_compute_table_gives_total_wasted_share_each_fidelity_and_partial_results(tmp_path):
    store = SQLiteStore(tmp_path / STORE_NAME, writer=True)
    store.set_meta("config", "{}")  # no grammar: the page still has its compute section
    for i, (status, fidelity, cpu, partial) in enumerate(
        [("ok", 1, 4.0, False), ("failed", 1, 2.0, False), ("ok", 3, 10.0, True)]
    ):
        fitness = -math.inf if status == "failed" else 0.5
        outcome = dict(status=status, fitness=fitness, partial=partial, cost=Cost(cpu_seconds=cpu).to_json())
        record = Record(i, f"(S t{i})", f"h{i}", "sampled", fidelity=fidelity, **outcome)
        store.submit(record)
        store.finish(record)
    store.close()
    text = write_html_report(tmp_path).read_text()
    rows = [
        ("total", "16.0 s (CPU), 3 evaluated"),
        ("wasted on failures", "2.0 s (12.5%)"),
        ("partial results kept (time budget)", "1"),
        ("best found after", "16.0 s"),
        ("fidelity 1", "2 evaluated, 6.0 s; 0 promoted (0%)"),
        ("fidelity 3", "1 evaluated, 10.0 s"),
    ]
    assert "".join(f"<tr><th>{html.escape(k)}</th><td>{v}</td></tr>" for k, v in rows) in text
    assert "<h3>#1: fitness 0.5, id 2, sampled, fidelity 3, partial (time budget)</h3>" in text
    page = _Page()
    page.feed(text)
    assert "Best so far against compute" in page.headings
    assert [i["alt"] for i in page.images[:2]] == ["fitness over evaluations", "best so far against compute"]


def test_diversity_counts_distinct_trees_and_profile_distance_in_a_window():
    history = [Record(i, "t", h, "sampled", seq=i + 1) for i, h in enumerate("aabc")]
    ops = {"a": Counter(norm=2), "b": Counter(norm=1, linear=1), "c": Counter(linear=2)}
    points = diversity(history, ops, window=2)
    assert [p[1] for p in points] == [1.0, 0.5, 1.0, 1.0]
    # windows: {a}, {a, a}: distance 0; {a, b}: |1 - 1/2| + |0 - 1/2| over 2 = 0.5; {b, c}: 0.5
    assert [p[2] for p in points] == [0.0, 0.0, 0.5, 0.5]


def test_operation_shares_count_terminal_nodes_over_all_trees():
    shares = operation_shares([Counter(norm=2, add=1), Counter(norm=1)])
    assert shares == {"norm": 0.75, "add": 0.25}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium package")
def test_report_page_renders_in_a_headless_browser(quickstart_run, tmp_path):
    from PIL import Image

    run_dir, _ = quickstart_run
    assert main(["report", str(run_dir), "--top", "2", "--no-plot", "--html", str(tmp_path / "r.html")]) == 0
    shot = tmp_path / "shot.png"
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",  # this machine's closed network refuses them
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1280,3000",
        f"--screenshot={shot}",
    ]
    page = (tmp_path / "r.html").as_uri()
    subprocess.run(["chromium", *flags, page], check=True, capture_output=True, timeout=120)
    with Image.open(shot) as image:
        colours = image.convert("RGB").resize((64, 150)).getcolors(64 * 150)
    assert image.size == (1280, 3000) and len(colours) > 50  # a page with pictures, not a blank one
