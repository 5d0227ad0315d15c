//! The job record the registry keeps: all a worker needs to serve a job it has never seen.

use std::time::{SystemTime, UNIX_EPOCH};

use fleetrun_config::JobSpec;
use serde::{Deserialize, Serialize};

use super::error::JobError;

/// What the registry holds for a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobRecord {
    pub spec: JobSpec,
    /// Seconds since the Unix epoch.
    pub submitted_at: f64,
    /// The pool that serves it.
    pub pool: String,
    /// What its publication cuts, and so who may finish it.
    #[serde(default)]
    pub publication: Publication,
}

/// What a job's publication cuts, and so who may finish a publication its publisher left.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Publication {
    /// Its input, whole: anyone holding the record can cut it again and finish it.
    Input,
    /// Items only its submitter knows (a retry of failed items), or a record from before
    /// publications were told apart: only a submitter of the job finishes it.
    #[default]
    Submitter,
}

impl JobRecord {
    pub fn new(spec: JobSpec, pool: &str) -> JobRecord {
        JobRecord {
            spec,
            submitted_at: unix_now(),
            pool: pool.to_owned(),
            publication: Publication::Input,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a job record always encodes")
    }

    pub fn decode(bytes: &[u8]) -> Result<JobRecord, JobError> {
        serde_json::from_slice(bytes).map_err(JobError::Record)
    }
}

pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record written by a submitter from before `append_row_separator`, `[models]`,
    /// `profile`, `pass_environment` and named side inputs still serves.
    #[test]
    fn a_record_without_newer_fields_reads_with_their_defaults() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("score.py"), "def run(b): return b\n").unwrap();
        let text = "name = \"old\"\nentry_script = \"score.py\"\noutput_action = \"append_row\"\n[input]\nfiles = \"in\"\n[output]\npath = \"out\"\n";
        let spec = fleetrun_config::load_str(text, "job.toml", dir.path(), &[]).unwrap();
        let mut json: serde_json::Value =
            serde_json::from_slice(&JobRecord::new(spec.clone(), "p").encode()).unwrap();
        let fields = json["spec"].as_object_mut().unwrap();
        for newer in [
            "append_row_separator",
            "models",
            "profile",
            "partition_format",
            "pass_environment",
            "notify_url",
        ] {
            fields.remove(newer);
        }
        fields.insert("side_inputs".into(), serde_json::json!([]));
        let old = JobRecord::decode(&serde_json::to_vec(&json).unwrap()).unwrap();
        assert_eq!(old.spec, spec);

        // Side inputs were a list: each is named after its last path component.
        let mut json: serde_json::Value =
            serde_json::from_slice(&JobRecord::new(spec, "p").encode()).unwrap();
        json["spec"]["side_inputs"] = serde_json::json!([
            {"Local": "/data/labels.txt"},
            {"S3": {"bucket": "b", "prefix": "ref/vocab/"}}
        ]);
        let old = JobRecord::decode(&serde_json::to_vec(&json).unwrap()).unwrap();
        let names: Vec<&String> = old.spec.side_inputs.keys().collect();
        assert_eq!(names, ["labels.txt", "vocab"]);
    }
}
