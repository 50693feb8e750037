"""Metric series from what programs print (``train.contract.metrics``), table-tested on the shapes of
the trainers people use, and the tap that keeps them one record per step."""

import json
import math

import pytest

from train.contract.metrics import MetricsTap, parse_line, read_value

NAN = float("nan")


@pytest.mark.parametrize(
    "line, expected",
    [
        # nanoGPT: its training line and its evaluation line
        ("iter 10: loss 4.1886, time 16.00ms, mfu 12.50%", (10, {"loss": 4.1886, "time": 16.0, "mfu": 12.5})),
        ("step 0: train loss 4.2874, val loss 4.2823", (0, {"train_loss": 4.2874, "val_loss": 4.2823})),
        # torchtitan, after its logger's prefix, its colours, its padding and thousands
        ("[titan] 2025-01-01 12:00:00,000 - root - INFO - \x1b[31mstep:  1  \x1b[32mloss:  8.1234  \x1b[33m"
         "grad_norm:  1.2345  \x1b[35mmemory: 10.50GiB(11.03%)  tps: 1,234  mfu: 5.74%\x1b[39m",
         (1, {"loss": 8.1234, "grad_norm": 1.2345, "memory": 10.5, "tps": 1234.0, "mfu": 5.74})),
        # Hugging Face's Trainer: a dict's repr, numbers as strings, no step of its own
        ("{'loss': '4.704', 'grad_norm': 2.1, 'learning_rate': 4.5e-05, 'epoch': 0.16}",
         (None, {"loss": 4.704, "grad_norm": 2.1, "learning_rate": 4.5e-05, "epoch": 0.16})),
        ('{"step": 10, "loss": 1.2, "name": "x"}', (10, {"loss": 1.2})),  # JSON; a text field is no metric
        ("Epoch 0:  45%|####      | 45/100 [00:01<00:02, 30.00it/s, v_num=0, loss=0.123]",
         (None, {"v_num": 0.0, "loss": 0.123})),  # Lightning's progress-bar postfix
        ("global_step=7 loss=1,234.5 lr=3e-4", (7, {"loss": 1234.5, "lr": 3e-4})),
        ("                 train_loss: 0.907", (None, {"train_loss": 0.907})),  # rich's bar (Lightning's default), its last line
        ("step: 3 loss: 0.5", (3, {"loss": 0.5})),
        ("step=5 loss=nan", (5, {"loss": NAN})),  # kept: a loss that turned nan is what one looks for
        ("iter 5: loss inf, time 3ms", (5, {"loss": math.inf, "time": 3.0})),
        ('{"<script>": 1.0}', (None, {"<script>": 1.0})),  # a name is data: the page escapes it
        # no metrics
        ("loss=<script>", None), ("loss=abc", None), ("Loaded 50000 samples", None), ("step 3 done", None),
        ("tokens per iteration will be: 32,768", None), ("rank 0/4 on host", None), ("a==b", None), ("", None),
        ("{'x': __import__('os')}", None),  # a log is data, never code
        ("`Trainer.fit` stopped: `max_steps=30` reached.", None), ("Total params: 9", None),
    ],
)  # fmt: skip
def test_a_line_is_read_as_the_trainers_print_it(line, expected):
    found = parse_line(line)
    if expected is None:
        assert found is None
        return
    step, values = found
    assert step == expected[0]
    assert values.keys() == expected[1].keys()
    for name, value in expected[1].items():
        assert values[name] == value or (math.isnan(value) and math.isnan(values[name])), name


def records(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_tap_keeps_one_record_per_step_the_step_counted_where_the_line_names_none(tmp_path):
    """A progress bar redrawn at every batch and two dicts of one step merge into that step's
    record, written when the step moves on; a line naming its step keeps it."""
    counted = iter([0, 3, 3, 3, 4])
    tap = MetricsTap(str(tmp_path / "m.jsonl"), lambda: next(counted))
    tap.line("Namespace(lr=0.1, batch_size=64)")  # before the first step: step 0
    tap.line("45/100 [00:01, loss=0.5]")
    tap.line("46/100 [00:01, loss=0.4]")
    tap.line("{'eval_loss': '0.9', 'epoch': 1.0}")
    tap.line("iter 40: loss 0.3")  # its own step
    tap.line("loss=0.2")
    tap.line("nothing here")
    tap.flush()
    steps = [(r["step"], r["values"]) for r in records(tmp_path / "m.jsonl")]
    assert steps == [(0, {"lr": 0.1, "batch_size": 64.0}), (3, {"loss": 0.4, "eval_loss": 0.9, "epoch": 1.0}),
                     (40, {"loss": 0.3}), (4, {"loss": 0.2})]  # fmt: skip


def test_without_a_step_count_a_metric_lines_number_stands_for_it_and_nan_survives_the_file(tmp_path):
    """A ``command`` (nothing counts its steps): its metric lines' numbers; nan and inf are
    written as strings (JSON has no nan) and read back as floats."""
    tap = MetricsTap(str(tmp_path / "m.jsonl"), lambda: None)
    for line in ("loss=1.0", "loss=nan", "loss=-inf"):
        tap.line(line)
    tap.flush()
    got = [(r["step"], read_value(r["values"]["loss"])) for r in records(tmp_path / "m.jsonl")]
    assert got[0] == (1, 1.0) and got[1][0] == 2 and math.isnan(got[1][1]) and got[2] == (3, -math.inf)


def test_a_tap_that_cannot_write_stops_and_says_why(tmp_path):
    tap = MetricsTap(str(tmp_path / "no-such-dir" / "m.jsonl"), lambda: 1)
    tap.line("loss=1.0")
    tap.flush_quietly()
    tap.line("loss=2.0")
    assert tap.stopped and "FileNotFoundError" in tap.stopped and tap.pending is None
