//! The ledger's Redis failing over mid-job: its primary dies with writes its replica never
//! received, and the replica is promoted, behind the same endpoint (a managed Redis's
//! maintenance, a Kubernetes Service) or by Sentinel. Recordings are believed only once the
//! replicas have them, so nothing acknowledged is lost with the primary.

use fleetrun_tests::PrivateSentinel;
use fleetrun_tests::relay::Relay;

use super::*;

/// Mini-batches of the jobs below, of 10 files each.
const MINI_BATCHES: usize = 200;

/// Runs a job of `MINI_BATCHES` mini-batches on two workers whose ledger is at
/// `redis_url`, calls `fail_over` a third of the way in, and checks that the job completes
/// with every line once.
fn completes_through(redis_url: String, fail_over: impl FnOnce()) {
    completes_through_on(redis_url, false, fail_over);
}

/// [`completes_through`], the fleet's processes given the test certificates when `tls`.
fn completes_through_on(redis_url: String, tls: bool, fail_over: impl FnOnce()) {
    let markers = tempfile::tempdir().unwrap();
    let runs = markers.path().join("runs");
    let script = format!(
        "import time\nRUNS = {:?}\ndef run(mini_batch):\n    with open(RUNS, 'a') as f:\n        f.write(mini_batch[0] + '\\n')\n    time.sleep(0.1)\n    return [open(p).read() for p in mini_batch]\n",
        runs.display().to_string()
    );
    let mut fleet = Fleet::new(&script);
    if tls {
        fleet.use_test_certificates();
    }
    fleet.redis_url = redis_url;
    fleet.know_pool(&fleet.pool);
    let files = MINI_BATCHES * 10;
    for i in 0..files {
        // The fleet's nodes share this machine's disk.
        let path = fleet.path(&format!("local-in/g{:02}/f{i:04}.txt", i / 100));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, format!("f{i:04}")).unwrap();
    }
    fleet.worker("w1", 2);
    fleet.worker("w2", 2);
    let out = fleet.path("out");
    let job = fleet.job(
        "mini_batch_size = 10\nnode_count = 2",
        &fleet.path("local-in").display().to_string(),
        &out.display().to_string(),
    );
    let mut submit = fleet.spawn_submit(&job);
    let ran = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
    wait_for(
        "a third of the mini-batches to run",
        Duration::from_secs(120),
        || ran() >= MINI_BATCHES / 3,
    );
    fail_over();
    assert_eq!(submit.exit_within(Duration::from_secs(180)).code(), Some(0));
    let output = lines(&std::fs::read(out.join("parallel_run_step.txt")).unwrap());
    assert_eq!(output, expected_lines(files, |_| false));
}

/// The primary and its replica behind one endpoint. The replica's link stalls for 1.5 s
/// (what the primary acknowledged then never reaches it), the primary is killed, and the
/// replica is promoted behind the endpoint.
#[test]
fn a_job_completes_when_its_redis_fails_over_losing_unreplicated_writes() {
    let mut primary = PrivateRedis::start();
    let link = Relay::to(primary.port());
    let mut replica = PrivateRedis::replica_of(link.port());
    let endpoint = Relay::to(primary.port());
    let url = format!("redis://127.0.0.1:{}/", endpoint.port());
    completes_through(url, || {
        link.stall();
        // The stall the scenario is made of, not a wait for something to happen.
        std::thread::sleep(Duration::from_millis(1500));
        primary.kill();
        link.cut();
        replica.promote();
        endpoint.retarget(replica.port());
        endpoint.cut();
    });
}

/// The same through Sentinel (three sentinels, quorum two): the replica is frozen for 1.5 s,
/// the primary killed, and the sentinels promote the replica; the workers follow it.
#[test]
fn a_job_completes_when_sentinel_fails_its_redis_over() {
    sentinel_fails_over(false);
}

/// The same over TLS (`rediss+sentinel://`): the primary, its replica and three sentinels all
/// speak TLS and want the fleet's client certificate, and replicate and watch each other over
/// TLS; the workers ask the sentinels over TLS and follow the promoted replica.
#[test]
fn a_job_completes_when_sentinel_fails_its_redis_over_all_over_tls() {
    sentinel_fails_over(true);
}

/// A job through a Sentinel failover (see the two tests above), all of it over TLS if `tls`.
fn sentinel_fails_over(tls: bool) {
    let master = "ledger";
    let (mut primary, replica) = if tls {
        let primary = PrivateRedis::with_tls(&services::tls_dir());
        let replica = PrivateRedis::tls_replica_of(&primary);
        (primary, replica)
    } else {
        let primary = PrivateRedis::start();
        let replica = PrivateRedis::replica_of(primary.port());
        (primary, replica)
    };
    let sentinels: Vec<PrivateSentinel> = (0..3)
        .map(|_| match tls {
            true => PrivateSentinel::watch_tls(master, &primary, 2),
            false => PrivateSentinel::watch(master, primary.port(), 2),
        })
        .collect();
    let promoted = if tls {
        replica.tls_port()
    } else {
        replica.port()
    };
    let listed: Vec<String> = sentinels.iter().map(PrivateSentinel::address).collect();
    let scheme = if tls {
        "rediss+sentinel"
    } else {
        "redis+sentinel"
    };
    let url = format!("{scheme}://{}/{master}", listed.join(","));
    completes_through_on(url, tls, || {
        replica.freeze();
        std::thread::sleep(Duration::from_millis(1500));
        primary.kill();
        replica.thaw();
        wait_for(
            "the sentinels to promote the replica",
            Duration::from_secs(60),
            || sentinels[0].primary(master) == Some(promoted),
        );
    });
}
