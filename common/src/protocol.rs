//! The private channel between a node agent and one runner process.
//!
//! Frames are a 4-byte big-endian length followed by a MessagePack map (`rmp_serde`'s named
//! encoding), exchanged over a socket the agent hands the runner as file descriptor
//! [`CHANNEL_FD`]. The runner's stdout and stderr belong to the user's script and never carry
//! protocol. One request gets one reply, in order.
//!
//! A runner that may hold its replies back ([`InitParams::hold_replies`]) also gets its
//! progress page on [`PROGRESS_FD`]: a shared page in which it counts the `Run` requests it
//! has begun, so that when it dies with replies held, the agent knows which mini-batch it
//! died in, and which ones before it only lost their replies with it.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::PathBuf;

use serde::{Deserialize, Serialize, de::DeserializeOwned};

/// The file descriptor on which a runner finds its channel to the agent.
pub const CHANNEL_FD: i32 = 3;

/// The file descriptor on which a runner that may hold its replies finds its progress page:
/// a file of [`PROGRESS_LEN`] bytes, shared with the agent, holding the count of `Run`
/// requests the runner has begun as a native-endian `u64` at offset 0.
pub const PROGRESS_FD: i32 = 4;

/// The signal the kernel sends a runner when its agent dies (`PR_SET_PDEATHSIG`, set by the
/// agent between fork and exec, so no death goes unseen): the runner then kills its process
/// group, itself and what its script started. The last real-time signal, which Python and the
/// usual libraries leave alone; until the runner handles it, it ends the runner.
pub fn agent_gone_signal() -> i32 {
    libc::SIGRTMAX()
}

/// The progress page's length.
pub const PROGRESS_LEN: usize = 8;

/// Frames larger than this are refused (a runaway `run()` result, or a corrupt stream).
pub const MAX_FRAME: usize = 1 << 30;

/// The most replies a runner holds back and sends together ([`InitParams::hold_replies`]),
/// and so the most mini-batches an agent sends ahead of the one it waits for.
pub const HELD_REPLIES: usize = 4;

/// The longest a held reply waits for the ones after it: a run that takes longer, or
/// hangs, does not keep the replies before it from the agent.
pub const HOLD_LIMIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Agent → runner.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Request {
    /// First frame: load the script and call `init()`.
    Init(Box<InitParams>),
    /// Call `run()` on these local paths. A Unix path is bytes, not always UTF-8: each travels
    /// as a MessagePack binary, and the runner hands it to the script as `os.fsdecode` does.
    Run {
        mini_batch: u64,
        #[serde(with = "paths_as_bytes")]
        items: Vec<PathBuf>,
        /// What `run(mini_batch, mini_batch_context)` receives as its second argument.
        #[serde(default)]
        context: RunContext,
        /// A tabular input's mini-batch: the staged chunks the runner reads into one
        /// DataFrame (`items` is then empty).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tables: Vec<StagedTable>,
    },
    /// Call `shutdown()` and exit 0.
    Shutdown,
}

/// The mini-batch's context (CONTRACT.md §1), for scripts whose `run` takes two parameters.
/// Its `minibatch_index` is the request's `mini_batch`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunContext {
    /// The `partition_keys` values this mini-batch holds, in the order of `partition_keys`;
    /// `None` without `partition_keys`.
    pub partition_key_value: Option<crate::wire::PartitionValues>,
    /// What the mini-batch was cut from: the job's input location.
    pub dataset: String,
}

/// One staged chunk of a tabular input, as the runner reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StagedTable {
    /// The local file: a CSV (header first) or JSON Lines file of the chunk's records, or a
    /// sparse copy of a Parquet file holding the chunk's row groups and the footer.
    pub path: String,
    pub format: crate::wire::ChunkFormat,
    /// Parquet: the row groups to read.
    #[serde(default)]
    pub row_groups: Vec<u32>,
    /// Columns added to every row, name → value ([`crate::wire::Chunk::columns`]).
    #[serde(default)]
    pub columns: Vec<(String, String)>,
}

/// How a runner reads a tabular input's chunks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TabularInit {
    /// The CSV field separator.
    pub separator: u8,
    /// The job reads Parquet: `pyarrow` must be importable.
    pub parquet: bool,
    /// The Python codec of CSV and JSON Lines files, when not UTF-8 (an MLTable's
    /// `encoding`).
    #[serde(default)]
    pub encoding: Option<String>,
    /// CSV: an empty field is `""`, not missing (an MLTable's `empty_as_string`).
    #[serde(default)]
    pub empty_as_string: bool,
    /// Columns of the files taken out of the DataFrame `run()` is given (an MLTable's
    /// `drop_columns`, less the columns it takes from the path, which never reach the runner):
    /// a name that is not a column of a mini-batch's rows fails the mini-batch.
    #[serde(default)]
    pub drop_columns: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InitParams {
    /// Absolute path of the entry script.
    pub entry_script: String,
    /// Absolute path of the source directory (importable), if any.
    pub source_directory: Option<String>,
    /// `sys.argv[1:]`.
    pub arguments: Vec<String>,
    pub node_id: String,
    /// `processNNN`.
    pub process_name: String,
    /// The job's log folder (`<output>/logs`); `EntryScript().log_dir`.
    pub log_dir: String,
    /// `EntryScript().output_dir`.
    pub output_dir: String,
    /// `WARNING`, `INFO` or `DEBUG`.
    pub logging_level: String,
    /// A virtualenv folder or a Python interpreter to run the script with.
    pub environment: Option<String>,
    /// A tabular input: `run()` gets a pandas DataFrame, and pandas must be importable.
    #[serde(default)]
    pub tabular: Option<TabularInit>,
    /// The separator of a returned DataFrame's values in its rows.
    #[serde(default = "default_append_row_separator")]
    pub append_row_separator: u8,
    /// The runner's own working folder, holding the source directory's entries: the runner
    /// starts there, so relative paths behave alike on every node.
    #[serde(default)]
    pub working_dir: Option<String>,
    /// `[models]`: name → local path, what `Model.get_model_path(name)` returns.
    #[serde(default)]
    pub models: BTreeMap<String, String>,
    /// Where to write the cProfile stats of `init()` and `run()` when the runner stops
    /// cleanly (`profile = true`); `None` runs the script unprofiled.
    #[serde(default)]
    pub profile: Option<String>,
    /// The Python the agent resolved `environment` to (see [`crate::python`]); `None` has
    /// the runner resolve it itself.
    #[serde(default)]
    pub python: Option<Box<crate::python::Python>>,
    /// Replies may be held back while the runner already has its next request, and sent
    /// together (up to [`HELD_REPLIES`], at most [`HOLD_LIMIT`] late): the agent then wakes
    /// once for several short runs. Set only with the progress page on [`PROGRESS_FD`]; off
    /// for a job with named outputs, whose files are told apart by when each reply arrives.
    #[serde(default)]
    pub hold_replies: bool,
}

fn default_append_row_separator() -> u8 {
    b' '
}

/// Runner → agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Reply {
    /// The script is loaded and `init()` returned.
    Ready(ReadyInfo),
    /// Loading the script or `init()` failed. The runner exits after sending this.
    InitFailed(ScriptError),
    /// `run()` returned: one string per returned element.
    Done {
        rows: Vec<String>,
        timing: Timing,
        /// The rows of the DataFrame `run()` was given (a tabular input): its items.
        #[serde(default)]
        given: Option<u64>,
        /// The returned DataFrame's header row, when `run()` returned one.
        #[serde(default)]
        header: Option<String>,
    },
    /// `run()` raised, or returned something that is not a list/array/DataFrame.
    Failed { error: ScriptError, timing: Timing },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ReadyInfo {
    pub python_version: String,
    pub python_prefix: String,
    pub python_executable: String,
    pub pid: u32,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScriptError {
    /// One line: `ValueError: cannot score 'bad.png'`.
    pub message: String,
    /// The full traceback text.
    pub traceback: String,
    /// What the error says of its cause, as the runner read it off the exception.
    #[serde(default)]
    pub cause: ErrorCause,
}

impl ScriptError {
    /// An error whose cause is the script's, shaped like an exception without traceback.
    pub fn plain(message: String) -> ScriptError {
        ScriptError {
            traceback: format!("{message}\n"),
            message,
            cause: ErrorCause::Script,
        }
    }
}

/// Why `run()` (or `init()`) raised, as far as fleetrun tells causes apart: the agent splits
/// a mini-batch that ran out of GPU memory instead of charging it an attempt, and fails a
/// job whose environment lacks a package its input needs instead of starting runners again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCause {
    /// Anything else: the script's error, charged to the mini-batch.
    #[default]
    Script,
    /// The accelerator's memory ran out (see [`ErrorCause::of`]).
    OutOfMemory,
    /// The job's environment lacks a package its tabular input needs (pandas, pyarrow): the
    /// runner's own `fleetrun_tabular.MissingPackage`.
    MissingPackage,
}

/// The class the runner raises for a package a tabular input needs and the job's Python
/// cannot import (`runner/src/python/tabular.py`).
const MISSING_PACKAGE_CLASS: &str = "fleetrun_tabular.MissingPackage";

/// The exception classes that are a GPU out-of-memory error, by qualified name: PyTorch's
/// (`torch.cuda.OutOfMemoryError` before 2.5, `torch.OutOfMemoryError` since), CuPy's, and
/// TensorFlow's `ResourceExhaustedError` (also raised for host memory, which halving helps
/// just the same).
const OUT_OF_MEMORY_CLASSES: [&str; 5] = [
    "torch.OutOfMemoryError",
    "torch.cuda.OutOfMemoryError",
    "cupy.cuda.memory.OutOfMemoryError",
    "tensorflow.python.framework.errors_impl.ResourceExhaustedError",
    "tensorflow.errors.ResourceExhaustedError",
];

/// What an out-of-memory error's message says, for the libraries whose class does not tell:
/// PyTorch before 1.13 (`RuntimeError: CUDA out of memory.`), its ROCm build, a CUDA error
/// raised from a kernel launch, TensorFlow's op errors, and XLA's (JAX's
/// `XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate …`).
const OUT_OF_MEMORY_MESSAGES: [&str; 5] = [
    "CUDA out of memory",
    "HIP out of memory",
    "CUDA error: out of memory",
    "OOM when allocating tensor",
    "RESOURCE_EXHAUSTED: Out of memory",
];

impl ErrorCause {
    /// The cause of an exception whose class and its bases (its MRO, each qualified as
    /// `module.QualName`) are `classes` and whose `str()` is `text`: out of memory when
    /// one of the classes is a known out-of-memory class, or the text holds a known
    /// out-of-memory message; a missing package when the class is the runner's
    /// [`ErrorCause::MissingPackage`]. A script's own `MemoryError` is not out of memory: it
    /// is host memory, and usually a bug rather than a size.
    pub fn of<'a>(classes: impl IntoIterator<Item = &'a str>, text: &str) -> ErrorCause {
        let classes: Vec<&str> = classes.into_iter().collect();
        if classes.contains(&MISSING_PACKAGE_CLASS) {
            ErrorCause::MissingPackage
        } else if classes
            .iter()
            .any(|class| OUT_OF_MEMORY_CLASSES.contains(class))
            || OUT_OF_MEMORY_MESSAGES.iter().any(|m| text.contains(m))
        {
            ErrorCause::OutOfMemory
        } else {
            ErrorCause::Script
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Timing {
    /// Wall seconds inside `run()`.
    pub run_seconds: f64,
    /// Process CPU seconds spent during `run()`.
    pub cpu_seconds: f64,
    /// Wall seconds the runner waited for this request, ready with nothing to run, since its
    /// `init()` or its previous `run()` returned: the agent's time to take and stage it, less
    /// what overlapped the previous run (its look-ahead).
    #[serde(default)]
    pub waited_seconds: f64,
}

/// Serializes paths as their bytes.
mod paths_as_bytes {
    use std::fmt;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::path::PathBuf;

    use serde::de::{Deserializer, Visitor};
    use serde::{Deserialize, Serialize, Serializer};

    pub fn serialize<S: Serializer>(paths: &[PathBuf], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(paths.iter().map(|p| Bytes(p.as_os_str().as_bytes())))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
        let paths = Vec::<PathBytes>::deserialize(d)?;
        Ok(paths.into_iter().map(|p| p.0).collect())
    }

    struct Bytes<'a>(&'a [u8]);

    impl Serialize for Bytes<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.serialize_bytes(self.0)
        }
    }

    struct PathBytes(PathBuf);

    impl<'de> Deserialize<'de> for PathBytes {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            d.deserialize_byte_buf(PathVisitor)
        }
    }

    struct PathVisitor;

    impl Visitor<'_> for PathVisitor {
        type Value = PathBytes;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a path as bytes")
        }

        fn visit_bytes<E: serde::de::Error>(self, bytes: &[u8]) -> Result<PathBytes, E> {
            self.visit_byte_buf(bytes.to_vec())
        }

        fn visit_byte_buf<E: serde::de::Error>(self, bytes: Vec<u8>) -> Result<PathBytes, E> {
            Ok(PathBytes(std::ffi::OsString::from_vec(bytes).into()))
        }
    }
}

/// One frame, length first, in one buffer: written with one write, so a frame costs one
/// system call on either side of the channel. Its body may exceed [`MAX_FRAME`], which
/// the reader refuses: a writer that can say so otherwise checks first.
pub fn frame<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    let mut frame = vec![0u8; 4];
    rmp_serde::encode::write_named(&mut frame, msg)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    let len = u32::try_from(frame.len() - 4)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "frame too large"))?;
    frame[..4].copy_from_slice(&len.to_be_bytes());
    Ok(frame)
}

/// Writes one frame, refusing one larger than [`MAX_FRAME`].
pub fn write_frame<W: Write, T: Serialize>(w: &mut W, msg: &T) -> io::Result<()> {
    let frame = frame(msg)?;
    check_len((frame.len() - 4) as u32)?;
    w.write_all(&frame)?;
    w.flush()
}

/// Reads one frame; `Ok(None)` at a clean end of stream.
pub fn read_frame<R: Read, T: DeserializeOwned>(r: &mut R) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = check_len(u32::from_be_bytes(len))?;
    let mut body = vec![0u8; len];
    r.read_exact(&mut body)?;
    decode(&body).map(Some)
}

/// Encodes a message body (no length prefix).
pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    rmp_serde::to_vec_named(msg).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Decodes a message body (no length prefix).
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> io::Result<T> {
    rmp_serde::from_slice(body).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Validates a frame length read off the wire.
pub fn check_len(len: u32) -> io::Result<usize> {
    let len = len as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"),
        ));
    }
    Ok(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_end_cleanly() {
        use std::os::unix::ffi::OsStringExt;
        // Paths are bytes: not UTF-8, a backslash, a newline.
        let paths: Vec<PathBuf> = [&b"/d/caf\xe9.txt"[..], b"/d/a\\b", b"/d/line\nbreak"]
            .iter()
            .map(|p| std::ffi::OsString::from_vec(p.to_vec()).into())
            .collect();
        let mut buf = Vec::new();
        write_frame(
            &mut buf,
            &Request::Run {
                mini_batch: 7,
                items: paths.clone(),
                context: RunContext::default(),
                tables: Vec::new(),
            },
        )
        .unwrap();
        let mut r = io::Cursor::new(buf);
        match read_frame::<_, Request>(&mut r).unwrap() {
            Some(Request::Run {
                mini_batch, items, ..
            }) => {
                assert_eq!(mini_batch, 7);
                assert_eq!(items, paths);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(read_frame::<_, Request>(&mut r).unwrap().is_none());
    }

    /// A frame reaches the channel in one write (one system call on a socket), its length
    /// first.
    #[test]
    fn a_frame_is_written_whole_in_one_write() {
        #[derive(Default)]
        struct Writes(Vec<Vec<u8>>);
        impl Write for Writes {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                self.0.push(buf.to_vec());
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut writes = Writes::default();
        write_frame(&mut writes, &Request::Shutdown).unwrap();
        assert_eq!(writes.0.len(), 1, "{:?}", writes.0);
        let body = encode(&Request::Shutdown).unwrap();
        assert_eq!(writes.0[0][..4], (body.len() as u32).to_be_bytes());
        assert_eq!(writes.0[0][4..], body[..]);
    }

    #[test]
    fn oversized_frames_are_refused() {
        assert!(check_len(u32::MAX).is_err());
    }

    #[test]
    fn out_of_memory_is_told_by_class_or_message() {
        let oom = ErrorCause::OutOfMemory;
        // PyTorch 2.x: its class, whatever its message.
        let torch = ["torch.OutOfMemoryError", "builtins.RuntimeError"];
        assert_eq!(ErrorCause::of(torch, "Tried to allocate 2.00 GiB"), oom);
        let torch_cuda = ["torch.cuda.OutOfMemoryError", "builtins.RuntimeError"];
        assert_eq!(ErrorCause::of(torch_cuda, ""), oom);
        let cupy = ["cupy.cuda.memory.OutOfMemoryError", "builtins.MemoryError"];
        assert_eq!(
            ErrorCause::of(cupy, "Out of memory allocating 512 bytes"),
            oom
        );
        let tf = [
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError",
            "tensorflow.python.framework.errors_impl.OpError",
        ];
        assert_eq!(ErrorCause::of(tf, "{{function_node}}"), oom);
        // Older PyTorch, JAX/XLA and TensorFlow's op messages: the message.
        let runtime = ["builtins.RuntimeError", "builtins.Exception"];
        let old_torch = "CUDA out of memory. Tried to allocate 20.00 MiB";
        assert_eq!(ErrorCause::of(runtime, old_torch), oom);
        let xla = [
            "jaxlib.xla_extension.XlaRuntimeError",
            "builtins.RuntimeError",
        ];
        let xla_text =
            "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 8589934592 bytes.";
        assert_eq!(ErrorCause::of(xla, xla_text), oom);
        let op = "OOM when allocating tensor with shape[1024,1024]";
        assert_eq!(ErrorCause::of(runtime, op), oom);
    }

    #[test]
    fn a_missing_package_is_told_by_its_class_not_its_text() {
        let missing = ["fleetrun_tabular.MissingPackage", "builtins.Exception"];
        let text = "a tabular input needs pandas, which the job's Python cannot import";
        assert_eq!(ErrorCause::of(missing, text), ErrorCause::MissingPackage);
        let same_text = ["builtins.ImportError", "builtins.Exception"];
        assert_eq!(ErrorCause::of(same_text, text), ErrorCause::Script);
    }

    #[test]
    fn other_errors_are_the_scripts() {
        let script = ErrorCause::Script;
        let value = ["builtins.ValueError", "builtins.Exception"];
        assert_eq!(ErrorCause::of(value, "cannot score 'bad.png'"), script);
        // Host memory, and a class that only shares the name.
        let memory = ["builtins.MemoryError", "builtins.Exception"];
        assert_eq!(ErrorCause::of(memory, ""), script);
        let own = ["score.OutOfMemoryError", "builtins.RuntimeError"];
        assert_eq!(ErrorCause::of(own, "my cache is full"), script);
        // An error from a frame older than the cause: it reads as the script's.
        let frame = std::collections::BTreeMap::from([("message", "m"), ("traceback", "t")]);
        let old: ScriptError = decode(&encode(&frame).unwrap()).unwrap();
        assert_eq!(old.cause, script);
    }
}
