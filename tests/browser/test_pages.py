"""The browser tier: the pages of real jobs opened as people open them, in Debian's headless
Chromium (through its chromedriver): a 4-rank job whose rank 2 crashed, a stalled job, and a
sweep's page, a log root's index of runs and a run's page load with no console error; their plots render (non-empty SVG, one series per
plotted line); the culprit's row is marked; every link to a rank's log and a point's page
resolves; a sweep's table sorts when its heading is clicked. The jobs run once, side by side."""

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from fixtures.browser import available, chromium, console_errors, open_page, screenshot
from tests.conftest import run_module

pytestmark = pytest.mark.browser

CRASH = ["train.steps=200", "train.fail_at_step=120", "train.fail_rank=2", "train.log_every=20"]
STALL = ["train.steps=100000", "train.log_every=5", "train.hang_at_step=20", "train.hang_rank=1",
         "train.stall_timeout_s=10", "tasks_per_node=2"]  # fmt: skip
RUN = ["train.steps=100", "train.ckpt_every=50", "train.log_every=10", "tasks_per_node=2"]


def page_of(target: Path | str, *flags: str) -> tuple[Path, dict]:
    done = run_module("cluster", "page", str(target), "--json", *flags)
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads(done.stdout)
    return Path(info["page"]), info


@pytest.fixture(scope="module")
def pages(tmp_path_factory):
    """Each scenario's page: (its path, what cluster page --json said)."""
    if why := available():
        pytest.skip(why)
    root = tmp_path_factory.mktemp("pages")

    def job(name: str, overrides: list[str]) -> tuple[str, tuple[Path, dict]]:
        done = run_module("cluster", "submit", "jobs/local.yaml", f"log_dir={root / name}", *overrides, "--json",
                          "--wait", timeout=300)  # fmt: skip
        job_dir = Path(json.loads(done.stdout.splitlines()[0])["log_dir"])
        return name, page_of(job_dir)

    def sweep() -> tuple[str, tuple[Path, dict]]:
        done = run_module("cluster", "sweep", "jobs/local.yaml", f"log_dir={root / 'sweep'}", "train.steps=200",
                          "train.log_every=20", "optim.lr=0.05,0.2", "--max-parallel", "2", "--wait", timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        return "sweep", page_of(next((root / "sweep" / "local").glob("sweep-*")))

    def run() -> tuple[str, tuple[Path, dict]]:
        """A run of two jobs (the second resumed from the first's last checkpoint, trained on) and a
        run that failed, under one log root: the root's index page, and the run's own."""
        where = f"log_dir={root / 'runs'}"
        done = run_module("cluster", "submit", "jobs/local.yaml", where, *RUN, "--json", "--wait", timeout=300)
        first = Path(json.loads(done.stdout.splitlines()[0])["log_dir"])
        done = run_module("cluster", "resume", str(first), "train.steps=200", "--json", "--wait", timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        run_id = json.loads(done.stdout.splitlines()[0])["run"]["id"]
        failed = run_module("cluster", "submit", "jobs/local.yaml", where, *RUN, "train.fail_at_step=30", "--wait",
                            timeout=300)  # fmt: skip
        assert failed.returncode == 1, failed.stderr[-2000:]
        run_page, _ = page_of(run_id, "--log-dir", str(root / "runs"))
        listed = run_module("cluster", "runs", "--log-dir", str(root / "runs"), "--json")
        assert listed.returncode == 0, listed.stderr[-2000:]
        return "run", (run_page, {"index": root / "runs" / "index.html", "runs": json.loads(listed.stdout)})

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(job, "crash", CRASH), pool.submit(job, "stall", STALL), pool.submit(sweep),
                   pool.submit(run)]  # fmt: skip
        return dict(f.result() for f in futures)


@pytest.fixture(scope="module")
def browser():
    if why := available():
        pytest.skip(why)
    with chromium() as driver:
        yield driver


def dom(driver, script: str):
    return driver.execute_script(script)


def charts(driver) -> dict:
    """Each chart's id: its SVG's drawn size, and how many series it says and shows."""
    return dom(
        driver,
        """
        const out = {};
        document.querySelectorAll('figure.chart').forEach(f => {
          const svg = f.querySelector('svg'), box = svg ? svg.getBoundingClientRect() : {width: 0, height: 0};
          out[f.id] = {width: box.width, height: box.height, said: f.dataset.lines ? Number(f.dataset.lines) : null,
                       series: Array.from(f.querySelectorAll('g[id^="series-"]')).filter(
                         g => Array.from(g.querySelectorAll('path')).some(p => (p.getAttribute('d') || '').length > 10)).length,
                       image: f.querySelectorAll('image').length};
        });
        return out;""",
    )


def links_resolve(driver, selector: str) -> list[str]:
    """The links' targets, each checked to be a file (file:// pages: the browser's own URLs)."""
    hrefs = dom(driver, f"return Array.from(document.querySelectorAll('{selector}')).map(a => a.href)")
    paths = [Path(unquote(urlparse(h).path)) for h in hrefs]
    assert paths and all(p.is_file() for p in paths), [str(p) for p in paths if not p.is_file()]
    return hrefs


def test_the_crashed_jobs_page_names_the_failure_and_marks_rank_2(pages, browser, tmp_path):
    page, info = pages["crash"]
    assert info["kind"] == "failed"
    load_ms = open_page(browser, page)
    assert console_errors(browser) == []
    verdict = dom(browser, "return document.getElementById('verdict').textContent")
    assert "DeliberateFailure" in verdict and "rank 2" in verdict
    assert "DeliberateFailure" in dom(
        browser, "return document.getElementById('failure').nextElementSibling.textContent"
    )
    marked = dom(
        browser, "return Array.from(document.querySelectorAll('#rank-table tr.culprit')).map(r => r.dataset.rank)"
    )
    assert marked == ["2"]
    drawn = charts(browser)
    assert set(drawn) == {"metrics-chart", "step-time-chart", "goodput-chart"}
    assert all(c["width"] > 300 and c["height"] > 100 for c in drawn.values()), drawn
    metrics = drawn["metrics-chart"]
    assert metrics["said"] == metrics["series"] >= 4  # local_loss: a line per rank (each its own shard's loss)
    assert drawn["step-time-chart"]["image"] == 2  # the heat map and its colour bar: images, whatever the ranks
    assert len(links_resolve(browser, "a.rank-log")) == 4
    dom(browser, "document.getElementById('merged-log').open = true")
    merged = dom(browser, "return document.querySelector('#merged-log .log').textContent")
    assert "[ranks 0-3]" in merged and "DeliberateFailure" in merged
    screenshot(browser, tmp_path / "crashed.png")
    print(f"loaded in {load_ms:.0f} ms; screenshot {tmp_path / 'crashed.png'}")


def test_the_stalled_jobs_page_names_the_hang_and_marks_its_culprit(pages, browser):
    page, info = pages["stall"]
    assert info["kind"] == "hung", info
    open_page(browser, page)
    assert console_errors(browser) == []
    assert "culprit rank(s) 1" in dom(browser, "return document.getElementById('verdict').textContent")
    row = dom(browser, "return document.querySelector('#rank-table tr[data-rank=\"1\"]').className")
    assert "culprit" in row.split() and "stalled" in row.split()
    frames = dom(browser, "return document.getElementById('frames').textContent")
    assert "hang_here" in frames  # the culprit's stack: where it stopped
    assert all(c["width"] > 300 for c in charts(browser).values())


def test_the_sweeps_page_sorts_links_each_point_and_draws_every_curve(pages, browser, tmp_path):
    page, info = pages["sweep"]
    open_page(browser, page)
    assert console_errors(browser) == []
    points = lambda: dom(
        browser, "return Array.from(document.querySelectorAll('#point-table tbody tr')).map(r => r.dataset.point)"
    )  # noqa: E731
    assert points() == ["0", "1"]
    heading = browser.find_element("xpath", "//table[@id='point-table']//th[text()='point']")
    heading.click()
    heading.click()  # descending
    assert points() == ["1", "0"]
    drawn = charts(browser)
    assert drawn["curves-chart"]["said"] == drawn["curves-chart"]["series"] == 2
    assert drawn["params-chart"]["width"] > 300
    for href in links_resolve(browser, "a.point-page"):
        browser.get(href)  # each point's own page opens, with no console error
        assert console_errors(browser) == [] and re.search("completed", browser.title + browser.page_source)
    open_page(browser, page)
    screenshot(browser, tmp_path / "sweep.png")


def test_the_index_lists_each_run_and_links_every_jobs_page_and_the_runs_own(pages, browser, tmp_path):
    run_page, info = pages["run"]
    assert [(r["jobs"], r["state"]) for r in info["runs"]] == [(1, "FAILED"), (2, "COMPLETED")]  # newest first
    open_page(browser, info["index"])
    assert console_errors(browser) == []
    rows = dom(browser, "return Array.from(document.querySelectorAll('#run-table tbody tr')).map("
                        "r => [r.dataset.state, r.className, r.cells[5].textContent])")  # fmt: skip
    # the failed run stands at its last logged step, before the failure at 30
    assert rows == [["FAILED", "culprit", "20/100"], ["COMPLETED", "", "200/200"]], rows
    assert "train.fail_at_step=30" in dom(browser, "return document.querySelector('#run-table tr.culprit').textContent")
    assert len(links_resolve(browser, "a.job-page")) == 3  # every job's page (--wait wrote them)
    (run_link,) = links_resolve(browser, "a.run-page")
    screenshot(browser, tmp_path / "index.png")
    browser.get(run_link)
    assert console_errors(browser) == [] and unquote(urlparse(browser.current_url).path) == str(run_page)
    figure = dom(browser, "const f = document.getElementById('run-curves'); return [f.dataset.boundaries, "
                          "f.querySelectorAll('g[id^=\"boundary-train_loss-\"]').length]")  # fmt: skip
    assert figure == ["1", 1]  # job 2's start, marked
    drawn = charts(browser)
    assert drawn["run-curves"]["series"] >= 3 and drawn["run-curves"]["width"] > 300, drawn  # a line per metric
    assert len(links_resolve(browser, "a.job-page")) == 2
    screenshot(browser, tmp_path / "run.png")
    print(f"screenshots {tmp_path / 'index.png'} {tmp_path / 'run.png'}")
