//! A fleet job's proof: its manifest on S3, signed, its digest in `status --json` and in its
//! end event, and `fleetrun verify s3://…` over its output.

use sha2::{Digest, Sha256};

use super::*;

const KEY: &str = "fleet-manifest-k3y";

/// `sha256:<hex>` of `bytes`, as a receiver checks the manifest it fetched.
pub(super) fn digest(bytes: &[u8]) -> String {
    let hex: String = Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// A job on two workers with its output on S3 and a manifest key: the manifest is signed,
/// `status --json` carries its digest, `verify` passes on the output as it is and names the
/// mini-batch whose part was changed.
#[test]
fn an_s3_jobs_manifest_is_signed_and_its_output_verifies() {
    let mut fleet = Fleet::new(ECHO);
    fleet
        .extra_env
        .push(("FLEETRUN_MANIFEST_KEY".into(), KEY.into()));
    fleet.inputs(60);
    fleet.worker("w1", 1);
    fleet.worker("w2", 1);
    let job = fleet.s3_job("mini_batch_size = 4");
    let id = format!("proof-{}", random_suffix());
    let (submitted, _, _) = fleet.fleetrun(&[
        "submit",
        job.to_str().unwrap(),
        "--job-id",
        &id,
        "--wait",
        "--quiet",
    ]);
    assert_eq!(submitted, 0);
    let manifest = fleet.output("out/logs/manifest.json");
    let status = fleet.status_json(&id);
    assert_eq!(status["manifest"], digest(&manifest), "{status}");
    let parsed: serde_json::Value = serde_json::from_slice(&manifest).unwrap();
    assert_eq!(parsed["job_id"], id.as_str());
    assert_eq!(parsed["mini_batches"].as_array().unwrap().len(), 15);

    let out = format!("s3://{}/out", fleet.bucket);
    let input = format!("s3://{}/in", fleet.bucket);
    let (verified, said, _) = fleet.fleetrun(&["verify", &out, "--input", &input]);
    assert_eq!(verified, 0, "{said}");
    assert_eq!(
        said.trim(),
        "verified: 60 lines, 15 mini-batches, 60 items (60 succeeded, 0 failed), signature valid"
    );

    // Mini-batch 3 holds items 12-15, lines 13-16: one of its rows edited in place.
    let lines: Vec<String> = lines(&fleet.output("out/parallel_run_step.txt"));
    let edited: String = lines
        .iter()
        .enumerate()
        .map(|(i, l)| {
            if i == 13 {
                "edited\n".to_owned()
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    let s3 = fleet.storage("out");
    fleet
        .runtime
        .block_on(s3.put("parallel_run_step.txt", Bytes::from(edited)))
        .unwrap();
    let (verified, said, _) = fleet.fleetrun(&["verify", &out]);
    assert_eq!(verified, 1, "{said}");
    assert!(
        said.contains("problem: mini-batch 3 (items 12-15): its rows changed (lines 13-16)"),
        "{said}"
    );
    let (verified, said, _) = fleet.fleetrun(&["verify", &out, "--key", "not the key"]);
    assert_eq!(verified, 1, "{said}");
    assert!(
        said.contains("signature: does not match the key given"),
        "{said}"
    );
}
