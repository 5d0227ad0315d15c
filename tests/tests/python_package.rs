//! The `fleetrun` wheel (`scripts/build-wheel.sh`, built from the debug build) as a user
//! gets it: installed with `pip install --no-index` into fresh virtualenvs of CPython 3.10
//! and 3.12, run with a `PATH` that holds no Rust toolchain and no build folder. Its
//! `fleetrun run` runs the digits example; its Python package drives `fleetrun serve`
//! (`fleetrun.Client`, `fleetrun.verify_webhook`), runs a job from Python (`fleetrun.run`),
//! and repeats only idempotent requests. The Python side of each test is a script under
//! `python/tests/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use fleetrun_tests::{RUN_LIMIT, Venv, output_within};

/// The repository's folder `rel`.
fn repo(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// Where `scripts/install-deps.sh` keeps the wheels of the digits example's requirements
/// (scikit-learn, Pillow) for CPython 3.10 and 3.12, so that the tests install them offline.
fn wheelhouse() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cache"));
    let dir = cache.join("fleetrun-tests/wheels");
    assert!(
        dir.join(".complete").exists(),
        "no wheelhouse at {}: run scripts/install-deps.sh",
        dir.display()
    );
    dir
}

/// Runs `cmd` to its end within [`RUN_LIMIT`], failing the test with its output unless it
/// exits 0; its stdout.
fn succeeds(what: &str, cmd: &mut std::process::Command) -> String {
    let out = output_within(cmd, RUN_LIMIT);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    eprintln!("--- {what} stdout\n{stdout}--- stderr\n{stderr}");
    assert!(out.status.success(), "{what}: {:?}", out.status);
    stdout
}

/// Runs `python/tests/<script> <work>` with the venv's Python: it must print `ok` last. Its
/// stdout.
fn python_test(venv: &Venv, script: &str, work: &Path) -> String {
    let stdout = succeeds(
        script,
        venv.command("python")
            .arg(repo("python/tests").join(script))
            .arg(work),
    );
    assert!(stdout.trim_end().ends_with("ok"), "{stdout}");
    stdout
}

/// The digits example (its script, model helper and job file, as shipped) in a project folder
/// whose `.venv` (the job's `environment`) has the wheel and the example's requirements: its
/// data made by its own `make_data.py`, then cut to two folders of images (100 good ones and
/// one corrupt), and `fleetrun run job.toml` from the venv's `PATH` completes, the corrupt
/// image counted as the one failed item.
fn digits_run_from_the_wheel(minor: &str) {
    let project = tempfile::tempdir().unwrap();
    for file in ["job.toml", "score.py", "digits_model.py", "make_data.py"] {
        std::fs::copy(
            repo("examples/digits").join(file),
            project.path().join(file),
        )
        .unwrap();
    }
    let venv = Venv::with_wheel_at(minor, &project.path().join(".venv"));
    let wheels = wheelhouse();
    venv.pip(&[
        "install".as_ref(),
        "--no-index".as_ref(),
        "--find-links".as_ref(),
        wheels.as_os_str(),
        "scikit-learn".as_ref(),
        "pillow".as_ref(),
    ]);
    let make_data = project.path().join("make_data.py");
    succeeds(
        "make_data.py",
        venv.command("python")
            .arg(&make_data)
            .current_dir(project.path()),
    );
    let images = project.path().join("data/images");
    for batch in ["batch-01", "batch-03", "batch-04", "batch-05"] {
        std::fs::remove_dir_all(images.join(batch)).unwrap();
    }
    let stdout = succeeds(
        "fleetrun run",
        venv.command("fleetrun")
            .args(["run", "job.toml", "--quiet"])
            .current_dir(project.path()),
    );
    assert!(stdout.contains("100 items succeeded, 1 failed"), "{stdout}");
    let rows = std::fs::read_to_string(project.path().join("out/parallel_run_step.txt")).unwrap();
    assert_eq!(rows.lines().count(), 100, "{rows}");
    let failed = std::fs::read_to_string(project.path().join("out/logs/failed_items.csv")).unwrap();
    assert!(failed.contains("digit-corrupt-a.png"), "{failed}");
}

#[test]
fn the_wheel_runs_the_digits_example_in_python_3_10() {
    digits_run_from_the_wheel("3.10");
}

#[test]
fn the_wheel_runs_the_digits_example_in_python_3_12() {
    digits_run_from_the_wheel("3.12");
}

/// `fleetrun.run` from Python 3.12 (`python/tests/run_job.py`): a job file with overrides
/// returns its counts, output path and failed items; a dict job, relative paths and all,
/// returns its failure; a job that does not validate raises.
#[test]
fn fleetrun_run_from_python_returns_counts_and_the_output_path() {
    let venv = Venv::with_wheel("3.12");
    let work = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join("data")).unwrap();
    for i in 0..10 {
        std::fs::write(
            work.path().join(format!("data/f{i:02}.txt")),
            format!("f{i:02}"),
        )
        .unwrap();
    }
    std::fs::write(
        work.path().join("score.py"),
        "def run(mini_batch):\n    return [open(p).read() for p in mini_batch if not p.endswith('f03.txt')]\n",
    )
    .unwrap();
    let stdout = python_test(&venv, "run_job.py", work.path());
    // The progress line a notebook shows.
    assert!(stdout.contains("5 of 5"), "{stdout}");
}

/// `fleetrun.Client` tries a request again after a dropped connection only where repeating
/// it changes nothing (reads, a submission under its own id), and reads a TOML job file with
/// its relative paths made absolute from its folder (`python/tests/retries.py`), on 3.12;
/// on 3.10, without `tomllib`, it says to install `tomli`.
#[test]
fn the_client_retries_only_what_is_idempotent() {
    for minor in ["3.10", "3.12"] {
        let venv = Venv::with_wheel(minor);
        let work = tempfile::tempdir().unwrap();
        python_test(&venv, "retries.py", work.path());
    }
}

#[cfg(feature = "services")]
mod fleet {
    use super::*;
    use fleetrun_common::ledger::{JobRegistry, RedisRegistry};
    use fleetrun_common::queue::QueueOptions;
    use fleetrun_common::queue::amqp::AmqpQueue;
    use fleetrun_common::testing::random_suffix;
    use fleetrun_common::tls::Tls;
    use fleetrun_tests::{KillOnDrop, first_line_within, services};

    /// A Python service on 3.10 (`python/tests/drive_serve.py`) drives the wheel's
    /// `fleetrun serve` through `fleetrun.Client`, a worker of the wheel's serving the pool:
    /// it submits with its own id, again (attached), waits to Completed, gets `BadJob` with
    /// the message, `NotFound`, `Conflict` and `Unauthorized`, cancels a job, sees a job past
    /// its `deadline` end Expired (`wait` raises `JobEnded`), and its webhook receiver
    /// verifies the three jobs' signed webhooks with `fleetrun.verify_webhook` and refuses a
    /// tampered body.
    #[test]
    fn a_python_service_drives_serve_through_the_client() {
        let venv = Venv::with_wheel("3.10");
        let work = tempfile::tempdir().unwrap();
        let pool = format!("py{}", random_suffix());
        std::fs::create_dir_all(work.path().join("in")).unwrap();
        for i in 0..20 {
            std::fs::write(
                work.path().join(format!("in/f{i:02}.txt")),
                format!("f{i:02}"),
            )
            .unwrap();
        }
        std::fs::write(
            work.path().join("fast.py"),
            "def run(mini_batch):\n    return [open(p).read() for p in mini_batch]\n",
        )
        .unwrap();
        std::fs::write(
            work.path().join("slow.py"),
            "import time\n\ndef run(mini_batch):\n    time.sleep(2)\n    return [open(p).read() for p in mini_batch]\n",
        )
        .unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        fleetrun_common::tls::install_crypto_provider();
        // Known as a pool, as a worker that started once makes it: submissions to a pool no
        // worker has started are refused.
        runtime.block_on(async {
            RedisRegistry::connect(&services::redis_url(), "fleetrun", &Tls::default())
                .await
                .unwrap()
                .beat(&pool, "test-fixture", Duration::from_millis(1))
                .await
                .unwrap();
        });
        let fleet_env = |cmd: &mut std::process::Command| {
            cmd.env("FLEETRUN_AMQP_URL", services::amqp_url())
                .env("FLEETRUN_REDIS_URL", services::redis_url())
                .env("FLEETRUN_POOL", &pool)
                .env("FLEETRUN_CONFIG", "/nonexistent")
                .env("FLEETRUN_WEBHOOK_SECRET", "hook-s3cret")
                .env("AWS_ENDPOINT_URL", services::s3_endpoint())
                .env("AWS_ACCESS_KEY_ID", "test")
                .env("AWS_SECRET_ACCESS_KEY", "test")
                .env("AWS_REGION", "us-east-1");
        };
        let worker_log = std::fs::File::create(work.path().join("worker.log")).unwrap();
        let mut worker = venv.command("fleetrun-worker");
        fleet_env(&mut worker);
        let _worker = KillOnDrop(
            worker
                .args(["--node-id", "py-w1", "--processes", "2", "--cache-dir"])
                .arg(work.path().join("cache"))
                .stdout(worker_log.try_clone().unwrap())
                .stderr(worker_log)
                .spawn()
                .unwrap(),
        );
        let mut serve = venv.command("fleetrun");
        fleet_env(&mut serve);
        let serve_log = std::fs::File::create(work.path().join("serve.log")).unwrap();
        let mut serve = KillOnDrop(
            serve
                .args(["serve", "--listen", "127.0.0.1:0"])
                .env("FLEETRUN_API_TOKEN", "t0ken")
                .stdout(std::process::Stdio::piped())
                .stderr(serve_log)
                .spawn()
                .unwrap(),
        );
        let listening = first_line_within(&mut serve.0, Duration::from_secs(60));
        let base = listening.split(" on ").nth(1).unwrap().to_owned();
        let out = output_within(
            venv.command("python")
                .arg(repo("python/tests/drive_serve.py"))
                .arg(&base)
                .arg(work.path())
                .env("API_TOKEN", "t0ken")
                .env("WEBHOOK_SECRET", "hook-s3cret"),
            RUN_LIMIT,
        );
        let logs = ["serve.log", "worker.log"]
            .map(|log| std::fs::read_to_string(work.path().join(log)).unwrap_or_default());
        assert!(
            out.status.success(),
            "{}\n{}\n--- serve\n{}\n--- worker\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            logs[0],
            logs[1]
        );
        assert!(String::from_utf8_lossy(&out.stdout).ends_with("ok\n"));
        for log in &logs {
            assert!(
                !log.contains("t0ken") && !log.contains("hook-s3cret"),
                "{log}"
            );
        }
        // The pool's queues go with the test.
        let _ = runtime.block_on(async {
            AmqpQueue::connect(
                &services::amqp_url(),
                &pool,
                QueueOptions {
                    delivery_limit: Some(101),
                },
                None,
                &Tls::default(),
            )
            .await?
            .delete()
            .await
        });
    }
}
