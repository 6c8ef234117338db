//! The client against a cluster: one PostgreSQL and two ragplane servers on it (issue 26),
//! started once for these tests by `scripts/cluster_for_tests.py` from the virtualenv
//! (`$VENV`, default `<repo>/.venv`), or the one described by `$RAGPLANE_CLUSTER` (that
//! script's JSON line; `scripts/test_clients.sh` starts one for all three clients). Without
//! a virtualenv or PostgreSQL the tests print `SKIPPED` and why, and pass.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ragplane_client::{item, v1, Client, Options};

/// The script's JSON line: `{"servers": [{"addr": ..., "metrics": ...}]}` or `{"skip": ...}`.
#[derive(Clone, Debug)]
enum Cluster {
    Up {
        addrs: Vec<String>,
        metrics: Vec<String>,
    },
    Skip(String),
}

/// Every value of `"key": "..."` in a line of JSON (the script writes no escapes there).
fn strings(json: &str, key: &str) -> Vec<String> {
    let pat = format!("\"{key}\": \"");
    json.match_indices(&pat)
        .map(|(i, _)| {
            let rest = &json[i + pat.len()..];
            rest[..rest.find('"').unwrap()].to_owned()
        })
        .collect()
}

fn parse(json: &str) -> Cluster {
    if let Some(why) = strings(json, "skip").pop() {
        return Cluster::Skip(why);
    }
    Cluster::Up {
        addrs: strings(json, "addr"),
        metrics: strings(json, "metrics"),
    }
}

/// The script's process; its stdin closes when the test binary exits, which tears the
/// cluster down.
static SCRIPT: Mutex<Option<(Child, ChildStdin)>> = Mutex::new(None);

fn venv_python(root: &Path) -> PathBuf {
    let venv = std::env::var_os("VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv"));
    if venv.is_absolute() {
        venv
    } else {
        root.join(venv)
    }
    .join("bin/python")
}

fn start() -> Cluster {
    if let Ok(js) = std::env::var("RAGPLANE_CLUSTER") {
        if !js.is_empty() {
            return parse(&js);
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap();
    let python = venv_python(&root);
    if !python.exists() {
        return Cluster::Skip(format!(
            "no Python virtualenv at {} (run `make install` first)",
            python.display()
        ));
    }
    let mut child = Command::new(python)
        .arg(root.join("scripts/cluster_for_tests.py"))
        .args(["--servers", "2"])
        .current_dir(&root)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start scripts/cluster_for_tests.py");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        !line.is_empty(),
        "scripts/cluster_for_tests.py printed no cluster; see its stderr"
    );
    let stdin = child.stdin.take().unwrap();
    *SCRIPT.lock().unwrap() = Some((child, stdin));
    parse(&line)
}

/// The shared cluster, or None (after printing why) when the tests cannot run.
fn cluster(test: &str) -> Option<(Vec<String>, Vec<String>)> {
    static CLUSTER: OnceLock<Cluster> = OnceLock::new();
    match CLUSTER.get_or_init(start).clone() {
        Cluster::Up { addrs, metrics } => {
            assert_eq!(addrs.len(), 2, "{addrs:?}");
            Some((addrs, metrics))
        }
        Cluster::Skip(why) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

/// How many calls of `method` a server has answered, from its /metrics (plain HTTP/1.0).
fn served(metrics_url: &str, method: &str) -> f64 {
    let rest = metrics_url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let mut s = std::net::TcpStream::connect(host).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body.lines()
        .filter(|l| l.starts_with("ragplane_requests_total{"))
        .filter(|l| l.contains(&format!("{method}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn http(addrs: &[String]) -> Vec<String> {
    addrs.iter().map(|a| format!("http://{a}")).collect()
}

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}_{nanos}")
}

/// How many calls of `method` each server has answered.
fn served_by_each(metrics: &[String], method: &str) -> Vec<f64> {
    metrics.iter().map(|m| served(m, method)).collect()
}

/// `connect_cluster` sends consecutive calls to the servers in turn (gRPC's round_robin),
/// clones of the client sharing the rotation: 20 calls alternate between the two servers,
/// 10 each (a random spread does that about once in 500,000 runs). Embed is called by no
/// other test here, so each server's Embed count says which one answered each call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_rotates_calls_over_servers() {
    let Some((addrs, metrics)) = cluster("cluster_rotates_calls_over_servers") else {
        return;
    };
    let c = Client::connect_cluster(http(&addrs), Options::default()).expect("connect_cluster");
    let clients = [c.clone(), c];
    let start = served_by_each(&metrics, "Embed");
    let mut last = start.clone();
    let mut answered = Vec::new();
    for k in 0..20 {
        clients[k % 2].embed(["round robin"]).await.expect("embed");
        let now = served_by_each(&metrics, "Embed");
        let by: Vec<usize> = (0..2).filter(|&i| now[i] > last[i]).collect();
        assert_eq!(
            by.len(),
            1,
            "call {k}: counts went from {last:?} to {now:?}"
        );
        assert_eq!(
            now[by[0]] - last[by[0]],
            1.0,
            "call {k}: {last:?} -> {now:?}"
        );
        answered.push(by[0]);
        last = now;
    }
    for (k, w) in answered.windows(2).enumerate() {
        assert_ne!(
            w[0],
            w[1],
            "calls {k} and {} on one server: {answered:?}",
            k + 1
        );
    }
    let got: Vec<f64> = (0..2).map(|i| last[i] - start[i]).collect();
    assert_eq!(got, [10.0, 10.0], "{answered:?}");
}

/// A server that cannot be reached fails the call sent to it (UNAVAILABLE, not retried),
/// then is left out of the rotation for about a second, the other server answering every
/// call meanwhile; after that it is tried again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_skips_an_unreachable_server() {
    let Some((addrs, _)) = cluster("cluster_skips_an_unreachable_server") else {
        return;
    };
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    }; // closed: nothing listens there
    let live = http(&addrs).remove(0);
    let c = Client::connect_cluster([dead, live], Options::default()).expect("connect_cluster");
    // ListCollections, not Embed: the rotation test counts the Embed calls.
    let call = || async {
        c.index_service()
            .list_collections(v1::ListCollectionsRequest::default())
            .await
    };
    // The rotation reaches the unreachable server within two calls.
    let mut failed = None;
    for k in 0..2 {
        if let Err(e) = call().await {
            assert_eq!(e.code(), tonic::Code::Unavailable, "call {k}: {e:?}");
            failed = Some(Instant::now());
            break;
        }
    }
    let mut failed = failed.expect("a call on the unreachable server within two calls");
    // Then it is skipped: the calls that start well within the second all succeed.
    let mut ok = 0;
    for k in 0..10 {
        let started = Instant::now();
        match call().await {
            Ok(_) => ok += 1,
            Err(e) => {
                let after = started - failed;
                assert!(
                    after >= Duration::from_millis(900),
                    "call {k} failed {after:?} after the last failure: {e:?}"
                );
                failed = Instant::now();
            }
        }
    }
    assert!(ok >= 1, "no call succeeded");
    // After the skip the server is tried again, once: the call after it is answered.
    tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(1200)))
        .await
        .unwrap();
    let results = [call().await.is_ok(), call().await.is_ok()];
    assert!(
        results.iter().filter(|&&r| r).count() == 1,
        "two calls after the skip: {results:?}; want one on each server"
    );
}

/// A write through the cluster client, then reads with its token on whichever server
/// answers, and on each server alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_reads_a_write_with_its_token() {
    let Some((addrs, _)) = cluster("cluster_reads_a_write_with_its_token") else {
        return;
    };
    let both = Client::connect_cluster(http(&addrs), Options::default()).expect("connect_cluster");
    let mut clients = vec![both.clone(), both.clone()];
    for a in http(&addrs) {
        clients.push(
            Client::connect(a, Options::default())
                .await
                .expect("connect"),
        );
    }
    // A write checks its collection against the answering server's own copy and carries
    // no token: the collection is created on one server and read with the create's token
    // on the other before writes go through the cluster client.
    let name = unique("rs_cluster");
    let info = clients[2].create_collection(&name).await.expect("create");
    assert!(!info.consistency_token.is_empty(), "{info:?}");
    assert_eq!(clients[2].last_consistency_token(), info.consistency_token);
    clients[3]
        .describe_collection(&name, &info.consistency_token)
        .await
        .expect("describe on the other server with the create's token");
    let up = both
        .upsert_with(v1::UpsertRequest {
            collection: name.clone(),
            items: vec![
                item("a", "the cat sat on the mat"),
                item("b", "stock markets fell sharply today"),
            ],
        })
        .await
        .expect("upsert");
    assert_eq!(up.upserted, 2);
    assert!(!up.consistency_token.is_empty());
    assert_eq!(both.last_consistency_token(), up.consistency_token);
    let token = up.consistency_token;
    for c in &clients {
        let r = c
            .search_with(v1::SearchRequest {
                collection: name.clone(),
                query: Some(v1::search_request::Query::Text(
                    "the cat sat on the mat".into(),
                )),
                top_k: 1,
                consistency_token: token.clone(),
                ..Default::default()
            })
            .await
            .expect("search with the token");
        assert_eq!(r.hits.first().map(|h| h.id.as_str()), Some("a"), "{r:?}");
        let d = c
            .describe_collection(&name, &token)
            .await
            .expect("describe");
        assert_eq!(d.count, 2);
        let g = c
            .index_service()
            .get(v1::GetRequest {
                collection: name.clone(),
                ids: vec!["a".into(), "b".into()],
                consistency_token: token.clone(),
                ..Default::default()
            })
            .await
            .expect("get with the token")
            .into_inner();
        assert_eq!(g.items.len(), 2);
    }

    let ns = unique("rs-ns");
    let m = clients[3]
        .remember(&ns, "the user prefers dark mode")
        .await
        .expect("remember");
    assert!(!m.consistency_token.is_empty());
    for c in [&clients[2], &both, &both] {
        let r = c
            .recall_with(v1::RecallRequest {
                namespace: ns.clone(),
                query: "dark mode".into(),
                top_k: 5,
                consistency_token: m.consistency_token.clone(),
                ..Default::default()
            })
            .await
            .expect("recall with the token");
        let ids: Vec<&str> = r.memories.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(ids, [m.id.as_str()]);
    }
}

/// The token reaches the server: one this cluster never gave is refused (InvalidArgument)
/// by every read, on both servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_refuses_a_foreign_token() {
    let Some((addrs, _)) = cluster("cluster_refuses_a_foreign_token") else {
        return;
    };
    let c = Client::connect_cluster(http(&addrs), Options::default()).expect("connect_cluster");
    let name = unique("rs_token");
    c.create_collection(&name).await.expect("create");
    let bad = "elsewhere.1".to_owned();
    for _ in 0..4 {
        let search = c
            .search_with(v1::SearchRequest {
                collection: name.clone(),
                query: Some(v1::search_request::Query::Text("x".into())),
                top_k: 1,
                consistency_token: bad.clone(),
                ..Default::default()
            })
            .await;
        let recall = c
            .recall_with(v1::RecallRequest {
                namespace: "ns".into(),
                query: "x".into(),
                top_k: 1,
                consistency_token: bad.clone(),
                ..Default::default()
            })
            .await;
        let describe = c.describe_collection(&name, &bad).await;
        for (what, r) in [
            ("search", search.err()),
            ("recall", recall.err()),
            ("describe", describe.err()),
        ] {
            let code = r.map(|e| e.code());
            assert_eq!(code, Some(tonic::Code::InvalidArgument), "{what}");
        }
    }
}
