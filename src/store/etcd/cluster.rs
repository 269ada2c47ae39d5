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

/// How many times [`LocalCluster::start`] starts a cluster whose member exited first.
const START_ATTEMPTS: usize = 3;

/// Why one start of a cluster failed.
enum Start {
    /// A member exited before it answered (most likely its port was taken meanwhile).
    Exited(String),
    /// Anything else.
    Failed(anyhow::Error),
}

impl From<anyhow::Error> for Start {
    fn from(e: anyhow::Error) -> Start {
        Start::Failed(e)
    }
}

impl From<std::io::Error> for Start {
    fn from(e: std::io::Error) -> Start {
        Start::Failed(e.into())
    }
}

impl LocalCluster {
    /// Starts `size` members and waits until the cluster answers. Fails with a clear
    /// message when `etcd` is not installed (Debian: `apt-get install etcd-server`).
    pub fn start(size: usize) -> anyhow::Result<LocalCluster> {
        let mut attempt = 1;
        loop {
            match LocalCluster::start_once(size) {
                Err(Start::Exited(why)) if attempt < START_ATTEMPTS => {
                    // A port found free was taken before the member bound it (another
                    // test's listener or connection): start again on other ports.
                    eprintln!("etcd test cluster: {why}; starting again on other ports");
                    attempt += 1;
                }
                Err(Start::Exited(why)) => anyhow::bail!("{why} (attempt {attempt} of {START_ATTEMPTS})"),
                Err(Start::Failed(e)) => return Err(e),
                Ok(cluster) => return Ok(cluster),
            }
        }
    }

    fn start_once(size: usize) -> Result<LocalCluster, Start> {
        let probe =
            Command::new("etcd").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status();
        if !probe.is_ok_and(|s| s.success()) {
            return Err(Start::Failed(anyhow::anyhow!(
                "etcd is not installed: `apt-get install etcd-server` (Debian) provides /usr/bin/etcd"
            )));
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

    /// Waits until every running member answers a read; fails at once, with its log's
    /// first and last lines, when a member exits first.
    fn wait_ready(&mut self, within: Duration) -> Result<(), Start> {
        let deadline = Instant::now() + within;
        for i in 0..self.members.len() {
            while post(&self.members[i].endpoint(), "/v3/kv/range", r#"{"key":"AA=="}"#).is_none() {
                let member = &mut self.members[i];
                let Some(child) = member.child.as_mut() else { break };
                if let Ok(Some(status)) = child.try_wait() {
                    let log = std::fs::read_to_string(self.dir.0.join(format!("{}.log", member.name)))
                        .unwrap_or_default();
                    // etcd says a bad flag on its first line, a port taken on its last.
                    let lines: Vec<&str> = log.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
                    let said = match (lines.first(), lines.last()) {
                        (Some(f), Some(l)) if f != l => format!("{f} … {l}"),
                        (Some(f), _) => f.to_string(),
                        (None, _) => "nothing in its log".to_string(),
                    };
                    return Err(Start::Exited(format!(
                        "etcd member {} exited before it answered ({status}): {said}",
                        member.name
                    )));
                }
                if Instant::now() > deadline {
                    return Err(Start::Failed(anyhow::anyhow!(
                        "etcd member {} did not start within {within:?}",
                        member.name
                    )));
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A member that exits before it answers (as one whose port was taken does) is
    /// reported at once with its log, not after the whole wait, so `start` can retry.
    #[test]
    fn a_member_that_exits_first_is_reported_at_once_with_its_log() {
        let dir = std::env::temp_dir().join(format!("hive-etcd-exit-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir).unwrap();
        let member = Member {
            name: "m0".into(),
            client_port: free_port().unwrap(),
            peer_port: free_port().unwrap(),
            child: None,
            args: vec!["--no-such-flag".into()],
        };
        let mut cluster = LocalCluster { members: vec![member], dir: DataDir(dir) };
        cluster.restart(0).unwrap();
        // The wait's own end is `Failed`: only a seen exit is `Exited`.
        match cluster.wait_ready(Duration::from_secs(30)) {
            Err(Start::Exited(why)) => {
                assert!(why.contains("m0") && why.contains("no-such-flag"), "{why}");
            }
            Err(Start::Failed(e)) => panic!("reported as a failure to start, not an exit: {e:#}"),
            Ok(()) => panic!("etcd started with a flag it does not have"),
        }
    }
}
