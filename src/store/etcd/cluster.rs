//! A local etcd cluster of Debian's `etcd` binary on 127.0.0.1 and free ports, one data
//! directory a member: for the tests and `hive bench` (never for serving). Members run
//! with a 50 ms heartbeat and a 500 ms election timeout, so leases may be as short as
//! 1 s and an etcd leader's loss is noticed in about half a second.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One member's ports and process.
pub struct Member {
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    child: Option<Child>,
    args: Vec<String>,
}

impl Member {
    /// `127.0.0.1:PORT` of its client port.
    pub fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    /// The member's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

/// A running cluster; its members are killed and their data removed when dropped.
pub struct LocalCluster {
    pub members: Vec<Member>,
    dir: DataDir,
}

/// The cluster's data: removed when dropped, after the members are gone.
struct DataDir(PathBuf);

impl Drop for DataDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A port nothing listens on now.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl LocalCluster {
    /// Starts `size` members and waits until the cluster answers. Fails with a clear
    /// message when `etcd` is not installed (Debian: `apt-get install etcd-server`).
    pub fn start(size: usize) -> anyhow::Result<LocalCluster> {
        let probe =
            Command::new("etcd").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if !probe.is_ok_and(|s| s.success()) {
            anyhow::bail!(
                "etcd is not installed: `apt-get install etcd-server` (Debian) provides /usr/bin/etcd"
            );
        }
        let dir = std::env::temp_dir().join(format!("hive-etcd-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir)?;
        let dir = DataDir(dir);
        let mut members = Vec::with_capacity(size);
        for i in 0..size {
            members.push(Member {
                name: format!("m{i}"),
                client_port: free_port()?,
                peer_port: free_port()?,
                child: None,
                args: Vec::new(),
            });
        }
        let initial: Vec<String> =
            members.iter().map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port)).collect();
        let initial = initial.join(",");
        let token = format!("hive-test-{}", unique());
        for member in &mut members {
            let data: PathBuf = dir.0.join(&member.name);
            let client = format!("http://127.0.0.1:{}", member.client_port);
            let peer = format!("http://127.0.0.1:{}", member.peer_port);
            member.args = vec![
                "--name".into(),
                member.name.clone(),
                "--data-dir".into(),
                data.display().to_string(),
                "--listen-client-urls".into(),
                client.clone(),
                "--advertise-client-urls".into(),
                client,
                "--listen-peer-urls".into(),
                peer.clone(),
                "--initial-advertise-peer-urls".into(),
                peer,
                "--initial-cluster".into(),
                initial.clone(),
                "--initial-cluster-state".into(),
                "new".into(),
                "--initial-cluster-token".into(),
                token.clone(),
                "--heartbeat-interval".into(),
                "50".into(),
                "--election-timeout".into(),
                "500".into(),
                "--log-level".into(),
                "error".into(),
            ];
        }
        let mut cluster = LocalCluster { members, dir };
        for i in 0..size {
            cluster.restart(i)?;
        }
        cluster.wait_ready(Duration::from_secs(30))?;
        Ok(cluster)
    }

    /// `host:port` of every member's client port.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Member::endpoint).collect()
    }

    /// `etcd://…` naming every member, for `--store`.
    pub fn url(&self) -> String {
        format!("etcd://{}", self.endpoints().join(","))
    }

    /// Kills member `i` (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again with its data (or for the first time).
    pub fn restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.kill(i);
        let member = &mut self.members[i];
        let log = std::fs::File::create(self.dir.0.join(format!("{}.log", member.name)))?;
        let child = Command::new("etcd")
            .args(&member.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        member.child = Some(child);
        Ok(())
    }

    /// The index of the member that leads the cluster now, as the running members say.
    pub fn leader(&self) -> Option<usize> {
        let ids: Vec<Option<(String, String)>> = self
            .members
            .iter()
            .map(|member| {
                member.child.as_ref()?;
                let status: serde_json::Value =
                    serde_json::from_str(&post(&member.endpoint(), "/v3/maintenance/status", "{}")?).ok()?;
                let own = status["header"]["member_id"].as_str()?.to_string();
                let leader = status["leader"].as_str()?.to_string();
                Some((own, leader))
            })
            .collect();
        let leader = ids.iter().flatten().map(|(_, leader)| leader).next()?;
        ids.iter().position(|id| id.as_ref().is_some_and(|(own, _)| own == leader))
    }

    /// Waits until every running member answers a read.
    fn wait_ready(&self, within: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        for member in self.members.iter().filter(|m| m.child.is_some()) {
            while post(&member.endpoint(), "/v3/kv/range", r#"{"key":"AA=="}"#).is_none() {
                if Instant::now() > deadline {
                    anyhow::bail!("etcd member {} did not start within {within:?}", member.name);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }
}

/// The body of a 200 answer to a POST of `body` to `path` on the member at `endpoint`.
fn post(endpoint: &str, path: &str, body: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(endpoint).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then(|| body.to_string())
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}

/// A number no other cluster of this process has, for directory names and tokens.
fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}
