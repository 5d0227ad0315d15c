//! The guard of a job's local output folder (DESIGN.md decision 10): fleetrun writes only what
//! it creates there, records it as its own, and never overwrites or deletes anything else; a
//! running job holds a lock on the folder.
//!
//! # What fleetrun keeps in an output folder
//!
//! - `<append_row_file_name>`: the output. Written beside its final name (`<name>.<pid>.tmp`,
//!   by [`LocalStorage`](fleetrun_common::storage::LocalStorage)'s writer) and renamed into
//!   place when the job completes, so a re-run that is killed or fails leaves the previous
//!   output as it was.
//! - `logs/` (CONTRACT.md §7): the last run's logs. A re-run removes the previous run's log
//!   files, and only those, before it starts.
//! - `_parts/`: output parts while a job runs on a fleet whose output folder is local. Left as
//!   they are (a resumed job reads them); a job removes its own `_parts/<job>/` when it
//!   completes. The parts of a job run here (named with [`OutputGuard::runs_job`]) that did
//!   not complete (it died, failed or was interrupted) are kept for `fleetrun run --resume`
//!   ([`OutputGuard::claim_to_resume`]), and removed by the next claim that does not resume.
//! - `.fleetrun/`: `lock`, held by the running job, `manifest.json`, the record of what
//!   fleetrun wrote here, and `journal`, the embedded ledger's record of the job run here
//!   (kept with its parts for a resume).
//!
//! # Rules
//!
//! - **What is fleetrun's.** An entry is fleetrun's when the manifest records it with the
//!   identity it has now: device, inode and birth time (where the file system keeps one). A
//!   file the user put in place of fleetrun's has another identity, so it is not fleetrun's
//!   even under the same name. Symbolic links are never fleetrun's and never followed.
//! - **What gets recorded.** While a run holds the folder, what appears at fleetrun's names is
//!   fleetrun's: the output file, and everything under `logs/` and `_parts/`, created (birth
//!   time; else last modified) since the run took the folder. [`OutputGuard::finish`] records
//!   it when the run ends; a run that died is settled the same way by the next
//!   [`OutputGuard::claim`], which also removes the dead run's unfinished `<name>.<pid>.tmp`.
//!   So a file the user adds to `logs/` while a job runs, or after a job that was killed and
//!   before the next claim, is taken as fleetrun's; one added after a job that finished is
//!   not, and the next claim refuses it.
//! - **What a claim refuses** (before the job starts; the error names the path):
//!   an output file name that is taken by something not fleetrun's (the entry script, when the
//!   output folder is the source folder); a `logs/` or `_parts/` that is not fleetrun's and
//!   not empty, or holds anything not fleetrun's; an `append_row_file_name` of `logs`,
//!   `_parts` or `.fleetrun`; a folder another job holds.
//! - **What a claim removes:** the previous run's log files and folders that are fleetrun's.
//!   Never the output file: only the rename at completion replaces it.
//! - An empty `logs/` or `_parts/` fleetrun did not make is taken over: nothing in it can be
//!   lost.
//!
//! The lock is `flock(2)` on `.fleetrun/lock` (through [`File::try_lock`]), held by an open
//! file that is closed on exec, so it is released when the guard drops or its process dies,
//! and runner processes never hold it. S3 outputs have no guard: there is no lock, and the
//! output object is replaced when the job completes.
//!
//! # A fleet job's local output folder
//!
//! `fleetrun submit` claims the folder as `fleetrun run` does ([`OutputGuard::hand_to_fleet`]:
//! the same refusals, the previous run's logs removed), then leaves it to the job's workers
//! with the run open and the lock released: the workers, on this host or sharing its folder,
//! write the output file, `logs/` and `_parts/` as the job goes. Two fleet jobs never write
//! one folder at once (the submitter refuses an output a live job writes). Once the job has
//! ended, the node that writes its results and every node as it lets go of the job record
//! what it wrote as fleetrun's ([`OutputGuard::release_fleet`]); what appears after is not.
//! A job whose end nobody recorded (every worker died) is settled by the next claim, as a
//! run that died. A fleet job's parts are kept for `fleetrun resume` (its finalizer removes
//! them when it completes). A run here does not know whether a fleet job on the folder has
//! ended: do not start one on the output folder of a fleet job that has not.

use std::collections::BTreeMap;
use std::fs::{self, File, Metadata, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use fleetrun_config::{JobSpec, OutputAction};
use serde::{Deserialize, Serialize};

/// fleetrun's own folder in an output folder: the lock and the manifest.
pub const STATE_DIR: &str = ".fleetrun";
/// The job's log folder in the output folder (CONTRACT.md §7).
pub const LOGS_DIR: &str = "logs";
/// Where parts wait for the finalizer when the output folder is local ([`crate::parts`]).
pub const PARTS_DIR: &str = "_parts";
const LOCK_FILE: &str = "lock";
const MANIFEST_FILE: &str = "manifest.json";
const JOURNAL_FILE: &str = "journal";
const MANIFEST_VERSION: u32 = 1;
/// Names an output file may not take.
const RESERVED: [&str; 3] = [STATE_DIR, LOGS_DIR, PARTS_DIR];

/// Why a job may not use an output folder. Every one is found before the job starts.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// Another job, in this or another process, holds the folder.
    #[error("output folder {} is in use by another fleetrun job{}", .dir.display(), holder_text(*.holder))]
    Locked {
        dir: PathBuf,
        /// The process id the holder wrote in the lock file, when it could be read.
        holder: Option<u32>,
    },
    /// fleetrun would overwrite or write into something it did not write.
    #[error(
        "{} was not written by fleetrun, which never overwrites or deletes what it did not \
         write; move it away, or choose another output folder or append_row_file_name",
        .path.display()
    )]
    NotOurs { path: PathBuf },
    /// The output file would take the name of one of fleetrun's own entries.
    #[error(
        "append_row_file_name {name:?} is taken by fleetrun's own {name} in the output folder; \
         choose another name"
    )]
    Reserved { name: String },
    #[error("{}: fleetrun's record of this output folder cannot be read: {source}", .path.display())]
    Manifest {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn holder_text(holder: Option<u32>) -> String {
    holder.map_or_else(String::new, |pid| format!(" (process {pid})"))
}

/// A job's hold on its local output folder, from before the job starts to its end: the lock,
/// and the record of what the job writes there. Dropped without [`finish`](Self::finish) (a
/// panic, a kill), the run counts as dead and the next claim settles it.
#[derive(Debug)]
pub struct OutputGuard {
    dir: PathBuf,
    output: Option<String>,
    manifest: Manifest,
    /// Holds the lock while open.
    _lock: File,
}

impl OutputGuard {
    /// Takes the output folder `dir` of job `spec` (its local `output`), creating it when
    /// missing: locks it, settles a previous run that died, refuses what the job would
    /// overwrite that is not fleetrun's, and removes the previous run's logs. Fails at once
    /// if another job holds the folder.
    pub fn claim(dir: &Path, spec: &JobSpec) -> Result<OutputGuard, OutputError> {
        Self::claim_with(dir, spec, Claim::Run)
    }

    /// [`OutputGuard::claim`] for a run that continues the last one left unfinished here
    /// (`fleetrun run --resume`): its parts and its journal are kept, not removed.
    pub fn claim_to_resume(dir: &Path, spec: &JobSpec) -> Result<OutputGuard, OutputError> {
        Self::claim_with(dir, spec, Claim::Resume)
    }

    /// Hands the output folder `dir` to fleet job `job` when it is submitted: the same
    /// claim, refusals and removal of the previous run's logs as [`OutputGuard::claim`], but
    /// the folder is then left to the job's workers (which hold no lock) with the run open,
    /// so that the next claim records what they wrote as fleetrun's, and the job's parts
    /// are kept for `fleetrun resume`. Submitting the same job again (attaching to it)
    /// changes nothing.
    pub fn hand_to_fleet(dir: &Path, spec: &JobSpec, job: &str) -> Result<(), OutputError> {
        Self::claim_with(dir, spec, Claim::Fleet(job)).map(drop)
    }

    fn claim_with(
        dir: &Path,
        spec: &JobSpec,
        claim: Claim<'_>,
    ) -> Result<OutputGuard, OutputError> {
        let output = (spec.output_action == OutputAction::AppendRow)
            .then(|| spec.append_row_file_name.clone());
        if let Some(name) = &output
            && RESERVED.contains(&name.as_str())
        {
            return Err(OutputError::Reserved { name: name.clone() });
        }
        fs::create_dir_all(dir).map_err(io_at(dir))?;
        let state = state_dir(dir)?;
        let (lock, since) = lock(dir, &state.join(LOCK_FILE))?;
        let mut manifest = Manifest::load(&state.join(MANIFEST_FILE))?;
        if let Claim::Fleet(job) = claim
            && manifest.handed_to(job)
        {
            // The job has the folder already: this submission attaches to it.
            return Ok(OutputGuard {
                dir: dir.to_path_buf(),
                output,
                manifest,
                _lock: lock,
            });
        }
        manifest.settle_last_run(dir, matches!(claim, Claim::Resume))?;
        // Every refusal comes before anything is removed.
        if let Some(name) = &output {
            let path = dir.join(name);
            if let Some(meta) = lstat(&path)?
                && !manifest.owns(name, &meta)
            {
                return Err(OutputError::NotOurs { path });
            }
        }
        manifest.fresh_logs(dir)?;
        let fleet_job = match claim {
            Claim::Fleet(job) => Some(job.to_owned()),
            Claim::Run | Claim::Resume => None,
        };
        manifest.run = Some(Run {
            pid: std::process::id(),
            since,
            output: output.clone(),
            fleet: fleet_job.is_some(),
            job: fleet_job,
            ended: false,
        });
        manifest.save(&state)?;
        Ok(OutputGuard {
            dir: dir.to_path_buf(),
            output,
            manifest,
            _lock: lock,
        })
    }

    /// Records what fleet job `job` wrote in its output folder `dir` as fleetrun's, once it
    /// has ended: called by the node that wrote its results, and by every node as it lets go
    /// of the job (its last log lines written). What appears after the last call is not
    /// fleetrun's. Nothing happens unless the folder was handed to that job (a run here keeps
    /// its own guard). Returns whether anything was recorded.
    pub fn release_fleet(dir: &Path, job: &str) -> Result<bool, OutputError> {
        let state = dir.join(STATE_DIR);
        let manifest = state.join(MANIFEST_FILE);
        if !Manifest::load(&manifest)?.handed_to(job) {
            return Ok(false);
        }
        // Another submission may hold the lock a moment. Letting go writes nothing in the
        // lock file (the pid of whoever claimed the folder stays): a node that lets go after
        // the job's submitter returned changes nothing a user sees unless it records some.
        let mut tries = 0;
        let _lock = loop {
            match take_lock(dir, &state.join(LOCK_FILE)) {
                Ok(lock) => break lock,
                Err(OutputError::Locked { .. }) if tries < 20 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        };
        let mut manifest = Manifest::load(&manifest)?;
        if !manifest.handed_to(job) {
            return Ok(false);
        }
        let Some(mut run) = manifest.run.take() else {
            return Ok(false);
        };
        manifest.settle(dir, &run)?;
        run.ended = true;
        manifest.run = Some(run);
        manifest.save(&state)?;
        Ok(true)
    }

    /// Records that this run runs job `job`, whose parts (`_parts/<job>/`) nothing else will
    /// read: if the run dies, the next claim removes them.
    pub fn runs_job(&mut self, job: &str) -> Result<(), OutputError> {
        if let Some(run) = &mut self.manifest.run {
            run.job = Some(job.to_owned());
        }
        self.manifest.save(&self.dir.join(STATE_DIR))
    }

    /// Keeps what this run's job leaves unfinished here (its parts and journal) for
    /// `fleetrun run --resume`; the next claim that does not resume removes them.
    pub fn keep_for_resume(&mut self, job: &str) {
        self.manifest.resumable = Some(job.to_owned());
    }

    /// The embedded ledger's journal of the job run here (see `fleetrun run --resume`).
    pub fn journal_path(&self) -> PathBuf {
        self.dir.join(STATE_DIR).join(JOURNAL_FILE)
    }

    /// The output folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The job's log folder, `logs/` of the output folder.
    pub fn log_dir(&self) -> PathBuf {
        self.dir.join(LOGS_DIR)
    }

    /// The `append_row` file's final path; `None` when the job writes no output file.
    pub fn output_file(&self) -> Option<PathBuf> {
        self.output.as_ref().map(|name| self.dir.join(name))
    }

    /// Ends the run, whatever its outcome, once nothing writes the folder any more (the logs
    /// flushed for the last time): records what the run wrote as fleetrun's, removes its
    /// unfinished output file, if any, and releases the lock.
    pub fn finish(mut self) -> Result<(), OutputError> {
        if let Some(run) = self.manifest.run.take() {
            self.manifest.settle(&self.dir, &run)?;
        }
        self.manifest.save(&self.dir.join(STATE_DIR))
    }
}

/// Who claims an output folder.
#[derive(Clone, Copy)]
enum Claim<'a> {
    /// A job run here (`fleetrun run`).
    Run,
    /// `fleetrun run --resume`: the last run's parts and journal are kept.
    Resume,
    /// Fleet job `0`, at its submission.
    Fleet(&'a str),
}

/// The output folder's own state folder, made when it is not there yet; refused when
/// something else has its name.
fn state_dir(dir: &Path) -> Result<PathBuf, OutputError> {
    let state = dir.join(STATE_DIR);
    match lstat(&state)? {
        None => match fs::create_dir(&state) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(io_at(&state)(e));
            }
            _ => {}
        },
        Some(meta) if meta.is_dir() => {}
        Some(_) => return Err(OutputError::NotOurs { path: state }),
    }
    Ok(state)
}

/// Opens and locks `path` for the folder `dir`, and writes this process's id in it. Returns
/// the lock and the file system's time at locking: whatever is created after it has a birth
/// time (or modification time) no earlier.
fn lock(dir: &Path, path: &Path) -> Result<(File, i64), OutputError> {
    let file = take_lock(dir, path)?;
    let pid = format!("{}\n", std::process::id());
    file.set_len(0)
        .and_then(|()| file.write_all_at(pid.as_bytes(), 0))
        .map_err(io_at(path))?;
    let meta = file.metadata().map_err(io_at(path))?;
    Ok((file, modified(&meta)))
}

/// Opens and locks `path` for the folder `dir`, writing nothing in it.
fn take_lock(dir: &Path, path: &Path) -> Result<File, OutputError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_at(path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(fs::TryLockError::WouldBlock) => {
            let holder = fs::read_to_string(path)
                .ok()
                .and_then(|text| text.trim().parse().ok());
            return Err(OutputError::Locked {
                dir: dir.to_path_buf(),
                holder,
            });
        }
        Err(fs::TryLockError::Error(e)) => return Err(io_at(path)(e)),
    }
    Ok(file)
}

/// What fleetrun wrote in an output folder, kept in `.fleetrun/manifest.json`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Manifest {
    version: u32,
    /// fleetrun's entries by path relative to the output folder, `/`-separated.
    entries: BTreeMap<String, Identity>,
    /// The run that holds the folder. Still set when a claim reads it: that run died.
    run: Option<Run>,
    /// The job whose parts and journal the last run left here for a resume.
    #[serde(default)]
    resumable: Option<String>,
}

/// Which file an entry is: another file put under the same name has another identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Identity {
    dir: bool,
    dev: u64,
    ino: u64,
    /// Birth time in nanoseconds, where the file system keeps one.
    born: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Run {
    pid: u32,
    /// The file system's time when the run took the folder, in nanoseconds.
    since: i64,
    /// The output file it writes, if any.
    output: Option<String>,
    /// The job it runs, once named ([`OutputGuard::runs_job`]).
    #[serde(default)]
    job: Option<String>,
    /// A fleet job's ([`OutputGuard::hand_to_fleet`]): its workers write the folder until it
    /// ends, holding no lock.
    #[serde(default)]
    fleet: bool,
    /// The fleet job ended: what it wrote was recorded as each node let go of it
    /// ([`OutputGuard::release_fleet`]), and what appeared after is not fleetrun's.
    #[serde(default)]
    ended: bool,
}

/// An entry found under a folder: `rel` is `None` when its name is not UTF-8 (fleetrun
/// writes no such name).
#[derive(Debug)]
struct Found {
    path: PathBuf,
    rel: Option<String>,
    meta: Metadata,
}

impl Manifest {
    /// Settles the last run on the folder `dir` if it did not say it ended (what it wrote
    /// becomes fleetrun's); unless this claim `resume`s it, the last run's parts and journal
    /// go. Forgets files replaced since they were recorded.
    fn settle_last_run(&mut self, dir: &Path, resume: bool) -> Result<(), OutputError> {
        if let Some(last) = self.run.take()
            && !last.ended
        {
            if last.fleet {
                tracing::info!(
                    folder = %dir.display(),
                    job = last.job.as_deref().unwrap_or_default(),
                    "The fleet job on this output folder did not say it ended; recording what it wrote."
                );
            } else {
                tracing::warn!(
                    folder = %dir.display(),
                    pid = last.pid,
                    "The last job on this output folder did not finish; settling what it wrote."
                );
            }
            self.settle(dir, &last)?;
            // A fleet job's parts are its finalizer's to remove, and `fleetrun resume`'s.
            if last.job.is_some() && !last.fleet {
                self.resumable = last.job;
            }
        }
        if !resume && let Some(job) = self.resumable.take() {
            // A new run: the last one's parts and journal are of no use any more.
            self.remove_parts(dir, &job)?;
            let journal = dir.join(STATE_DIR).join(JOURNAL_FILE);
            match fs::remove_file(&journal) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_at(&journal)(e)),
                _ => {}
            }
        }
        self.forget_replaced(dir)
    }

    /// Removes the last run's logs (what fleetrun wrote of them; a folder something else
    /// was put in is kept, with a warning) and makes the `logs` folder anew.
    fn fresh_logs(&mut self, dir: &Path) -> Result<(), OutputError> {
        let old_logs = self.own_folder(dir, LOGS_DIR)?;
        self.own_folder(dir, PARTS_DIR)?;
        for found in old_logs.iter().rev() {
            let removed = if found.meta.is_dir() {
                fs::remove_dir(&found.path)
            } else {
                fs::remove_file(&found.path)
            };
            match removed {
                Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => {
                    tracing::warn!(path = %found.path.display(), "Keeping a log folder that is not empty.");
                }
                Err(e) if e.kind() != io::ErrorKind::NotFound => {
                    return Err(io_at(&found.path)(e));
                }
                _ => {
                    if let Some(rel) = &found.rel {
                        self.entries.remove(rel);
                    }
                }
            }
        }
        let logs = dir.join(LOGS_DIR);
        if lstat(&logs)?.is_none() {
            fs::create_dir(&logs).map_err(io_at(&logs))?;
            let meta = fs::symlink_metadata(&logs).map_err(io_at(&logs))?;
            self.record(LOGS_DIR, &meta);
        }
        Ok(())
    }

    /// Whether the folder is handed to fleet job `job` ([`OutputGuard::hand_to_fleet`]).
    fn handed_to(&self, job: &str) -> bool {
        self.run
            .as_ref()
            .is_some_and(|run| run.fleet && run.job.as_deref() == Some(job))
    }

    fn load(path: &Path) -> Result<Manifest, OutputError> {
        match fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| OutputError::Manifest {
                path: path.to_path_buf(),
                source,
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Manifest::default()),
            Err(e) => Err(io_at(path)(e)),
        }
    }

    /// Replaces the manifest in `state` whole: a crash leaves the old one or the new one.
    fn save(&mut self, state: &Path) -> Result<(), OutputError> {
        self.version = MANIFEST_VERSION;
        let path = state.join(MANIFEST_FILE);
        let tmp = state.join(format!("{MANIFEST_FILE}.tmp"));
        let body = serde_json::to_vec_pretty(self).expect("a manifest serializes");
        File::create(&tmp)
            .and_then(|mut file| {
                io::Write::write_all(&mut file, &body)?;
                file.sync_all()
            })
            .map_err(io_at(&tmp))?;
        fs::rename(&tmp, &path).map_err(io_at(&path))
    }

    fn owns(&self, rel: &str, meta: &Metadata) -> bool {
        identity(meta).is_some_and(|id| self.entries.get(rel) == Some(&id))
    }

    fn record(&mut self, rel: &str, meta: &Metadata) {
        if let Some(id) = identity(meta) {
            self.entries.insert(rel.to_owned(), id);
        }
    }

    /// Records what `run` wrote in `dir`: what appeared at fleetrun's names since it took the
    /// folder. Removes its unfinished output file.
    fn settle(&mut self, dir: &Path, run: &Run) -> Result<(), OutputError> {
        let fresh = |meta: &Metadata| appeared(meta) >= run.since;
        if let Some(name) = &run.output {
            // LocalStorage's writer's name for it (`temp_sibling`).
            let tmp = dir.join(format!("{name}.{}.tmp", run.pid));
            if let Some(meta) = lstat(&tmp)?
                && meta.is_file()
                && fresh(&meta)
            {
                match fs::remove_file(&tmp) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_at(&tmp)(e)),
                    _ => {}
                }
            }
            if let Some(meta) = lstat(&dir.join(name))?
                && meta.is_file()
                && fresh(&meta)
            {
                self.record(name, &meta);
            }
        }
        for folder in [LOGS_DIR, PARTS_DIR] {
            let path = dir.join(folder);
            let Some(meta) = lstat(&path)? else { continue };
            if !meta.is_dir() || !(self.owns(folder, &meta) || fresh(&meta)) {
                continue;
            }
            self.record(folder, &meta);
            if folder == LOGS_DIR {
                for found in walk(&path, folder)? {
                    if let Some(rel) = &found.rel
                        && fresh(&found.meta)
                    {
                        self.record(rel, &found.meta);
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes the parts of the job a dead `run` ran here (fleetrun's, as they appeared during
    /// that run), and `_parts/` once it is empty.
    fn remove_parts(&mut self, dir: &Path, job: &str) -> Result<(), OutputError> {
        let parts = dir.join(PARTS_DIR);
        let Some(meta) = lstat(&parts)? else {
            return Ok(());
        };
        if !meta.is_dir() || !self.owns(PARTS_DIR, &meta) {
            return Ok(());
        }
        let held = parts.join(job);
        if let Some(meta) = lstat(&held)?
            && meta.is_dir()
        {
            match fs::remove_dir_all(&held) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_at(&held)(e)),
                _ => {}
            }
        }
        if fs::remove_dir(&parts).is_ok() {
            self.entries.remove(PARTS_DIR);
        }
        Ok(())
    }

    /// Forgets entries that are gone or were replaced by another file.
    fn forget_replaced(&mut self, dir: &Path) -> Result<(), OutputError> {
        let mut gone = Vec::new();
        for (rel, id) in &self.entries {
            let now = lstat(&dir.join(rel))?;
            if now.as_ref().and_then(identity) != Some(*id) {
                gone.push(rel.clone());
            }
        }
        for rel in gone {
            self.entries.remove(&rel);
        }
        Ok(())
    }

    /// Makes sure the folder `name` of `dir` is fleetrun's, when it exists: taken over when
    /// empty, refused when it holds anything not fleetrun's. Returns what it holds.
    fn own_folder(&mut self, dir: &Path, name: &str) -> Result<Vec<Found>, OutputError> {
        let path = dir.join(name);
        let Some(meta) = lstat(&path)? else {
            return Ok(Vec::new());
        };
        if !meta.is_dir() {
            return Err(OutputError::NotOurs { path });
        }
        let held = walk(&path, name)?;
        if !self.owns(name, &meta) {
            if !held.is_empty() {
                return Err(OutputError::NotOurs { path });
            }
            self.record(name, &meta);
        }
        // `_parts/` holds what the fleet's workers wrote for jobs that may resume: its
        // entries are not recorded one by one.
        if name == LOGS_DIR
            && let Some(foreign) = held
                .iter()
                .find(|f| !f.rel.as_ref().is_some_and(|rel| self.owns(rel, &f.meta)))
        {
            return Err(OutputError::NotOurs {
                path: foreign.path.clone(),
            });
        }
        Ok(held)
    }
}

/// Every entry under `root` (whose relative path is `rel_root`), parents before their
/// children, without following links.
fn walk(root: &Path, rel_root: &str) -> Result<Vec<Found>, OutputError> {
    let mut found = Vec::new();
    let mut folders = vec![(root.to_path_buf(), Some(rel_root.to_owned()))];
    while let Some((folder, rel)) = folders.pop() {
        for entry in fs::read_dir(&folder).map_err(io_at(&folder))? {
            let entry = entry.map_err(io_at(&folder))?;
            let path = entry.path();
            let Some(meta) = lstat(&path)? else { continue };
            let rel = match (&rel, entry.file_name().to_str()) {
                (Some(parent), Some(name)) => Some(format!("{parent}/{name}")),
                _ => None,
            };
            if meta.is_dir() {
                folders.push((path.clone(), rel.clone()));
            }
            found.push(Found { path, rel, meta });
        }
    }
    // Path order keeps parents before children, and makes the first refusal the same
    // every time.
    found.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(found)
}

/// The identity of a file or folder; `None` for anything else (a link, a socket).
fn identity(meta: &Metadata) -> Option<Identity> {
    let kind = meta.file_type();
    (kind.is_file() || kind.is_dir()).then(|| Identity {
        dir: kind.is_dir(),
        dev: meta.dev(),
        ino: meta.ino(),
        born: born(meta),
    })
}

fn born(meta: &Metadata) -> Option<i64> {
    meta.created().ok().and_then(nanos).filter(|&t| t > 0)
}

fn modified(meta: &Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

/// When an entry appeared: its birth time, else its last modification.
fn appeared(meta: &Metadata) -> i64 {
    born(meta).unwrap_or_else(|| modified(meta))
}

fn nanos(time: SystemTime) -> Option<i64> {
    let since_epoch = time.duration_since(UNIX_EPOCH).ok()?;
    i64::try_from(since_epoch.as_nanos()).ok()
}

/// The entry at `path` itself (a link, not its target); `None` if there is none.
fn lstat(path: &Path) -> Result<Option<Metadata>, OutputError> {
    match fs::symlink_metadata(path) {
        Ok(meta) => Ok(Some(meta)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_at(path)(e)),
    }
}

fn io_at(path: &Path) -> impl FnOnce(io::Error) -> OutputError + '_ {
    move |source| OutputError::Io {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use fleetrun_common::storage::{LocalStorage, Storage};

    use super::*;
    use crate::logs::JobLogs;

    const OUT: &str = "results.txt";

    /// A job writing `output_file`; the output folder is the guard's argument, not the spec's.
    fn spec(output_file: &str) -> JobSpec {
        static SPEC: std::sync::OnceLock<JobSpec> = std::sync::OnceLock::new();
        let mut spec = SPEC
            .get_or_init(|| {
                let job = tempfile::tempdir().unwrap().keep();
                fs::write(job.join("score.py"), "").unwrap();
                fs::create_dir(job.join("in")).unwrap();
                let text = "name = \"guard\"\nentry_script = \"score.py\"\n\
                            output_action = \"append_row\"\nmini_batch_size = 1\n\
                            [input]\nfiles = \"in\"\n[output]\npath = \"out\"\n";
                fleetrun_config::load_str(text, "job.toml", &job, &[]).unwrap()
            })
            .clone();
        spec.append_row_file_name = output_file.to_owned();
        spec
    }

    /// The path a claim of `dir` for a job writing `output_file` is refused over.
    fn refused(dir: &Path, output_file: &str) -> PathBuf {
        not_ours(OutputGuard::claim(dir, &spec(output_file)))
    }

    /// Asserts the user's file at `path` is as they wrote it.
    fn kept(path: &Path) {
        assert_eq!(
            fs::read_to_string(path).unwrap(),
            "mine",
            "{}",
            path.display()
        );
    }

    fn not_ours(result: Result<OutputGuard, OutputError>) -> PathBuf {
        match result {
            Err(OutputError::NotOurs { path }) => path,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// One run of a job: claims `dir`, writes a log line and the output `body` (renamed into
    /// place when `complete`, else abandoned half written), and finishes.
    async fn run(dir: &Path, body: &str, complete: bool) -> Result<(), OutputError> {
        let guard = OutputGuard::claim(dir, &spec(OUT))?;
        let logs = JobLogs::new(guard.log_dir());
        logs.log(JobLogs::node_main("n1"), body);
        logs.write(crate::logs::JOB_RESULT, body);
        logs.flush();
        let storage = LocalStorage::new(dir);
        let mut writer = storage.writer(OUT).await.unwrap();
        writer.write(Bytes::from(body.to_owned())).await.unwrap();
        if complete {
            writer.finish().await.unwrap();
        }
        guard.finish()
    }

    /// The path handing `dir` to fleet job `job` is refused over.
    fn refused_to_fleet(dir: &Path, job: &str) -> PathBuf {
        match OutputGuard::hand_to_fleet(dir, &spec(OUT), job) {
            Err(OutputError::NotOurs { path }) => path,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    /// A fleet job's turn on a folder: handed over at submission (its workers write without
    /// the lock), attached to again without losing what it wrote, released when it ended;
    /// its output and logs are then fleetrun's, a file the user adds after is not.
    #[test]
    fn a_folder_handed_to_a_fleet_job_is_settled_when_it_ends() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::write(dir.join(OUT), "mine").unwrap();
        assert_eq!(refused_to_fleet(dir, "j1"), dir.join(OUT));
        kept(&dir.join(OUT));
        fs::remove_file(dir.join(OUT)).unwrap();

        OutputGuard::hand_to_fleet(dir, &spec(OUT), "j1").unwrap();
        // Its workers write, holding no lock.
        fs::create_dir_all(dir.join("logs/sys/node/n1")).unwrap();
        fs::write(dir.join("logs/sys/node/n1/_main.txt"), "ran").unwrap();
        fs::write(dir.join(OUT), "out").unwrap();
        // Submitting it again attaches: its logs stay.
        OutputGuard::hand_to_fleet(dir, &spec(OUT), "j1").unwrap();
        assert!(dir.join("logs/sys/node/n1/_main.txt").exists());
        // Another job's end releases nothing; its own does.
        assert!(!OutputGuard::release_fleet(dir, "j2").unwrap());
        assert!(OutputGuard::release_fleet(dir, "j1").unwrap());
        // Another node's last log lines, written after the job's results: its own release.
        fs::write(dir.join("logs/sys/node_n2.txt"), "ended").unwrap();
        assert!(OutputGuard::release_fleet(dir, "j1").unwrap());

        fs::write(dir.join("logs/notes.txt"), "mine").unwrap();
        assert_eq!(refused_to_fleet(dir, "j3"), dir.join("logs/notes.txt"));
        kept(&dir.join("logs/notes.txt"));
        fs::remove_file(dir.join("logs/notes.txt")).unwrap();
        // The next job takes the folder: j1's logs go, its output stays until replaced.
        OutputGuard::hand_to_fleet(dir, &spec(OUT), "j3").unwrap();
        assert!(!dir.join("logs/sys/node/n1/_main.txt").exists());
        assert!(!dir.join("logs/sys/node_n2.txt").exists());
        assert_eq!(fs::read_to_string(dir.join(OUT)).unwrap(), "out");
    }

    /// A fleet job whose end no node recorded (every worker died) is settled by the next
    /// claim, as a run that died: what it wrote is fleetrun's and goes, its parts stay for
    /// `fleetrun resume`, and a run here takes the folder.
    #[test]
    fn a_fleet_job_nobody_saw_end_is_settled_by_the_next_claim() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        OutputGuard::hand_to_fleet(dir, &spec(OUT), "j1").unwrap();
        fs::create_dir_all(dir.join("logs/sys")).unwrap();
        fs::write(dir.join("logs/sys/master_role.n1.txt"), "ran").unwrap();
        fs::create_dir_all(dir.join("_parts/j1")).unwrap();
        fs::write(dir.join("_parts/j1/0"), "row").unwrap();
        fs::write(dir.join(OUT), "out").unwrap();

        let guard = OutputGuard::claim(dir, &spec(OUT)).unwrap();
        assert!(!dir.join("logs/sys/master_role.n1.txt").exists());
        assert!(
            dir.join("_parts/j1/0").exists(),
            "a fleet job's parts are kept"
        );
        guard.finish().unwrap();
        assert_eq!(fs::read_to_string(dir.join(OUT)).unwrap(), "out");
        // The output was the fleet job's: the next run may replace it.
        OutputGuard::claim(dir, &spec(OUT))
            .unwrap()
            .finish()
            .unwrap();
    }

    #[test]
    fn a_new_or_empty_folder_is_taken_and_gets_logs() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/out");
        let guard = OutputGuard::claim(&dir, &spec(OUT)).unwrap();
        assert!(guard.log_dir().is_dir());
        assert_eq!(guard.output_file(), Some(dir.join(OUT)));
        guard.finish().unwrap();

        let empty = tmp.path().join("empty");
        fs::create_dir_all(empty.join(LOGS_DIR)).unwrap();
        let guard = OutputGuard::claim(&empty, &spec(OUT)).unwrap();
        guard.finish().unwrap();
    }

    #[test]
    fn a_users_logs_folder_is_refused_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::create_dir(dir.join("logs")).unwrap();
        fs::write(dir.join("logs/notes.txt"), "mine").unwrap();
        assert_eq!(refused(dir, OUT), dir.join("logs"));
        kept(&dir.join("logs/notes.txt"));

        // A file named `logs`, and a link named `logs` to an empty folder, are refused too.
        fs::remove_dir_all(dir.join("logs")).unwrap();
        fs::write(dir.join("logs"), "mine").unwrap();
        refused(dir, OUT);
        fs::remove_file(dir.join("logs")).unwrap();
        fs::create_dir(dir.join("elsewhere")).unwrap();
        std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("logs")).unwrap();
        refused(dir, OUT);
    }

    #[test]
    fn a_users_file_named_like_the_output_is_refused_and_kept() {
        // The output folder is the source folder, and the output takes the script's name.
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::write(dir.join("score.py"), "mine").unwrap();
        assert_eq!(refused(dir, "score.py"), dir.join("score.py"));
        kept(&dir.join("score.py"));
        assert!(
            !dir.join(LOGS_DIR).exists(),
            "a refused claim writes no logs"
        );

        // A link under the output's name is not fleetrun's either; its target stays.
        fs::write(dir.join("target.txt"), "mine").unwrap();
        std::os::unix::fs::symlink(dir.join("target.txt"), dir.join(OUT)).unwrap();
        assert_eq!(refused(dir, OUT), dir.join(OUT));
        kept(&dir.join("target.txt"));
    }

    #[test]
    fn a_users_parts_folder_is_refused_and_an_empty_one_taken_over() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::create_dir(dir.join(PARTS_DIR)).unwrap();
        OutputGuard::claim(dir, &spec(OUT))
            .unwrap()
            .finish()
            .unwrap();
        // Parts a fleet's job left for a resume stay, and are no refusal.
        fs::create_dir(dir.join("_parts/job-1")).unwrap();
        OutputGuard::claim(dir, &spec(OUT))
            .unwrap()
            .finish()
            .unwrap();
        assert!(dir.join("_parts/job-1").is_dir());

        let other = tmp.path().join("other");
        fs::create_dir_all(other.join(PARTS_DIR)).unwrap();
        fs::write(other.join("_parts/notes.txt"), "mine").unwrap();
        assert_eq!(refused(&other, OUT), other.join(PARTS_DIR));
        kept(&other.join("_parts/notes.txt"));
    }

    #[test]
    fn fleetruns_own_names_are_not_output_names() {
        let tmp = tempfile::tempdir().unwrap();
        for name in RESERVED {
            let refused = OutputGuard::claim(tmp.path(), &spec(name));
            assert!(
                matches!(refused, Err(OutputError::Reserved { .. })),
                "{name}"
            );
        }
    }

    #[tokio::test]
    async fn the_previous_output_stays_until_a_run_completes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let tmp_file = dir.join(format!("{OUT}.{}.tmp", std::process::id()));
        run(dir, "first\n", true).await.unwrap();
        assert_eq!(fs::read_to_string(dir.join(OUT)).unwrap(), "first\n");

        // A run that fails while writing: the first output stays, the half-written one goes.
        run(dir, "second\n", false).await.unwrap();
        assert_eq!(fs::read_to_string(dir.join(OUT)).unwrap(), "first\n");
        assert!(!tmp_file.exists());
        assert_eq!(
            fs::read_to_string(dir.join("logs").join(crate::logs::JOB_RESULT)).unwrap(),
            "second\n",
            "the logs are the last run's"
        );

        run(dir, "third\n", true).await.unwrap();
        assert_eq!(fs::read_to_string(dir.join(OUT)).unwrap(), "third\n");
        // The replaced output is recorded as fleetrun's: the next run may replace it.
        run(dir, "fourth\n", true).await.unwrap();
        assert_eq!(fs::read_to_string(dir.join(OUT)).unwrap(), "fourth\n");

        // An output the user put in its place is theirs.
        fs::remove_file(dir.join(OUT)).unwrap();
        fs::write(dir.join(OUT), "mine").unwrap();
        assert_eq!(refused(dir, OUT), dir.join(OUT));
    }

    #[tokio::test]
    async fn a_rerun_replaces_fleetruns_logs_and_refuses_a_users_file_among_them() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        run(dir, "first\n", true).await.unwrap();
        let main = dir.join("logs").join(JobLogs::node_main("n1"));
        assert!(fs::read_to_string(&main).unwrap().contains(" first"));

        let guard = OutputGuard::claim(dir, &spec(OUT)).unwrap();
        assert!(!main.exists(), "the previous run's logs are removed");
        assert!(!dir.join("logs/sys").exists());
        assert!(dir.join("logs").is_dir());
        guard.finish().unwrap();

        run(dir, "second\n", true).await.unwrap();
        fs::write(dir.join("logs/sys/notes.txt"), "mine").unwrap();
        assert_eq!(refused(dir, OUT), dir.join("logs/sys/notes.txt"));
        assert!(main.exists(), "a refused claim removes nothing");
        kept(&dir.join("logs/sys/notes.txt"));

        // A link among the logs is never fleetrun's, and never followed.
        fs::remove_file(dir.join("logs/sys/notes.txt")).unwrap();
        fs::write(dir.join("precious.txt"), "mine").unwrap();
        std::os::unix::fs::symlink(dir.join("precious.txt"), dir.join("logs/link")).unwrap();
        assert_eq!(refused(dir, OUT), dir.join("logs/link"));
        kept(&dir.join("precious.txt"));
    }

    #[tokio::test]
    async fn a_run_that_died_is_settled_by_the_next_claim() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        run(dir, "first\n", true).await.unwrap();
        let other_tmp = dir.join(format!("{OUT}.999999.tmp"));
        fs::write(&other_tmp, "mine").unwrap();

        // Killed midway: logs and a half-written output, no finish.
        let guard = OutputGuard::claim(dir, &spec(OUT)).unwrap();
        let logs = JobLogs::new(guard.log_dir());
        logs.log(JobLogs::node_main("n2"), "dying");
        logs.flush();
        let mut writer = LocalStorage::new(dir).writer(OUT).await.unwrap();
        writer.write(Bytes::from("half")).await.unwrap();
        drop(writer);
        drop(guard);
        let half = dir.join(format!("{OUT}.{}.tmp", std::process::id()));
        assert!(half.exists());

        let guard = OutputGuard::claim(dir, &spec(OUT)).unwrap();
        assert!(
            !half.exists(),
            "the dead run's unfinished output is removed"
        );
        assert!(
            !dir.join("logs").join(JobLogs::node_main("n2")).exists(),
            "the dead run's logs are fleetrun's, and removed"
        );
        assert_eq!(fs::read_to_string(dir.join(OUT)).unwrap(), "first\n");
        kept(&other_tmp);
        guard.finish().unwrap();
    }

    #[test]
    fn the_parts_of_a_dead_run_go_with_the_next_claim_and_no_others() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // A fleet job's parts, there before: kept for a resume.
        drop(OutputGuard::claim(dir, &spec(OUT)).unwrap());
        fs::create_dir_all(dir.join("_parts/fleet-job")).unwrap();
        fs::write(dir.join("_parts/fleet-job/0.part"), "mine").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        OutputGuard::claim(dir, &spec(OUT))
            .unwrap()
            .finish()
            .unwrap();

        // Killed midway (no finish) while its parts were being written.
        let mut guard = OutputGuard::claim(dir, &spec(OUT)).unwrap();
        guard.runs_job("local-job").unwrap();
        fs::create_dir_all(dir.join("_parts/local-job")).unwrap();
        fs::write(dir.join("_parts/local-job/3.part"), "half").unwrap();
        drop(guard);

        OutputGuard::claim(dir, &spec(OUT))
            .unwrap()
            .finish()
            .unwrap();
        assert!(!dir.join("_parts/local-job").exists());
        kept(&dir.join("_parts/fleet-job/0.part"));

        // Once the folder holds no job's parts, it goes too.
        fs::remove_dir_all(dir.join("_parts/fleet-job")).unwrap();
        let mut guard = OutputGuard::claim(dir, &spec(OUT)).unwrap();
        guard.runs_job("local-job-2").unwrap();
        fs::create_dir_all(dir.join("_parts/local-job-2")).unwrap();
        drop(guard);
        OutputGuard::claim(dir, &spec(OUT))
            .unwrap()
            .finish()
            .unwrap();
        assert!(!dir.join("_parts").exists());
    }

    /// Marks the run recorded in `dir`'s manifest as process `pid`'s.
    fn pretend_run_was(dir: &Path, pid: u32) {
        let state = dir.join(STATE_DIR);
        let mut manifest = Manifest::load(&state.join(MANIFEST_FILE)).unwrap();
        manifest.run.as_mut().unwrap().pid = pid;
        manifest.save(&state).unwrap();
    }

    #[test]
    fn only_what_appeared_during_a_dead_run_is_taken_as_its_own() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // Named like the unfinished output of a run of process 1, but there before it.
        let before = dir.join(format!("{OUT}.1.tmp"));
        fs::write(&before, "mine").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        drop(OutputGuard::claim(dir, &spec(OUT)).unwrap());
        pretend_run_was(dir, 1);
        drop(OutputGuard::claim(dir, &spec(OUT)).unwrap());
        kept(&before);

        // What the dead run of process 2 left is removed.
        pretend_run_was(dir, 2);
        let left = dir.join(format!("{OUT}.2.tmp"));
        fs::write(&left, "half").unwrap();
        OutputGuard::claim(dir, &spec(OUT))
            .unwrap()
            .finish()
            .unwrap();
        assert!(!left.exists());
        kept(&before);
    }

    #[test]
    fn a_second_job_on_a_held_folder_fails_at_once_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("out");
        let first = OutputGuard::claim(&dir, &spec(OUT)).unwrap();
        let started = Instant::now();
        let second = OutputGuard::claim(&dir, &spec("other.txt"));
        assert!(started.elapsed() < Duration::from_secs(1));
        let err = second.unwrap_err();
        assert!(
            matches!(&err, OutputError::Locked { dir: d, holder: Some(pid) } if *d == dir && *pid == std::process::id()),
            "{err:?}"
        );
        assert!(
            err.to_string().contains(&dir.display().to_string()),
            "{err}"
        );

        // Released when the guard drops, finished or not.
        drop(first);
        let again = OutputGuard::claim(&dir, &spec(OUT)).unwrap();
        again.finish().unwrap();
        OutputGuard::claim(&dir, &spec(OUT)).unwrap();
    }

    #[test]
    fn an_unreadable_manifest_is_reported_not_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        fs::create_dir(dir.join(STATE_DIR)).unwrap();
        fs::write(dir.join(STATE_DIR).join(MANIFEST_FILE), "not json").unwrap();
        let refused = OutputGuard::claim(dir, &spec(OUT));
        assert!(
            matches!(refused, Err(OutputError::Manifest { .. })),
            "{refused:?}"
        );
        assert_eq!(
            fs::read_to_string(dir.join(STATE_DIR).join(MANIFEST_FILE)).unwrap(),
            "not json"
        );
    }
}
