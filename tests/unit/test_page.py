"""``cluster page``: the job's and the sweep's pages, as files (the browser tier opens them in
Chromium), and the TensorBoard events written beside them, read back with TensorBoard's own
``EventAccumulator``; bad input renders, escaped, and what is not a job exits 2."""

import json
import re
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from fixtures.synthetic import make_job, make_sweep
from tests.conftest import run_module
from train.contract.protocol import TENSORBOARD


class Links(HTMLParser):
    """Every href, and the classes and data-rank of every table row."""

    def __init__(self):
        super().__init__()
        self.hrefs, self.rows = [], {}

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])
        if tag == "tr" and "data-rank" in attrs:
            self.rows[int(attrs["data-rank"])] = (attrs.get("class") or "").split()


def parsed(page: Path) -> Links:
    links = Links()
    links.feed(page.read_text())
    return links


def page_of(target: Path, *extra: str) -> tuple[dict, Path]:
    result = run_module("cluster", "page", str(target), "--json", *extra)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    return info, Path(info["page"])


def scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def as_program(job: Path, metrics: dict[int, list[str]]) -> Path:
    """A synthetic job turned into a program's, each rank's metrics file holding these lines."""
    plan = json.loads((job / "plan.json").read_text())
    plan["program"] = {"kind": "script", "target": "train.py", "args": []}
    (job / "plan.json").write_text(json.dumps(plan))
    for rank, lines in metrics.items():
        (job / f"rank_{rank:05d}.metrics.jsonl").write_text("".join(line + "\n" for line in lines))
    return job


def test_a_crashed_jobs_page_names_the_failure_marks_the_culprit_and_links_every_log(tmp_path):
    job = make_job(tmp_path / "crash" / "1", world=4, lines=30, crash_rank=2, slow_rank=3)
    info, page = page_of(job)
    assert page == job / "page.html" and info["kind"] == "failed" and "rank 2" in info["verdict"]
    html = unescape(page.read_text())
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in html
    assert 'File "/home/user/project/train/loop.py", line 42, in train' in html and "loss = model(x)" in html
    links = parsed(page)
    assert links.rows[2] == ["culprit"] and "straggler" in links.rows[3] and links.rows[0] == []
    logs = [h for h in links.hrefs if h.endswith(".log")]
    assert sorted(set(logs)) == [f"rank_{r:05d}.log" for r in range(4)]
    assert all((page.parent / h).exists() for h in links.hrefs)
    assert html.count("<svg") == 3 and not re.search(r"""(src|href)=["']?https?:|url\((?!#)|@import|<link""", html)
    assert html.count("<script") == 1  # the page's own (sortable tables) and nothing else


def test_a_page_written_elsewhere_links_back_to_the_job(tmp_path):
    job = make_job(tmp_path / "j" / "1", world=2, lines=5)
    _, page = page_of(job, "-o", str(tmp_path / "elsewhere" / "p.html"))
    assert all((page.parent / h).exists() for h in parsed(page).hrefs)


def test_bad_input_renders_escaped(tmp_path):
    """No records yet; a log cut mid-line; metric lines with nan, with text, with a name that is
    HTML: the page renders, shows them as text, and every link resolves."""
    empty = make_job(tmp_path / "empty" / "1", world=2, lines=3)
    for f in empty.glob("rank_*"):
        f.unlink()
    info, page = page_of(empty)
    assert "<svg" in page.read_text() and info["kind"] in ("unknown", "failed")

    job = make_job(tmp_path / "bad" / "1", world=2, lines=10)
    log = job / "rank_00000.log"
    log.write_bytes(log.read_bytes() + b"2026-01-01T12:00:11.000 a line cut mid-wr")
    as_program(job, {0: ['{"step": 1, "time": 1, "values": {"loss": 2.0, "<script>alert(1)</script>": 1.0}}',
                         '{"step": 2, "time": 2, "values": {"loss": "nan", "acc": "x"}}',
                         '{"step": 3, "time": 3, "values": {"loss": 1.5}', "not json"]})  # fmt: skip
    _, page = page_of(job)
    html = page.read_text()
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "a line cut mid-wr" in html
    assert all((page.parent / h).exists() for h in parsed(page).hrefs)


@pytest.mark.parametrize("target", ["empty", "file", "missing"])
def test_a_page_of_what_is_not_a_job_exits_2_naming_it(tmp_path, target):
    path = tmp_path / target
    if target == "empty":
        path.mkdir()
    elif target == "file":
        path.write_text("x")
    result = run_module("cluster", "page", str(path))
    assert result.returncode == 2 and str(path) in result.stderr and "Traceback" not in result.stderr


def test_tensorboard_shows_a_programs_series_the_ranks_step_times_and_the_goodput(tmp_path):
    job = make_job(tmp_path / "prog" / "1", world=2, lines=30)
    as_program(job, {0: [json.dumps({"step": s, "time": s, "values": {"loss": 1.0 / s}}) for s in (5, 10, 15)]})
    page_of(job)
    found = scalars(job / TENSORBOARD)
    assert found["metrics/loss"] == [
        (5, pytest.approx(1 / 5)),
        (10, pytest.approx(1 / 10)),
        (15, pytest.approx(1 / 15)),
    ]
    assert [s for s, _ in found["step_time_ms/median"]] == [3, 6, 9, 12, 15, 18, 21, 24, 27]
    assert all(v == pytest.approx(10.0) for _, v in found["step_time_ms/slowest"])
    assert "goodput/ettr" in found and "goodput/productive_s" in found
    page_of(job)  # written again: one file of the kit's, the same points
    assert len(list((job / TENSORBOARD).glob("*.kit"))) == 1 and scalars(job / TENSORBOARD) == found


def test_a_sweeps_page_links_each_points_page_and_marks_the_best(tmp_path):
    sweep = make_sweep(tmp_path / "sweep", ["ok", "crash", "ok", "ok"])
    info, page = page_of(sweep.path)
    html = page.read_text()
    assert page == sweep.path / "page.html" and info["kind"] == "sweep"
    pages = [h for h in parsed(page).hrefs if h.endswith("page.html")]
    assert len(pages) == 4 and all((page.parent / h).exists() for h in pages)
    best = re.search(r'<tr class="best[^"]*" data-point="(\d+)"', html)
    assert best and best.group(1) == "3"  # point i's test_loss is 1 - 0.1 i
    assert 'id="series-point-3"' in html  # every point's curve; the best one named
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    point = Path(json.loads((sweep.path / "jobs.jsonl").read_text().splitlines()[0])["job_dir"])
    acc = EventAccumulator(str(point / TENSORBOARD))
    acc.Reload()
    assert "hparams" in acc.PluginTagToContent("hparams") or acc.PluginTagToContent("hparams")


def test_the_table_of_a_large_job_shows_what_stands_out_and_links_every_log(tmp_path):
    from cluster.views import job_page

    job = make_job(tmp_path / "big" / "1", world=40, lines=5, crash_rank=21, slow_rank=30)
    original = job_page.TABLE_ROWS
    job_page.TABLE_ROWS = 20
    try:
        from cluster.jobdir import JobDir
        from cluster.views.job_page import Reading, write_job_page

        page, view = write_job_page(Reading.of(JobDir(job), running=False))
    finally:
        job_page.TABLE_ROWS = original
    shown = [r["rank"] for r in view["ranks"]]
    assert len(shown) == 20 and 21 in shown and 30 in shown and {0, 39} <= set(shown)
    assert len(view["all_logs"]) == 40 and all((page.parent / link).exists() for _, link in view["all_logs"])
