//! The fleet on a RabbitMQ cluster named as a list of URLs: a node lost mid-job costs a
//! reconnection to the next node of the list, never a line.

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
        "import time\nRUNS = {:?}\ndef run(mini_batch):\n    with open(RUNS, 'a') as f:\n        f.write('run\\n')\n    time.sleep(0.3)\n    return [open(p).read() for p in mini_batch]\n",
        runs.display().to_string()
    );
    let mut fleet = Fleet::on_broker(&script, cluster.urls());
    fleet.inputs(200);
    cluster.suspend_listeners(&[1, 2]);
    fleet.worker("w1", 1);
    fleet.worker("w2", 1);
    let job = fleet.s3_job("mini_batch_size = 5\nrun_max_try = 3\nnode_count = 2");
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
    assert!(started() < 40, "the node was lost mid-job");
    assert_eq!(submit.exit_within(Duration::from_secs(180)).code(), Some(0));
    assert_eq!(
        lines(&fleet.output("out/parallel_run_step.txt")),
        expected_lines(200, |_| false)
    );
}
