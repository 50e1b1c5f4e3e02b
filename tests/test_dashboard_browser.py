"""The served dashboard in a real headless Chromium (Debian's `chromium`, driven by Playwright).

The results folder is made by a real, small tuning run of a tiny model. Chromium is installed by
the project's set-up (.ci/run); when it is missing this test fails rather than skips, so that CI
cannot pass without having looked at the page in a browser.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
from conftest import FIXTURES, serving

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
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
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
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
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
