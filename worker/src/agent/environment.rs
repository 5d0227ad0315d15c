//! A runner's environment: the worker's own, less fleetrun's service settings and
//! credentials unless the job passes them by name, plus the job's `environment_variables`
//! and the runner's identity. A script that prints `os.environ` (as many do in `init()`)
//! then writes no broker password or storage key into the job's logs.

use fleetrun_config::JobSpec;

/// The worker's variables its runners do not inherit: the URLs of the broker and the
/// ledger (which carry their passwords), the API's and the webhooks' secrets, and the
/// storage credentials. A job that needs one names it in `pass_environment`.
pub const WITHHELD_VARS: &[&str] = &[
    "FLEETRUN_AMQP_URL",
    "FLEETRUN_AMQP_MANAGEMENT_URL",
    "FLEETRUN_REDIS_URL",
    "FLEETRUN_TLS_KEY_FILE",
    "FLEETRUN_API_TOKEN",
    "FLEETRUN_WEBHOOK_SECRET",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
];

/// What a runner's environment changes from the worker's.
#[derive(Debug, PartialEq)]
pub struct RunnerEnv {
    /// Removed first: the withheld variables the job does not pass.
    pub remove: Vec<String>,
    /// Then set: the job's `environment_variables` (a job may set a withheld name itself)
    /// and the runner's identity.
    pub set: Vec<(String, String)>,
}

/// The environment of `job`'s runner `process` on `node`.
pub fn runner_env(spec: &JobSpec, job: &str, node: &str, process: &str) -> RunnerEnv {
    let remove = WITHHELD_VARS
        .iter()
        .filter(|name| !spec.pass_environment.iter().any(|p| p == *name))
        .map(|name| (*name).to_owned())
        .collect();
    let mut set: Vec<(String, String)> = spec
        .environment_variables
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    set.push(("FLEETRUN_JOB_ID".into(), job.to_owned()));
    set.push(("FLEETRUN_NODE_ID".into(), node.to_owned()));
    set.push(("FLEETRUN_PROCESS_NAME".into(), process.to_owned()));
    RunnerEnv { remove, set }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::Launch;

    fn spec(settings: &str) -> JobSpec {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("score.py"), "def run(b): return b\n").unwrap();
        let text = format!(
            "name = \"env\"\nentry_script = \"score.py\"\noutput_action = \"append_row\"\n{settings}\n[input]\nfiles = \"in\"\n[output]\npath = \"out\"\n"
        );
        fleetrun_config::load_str(&text, "job.toml", dir.path(), &[]).unwrap()
    }

    /// The environment a runner launched with `env` sees, from a worker whose own holds
    /// every withheld variable and `PATH`.
    fn seen(env: RunnerEnv) -> String {
        let launch = Launch {
            exe: "env".into(),
            stdout: "/dev/null".into(),
            stderr: "/dev/null".into(),
            env: env.set,
            env_remove: env.remove,
        };
        let mut cmd = std::process::Command::new(&launch.exe);
        cmd.env_clear().env("PATH", "/usr/bin:/bin");
        for name in WITHHELD_VARS {
            cmd.env(name, format!("secret-of-{name}"));
        }
        launch.apply_env(&mut cmd);
        String::from_utf8(cmd.output().unwrap().stdout).unwrap()
    }

    #[test]
    fn a_runner_gets_no_service_url_or_credential_of_the_worker() {
        let env = runner_env(&spec(""), "j1", "n1", "process000");
        let seen = seen(env);
        assert!(!seen.contains("secret-of-"), "{seen}");
        for line in [
            "PATH=/usr/bin:/bin",
            "FLEETRUN_JOB_ID=j1",
            "FLEETRUN_NODE_ID=n1",
            "FLEETRUN_PROCESS_NAME=process000",
        ] {
            assert!(seen.lines().any(|l| l == line), "{line} in\n{seen}");
        }
    }

    #[test]
    fn a_job_gets_the_withheld_variables_it_names_and_those_it_sets() {
        let env = runner_env(
            &spec(
                "pass_environment = [\"AWS_ACCESS_KEY_ID\", \"AWS_SECRET_ACCESS_KEY\"]\n\
                 environment_variables = { FLEETRUN_REDIS_URL = \"redis://own\" }",
            ),
            "j1",
            "n1",
            "process000",
        );
        let seen = seen(env);
        let mut secrets: Vec<&str> = seen.lines().filter(|l| l.contains("secret-of-")).collect();
        secrets.sort_unstable();
        assert_eq!(
            secrets,
            [
                "AWS_ACCESS_KEY_ID=secret-of-AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY=secret-of-AWS_SECRET_ACCESS_KEY",
            ]
        );
        assert!(seen.lines().any(|l| l == "FLEETRUN_REDIS_URL=redis://own"));
    }
}
