"""What ``mmrl train`` prints while it runs when stdout is a log file (mmrl.run.progress)."""

import io

from mmrl.run.progress import duration, progress


def test_a_log_gets_plain_lines_on_the_first_step_every_few_steps_on_evaluations_and_the_last():
    out = io.StringIO()
    with progress(total=100, start=0, enabled=True, stream=out) as advance:
        for step in range(1, 101):
            metrics = {"reward/mean": step / 100}
            if step == 33:
                metrics["eval/accuracy"] = 0.5
            advance(step, metrics)
    lines = out.getvalue().splitlines()
    steps = [int(line.split()[1].split("/")[0]) for line in lines]
    assert steps == [1, 5, 10, 15, 20, 25, 30, 33, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 95, 100]
    assert lines[0].startswith("step 1/100 reward 0.010 ") and lines[0].endswith(" left")
    assert " eval 0.500 " in lines[7] and "s/step" in lines[7]
    assert lines[-1].endswith(" 0s left")


def test_a_resumed_run_counts_its_own_steps_and_nothing_is_printed_when_disabled():
    out = io.StringIO()
    with progress(total=10, start=8, enabled=True, stream=out) as advance:
        advance(9, {"reward/mean": 1.0})
        advance(10, {"reward/mean": 1.0})
    assert [line.split()[1] for line in out.getvalue().splitlines()] == ["9/10", "10/10"]
    quiet = io.StringIO()
    with progress(total=10, start=0, enabled=False, stream=quiet) as advance:
        advance(1, {"reward/mean": 1.0})
    assert quiet.getvalue() == ""


def test_durations_read_as_a_person_writes_them():
    assert [duration(s) for s in (4.4, 61, 3599, 3600, 7325)] == ["4s", "1m01s", "59m59s", "1h00m", "2h02m"]
