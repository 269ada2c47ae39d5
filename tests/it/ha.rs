//! `hive serve --store etcd://…` with several replicas on one etcd cluster (Debian's
//! etcd on 127.0.0.1): every replica serves the API; one is elected and runs the
//! scheduler, and a request only it can answer is forwarded to it; when it dies another
//! takes over, with every acknowledged write.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hive::store::etcd::cluster::LocalCluster;
use serde_json::{json, Value};

use crate::harness::{agent, eventually, Daemon};

/// Starts a replica on `store` (it serves at once, leading or not).
pub(crate) fn replica(store: &str) -> Daemon {
    Daemon::start_with(&["--store", store])
}

/// The epoch `daemon` leads under, once its banner says it leads.
pub(crate) async fn leading(daemon: &Daemon) -> u64 {
    eventually("the replica to lead", || {
        let lines = daemon.stdout_lines();
        let epoch = lines
            .iter()
            .find_map(|l| l.strip_prefix("hive: leading (epoch "))
            .map(|rest| rest.trim_end_matches(')').parse::<u64>().expect("an epoch"));
        std::future::ready(epoch)
    })
    .await
}

/// Waits until `daemon` says another replica leads.
pub(crate) async fn following(daemon: &Daemon) {
    eventually("the replica to follow a leader", || {
        std::future::ready(
            daemon.stdout_lines().iter().any(|l| l.starts_with("hive: following")).then_some(()),
        )
    })
    .await
}

/// An Offline agent no Job starts anything for.
pub(crate) fn offline(name: &str) -> Value {
    let mut agent = agent(name);
    agent["spec"]["wanted"] = json!("Offline");
    agent
}

/// A Job of one SetWanted node on `agent`: it is Done as soon as a scheduler runs it.
pub(crate) fn set_wanted(name: &str, agent: &str) -> Value {
    json!({"apiVersion": "hive.dev/v1", "kind": "Job", "metadata": {"name": name},
           "spec": {"template": "Reconcile", "nodes": [
               {"id": "offline", "kind": "SetWanted", "agent": agent, "params": {"wanted": "Offline"}}]}})
}

/// Waits until Job `name`, read through `daemon`, is Done.
async fn done(daemon: &Daemon, name: &str) {
    let api = daemon.client();
    let path = format!("/apis/hive.dev/v1/jobs/{name}");
    eventually(&format!("Job {name} to be Done"), || {
        let (api, path) = (&api, &path);
        async move {
            let job = api.get(path).await;
            let phase = job.body["status"]["phase"].as_str().unwrap_or_default().to_string();
            assert!(!matches!(phase.as_str(), "Failed" | "Cancelled" | "Interrupted"), "{:?}", job.body);
            (phase == "Done").then_some(())
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_replica_serves_and_what_only_the_leader_runs_is_forwarded_to_it() {
    let cluster = LocalCluster::start(1).unwrap();
    let store = cluster.url();
    let leader = replica(&store);
    leading(&leader).await;
    let followers = [replica(&store), replica(&store)];
    for follower in &followers {
        following(follower).await;
    }
    // One CA for all: a client that trusts the leader's kubeconfig trusts every replica.
    assert!(followers.iter().all(|f| f.ca_pem == leader.ca_pem), "every replica serves under the shared CA");
    // One fleet identity: workers rejoin whichever replica leads.
    let key = |d: &Daemon| std::fs::read(d.dir.join("identity.key")).unwrap();
    assert!(followers.iter().all(|f| key(f) == key(&leader)), "every replica has the shared fleet identity");
    // Who leads, as /readyz and /metrics say it, on the leader and on a follower.
    let leader_name = format!("/{}", leader.url.trim_start_matches("https://"));
    for (replica, leads) in [(&leader, true), (&followers[0], false)] {
        let ready = replica.client().get("/readyz?verbose").await;
        assert_eq!(ready.code, 200);
        let text = ready.body.as_str().unwrap_or_default().to_string();
        assert!(text.contains("[+]leader ok") && text.contains(&leader_name), "{text}");
        assert_eq!(text.contains("this replica"), leads, "{text}");
        let metrics = replica.client().get("/metrics").await.body.as_str().unwrap_or_default().to_string();
        assert!(metrics.contains(&format!("hive_leading {}", u8::from(leads))), "{metrics}");
        assert!(
            metrics.lines().any(|l| l.starts_with("hive_leader{") && l.contains(&leader_name)),
            "{metrics}"
        );
    }

    // Plain CRUD on a follower, seen on the other.
    let created = followers[0].client().post("/apis/hive.dev/v1/agents", &offline("a")).await;
    assert_eq!(created.code, 201, "{:?}", created.body);
    let other = followers[1].client();
    eventually("the agent on the other follower", || {
        let other = &other;
        async move { (other.get("/apis/hive.dev/v1/agents/a").await.code == 200).then_some(()) }
    })
    .await;

    // A Job posted through a follower is taken by the leader's submit layer and runs.
    let posted =
        followers[0].client().post("/apis/hive.dev/v1/jobs", &set_wanted("through-follower", "a")).await;
    assert_eq!(posted.code, 201, "{:?}", posted.body);
    done(&followers[1], "through-follower").await;
    // The follower's audit log names it, and has the leader's answer to what it forwarded.
    let follower_name = format!("/{}", followers[0].url.trim_start_matches("https://"));
    let audited = eventually("the forwarded create in the follower's audit log", || {
        let log = std::fs::read_to_string(followers[0].dir.join("audit.log")).unwrap_or_default();
        let line = log
            .lines()
            .find(|l| l.contains("\"resource\":\"jobs\"") && l.contains("\"verb\":\"create\""))
            .map(str::to_string);
        std::future::ready(line)
    })
    .await;
    let audited: Value = serde_json::from_str(&audited).unwrap();
    assert_eq!(audited["code"], 201, "{audited}");
    assert!(audited["replica"].as_str().unwrap().ends_with(&follower_name), "{audited}");
    // Its node's log, which only the leader's scheduler holds, through the other one.
    let log = followers[1].client().get("/apis/hive.dev/v1/jobs/through-follower/log?node=offline").await;
    assert_eq!(log.code, 200, "{:?}", log.body);

    // A dashboard session is shared by the replicas; what it asks of the leader is
    // forwarded with its cookie and CSRF header.
    let browser = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&leader.ca_pem).unwrap())
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = &followers[1].url;
    let signed_in = browser
        .post(format!("{base}/login"))
        .form(&[("token", followers[1].token.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(signed_in.status(), 303);
    let cookie = signed_in.headers()["set-cookie"].to_str().unwrap().split(';').next().unwrap().to_string();
    let page =
        browser.get(format!("{base}/")).header("cookie", &cookie).send().await.unwrap().text().await.unwrap();
    let csrf = page.split("name=\"csrf-token\" content=\"").nth(1).unwrap().split('"').next().unwrap();
    let posted = browser
        .post(format!("{base}/apis/hive.dev/v1/jobs"))
        .header("cookie", &cookie)
        .header("x-csrf-token", csrf)
        .json(&set_wanted("from-dashboard", "a"))
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 201, "{}", posted.text().await.unwrap());
    done(&followers[0], "from-dashboard").await;

    // A token made through one follower works on the other, and a revocation through
    // that one reaches every replica.
    let minted = followers[0]
        .client()
        .post("/hive/v1/tokens", &json!({"name": "shared-viewer", "role": "viewer"}))
        .await;
    assert_eq!(minted.code, 201, "{:?}", minted.body);
    let token = minted.body["token"].as_str().unwrap().to_string();
    let viewer = followers[1].client_with(Some(&token));
    eventually("the new token to count on the other follower", || {
        let viewer = &viewer;
        async move { (viewer.get("/apis/hive.dev/v1/agents").await.code == 200).then_some(()) }
    })
    .await;
    let revoked = followers[1].client().delete("/hive/v1/tokens/shared-viewer").await;
    assert_eq!(revoked.code, 200, "{:?}", revoked.body);
    for replica in [&leader, &followers[0]] {
        let viewer = replica.client_with(Some(&token));
        eventually("the revoked token to be refused everywhere", || {
            let viewer = &viewer;
            async move { (viewer.get("/apis/hive.dev/v1/agents").await.code == 401).then_some(()) }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_while_clients_write_through_the_other_replicas() {
    failover_under_writes(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_replaced_while_etcds_leader_dies_with_it() {
    failover_under_writes(true).await;
}

/// 16 clients write through two followers while the leader is killed (and with it,
/// when `etcd_too`, the etcd member that leads etcd's cluster): a follower leads and
/// runs Jobs, every acknowledged write is on both, and no Job is left unfinished.
async fn failover_under_writes(etcd_too: bool) {
    let mut cluster = LocalCluster::start(3).unwrap();
    let store = cluster.url();
    let mut leader = replica(&store);
    let first_epoch = leading(&leader).await;
    let followers = [replica(&store), replica(&store)];
    for follower in &followers {
        following(follower).await;
    }
    let created = followers[0].client().post("/apis/hive.dev/v1/agents", &offline("a")).await;
    assert_eq!(created.code, 201, "{:?}", created.body);

    // 16 clients create agents through the two followers until told to stop; each keeps
    // the names the API acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for i in 0..16 {
        let api = followers[i % 2].client();
        let stop = stop.clone();
        writers.push(tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            let mut j = 0;
            let url = format!("{}/apis/hive.dev/v1/agents", api.base);
            while !stop.load(Ordering::Relaxed) {
                let name = format!("w{i}-{j}");
                let answer = api.http.post(&url).bearer_auth(api.token()).json(&offline(&name)).send().await;
                match answer.map(|a| a.status().as_u16()) {
                    Ok(201) => acknowledged.push(name),
                    // Not acknowledged (etcd electing a member, a replica busy): a new
                    // name next, so an unknown outcome is never counted.
                    other => {
                        eprintln!("writer {i}: {name} not acknowledged: {other:?}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                j += 1;
            }
            acknowledged
        }));
    }
    // Jobs posted through the followers all along: running when the leader dies, or
    // taken by the next one.
    let posted_jobs = {
        let apis = [followers[0].client(), followers[1].client()];
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut posted = Vec::new();
            let mut k = 0;
            while !stop.load(Ordering::Relaxed) {
                let name = format!("during-{k}");
                let url = format!("{}/apis/hive.dev/v1/jobs", apis[k % 2].base);
                let job = set_wanted(&name, "a");
                let sent =
                    apis[k % 2].http.post(&url).bearer_auth(apis[k % 2].token()).json(&job).send().await;
                if sent.is_ok_and(|r| r.status() == 201) {
                    posted.push(name);
                }
                k += 1;
                tokio::time::sleep(Duration::from_millis(150)).await;
            }
            posted
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let etcd_leader = if etcd_too { Some(cluster.leader().expect("etcd has a leader")) } else { None };
    leader.kill9();
    if let Some(member) = etcd_leader {
        cluster.kill(member);
    }
    let killed = Instant::now();

    // A follower is elected, and runs a Job posted through either of them.
    let epochs = futures_util::future::select_all(followers.iter().map(|f| Box::pin(leading(f)))).await.0;
    assert!(epochs > first_epoch);
    let elected = killed.elapsed();
    let posted =
        followers[1].client().post("/apis/hive.dev/v1/jobs", &set_wanted("after-failover", "a")).await;
    if posted.code != 201 {
        for follower in &followers {
            eprintln!("---- {}\n{}", follower.url, follower.log());
        }
    }
    assert_eq!(posted.code, 201, "{:?}", posted.body);
    done(&followers[0], "after-failover").await;
    eprintln!(
        "failover (etcd's leader killed too: {etcd_too}): a replica led {elected:?} after the leader was \
         killed; ran a Job after {:?}",
        killed.elapsed()
    );
    if let Some(member) = etcd_leader {
        assert_ne!(cluster.leader(), Some(member), "etcd elected another member");
    }

    stop.store(true, Ordering::Relaxed);
    let mut acknowledged = BTreeSet::new();
    for writer in writers {
        acknowledged.extend(writer.await.unwrap());
    }
    assert!(acknowledged.len() >= 16, "the writers were acknowledged: {}", acknowledged.len());
    for follower in &followers {
        let listed = follower.client().get("/apis/hive.dev/v1/agents").await;
        assert_eq!(listed.code, 200);
        let names: BTreeSet<String> = listed.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["metadata"]["name"].as_str().unwrap().into())
            .collect();
        let lost: Vec<_> = acknowledged.difference(&names).collect();
        assert!(lost.is_empty(), "acknowledged writes missing after the failover: {lost:?}");
    }
    // No Job is left unfinished by the failover.
    let posted_jobs = posted_jobs.await.unwrap();
    assert!(!posted_jobs.is_empty());
    let api = followers[0].client();
    let jobs = eventually("every Job to finish", || {
        let api = &api;
        async move {
            let jobs =
                api.get("/apis/hive.dev/v1/jobs").await.body["items"].as_array().cloned().unwrap_or_default();
            jobs.iter()
                .all(|job| {
                    matches!(
                        job["status"]["phase"].as_str().unwrap_or_default(),
                        "Done" | "Failed" | "Cancelled" | "Interrupted"
                    )
                })
                .then_some(jobs)
        }
    })
    .await;
    // Each (Job, node, attempt) was started at most once, across both leaders (a second
    // start folds into its Event's count); every Job that is Done was started.
    let events = api.get("/api/v1/events").await.body["items"].as_array().cloned().unwrap_or_default();
    let starts: Vec<&Value> = events.iter().filter(|e| e["reason"] == "NodeStarted").collect();
    for start in &starts {
        assert_eq!(start["count"], 1, "a node started more than once: {start}");
    }
    for job in &jobs {
        let name = job["metadata"]["name"].as_str().unwrap();
        let started = starts.iter().filter(|e| e["involvedObject"]["name"] == name).count();
        if job["status"]["phase"] == "Done" {
            assert!(started >= 1, "Job {name} is Done and its node never started");
        }
    }
    eprintln!(
        "failover: {} Jobs posted around it, {} nodes started, none twice",
        posted_jobs.len(),
        starts.len()
    );
}

/// Sends `signal` (`-STOP`, `-CONT`) to `pid`.
fn signal(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_paused_past_its_lease_is_replaced_and_exits_when_it_resumes() {
    let cluster = LocalCluster::start(1).unwrap();
    let store = cluster.url();
    let mut paused = replica(&store);
    let first_epoch = leading(&paused).await;
    let follower = replica(&store);
    following(&follower).await;

    signal(paused.pid(), "-STOP");
    assert!(leading(&follower).await > first_epoch);
    let created = follower.client().post("/apis/hive.dev/v1/agents", &agent("while-paused")).await;
    assert_eq!(created.code, 201, "{:?}", created.body);

    // Resumed, the old leader finds its leadership gone and exits (75: run me again).
    signal(paused.pid(), "-CONT");
    let status = tokio::task::spawn_blocking(move || paused.wait_exit(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the deposed leader exits");
    assert_eq!(status.code(), Some(75), "{status:?}");
    let listed = follower.client().get("/apis/hive.dev/v1/agents/while-paused").await;
    assert_eq!(listed.code, 200, "the new leader's write stands");
}

/// The keys of the linearizability history: Events, which nothing in hive writes but
/// their clients.
const KEYS: usize = 4;

/// Reads, writes and compare-and-swaps of the `message` of `KEYS` Events.
struct Messages;

#[derive(Clone, Debug)]
enum Call {
    Get(usize),
    List,
    Patch(usize, String),
    /// A PUT carrying the resourceVersion of a read that returned the first message.
    Swap(usize, String, String),
}

#[derive(Clone, Debug)]
enum Answer {
    Message(String),
    All(Vec<Option<String>>),
    Written,
    Conflict,
}

impl crate::linearizable::Model for Messages {
    type State = Vec<String>;
    type Input = Call;
    type Output = Answer;

    fn step(state: &Vec<String>, call: &Call, answer: Option<&Answer>) -> Vec<Vec<String>> {
        let set = |key: usize, message: &str| {
            let mut next = state.clone();
            next[key] = message.to_string();
            next
        };
        match (call, answer) {
            (Call::Get(key), Some(Answer::Message(m))) if *m == state[*key] => vec![state.clone()],
            (Call::List, Some(Answer::All(all)))
                if all.iter().zip(state).all(|(a, s)| a.as_ref() == Some(s)) =>
            {
                vec![state.clone()]
            }
            (Call::Patch(key, message), Some(Answer::Written) | None) => vec![set(*key, message)],
            // Every message is written once, so the message read names the version.
            (Call::Swap(key, from, to), Some(Answer::Written)) if state[*key] == *from => vec![set(*key, to)],
            (Call::Swap(key, from, _), Some(Answer::Conflict)) if state[*key] != *from => vec![state.clone()],
            (Call::Swap(key, from, to), None) if state[*key] == *from => vec![set(*key, to), state.clone()],
            (Call::Swap(..), None) => vec![state.clone()],
            _ => Vec::new(),
        }
    }
}

/// One client's operations through random replicas until `stop`: `(call time, return
/// time or None, call, answer)`. A read that failed is left out (it changed nothing); a
/// write that failed after it was sent has no return (it may have happened).
async fn client_history(
    client: u64,
    replicas: Vec<(String, String)>,
    start: Instant,
    done: Arc<std::sync::atomic::AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> Vec<crate::linearizable::Op<Call, Answer>> {
    use crate::linearizable::Op;
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let now = || start.elapsed().as_nanos() as u64;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64 ^ (client + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let mut random = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut history = Vec::new();
    let mut written = 0;
    while !stop.load(Ordering::Relaxed) && history.len() < 250 {
        let (base, token) = &replicas[random(replicas.len() as u64) as usize];
        let key = random(KEYS as u64) as usize;
        let path = format!("{base}/api/v1/namespaces/default/events/lin-{key}");
        let roll = random(100);
        let call = now();
        if roll < 55 {
            // A read; now and then followed by a swap from what it read.
            let Ok(reply) = http.get(&path).bearer_auth(token).send().await else { continue };
            if reply.status() != 200 {
                continue;
            }
            let Ok(event) = reply.json::<Value>().await else { continue };
            let ret = now();
            let Some(message) = event["message"].as_str().map(str::to_string) else { continue };
            history.push(Op {
                call,
                ret: Some(ret),
                input: Call::Get(key),
                output: Some(Answer::Message(message.clone())),
            });
            if roll < 25 {
                written += 1;
                let to = format!("c{client}-{written}");
                let mut replaced = event.clone();
                replaced["message"] = json!(to);
                let call = now();
                let sent = http.put(&path).bearer_auth(token).json(&replaced).send().await;
                let answer = match sent {
                    Err(e) if e.is_connect() => continue,
                    Ok(reply) if reply.status().as_u16() == 200 => Some(Answer::Written),
                    Ok(reply) if reply.status().as_u16() == 409 => Some(Answer::Conflict),
                    _ => None,
                };
                let ret = answer.as_ref().map(|_| now());
                history.push(Op { call, ret, input: Call::Swap(key, message, to), output: answer });
            }
        } else if roll < 75 {
            let url = format!("{base}/api/v1/namespaces/default/events?labelSelector=lin%3Dyes");
            let Ok(reply) = http.get(&url).bearer_auth(token).send().await else { continue };
            if reply.status() != 200 {
                continue;
            }
            let Ok(list) = reply.json::<Value>().await else { continue };
            let ret = now();
            let Some(items) = list["items"].as_array() else { continue };
            let mut all = vec![None; KEYS];
            for item in items {
                let name = item["metadata"]["name"].as_str().unwrap_or_default();
                if let Some(key) = name.strip_prefix("lin-").and_then(|k| k.parse::<usize>().ok()) {
                    all[key] = item["message"].as_str().map(str::to_string);
                }
            }
            history.push(Op { call, ret: Some(ret), input: Call::List, output: Some(Answer::All(all)) });
        } else {
            written += 1;
            let to = format!("c{client}-{written}");
            let sent = http
                .patch(&path)
                .bearer_auth(token)
                .header("content-type", "application/merge-patch+json")
                .body(json!({"message": to}).to_string())
                .send()
                .await;
            let answer = match sent {
                Err(e) if e.is_connect() => continue,
                Ok(reply) if reply.status().as_u16() == 200 => Some(Answer::Written),
                _ => None,
            };
            let ret = answer.as_ref().map(|_| now());
            history.push(Op { call, ret, input: Call::Patch(key, to), output: answer });
        }
        done.fetch_add(1, Ordering::Relaxed);
    }
    history
}

/// Reads, writes and compare-and-swaps through every replica while hive's leader, then
/// etcd's, is killed form a linearizable history: no read, list included, misses a write
/// acknowledged before it began, whichever replica took either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_writes_and_swaps_through_every_replica_across_a_failover_are_linearizable() {
    use crate::linearizable::{check, Verdict};
    let mut cluster = LocalCluster::start(3).unwrap();
    let store = cluster.url();
    let mut leader = replica(&store);
    leading(&leader).await;
    let followers = [replica(&store), replica(&store)];
    for follower in &followers {
        following(follower).await;
    }
    let api = followers[0].client();
    for key in 0..KEYS {
        let event = json!({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": format!("lin-{key}"), "labels": {"lin": "yes"}},
            "involvedObject": {"apiVersion": "hive.dev/v1", "kind": "Agent", "name": "nobody"},
            "reason": "Linearizable", "message": "initial", "type": "Normal", "count": 1,
            "source": {"component": "hive-test"}
        });
        let created = api.post("/api/v1/namespaces/default/events", &event).await;
        assert_eq!(created.code, 201, "{:?}", created.body);
    }

    let replicas: Vec<(String, String)> = [&leader, &followers[0], &followers[1]]
        .iter()
        .map(|d| (d.url.clone(), d.client().token().to_string()))
        .collect();
    let start = Instant::now();
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..6)
        .map(|c| tokio::spawn(client_history(c, replicas.clone(), start, done.clone(), stop.clone())))
        .collect();
    // hive's leader dies a third of the way in, etcd's two thirds of the way in.
    eventually("a third of the history", || {
        std::future::ready((done.load(Ordering::Relaxed) >= 500).then_some(()))
    })
    .await;
    leader.kill9();
    eventually("two thirds of the history", || {
        std::future::ready((done.load(Ordering::Relaxed) >= 1000).then_some(()))
    })
    .await;
    cluster.kill(cluster.leader().expect("etcd has a leader"));
    let history_deadline = Instant::now() + Duration::from_secs(60);
    while clients.iter().any(|c| !c.is_finished()) && Instant::now() < history_deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let mut history = Vec::new();
    for client in clients {
        history.extend(client.await.unwrap());
    }
    let lists = history.iter().filter(|op| matches!(op.input, Call::List)).count();
    let unknown = history.iter().filter(|op| op.ret.is_none()).count();
    eprintln!("linearizability: {} operations ({lists} lists, {unknown} without an answer)", history.len());
    assert!(history.len() >= 1000, "too short a history: {}", history.len());

    match check::<Messages>(vec!["initial".to_string(); KEYS], &history, 5_000_000) {
        Verdict::Linearizable => {}
        Verdict::Violation { longest } => {
            let placed: BTreeSet<usize> = longest.iter().copied().collect();
            let first_call = history
                .iter()
                .enumerate()
                .filter(|(i, _)| !placed.contains(i))
                .map(|(_, op)| op.call)
                .min()
                .unwrap_or(0);
            let stuck: Vec<_> = history
                .iter()
                .filter(|op| op.call + 50_000_000 >= first_call && op.call <= first_call + 50_000_000)
                .collect();
            panic!(
                "not linearizable: {} of {} operations placed; the last placed {:?}; operations around the first unplaced:\n{stuck:#?}",
                longest.len(),
                history.len(),
                longest.last().map(|&i| &history[i]),
            );
        }
        Verdict::TooLong => {
            panic!("the linearizability search ran out of its budget on {} operations", history.len())
        }
    }
}

/// A Provider is admitted by the key sources the operator allowed, through whichever
/// replica it is written (a follower, which runs no fleet, admitted nothing before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_admits_a_providers_key_sources_by_the_flags_as_the_leader_does() {
    let cluster = LocalCluster::start(1).unwrap();
    let store = cluster.url();
    let keys = tempfile::tempdir().unwrap();
    std::fs::write(keys.path().join("vast.key"), "allowed-key").unwrap();
    let dir = keys.path().display().to_string();
    let base = "http://127.0.0.1:9/api/v0";
    let args = ["--store", &store, "--provider-key-dir", &dir, "--provider-base-url", base];
    let leader = Daemon::start_with(&args);
    leading(&leader).await;
    let follower = Daemon::start_with(&args);
    following(&follower).await;
    let provider = |name: &str, file: &str| {
        json!({"apiVersion": "hive.dev/v1", "kind": "Provider", "metadata": {"name": name},
               "spec": {"type": "vastai", "vastai": {"apiKeyFile": file, "baseUrl": base}}})
    };
    for (daemon, name) in [(&follower, "through-follower"), (&leader, "through-leader")] {
        let api = daemon.client();
        let allowed = api.post("/apis/hive.dev/v1/providers", &provider(name, "vast.key")).await;
        assert_eq!(allowed.code, 201, "{name}: {:?}", allowed.body);
        let refused =
            api.post("/apis/hive.dev/v1/providers", &provider(&format!("{name}-x"), "/etc/hostname")).await;
        assert_eq!(refused.code, 422, "{name}: {:?}", refused.body);
        assert!(
            refused.body["message"].as_str().unwrap_or_default().contains("spec.vastai.apiKeyFile"),
            "{:?}",
            refused.body
        );
    }
}
