//! Named outputs on a fleet: two workers each write files into `${{outputs.models}}`, an
//! `s3://` prefix; every file is in S3 by the time the job is Completed.

use super::*;

#[test]
fn a_named_output_on_s3_gets_every_workers_files() {
    let script = r#"
import argparse
import os

from azureml_user.parallel_run import EntryScript

def init():
    global models
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_folder")
    args, _ = parser.parse_known_args()
    models = args.model_folder

def run(mini_batch):
    for p in mini_batch:
        name = os.path.basename(p)
        with open(os.path.join(models, "model-" + name), "w") as f:
            f.write("%s by %s\n" % (open(p).read(), EntryScript().node_id))
    # One name every runner writes: the last writer wins, and is told so.
    with open(os.path.join(models, "latest.txt"), "w") as f:
        f.write("%s %s\n" % (EntryScript().node_id, os.path.basename(mini_batch[0])))
    return [os.path.basename(p) for p in mini_batch]
"#;
    let mut fleet = Fleet::new(script);
    fleet.inputs(20);
    let bucket = fleet.bucket.clone();
    // An object fleetrun did not write, under a name of its own, stays.
    let storage = fleet.storage("models");
    fleet.runtime.block_on(async {
        storage
            .put("notes.txt", Bytes::from_static(b"mine\n"))
            .await
            .unwrap();
    });
    for node in ["w1", "w2"] {
        fleet.worker(node, 1);
    }
    let settings = "mini_batch_size = 2\nnode_count = 2\n\
                    arguments = [\"--model_folder\", \"${{outputs.model_folder}}\"]";
    let job = fleet.job(
        settings,
        &format!("s3://{bucket}/in"),
        &format!("s3://{bucket}/out"),
    );
    let mut text = std::fs::read_to_string(&job).unwrap();
    text.push_str(&format!(
        "\n[outputs]\nmodel_folder = \"s3://{bucket}/models/\"\n"
    ));
    std::fs::write(&job, text).unwrap();
    let submitted = fleet.submit(&job, &["--wait"]);
    assert_eq!(code(&submitted), 0);

    let keys: BTreeSet<String> = fleet
        .runtime
        .block_on(storage.list("").map_ok(|m| m.key).try_collect())
        .unwrap();
    let mut expected: BTreeSet<String> = (0..20).map(|i| format!("model-f{i:04}.txt")).collect();
    expected.insert("notes.txt".to_owned());
    expected.insert("latest.txt".to_owned());
    assert_eq!(keys, expected);
    let mut nodes = BTreeSet::new();
    for i in 0..20 {
        let body = lines(&fleet.output(&format!("models/model-f{i:04}.txt")));
        let (content, node) = body[0].split_once(" by ").unwrap();
        assert_eq!(content, format!("f{i:04}"));
        nodes.insert(node.to_owned());
    }
    assert_eq!(lines(&fleet.output("models/notes.txt")), ["mine"]);
    assert_eq!(nodes.len(), 2, "both workers wrote models: {nodes:?}");
    // Both nodes delivered latest.txt: whichever replaced the other's says so in its log,
    // which reaches S3 once the node has let the job go.
    let root = fleet.storage("");
    let said: Vec<String> = ["w1", "w2"]
        .iter()
        .map(|node| {
            let key = format!("out/logs/sys/node/{node}/_main.txt");
            wait_for(
                &format!("{node}'s _main.txt on S3"),
                Duration::from_secs(30),
                || fleet.runtime.block_on(root.get(&key)).is_ok(),
            );
            String::from_utf8_lossy(&fleet.output(&key)).into_owned()
        })
        .filter(|log| log.contains("outputs.model_folder: latest.txt from process"))
        .collect();
    assert!(!said.is_empty(), "no node told of replacing latest.txt");
    assert!(
        said[0].contains("(the last writer of a name wins)"),
        "{}",
        said[0]
    );
}

#[test]
fn a_local_named_output_is_refused_for_a_job_whose_output_is_on_s3() {
    let fleet = Fleet::new("def run(b):\n    return b\n");
    fleet.inputs(2);
    let job = fleet.s3_job("arguments = [\"${{outputs.models}}\"]");
    let mut text = std::fs::read_to_string(&job).unwrap();
    text.push_str("\n[outputs]\nmodels = \"/tmp/models\"\n");
    std::fs::write(&job, text).unwrap();
    let submitted = fleet.submit(&job, &[]);
    assert_eq!(code(&submitted), 2);
    let stderr = String::from_utf8_lossy(&submitted.stderr);
    assert!(
        stderr.contains("outputs.models: a job whose output is on S3 runs on workers elsewhere"),
        "{stderr}"
    );
}
