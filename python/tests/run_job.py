"""fleetrun.run from Python, as in a notebook: a small job on this machine.

    python run_job.py WORK_DIR

WORK_DIR holds score.py and data/ (10 files f00..f09; the script drops f03). Prints "ok".
"""

import os
import sys

import fleetrun

work = sys.argv[1]
os.chdir(work)

# A job file, with an override.
with open("job.toml", "w") as f:
    f.write(
        'name = "py-run"\nentry_script = "score.py"\noutput_action = "append_row"\n'
        "mini_batch_size = 5\n[input]\nfiles = \"data\"\n[output]\npath = \"out\"\n"
    )
result = fleetrun.run("job.toml", mini_batch_size=2, error_threshold=5)
assert isinstance(result, fleetrun.RunResult), result
assert result.completed and result.exit_code == 0 and result.cause is None, result
assert result.succeeded_items == 9 and result.failed_items == 1, result
assert result.completed_mini_batches == 5 and result.failed_mini_batches == 1, result
assert os.path.samefile(result.output, os.path.join(work, "out", "parallel_run_step.txt"))
with open(result.output) as f:
    assert sorted(f.read().split()) == [f"f{i:02d}" for i in range(10) if i != 3]
# failed_items.csv names every item of the mini-batch that returned short.
assert sorted(i.item for i in result.failed) == ["f02.txt", "f03.txt"], result.failed
assert all(i.mini_batch == 1 for i in result.failed), result.failed

# A dict, relative paths from the current folder; a failing threshold is returned, not raised.
job = {
    "name": "py-run-dict",
    "entry_script": "score.py",
    "output_action": "append_row",
    "input": {"files": "data"},
    "output": {"path": "out-dict"},
}
failed = fleetrun.run(job, error_threshold=0, progress=False)
assert failed.state == "Failed" and failed.exit_code == 42, failed
assert "error_threshold" in (failed.cause or ""), failed
assert failed.output is None and failed.output_dir.name == "out-dict", failed

# A job that does not validate raises, with fleetrun's message.
try:
    fleetrun.run(dict(job, mini_batch_size=0))
    raise AssertionError("a bad job ran")
except fleetrun.FleetrunError as e:
    assert "mini_batch_size" in str(e), e
print("ok")
