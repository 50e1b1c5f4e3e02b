"""The served dashboard in a real headless Chromium (Debian's `chromium`, driven by Playwright).

The results folder is made by a real, small tuning run of a tiny model. Chromium is installed by
the project's set-up (.ci/run); when it is missing this test fails rather than skips, so that CI
cannot pass without having looked at the page in a browser.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

import pytest
from conftest import FIXTURES, serving
from PIL import Image

from tpu_tuner.cli import main

CHROMIUM = "/usr/bin/chromium"
# No sandbox (containers run as root), no GPU, and none of Chromium's own background connections,
# which this machine's network refuses.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session")
def real_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder holding one real tuning run of the tiny MLP (3 settings, 4 verify rounds)."""
    root = tmp_path_factory.mktemp("results")
    status = main(
        [
            "-q",
            str(FIXTURES / "tiny_mlp_benchmark.py"),
            "--trials",
            "3",
            "--verify-rounds",
            "4",
            "--space",
            "precision",
            "--out",
            str(root),
        ]
    )
    assert status == 0
    return root


@pytest.fixture
def server(real_results):
    with serving(real_results) as server:
        yield server


def _page(browser, problems: list[str]):
    """A 1400 x 1000 page whose console errors and page errors are appended to `problems`."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    return page


def test_dashboard_in_headless_chromium(server, real_results, tmp_path) -> None:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail("chromium is not installed: run .ci/run, or apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    (run_dir,) = [p for p in real_results.iterdir() if p.is_dir()]
    config = tomllib.loads((run_dir / "tuned_config.toml").read_text())
    tuned = config["provenance"].get("tuned") or config["provenance"]["baseline"]
    report_title = (run_dir / "report.md").read_text().splitlines()[0]

    problems: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = _page(browser, problems)
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            response = page.goto(server.url, wait_until="load")
            assert response is not None and response.status == 200

            row = page.locator(f'#runs tbody tr[data-run="{run_dir.name}"]')
            assert row.count() == 1
            assert row.locator("td.mfu").inner_text() == f"{tuned['mfu']:.1%}"
            assert row.locator("td").nth(2).inner_text() == "tiny_mlp_benchmark"
            # Every plot decoded into a real image (natural width > 0), none broken.
            widths = page.eval_on_selector_all("img", "imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")
            assert len(widths) >= 4 and min(widths) > 0
            # Shown at their own size on a 1400 px page: their labels are sized for that (at least 10 px,
            # tests/test_dashboard_figures.py), and a shrunk image would shrink them.
            shown = page.eval_on_selector_all("img", "imgs => imgs.map(i => [i.clientWidth, i.naturalWidth])")
            assert all(client == natural for client, natural in shown), shown
            # Sorting: a click on the MFU header marks it sorted.
            header = page.locator("#runs th", has_text="MFU").nth(1)
            header.click()
            assert header.get_attribute("aria-sort") == "ascending"

            page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)

            with page.expect_navigation():
                row.locator("a").first.click()
            assert page.url == f"{server.url}{run_dir.name}/report.md"
            assert report_title in page.locator("body").inner_text()
        finally:
            browser.close()
    assert problems == []
    assert (tmp_path / "dashboard.png").stat().st_size > 10_000


def test_ranking_in_headless_chromium(tmp_path) -> None:
    """The 'Which TPU to rent' section of a ranking folder (tpu-tune plan --topology A,B,...): its
    table sorts, its chart decodes, and a slice's best point links to that slice's plan.md."""
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail("chromium is not installed: run .ci/run, or apt-get install -y chromium")
    from helpers.common import write_ranking_folder
    from playwright.sync_api import sync_playwright

    folder = write_ranking_folder(tmp_path, ["v5p-8", "v5p-16", "tpu7x-8"])
    problems: list[str] = []
    with serving(tmp_path) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = _page(browser, problems)
            assert page.goto(server.url, wait_until="load").status == 200
            table = page.locator("table.ranking")
            topologies = lambda: table.locator("tbody tr td:nth-child(2)").all_inner_texts()  # noqa: E731
            assert topologies() == ["v5p-8", "tpu7x-8", "v5p-16"]
            assert table.locator("tbody tr").first.locator("td").nth(6).inner_text() == "41.0% ± 4.0"
            # Sorted by tokens/s per chip, least first: tpu7x-8 (1e5 / 8) before v5p-8 (1e5 / 4); no figure last.
            header = table.locator("th", has_text="tokens/s per chip")
            header.click()
            assert header.get_attribute("aria-sort") == "ascending" and topologies() == ["tpu7x-8", "v5p-8", "v5p-16"]
            chart = page.locator("section.ranking img")
            assert chart.evaluate("i => i.complete ? i.naturalWidth : 0") > 0
            page.screenshot(path=str(tmp_path / "ranking.png"), full_page=True)
            with page.expect_navigation():
                table.locator("a", has_text="data 1 x fsdp 4").first.click()
            assert page.url == f"{server.url}{folder.name}/gpt_70b-plan-v5p-8-20261202-000000/plan.md"
        finally:
            browser.close()
    assert problems == []


# The chip and CPU runs the dashboard is shown (tests/fixtures/dashboard_runs/README.md): a tuning run on
# a lent TPU v5e, a profile and a bucketing run on this host, each folder as its command wrote it.
DASHBOARD_RUNS = FIXTURES / "dashboard_runs"


def _expected_devices() -> dict[str, str]:
    """Each run's device as its own files name it: kind and name."""
    tune = tomllib.loads((DASHBOARD_RUNS / "llama-tune-20261207-000235" / "tuned_config.toml").read_text())
    profile = json.loads((DASHBOARD_RUNS / "gpt-20261207-030146" / "profile.json").read_text())
    buckets = json.loads((DASHBOARD_RUNS / "encoder-buckets-20261207-030503" / "buckets.json").read_text())
    return {
        "llama-tune-20261207-000235": f"{tune['device_kind']}: {tune['provenance']['device']}",
        "gpt-20261207-030146": f"{profile['device']['kind']}: {profile['device']['name']}",
        "encoder-buckets-20261207-030503": f"{buckets['device']}: {buckets['device_name']}",
    }


def _inked(image: Image.Image) -> tuple[float, int]:
    """The share of an image's pixels that are not near-white, and how many colours it holds."""
    grey = image.convert("L")
    pixels = grey.width * grey.height
    dark = sum(count for level, count in enumerate(grey.histogram()) if level < 235)
    return dark / pixels, len(image.convert("RGB").getcolors(maxcolors=1 << 16) or [])


def test_chip_and_cpu_runs_in_headless_chromium(tmp_path) -> None:
    """Issue 69, item 6: the chip's tuning run and the host's profile and bucketing run on one page:
    every row names its device, each MFU says whose peak it is of, and the chip's MFU and the host's
    are drawn in a figure each (one section per device kind), which the screenshot shows, inked."""
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail("chromium is not installed: run .ci/run, or apt-get install -y chromium")
    from playwright.sync_api import sync_playwright

    devices = _expected_devices()
    tuned = tomllib.loads((DASHBOARD_RUNS / "llama-tune-20261207-000235" / "tuned_config.toml").read_text())
    shot = tmp_path / "chip_and_cpu.png"
    problems: list[str] = []
    with serving(DASHBOARD_RUNS) as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = _page(browser, problems)
            page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))
            assert page.goto(server.url, wait_until="load").status == 200

            # Every row, tuning, profile and bucketing alike, names its device: kind and name.
            rows = page.locator("#runs tbody tr")
            shown = {row.get_attribute("data-run"): row.locator("td.device").inner_text() for row in rows.all()}
            assert shown == devices
            chip = page.locator('#runs tr[data-run="llama-tune-20261207-000235"]')
            assert chip.get_attribute("data-device-kind") == "tpu"
            assert chip.locator("td.mfu").inner_text() == f"{tuned['provenance']['tuned']['mfu']:.1%}" == "11.7%"
            # Each MFU says whose peak it is of: the chip's spec, the host's measurement.
            assert chip.locator("td.peak").inner_text() == "197 TFLOP/s bfloat16, spec"
            assert "TPU v5e's 197 TFLOP/s bfloat16, spec peak" in chip.locator("td.mfu").get_attribute("title")
            host = page.locator('#runs tr[data-run="gpt-20261207-030146"]')
            assert host.locator("td.mfu").inner_text() == "4.8%"
            assert host.locator("td.peak").inner_text() == "153 GFLOP/s float32, measured"
            assert "measured roofline probe" in host.locator("td.peak").get_attribute("title")
            assert page.locator('#runs tr[data-run="encoder-buckets-20261207-030503"] td.mfu').inner_text() == "–"

            # One MFU section a device kind, chips first, each headed by whose peaks its MFU is of.
            kinds = page.locator("section.mfu-kind")
            assert [k.get_attribute("data-device-kind") for k in kinds.all()] == ["tpu", "cpu"]
            headings = kinds.locator("h3").all_inner_texts()
            assert headings[0] == "TPU runs: MFU of each chip's own spec peak (TPU v5e: 197 TFLOP/s bfloat16)"
            assert headings[1].startswith("CPU runs: MFU of each host's own measured peak (Intel(R) Xeon(R)")
            for kind in kinds.all():
                images = kind.locator("img")
                assert images.count() == 2  # MFU over time, best MFU per model
                assert min(images.evaluate_all("imgs => imgs.map(i => i.complete ? i.naturalWidth : 0)")) > 0
                # Side by side at their own size: a kind's two figures on one row, neither shrunk.
                shown = images.evaluate_all("imgs => imgs.map(i => [i.y, i.clientWidth, i.naturalWidth])")
                assert shown[0][0] == shown[1][0] and all(client == natural for _, client, natural in shown), shown
            # The buckets section names its device too.
            assert devices["encoder-buckets-20261207-030503"] in page.locator("section.buckets h3").inner_text()

            page.screenshot(path=str(shot), full_page=True)
            # Where each device kind's figures lie on the page (page coordinates: the full-page shot's).
            boxes = page.eval_on_selector_all(
                "section.mfu-kind .figs",
                "els => els.map(e => { const r = e.getBoundingClientRect();"
                " return [r.left + scrollX, r.top + scrollY, r.right + scrollX, r.bottom + scrollY]; })",
            )
        finally:
            browser.close()
    assert problems == []

    image = Image.open(shot)
    assert image.width == 1400 and image.height > 1000
    ink, colours = _inked(image)
    assert ink > 0.05 and colours > 50, (ink, colours)  # not a blank page
    (tpu_box, cpu_box) = [tuple(round(v) for v in box) for box in boxes]
    assert tpu_box[3] <= cpu_box[1]  # the chip's figures above the host's, apart
    for box in (tpu_box, cpu_box):
        panel = image.crop(box).convert("RGB")
        ink, colours = _inked(panel)
        # Both panels drawn in the screenshot: axes, labels and the runs' own marks (their lines,
        # points and bars in matplotlib's first colour), not an empty frame.
        data = sum(count for count, rgb in panel.getcolors(maxcolors=1 << 16) if _near(rgb, DATA_BLUE))
        assert panel.height > 150 and ink > 0.03 and colours > 30 and data > 100, (panel.size, ink, colours, data)


DATA_BLUE = (31, 119, 180)  # matplotlib's tab:blue, the first run's line and the bars


def _near(rgb: tuple[int, int, int], target: tuple[int, int, int], within: int = 12) -> bool:
    return all(abs(a - b) <= within for a, b in zip(rgb, target))
