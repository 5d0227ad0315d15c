"""fleetrun vs multiprocessing.Pool(2) and one plain Python loop: the benchmark driver
(bench/run.sh runs it).

    python3 bench/measure.py [--quick] [--files N] [--flat-files N] [--large-files N] [--reps K]
                             [--cases a,b] [--pool-only] [--bin-dir DIR]

For every case (an entry script + a fleetrun job file running it), each repetition
runs the Pool baseline, the one-loop baseline (cases that have it) and fleetrun on the
same input, rotating which goes first, and times each as a whole child process, start-up
and listing and writing the output included (wall clock, and the peak RSS of its biggest
process via os.wait4, which covers every descendant it reaped). It checks that every
output has one line per input file and the same lines, then prints a table of medians,
fleetrun's speed as a ratio of each baseline measured in the same run. Exit status: 0 all good; 1 a run failed or the outputs differ; 3 the
fleetrun binary is missing.

To add a row (e.g. the same job through RabbitMQ + Redis), append a Case to CASES:
give it its own job file and, if it needs more than `fleetrun run JOB`, a `command`;
`skip` tells why it cannot run here (a missing broker, say), or None.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import tomllib
from typing import Callable, Optional

import gen_csv
import gen_data

BENCH = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH)
WORK = os.path.join(BENCH, "work")
# The release build's binaries: $CARGO_TARGET_DIR/release when that is set (--bin-dir
# picks another folder).
BIN_DIR = os.path.join(os.environ.get("CARGO_TARGET_DIR") or os.path.join(ROOT, "target"),
                       "release")
FLEETRUN = os.path.join(BIN_DIR, "fleetrun")
RUNNER = os.path.join(BIN_DIR, "fleetrun-runner")


@dataclasses.dataclass
class Case:
    name: str
    script: str  # entry script in bench/, run by both sides
    job: str  # fleetrun job file in bench/ (its input must be work/data)
    # argv of the fleetrun side; default: fleetrun run <job>
    command: Optional[Callable[["Case"], list[str]]] = None
    # why this case cannot run here, or None
    skip: Callable[[], Optional[str]] = lambda: None
    # a tabular case: its input is one CSV of TABULAR_ROWS_PER_FILE x files rows, and its
    # baseline pandas read_csv chunks in a Pool (pool_tabular.py)
    tabular: bool = False
    # its input is --flat-files files in one folder (work/data-flat), not --files in
    # folders of 1,000
    flat: bool = False
    # its input is --large-files files in folders of 1,000 (work/data-large)
    large: bool = False
    # also measured against one plain Python loop (loop_baseline.py)
    loop: bool = False
    # what runs around all of the case's repetitions, outside the timed runs (a replica of
    # the ledger's Redis, started and synced once)
    around: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    def job_path(self) -> str:
        return os.path.join(BENCH, self.job)

    def fleetrun_argv(self) -> list[str]:
        if self.command is not None:
            return self.command(self)
        return [FLEETRUN, "run", self.job_path()]

    def fleetrun_output(self) -> tuple[str, str]:
        """(output folder, append_row file) as the job file says."""
        with open(self.job_path(), "rb") as f:
            job = tomllib.load(f)
        out_dir = os.path.join(BENCH, job["output"]["path"])
        name = job.get("append_row_file_name", "parallel_run_step.txt")
        return out_dir, os.path.join(out_dir, name)


def broker_reachable() -> Optional[str]:
    """Why the distributed rows cannot run, or None (they need scripts/services.sh's servers)."""
    import socket
    for port in (5673, 6390):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except OSError:
            return f"nothing listens on 127.0.0.1:{port}; run scripts/services.sh start"
    return None


def distributed(c: "Case") -> list[str]:
    return [sys.executable, os.path.join(BENCH, "fleet_run.py"), c.job_path()]


def ledger_replica() -> contextlib.AbstractContextManager:
    """A replica of the ledger's Redis for all of a case's repetitions: every recording waits
    for it. Started, and synced (a full copy of the ledger's Redis), before the first timed
    run, so that no run's time holds the copy."""
    import fleet_run
    return fleet_run.replica_of(fleet_run.fleet_env()["FLEETRUN_REDIS_URL"])


# The tabular row: rows per benchmark "file" (1,000,000 rows by default), and the chunk
# size both sides use (job-tabular.toml's mini_batch_size).
TABULAR_ROWS_PER_FILE = 50
TABULAR_CHUNK_BYTES = 256 << 10


def tabular_pandas() -> Optional[str]:
    """Why the tabular row cannot run, or None (it needs pandas here and in the runner's Python)."""
    try:
        import pandas  # noqa: F401
    except ImportError:
        return "pandas is not installed (scripts/install-deps.sh installs it)"
    return None


CASES = [
    Case("trivial", "trivial.py", "job-trivial.toml", loop=True),
    # One folder of 300,000 files (--flat-files): listing a large folder, and the most
    # mini-batches per second fleetrun is asked for.
    Case("trivial-flat", "trivial.py", "job-trivial-flat.toml", flat=True, loop=True),
    Case("sleep1ms", "sleep1ms.py", "job-sleep1ms.toml"),
    # The same jobs through RabbitMQ + Redis: one fleetrun-worker with 2 processes. The
    # trivial one over --large-files (100,000), the size the fleet's rate is judged at:
    # what a fleet job costs once (a worker's start, the job's queue, finalizing) weighs
    # about half a second, a quarter of a 20,000-file run.
    Case("trivial-distributed", "trivial.py", "job-trivial-distributed.toml",
         command=distributed, skip=broker_reachable, large=True),
    # The same, the ledger's Redis with one replica: each recording is believed once the
    # replica has it (WAIT), the failover-safe ledger's cost.
    Case("trivial-replicated", "trivial.py", "job-trivial-distributed.toml",
         command=distributed, around=ledger_replica, skip=broker_reachable, large=True),
    Case("sleep1ms-distributed", "sleep1ms.py", "job-sleep1ms-distributed.toml",
         command=distributed, skip=broker_reachable),
    # The same with a replica of the ledger's Redis: what the replicas' wait costs a job
    # whose run() does work (10 ms per mini-batch).
    Case("sleep1ms-replicated", "sleep1ms.py", "job-sleep1ms-distributed.toml",
         command=distributed, around=ledger_replica, skip=broker_reachable),
    # A CSV, 1 ms per 100 rows, against pandas read_csv(chunksize=...) in Pool(2).
    Case("tabular-csv", "sleep_rows.py", "job-tabular.toml", skip=tabular_pandas, tabular=True),
]


@dataclasses.dataclass
class Run:
    wall_s: float
    maxrss_mb: float
    returncode: int
    log: str


# Runs the timed commands. A child's peak RSS (ru_maxrss) counts its parent's at the fork,
# exec or not, so the children are forked by this small process, started before the
# driver holds anything (a listing of 300,000 files, say): its own ~10 MB is the floor.
_LAUNCHER = r"""
import json, os, subprocess, sys, time
for line in sys.stdin:
    argv, log_path, cwd = json.loads(line)
    with open(log_path, "wb") as log:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=cwd)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    print(json.dumps([wall, usage.ru_maxrss, os.waitstatus_to_exitcode(status)]), flush=True)
"""
_launcher: Optional[subprocess.Popen] = None


def start_launcher() -> None:
    global _launcher
    # fleetrun's default Python is `python3` on PATH: the interpreter the baselines run goes
    # first, as in an activated environment, so both sides start the same Python the same
    # way (not one of them through a version manager's shim; see docs/benchmarks.md).
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    _launcher = subprocess.Popen([sys.executable, "-c", _LAUNCHER], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env)


def timed(argv: list[str], log_path: str) -> Run:
    """Run argv as a child, output to log_path; wall time and peak RSS (MB) of the
    biggest process in its tree (ru_maxrss from wait4 includes reaped descendants)."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    if _launcher is None:
        start_launcher()
    _launcher.stdin.write(json.dumps([argv, log_path, ROOT]) + "\n")
    _launcher.stdin.flush()
    wall, maxrss_kb, returncode = json.loads(_launcher.stdout.readline())
    return Run(wall, maxrss_kb / 1024.0, returncode, log_path)


def tail(path: str, n: int = 15) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read().splitlines()


def compare(case: Case, pool_out: str, fr_out: str, n_files: int) -> list[str]:
    """Problems with the two outputs (empty when they agree), found in a child process:
    a child's peak RSS (ru_maxrss) starts from its parent's at the fork, so this process
    must not grow by holding 300,000 lines, or every side measured after would seem to."""
    import multiprocessing
    with multiprocessing.get_context("fork").Pool(1) as checker:
        return checker.apply(_compare, (pool_out, fr_out, n_files))


def _compare(pool_out: str, fr_out: str, n_files: int) -> list[str]:
    problems = []
    pool_lines = read_lines(pool_out)
    if len(pool_lines) != n_files:
        problems.append(f"pool output has {len(pool_lines)} lines, expected {n_files}")
    if not os.path.isfile(fr_out):
        return problems + [f"fleetrun output {fr_out} does not exist"]
    fr_lines = read_lines(fr_out)
    if len(fr_lines) != n_files:
        problems.append(f"fleetrun output has {len(fr_lines)} lines, expected {n_files}")
    if sorted(fr_lines) != sorted(pool_lines):
        only_fr = sorted(set(fr_lines) - set(pool_lines))
        only_pool = sorted(set(pool_lines) - set(fr_lines))
        problems.append(
            f"sorted lines differ: {len(only_fr)} only in fleetrun "
            f"(e.g. {only_fr[:2]}), {len(only_pool)} only in pool (e.g. {only_pool[:2]})"
            + ("; same set, different multiplicity (duplicates?)"
               if not only_fr and not only_pool else ""))
    return problems


def run_case(case: Case, reps: int, n_files: int, pool_only: bool) -> dict:
    out_dir, fr_out = case.fleetrun_output()
    pool_out = os.path.join(WORK, f"out-{case.name}-pool", "parallel_run_step.txt")
    loop_out = os.path.join(WORK, f"out-{case.name}-loop", "parallel_run_step.txt")
    script = os.path.join(BENCH, case.script)
    data = (gen_data.FLAT_DATA if case.flat
            else gen_data.LARGE_DATA if case.large else gen_data.DEFAULT_DATA)
    pool_argv = [sys.executable, os.path.join(BENCH, "pool_baseline.py"),
                 "--script", script, "--data", data, "--out", pool_out,
                 "--processes", "2", "--mini-batch-size", "10"]
    loop_argv = [sys.executable, os.path.join(BENCH, "loop_baseline.py"),
                 "--script", script, "--data", data, "--out", loop_out,
                 "--mini-batch-size", "10"]
    mini_batches = -(-n_files // 10)
    if case.tabular:
        n_files *= TABULAR_ROWS_PER_FILE  # items are rows
        csv_path = gen_csv.ensure_csv(n_files)
        mini_batches = -(-os.path.getsize(csv_path) // TABULAR_CHUNK_BYTES)
        pool_argv = [sys.executable, os.path.join(BENCH, "pool_tabular.py"),
                     "--script", script, "--data", csv_path, "--out", pool_out,
                     "--processes", "2", "--chunk-bytes", str(TABULAR_CHUNK_BYTES),
                     "--rows", str(n_files)]
    pool_runs: list[Run] = []
    loop_runs: list[Run] = []
    fr_runs: list[Run] = []
    errors: list[str] = []

    sides = ["pool", "loop", "fleetrun"] if case.loop else ["pool", "fleetrun"]
    for rep in range(reps):
        # Each side goes first in turn: a warm page cache or a busy neighbour favours none.
        order = sides[rep % len(sides):] + sides[:rep % len(sides)]
        for side in order:
            if side == "pool":
                if os.path.exists(pool_out):
                    os.remove(pool_out)
                r = timed(pool_argv, os.path.join(WORK, "logs", f"{case.name}-pool-{rep}.log"))
                pool_runs.append(r)
            elif side == "loop":
                if os.path.exists(loop_out):
                    os.remove(loop_out)
                r = timed(loop_argv, os.path.join(WORK, "logs", f"{case.name}-loop-{rep}.log"))
                loop_runs.append(r)
            elif not pool_only:
                shutil.rmtree(out_dir, ignore_errors=True)  # never resume a previous run
                r = timed(case.fleetrun_argv(),
                          os.path.join(WORK, "logs", f"{case.name}-fleetrun-{rep}.log"))
                fr_runs.append(r)
            else:
                continue
            print(f"  {case.name:<12} rep {rep + 1}/{reps} {side:<8} {r.wall_s:7.2f} s "
                  f"{n_files / r.wall_s:9.0f} items/s  peak {r.maxrss_mb:6.1f} MB"
                  + ("" if r.returncode == 0 else f"  EXIT {r.returncode}"), flush=True)
            if r.returncode != 0:
                errors.append(f"{side} rep {rep + 1} exited with {r.returncode}; "
                              f"last lines of {r.log}:\n{tail(r.log)}")
        if not pool_only and not errors:
            problems = compare(case, pool_out, fr_out, n_files)
            if case.loop:
                problems += [f"loop: {p}" for p in compare(case, pool_out, loop_out, n_files)
                             if "pool output" not in p]
            for problem in problems:
                errors.append(f"MISMATCH rep {rep + 1}: {problem}")
                print(f"  !!! MISMATCH {case.name} rep {rep + 1}: {problem}", flush=True)
        elif pool_only and not errors:
            with open(pool_out, "rb") as f:
                n = sum(1 for _ in f)
            if n != n_files:
                errors.append(f"MISMATCH rep {rep + 1}: pool output has {n} lines, expected {n_files}")
        if errors:
            break

    row = {"case": case.name, "files": n_files, "mini_batches": mini_batches,
           "reps": max(len(pool_runs), len(fr_runs)), "errors": errors,
           "pool_wall_s": [r.wall_s for r in pool_runs],
           "fleetrun_wall_s": [r.wall_s for r in fr_runs]}
    # Figures only from runs that succeeded (a failed run's speed means nothing).
    pool_runs = [r for r in pool_runs if r.returncode == 0]
    loop_runs = [r for r in loop_runs if r.returncode == 0]
    fr_runs = [r for r in fr_runs if r.returncode == 0]
    if loop_runs:
        row["loop_wall_s"] = [r.wall_s for r in loop_runs]
        row["loop_items_per_s"] = n_files / statistics.median(r.wall_s for r in loop_runs)
    if pool_runs:
        pool_wall = statistics.median(r.wall_s for r in pool_runs)
        row["pool_items_per_s"] = n_files / pool_wall
        row["pool_peak_rss_mb"] = max(r.maxrss_mb for r in pool_runs)
    if fr_runs and pool_runs:
        fr_wall = statistics.median(r.wall_s for r in fr_runs)
        row["fleetrun_items_per_s"] = n_files / fr_wall
        row["ratio"] = row["fleetrun_items_per_s"] / row["pool_items_per_s"]
        row["overhead_us_per_mini_batch"] = (fr_wall - pool_wall) / mini_batches * 1e6
        row["fleetrun_peak_rss_mb"] = max(r.maxrss_mb for r in fr_runs)
        if loop_runs:
            row["ratio_loop"] = row["fleetrun_items_per_s"] / row["loop_items_per_s"]
    return row


def fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict]) -> None:
    head = (f"{'case':<20} {'files':>7} {'loop it/s':>10} {'pool it/s':>10} "
            f"{'fleetrun it/s':>14} {'fleetrun/loop':>13} "
            f"{'fleetrun/pool':>13} {'overhead µs/mb':>15} {'fleetrun RSS MB':>16} "
            f"{'pool RSS MB':>12}")
    print("\n" + head + "\n" + "-" * len(head))
    for r in rows:
        if "skipped" in r:
            print(f"{r['case']:<20} skipped: {r['skipped']}")
            continue
        print(f"{r['case']:<20} {r['files']:>7} {fmt(r.get('loop_items_per_s'), '10.0f'):>10} "
              f"{fmt(r.get('pool_items_per_s'), '10.0f'):>10} "
              f"{fmt(r.get('fleetrun_items_per_s'), '14.0f'):>14} "
              f"{fmt(r.get('ratio_loop'), '13.2f'):>13} "
              f"{fmt(r.get('ratio'), '13.2f'):>13} "
              f"{fmt(r.get('overhead_us_per_mini_batch'), '+15.0f'):>15} "
              f"{fmt(r.get('fleetrun_peak_rss_mb'), '16.1f'):>16} "
              f"{fmt(r.get('pool_peak_rss_mb'), '12.1f'):>12}"
              + ("   FAILED" if r["errors"] else ""))
    print("(medians over the repetitions, each side timed as a whole process; loop = one "
          "plain Python loop; RSS = peak of the biggest single process; "
          "overhead = (fleetrun wall - pool wall) / mini-batches)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description="fleetrun vs multiprocessing.Pool(2)")
    parser.add_argument("--quick", action="store_true",
                        help="2,000 files and 1 repetition (CI: does the bench still run?)")
    parser.add_argument("--files", type=int, help="input files (default 20,000; 2,000 with --quick)")
    parser.add_argument("--flat-files", type=int,
                        help="input files of the flat cases, in one folder (default 300,000; "
                             "3,000 with --quick)")
    parser.add_argument("--large-files", type=int,
                        help="input files of the large cases, in folders of 1,000 (default "
                             "100,000; 4,000 with --quick)")
    parser.add_argument("--bin-dir", help="where fleetrun and fleetrun-runner are "
                                          f"(default {BIN_DIR})")
    parser.add_argument("--reps", type=int, help="repetitions (default 3; 1 with --quick)")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--pool-only", action="store_true",
                        help="run only the Pool baseline (no fleetrun binary needed)")
    args = parser.parse_args(argv)
    n_files = args.files or (2000 if args.quick else 20000)
    n_flat = args.flat_files or (3000 if args.quick else 300000)
    n_large = args.large_files or (4000 if args.quick else 100000)
    global FLEETRUN, RUNNER
    if args.bin_dir:
        FLEETRUN = os.path.join(args.bin_dir, "fleetrun")
        RUNNER = os.path.join(args.bin_dir, "fleetrun-runner")
    os.environ["BENCH_BIN_DIR"] = os.path.dirname(FLEETRUN)  # for fleet_run.py
    start_launcher()
    reps = args.reps or (1 if args.quick else 3)
    cases = CASES
    if args.cases:
        wanted = args.cases.split(",")
        unknown = set(wanted) - {c.name for c in CASES}
        if unknown:
            parser.error(f"unknown case(s) {sorted(unknown)}; known: {[c.name for c in CASES]}")
        cases = [c for c in CASES if c.name in wanted]

    if not args.pool_only:
        missing = [p for p in (FLEETRUN, RUNNER) if not os.access(p, os.X_OK)]
        if missing:
            print(f"error: fleetrun binary not found: {', '.join(missing)}\n"
                  f"  build it first: (cd {ROOT} && cargo build --release)   "
                  f"-- bench/run.sh does this --\n"
                  f"  or run only the baseline: python3 bench/measure.py --pool-only",
                  file=sys.stderr)
            return 3

    print(f"bench: {n_files} files x 1 KB ({n_flat} in one folder for the flat cases, "
          f"{n_large} for the large ones), "
          f"mini-batch 10, 2 processes, {reps} repetition(s); fleetrun from {FLEETRUN}; "
          f"{os.cpu_count()} CPUs, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"pool on Python {sys.version.split()[0]} ({sys.executable})")
    gen_data.ensure_data(n_files)
    if any(c.flat for c in cases):
        gen_data.ensure_data(n_flat, gen_data.FLAT_DATA, flat=True)
    if any(c.large for c in cases):
        gen_data.ensure_data(n_large, gen_data.LARGE_DATA)

    rows = []
    for case in cases:
        reason = case.skip()
        if reason:
            rows.append({"case": case.name, "skipped": reason, "errors": []})
            continue
        size = n_flat if case.flat else n_large if case.large else n_files
        with case.around():
            rows.append(run_case(case, reps, size, args.pool_only))

    print_table(rows)
    with open(os.path.join(WORK, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "files": n_files,
                   "flat_files": n_flat, "large_files": n_large,
                   "reps": reps, "cpus": os.cpu_count(), "rows": rows}, f, indent=1)

    failed = [r for r in rows if r["errors"]]
    for r in failed:
        print(f"\n!!!!! {r['case']}: FAILED !!!!!", file=sys.stderr)
        for e in r["errors"]:
            print(e, file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
