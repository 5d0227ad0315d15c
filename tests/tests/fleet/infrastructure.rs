//! The fleet on the infrastructure real fleets use: RabbitMQ and Redis over TLS with a private
//! CA and client certificates, and a RabbitMQ cluster named as a list of URLs, whose lost
//! node costs a reconnection to the next node of the list, never a line.

use fleetrun_tests::PrivateRabbitCluster;

use super::*;

/// A 3-node cluster of the test's own, named to the workers and the submitter as the list of
/// its nodes' URLs, the first node first. While the fleet connects, the other two nodes take
/// no connections, so every process and the job's queue (its leader) are on the first node;
/// then the first node is killed outright mid-job. Everyone reconnects to the next nodes of
/// the list, the queue's replicas elect a leader, the job completes, and every line is there
/// exactly once.
#[test]
fn a_three_node_cluster_losing_its_first_node_mid_job_loses_and_duplicates_nothing() {
    let cluster = PrivateRabbitCluster::start();
    let markers = tempfile::tempdir().unwrap();
    let runs = markers.path().join("runs");
    let script = format!(
        "import time\nRUNS = {:?}\ndef run(mini_batch):\n    with open(RUNS, 'a') as f:\n        f.write('run\\n')\n    time.sleep(0.5)\n    return [open(p).read() for p in mini_batch]\n",
        runs.display().to_string()
    );
    let mut fleet = Fleet::on_broker(&script, cluster.urls());
    fleet.inputs(200);
    cluster.suspend_listeners(&[1, 2]);
    fleet.worker("w1", 1);
    fleet.worker("w2", 1);
    // 100 mini-batches of half a second on two workers: 25 s of running.
    let job = fleet.s3_job("mini_batch_size = 2\nrun_max_try = 3\nnode_count = 2");
    let mut submit = fleet.spawn_submit(&job);
    let started = || std::fs::read_to_string(&runs).map_or(0, |s| s.lines().count());
    wait_for("a few mini-batches to run", Duration::from_secs(90), || {
        started() >= 6
    });
    assert!(
        cluster.connections(0) >= 2,
        "the workers are on the first node"
    );
    cluster.resume_listeners(&[1, 2]);
    cluster.kill(0);
    assert!(started() < 90, "the node was lost mid-job");
    assert_eq!(submit.exit_within(Duration::from_secs(180)).code(), Some(0));
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(200, |_| false)
    );
}

/// A job over `amqps://` and `rediss://` (the TLS-only servers of `scripts/services.sh`, which
/// require a client certificate signed by the test CA) on two workers: every line once, and
/// the servers' password in no log or output of the workers and the submitter.
#[test]
fn a_job_over_amqps_and_rediss_with_client_certificates_runs_every_line_once_and_shows_no_password()
{
    let mut fleet = Fleet::new(ECHO);
    fleet.use_test_certificates();
    fleet.amqp_url = services::amqps_url();
    fleet.redis_url = services::rediss_url();
    fleet.management_url = None;
    fleet.know_pool(&fleet.pool);
    fleet.inputs(50);
    fleet.worker("w1", 1);
    fleet.worker("w2", 1);
    let job = fleet.s3_job("mini_batch_size = 5\nnode_count = 2");
    let out = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&out), 0);
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(50, |_| false)
    );
    let passwords: BTreeSet<String> = [&fleet.amqp_url, &fleet.redis_url]
        .iter()
        .map(|url| {
            reqwest::Url::parse(url)
                .unwrap()
                .password()
                .unwrap()
                .to_owned()
        })
        .collect();
    let mut said = vec![
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ];
    for node in ["w1", "w2"] {
        said.push(std::fs::read_to_string(fleet.path(&format!("{node}.log"))).unwrap());
    }
    for text in &said {
        for password in &passwords {
            assert!(!text.contains(password.as_str()), "a password in: {text}");
        }
    }
}
