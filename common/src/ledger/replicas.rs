//! Recordings that survive losing the Redis primary.
//!
//! Redis replicates asynchronously: a primary acknowledges a write before its replicas have
//! it, and a replica promoted after the primary died (Sentinel's failover, a managed Redis's
//! maintenance, a Kubernetes operator's) never had the writes still in flight. A worker
//! acknowledges a mini-batch's message once its recording is acknowledged, so such a write,
//! lost, is a mini-batch counted nowhere and a job that never ends.
//!
//! So every step that writes is sent together with `WAIT n timeout` on the same connection
//! (one pipeline, one round trip), `n` being the replicas the primary has (`ROLE`, asked
//! again every few seconds and whenever fewer confirm): the step's answer is believed only
//! once every replica confirmed it has the write. Steps are committed in groups: while one
//! pipeline waits for its `WAIT`, the steps that come meanwhile gather, and go together in
//! the next pipeline, ending in one `WAIT` for them all (`WAIT` blocks the connection it is
//! sent on, so a step sent behind another's `WAIT` would wait for it anyway). A node with
//! several slots then sends fewer `WAIT`s than it records mini-batches. A replica that does not confirm within
//! [`WAIT_MS`] is asked again, with the step (every step is idempotent, see the ledger's
//! "Retries"), for up to [`PATIENCE`]; then the step fails as an unreachable Redis does, and
//! its mini-batch goes back to the queue. A primary with no replica costs nothing: no
//! `WAIT` is sent.
//!
//! `WAITAOF` (Redis ≥ 7.2) would also wait for the disk; the fleet's Redis runs with
//! `appendfsync always` instead (see the ledger's "Durability").

use std::future::Future;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{
    Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, ScriptInvocation, ServerErrorKind,
    Value,
};
use tokio::sync::oneshot;
use tracing::warn;

/// How long one `WAIT` waits for the replicas, in milliseconds.
pub(super) const WAIT_MS: u64 = 1000;
/// How long a step waits, in all, for replicas that stay connected and do not confirm.
pub(super) const PATIENCE: Duration = Duration::from_secs(30);
/// How often the replicas are counted again when all confirm.
const RECOUNT: Duration = Duration::from_secs(5);

/// A script step run through [`Replicas::invoke`].
pub(super) trait Replicated {
    fn replicated<'a, T: FromRedisValue + Send + 'a>(
        &'a self,
        conn: &'a mut ConnectionManager,
        replicas: &'a Replicas,
    ) -> impl Future<Output = RedisResult<T>> + Send + 'a;
}

impl Replicated for ScriptInvocation<'_> {
    fn replicated<'a, T: FromRedisValue + Send + 'a>(
        &'a self,
        conn: &'a mut ConnectionManager,
        replicas: &'a Replicas,
    ) -> impl Future<Output = RedisResult<T>> + Send + 'a {
        replicas.invoke(conn, self)
    }
}

/// The primary's replicas, as last counted, and the steps waiting for the next group.
pub(super) struct Replicas {
    count: AtomicUsize,
    counted: Mutex<Option<Instant>>,
    /// Steps gathered for the next group, each with where its answer goes.
    gathering: Mutex<Vec<Gathered>>,
    /// Held by the step that sends a group and waits for its `WAIT`.
    sending: tokio::sync::Mutex<()>,
}

/// A step gathered for a group: its command, and where its answer and the replicas that
/// confirmed the group go.
struct Gathered {
    step: Cmd,
    answer: oneshot::Sender<RedisResult<(Value, usize)>>,
}

impl Replicas {
    pub(super) fn new() -> Replicas {
        Replicas {
            count: AtomicUsize::new(0),
            counted: Mutex::new(None),
            gathering: Mutex::new(Vec::new()),
            sending: tokio::sync::Mutex::new(()),
        }
    }

    /// Runs `invocation` and returns its answer once every replica of the primary has its
    /// writes.
    pub(super) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut ConnectionManager,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        let start = Instant::now();
        loop {
            let expected = self.expected(conn).await?;
            if expected == 0 {
                return invocation.invoke_async(conn).await;
            }
            let (answer, confirmed) = match self.grouped(conn, invocation, expected).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    invocation.load_async(conn).await?;
                    continue;
                }
                reply => reply?,
            };
            let answer = T::from_redis_value(answer)?;
            if confirmed >= expected {
                return Ok(answer);
            }
            // A replica that left is no longer waited for; one that lags is.
            let now = self.count(conn).await?;
            if confirmed >= now {
                return Ok(answer);
            }
            if start.elapsed() >= PATIENCE {
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "Redis replicas did not confirm a write",
                    format!(
                        "{confirmed} of {now} confirmed within {}s; the write may be lost if the primary fails now",
                        PATIENCE.as_secs()
                    ),
                )));
            }
            warn!(
                confirmed,
                replicas = now,
                "Redis replicas have not confirmed a recording; asking again before it counts."
            );
        }
    }

    /// Sends `invocation` in a group of steps ending in one `WAIT expected`, and returns its
    /// answer and how many replicas confirmed the group. The first step to come while no
    /// group is being sent sends the steps gathered so far; the others wait for it, and the
    /// next of them sends what gathered meanwhile.
    async fn grouped(
        &self,
        conn: &mut ConnectionManager,
        invocation: &ScriptInvocation<'_>,
        expected: usize,
    ) -> RedisResult<(Value, usize)> {
        let mut one = redis::pipe();
        one.invoke_script(invocation);
        let copy = || {
            one.cmd_iter()
                .next()
                .expect("a pipeline of one step")
                .clone()
        };
        // Copied again only when the step must be gathered again.
        let mut step = Some(copy());
        loop {
            let (answer, mut mine) = oneshot::channel();
            self.gathering
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(Gathered {
                    step: step.take().unwrap_or_else(copy),
                    answer,
                });
            let _sending = self.sending.lock().await;
            match mine.try_recv() {
                Ok(answer) => return answer,
                // Sent by nobody: the step that took it was dropped before it answered.
                Err(oneshot::error::TryRecvError::Closed) => continue,
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            let group =
                std::mem::take(&mut *self.gathering.lock().unwrap_or_else(|p| p.into_inner()));
            send_group(conn, group, expected).await;
            match mine.await {
                Ok(answer) => return answer,
                Err(_) => continue,
            }
        }
    }

    /// The replicas to wait for: the last count, or a new one when it is old.
    async fn expected(&self, conn: &mut ConnectionManager) -> RedisResult<usize> {
        let fresh = self
            .counted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| at.elapsed() < RECOUNT);
        if fresh {
            Ok(self.count.load(Ordering::Relaxed))
        } else {
            self.count(conn).await
        }
    }

    /// Counts the replicas connected to the primary now (`ROLE`). A server that refuses
    /// `ROLE` (a managed Redis may rename or disable it) is taken to have none, with a warning
    /// at each count: its provider then answers for what a failover loses.
    async fn count(&self, conn: &mut ConnectionManager) -> RedisResult<usize> {
        let count = match redis::cmd("ROLE").query_async::<redis::Value>(conn).await {
            Ok(role) => connected_replicas(&role),
            Err(e)
                if e.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
                    || e.kind() == ErrorKind::Extension =>
            {
                warn!(error = %e, "Redis refuses ROLE: its replicas are not waited for, and a failover may lose recordings.");
                0
            }
            Err(e) => return Err(e),
        };
        self.count.store(count, Ordering::Relaxed);
        *self.counted.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
        Ok(count)
    }
}

/// Sends `group`'s steps and one `WAIT expected` in one pipeline, and gives each step its own
/// answer (or the error that kept the group from an answer), with the replicas that
/// confirmed. A step whose caller is gone (dropped while it waited) is not sent.
async fn send_group(conn: &mut ConnectionManager, group: Vec<Gathered>, expected: usize) {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    let mut waiting = Vec::with_capacity(group.len());
    for gathered in group.into_iter().filter(|g| !g.answer.is_closed()) {
        pipe.add_command(gathered.step);
        waiting.push(gathered.answer);
    }
    if waiting.is_empty() {
        return;
    }
    pipe.cmd("WAIT").arg(expected).arg(WAIT_MS);
    let reply: RedisResult<Vec<Value>> = pipe.query_async(conn).await;
    let answers = reply.and_then(|mut answers| {
        let confirmed = answers.pop().map(Value::extract_error).transpose()?;
        let confirmed = usize::from_redis_value(confirmed.unwrap_or(Value::Nil))?;
        Ok((answers, confirmed))
    });
    match answers {
        Ok((answers, confirmed)) => {
            for (waiting, answer) in waiting.into_iter().zip(answers) {
                let _ = waiting.send(answer.extract_error().map(|answer| (answer, confirmed)));
            }
        }
        Err(e) => {
            for waiting in waiting {
                let _ = waiting.send(Err(e.clone()));
            }
        }
    }
}

/// The replicas a `ROLE` reply lists: `["master", offset, [[host, port, offset], …]]` on a
/// primary; a replica (which refuses writes anyway) has none to wait for.
fn connected_replicas(role: &redis::Value) -> usize {
    match role {
        redis::Value::Array(fields) => match fields.as_slice() {
            [
                redis::Value::BulkString(name),
                _,
                redis::Value::Array(replicas),
                ..,
            ] if name.as_slice() == b"master" => replicas.len(),
            _ => 0,
        },
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::connected_replicas;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_primary_counts_the_replicas_it_lists() {
        let replica = || Value::Array(vec![bulk("127.0.0.1"), bulk("6380"), bulk("42")]);
        let role = Value::Array(vec![
            bulk("master"),
            Value::Int(42),
            Value::Array(vec![replica(), replica()]),
        ]);
        assert_eq!(connected_replicas(&role), 2);
    }

    #[test]
    fn a_lone_primary_and_a_replica_have_none_to_wait_for() {
        let alone = Value::Array(vec![bulk("master"), Value::Int(0), Value::Array(vec![])]);
        assert_eq!(connected_replicas(&alone), 0);
        let replica = Value::Array(vec![
            bulk("slave"),
            bulk("127.0.0.1"),
            Value::Int(6379),
            bulk("connected"),
            Value::Int(42),
        ]);
        assert_eq!(connected_replicas(&replica), 0);
    }
}
