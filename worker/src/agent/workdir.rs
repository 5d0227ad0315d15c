//! A runner's working folder: `<cache>/work/<job>/<node>/<process>/`, holding a link to every entry
//! of the job's source directory (the entry script's folder when there is none). The runner
//! starts there, so a relative path in `arguments` or in the script means the same on every
//! node, whatever folder `fleetrun` was started from; what the script writes there stays out
//! of the user's source directory.

use std::path::{Path, PathBuf};

use fleetrun_config::JobSpec;

/// The folder under the node's cache that holds the working folders.
pub const WORK_DIR: &str = "work";

/// The working folders of a job on node `node`, under the node's cache folder `cache`. The
/// node's id keeps apart workers that share one cache folder on a host (process names
/// repeat from worker to worker).
pub fn job_work_dir(cache: &Path, job: &str, node: &str) -> PathBuf {
    cache.join(WORK_DIR).join(job).join(node)
}

/// Makes `<cache>/work/<job>/<process>/` with links to the source directory's entries.
pub(super) fn make(
    cache: &Path,
    job: &str,
    node: &str,
    process: &str,
    spec: &JobSpec,
) -> std::io::Result<PathBuf> {
    let dir = job_work_dir(cache, job, node).join(process);
    std::fs::create_dir_all(&dir)?;
    let source = match &spec.source_directory {
        Some(location) => location.as_local().map(Path::to_path_buf),
        None => spec
            .entry_script
            .as_local()
            .and_then(Path::parent)
            .map(Path::to_path_buf),
    };
    if let Some(source) = source {
        for entry in std::fs::read_dir(&source)? {
            let entry = entry?;
            let link = dir.join(entry.file_name());
            if link.symlink_metadata().is_err() {
                std::os::unix::fs::symlink(entry.path(), &link)?;
            }
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_the_source_directory_into_a_folder_per_process() {
        let dir = tempfile::tempdir().unwrap();
        let code = dir.path().join("code");
        std::fs::create_dir_all(code.join("pkg")).unwrap();
        std::fs::write(code.join("score.py"), "def run(b): return b\n").unwrap();
        std::fs::write(code.join("labels.txt"), "cat\n").unwrap();
        let text = format!(
            "name = \"work\"\nentry_script = \"score.py\"\nsource_directory = {:?}\n\
             output_action = \"append_row\"\n[input]\nfiles = \"in\"\n[output]\npath = \"out\"\n",
            code.display().to_string()
        );
        let spec = fleetrun_config::load_str(&text, "job.toml", dir.path(), &[]).unwrap();
        let cache = dir.path().join("cache");
        let work = make(&cache, "j1", "w1", "process000", &spec).unwrap();
        assert_eq!(work, cache.join("work/j1/w1/process000"));
        assert_eq!(
            std::fs::read_to_string(work.join("labels.txt")).unwrap(),
            "cat\n"
        );
        assert!(work.join("pkg").is_dir());
        // A second start of the same process name finds its folder ready.
        assert_eq!(make(&cache, "j1", "w1", "process000", &spec).unwrap(), work);
        // Another worker sharing the cache folder has process names of its own.
        let other = make(&cache, "j1", "w2", "process000", &spec).unwrap();
        assert_ne!(other, work);
        assert!(job_work_dir(&cache, "j1", "w2").starts_with(cache.join("work/j1")));
    }
}
