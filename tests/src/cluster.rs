//! A RabbitMQ cluster of a test's own: three nodes on loopback that form one cluster at their
//! first boot (classic peer discovery), for losing a node in the middle of a job. Each node
//! has its own folder, ports and `HOME` (holding the cluster's shared Erlang cookie), and runs
//! as root from `/usr/lib/rabbitmq/bin`: Debian's `/usr/sbin` wrappers switch to the
//! `rabbitmq` user and its own cookie.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{exit_within, free_ports, kill, poll, wait_for};

const BIN: &str = "/usr/lib/rabbitmq/bin";

/// Three clustered nodes; every node still up is stopped on drop.
pub struct PrivateRabbitCluster {
    _dir: tempfile::TempDir,
    nodes: Vec<Node>,
}

struct Node {
    name: String,
    port: u16,
    dist_port: u16,
    dir: PathBuf,
}

impl PrivateRabbitCluster {
    /// Starts the three nodes and waits until each runs in the cluster (a minute or so on a
    /// busy machine).
    pub fn start() -> PrivateRabbitCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let ports: [u16; 6] = free_ports();
        let cookie = format!("fleetrun{}", ports[0]);
        let nodes: Vec<Node> = (0..3)
            .map(|i| Node {
                // Unique while its port is taken.
                name: format!("fleetrun-cluster-{}-{i}@localhost", ports[0]),
                port: ports[2 * i],
                dist_port: ports[2 * i + 1],
                dir: dir.path().join(format!("n{i}")),
            })
            .collect();
        let peers: String = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!(
                    "cluster_formation.classic_config.nodes.{} = {}\n",
                    i + 1,
                    n.name
                )
            })
            .collect();
        for node in &nodes {
            node.write_files(&cookie, &peers);
        }
        for node in &nodes {
            node.run();
        }
        let cluster = PrivateRabbitCluster { _dir: dir, nodes };
        for node in &cluster.nodes {
            wait_for(
                "a node of the private cluster to start",
                Duration::from_secs(180),
                || node.ctl(&["await_startup", "--timeout", "10"]),
            );
        }
        cluster
    }

    /// The nodes' URLs, comma-separated, the first node first.
    pub fn urls(&self) -> String {
        let urls: Vec<String> = self.nodes.iter().map(Node::url).collect();
        urls.join(",")
    }

    /// Makes nodes `nodes` refuse new client connections (`rabbitmqctl suspend_listeners`).
    pub fn suspend_listeners(&self, nodes: &[usize]) {
        for &i in nodes {
            assert!(
                self.nodes[i].ctl(&["suspend_listeners"]),
                "suspend node {i}"
            );
        }
    }

    /// Makes nodes `nodes` take client connections again.
    pub fn resume_listeners(&self, nodes: &[usize]) {
        for &i in nodes {
            assert!(self.nodes[i].ctl(&["resume_listeners"]), "resume node {i}");
        }
    }

    /// The client connections node `i` holds.
    pub fn connections(&self, i: usize) -> usize {
        let listed = self.nodes[i]
            .ctl_output(&["list_connections", "--no-table-headers", "name"])
            .expect("rabbitmqctl list_connections");
        listed.lines().filter(|l| !l.trim().is_empty()).count()
    }

    /// Kills node `i` outright (SIGKILL of its Erlang VM), as a lost machine would.
    pub fn kill(&self, i: usize) {
        let node = &self.nodes[i];
        let pid = node.pid().expect("the node's pid");
        assert!(sigkill(pid), "kill -9 {pid} ({})", node.name);
        wait_for("the killed node to go", Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", node.port)).is_err()
        });
    }
}

impl Node {
    fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }

    fn write_files(&self, cookie: &str, peers: &str) {
        for sub in ["home", "mnesia", "log"] {
            std::fs::create_dir_all(self.dir.join(sub)).unwrap();
        }
        let cookie_file = self.dir.join("home/.erlang.cookie");
        std::fs::write(&cookie_file, cookie).unwrap();
        let owner_only = std::os::unix::fs::PermissionsExt::from_mode(0o400);
        std::fs::set_permissions(&cookie_file, owner_only).unwrap();
        // `guest` may log in from loopback only, which is where the tests are.
        let conf = format!(
            "listeners.tcp.default = 127.0.0.1:{}\n\
             cluster_formation.peer_discovery_backend = classic_config\n{peers}\
             consumer_timeout = 3600000\n",
            self.port
        );
        std::fs::write(self.dir.join("rabbitmq.conf"), conf).unwrap();
        std::fs::write(self.dir.join("enabled_plugins"), "[].\n").unwrap();
    }

    fn run(&self) {
        let mut server = Command::new(format!("{BIN}/rabbitmq-server"));
        server
            .arg("-detached")
            .env("HOME", self.dir.join("home"))
            .env("RABBITMQ_NODENAME", &self.name)
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq.conf"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                self.dir.join("enabled_plugins"),
            )
            .env("RABBITMQ_MNESIA_BASE", self.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", self.dir.join("log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut started = server.spawn().expect("rabbitmq-server runs");
        let status = exit_within(&mut started, Duration::from_secs(120));
        assert!(status.success(), "rabbitmq-server -detached: {status}");
    }

    /// The pid of the node's Erlang VM, if it answers.
    fn pid(&self) -> Option<u32> {
        let out = self.ctl_output(&["eval", "os:getpid()."])?;
        out.trim().trim_matches('"').parse().ok()
    }

    /// Whether `rabbitmqctl ARGS` on this node succeeded within a minute.
    fn ctl(&self, args: &[&str]) -> bool {
        self.ctl_output(args).is_some()
    }

    /// What `rabbitmqctl ARGS` on this node printed, if it succeeded within a minute (it is
    /// killed past it).
    fn ctl_output(&self, args: &[&str]) -> Option<String> {
        let mut child = Command::new(format!("{BIN}/rabbitmqctl"))
            .env("HOME", self.dir.join("home"))
            .args(["-n", &self.name, "--quiet"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let mut exit = None;
        if !poll(Duration::from_secs(60), || {
            exit = child.try_wait().ok().flatten();
            exit.is_some()
        }) {
            kill(&mut child);
            return None;
        }
        let mut text = String::new();
        std::io::Read::read_to_string(child.stdout.as_mut()?, &mut text).ok()?;
        exit.filter(|s| s.success()).map(|_| text)
    }
}

impl Drop for PrivateRabbitCluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            if let Some(pid) = node.pid()
                && !node.ctl(&["stop"])
            {
                sigkill(pid);
            }
        }
    }
}

/// Whether `kill -9 PID` succeeded.
fn sigkill(pid: u32) -> bool {
    Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}
