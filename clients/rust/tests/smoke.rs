//! Smoke test against a live ragplane server: embed, create a collection, upsert, search,
//! remember and recall, asserting real results.
//!
//! The server is `python -m ragplane.server.cli serve` from the repository's virtualenv (`$VENV`,
//! default `<repo>/.venv`) on port 0 with the deterministic fake embedder and a fresh data
//! directory, or the server at `$RAGPLANE_ADDR` (`host:port`) when that is set. Without
//! either, the test prints why and passes without running: the Rust client alone does not
//! need Python to build.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ragplane_client::{item, v1, Client, Options};

struct Server {
    child: Child,
    dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn venv_python(root: &Path) -> PathBuf {
    let venv = std::env::var_os("VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join(".venv"));
    let venv = if venv.is_absolute() {
        venv
    } else {
        root.join(venv)
    };
    venv.join("bin/python")
}

/// Starts the Python server on port 0 (with extra `--set` settings) and returns it with the
/// port it bound.
fn start_server(python: &Path, root: &Path, settings: &[String]) -> (Server, u16) {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("ragplane-rs-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let port_file = dir.join("port");
    let log_path = dir.join("server.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let child = Command::new(python)
        .args([
            "-m",
            "ragplane.server.cli",
            "serve",
            "--port",
            "0",
            "--embedder",
            "fake",
        ])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--set")
        .arg(format!("port_file={}", port_file.display()))
        .args(["--set", "koder_toml="])
        .args(settings.iter().flat_map(|kv| ["--set", kv.as_str()]))
        .current_dir(root)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("spawn the ragplane server");
    let mut server = Server { child, dir };
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(s) = std::fs::read_to_string(&port_file) {
            if let Ok(port) = s.trim().parse::<u16>() {
                return (server, port);
            }
        }
        let exited = server.child.try_wait().unwrap();
        if exited.is_some() || Instant::now() > deadline {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            panic!("ragplane server did not start ({exited:?}); its log:\n{log}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn smoke_against_live_server() {
    let root = repo_root();
    let mut _server = None;
    let addr = match std::env::var("RAGPLANE_ADDR") {
        Ok(a) if !a.is_empty() => a,
        _ => {
            let python = venv_python(&root);
            if !python.exists() {
                eprintln!(
                    "SKIPPED smoke_against_live_server: no Python virtualenv at {} \
                     (run `make install` first, or set RAGPLANE_ADDR=host:port)",
                    python.display()
                );
                return;
            }
            let (srv, port) = start_server(&python, &root, &[]);
            _server = Some(srv);
            format!("127.0.0.1:{port}")
        }
    };
    let opts = Options {
        api_key: std::env::var("RAGPLANE_API_KEY")
            .ok()
            .filter(|k| !k.is_empty()),
        timeout: Some(Duration::from_secs(30)),
        ..Default::default()
    };
    let c = Client::connect(format!("http://{addr}"), opts)
        .await
        .expect("connect");

    // Embed: one normalised vector per text, of the advertised dimension.
    let texts = ["the cat sat on the mat", "stock markets fell sharply today"];
    let emb = c.embed(texts).await.expect("embed");
    assert!(emb.dim > 0, "dim {}", emb.dim);
    assert_eq!(emb.vectors.len(), 2);
    for v in &emb.vectors {
        assert_eq!(v.len(), emb.dim);
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-3, "norm {norm}");
    }
    assert!(!emb.embedder.is_empty());

    // A fresh collection takes the embedder's dimension and identity.
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let name = format!("rs_smoke_{nanos}");
    let info = c.create_collection(&name).await.expect("create collection");
    assert_eq!(info.name, name);
    assert_eq!(info.dim as usize, emb.dim);
    assert_eq!(info.embedder, emb.embedder);
    let again = c.create_collection(&name).await.expect_err("created twice");
    assert_eq!(again.code(), tonic::Code::AlreadyExists);
    let same = c
        .get_or_create_collection(&name)
        .await
        .expect("get or create");
    assert_eq!((same.name.as_str(), same.dim), (name.as_str(), info.dim));

    let docs = [
        ("a", "the cat sat on the mat"),
        ("b", "dogs chase cats in the park"),
        ("c", "python list and dictionaries"),
        ("d", "sorting a list in python"),
    ];
    let n = c
        .upsert(&name, docs.iter().map(|(id, t)| item(*id, *t)).collect())
        .await
        .expect("upsert");
    assert_eq!(n, 4);

    // Searching an item's own text finds it first (cosine ~1), scores never increase.
    let hits = c
        .search(&name, "sorting a list in python", 3)
        .await
        .expect("search");
    assert_eq!(hits.len(), 3, "{hits:?}");
    assert_eq!(hits[0].id, "d");
    assert_eq!(hits[0].text, "sorting a list in python");
    assert!(hits[0].score > 0.99, "top score {}", hits[0].score);
    assert!(
        hits.windows(2).all(|w| w[0].score >= w[1].score),
        "{hits:?}"
    );
    let ids: Vec<&str> = hits.iter().map(|h| h.id.as_str()).collect();
    assert!(
        ids.contains(&"c"),
        "the other python text should rank: {ids:?}"
    );

    // Lexical: an identifier no embedding carries finds its item by BM25, with a lexical
    // score only; hybrid puts it first too, with all three scores.
    c.upsert(
        &name,
        vec![item("e", "call SSL_CTX_set_options before the handshake")],
    )
    .await
    .expect("upsert");
    let lex = c
        .search_mode(&name, "SSL_CTX_set_options", 3, v1::SearchMode::Lexical)
        .await
        .expect("lexical search");
    assert_eq!(lex.len(), 1, "{lex:?}");
    assert_eq!(lex[0].id, "e");
    assert!(lex[0].lexical_score.is_some_and(|s| s > 0.0), "{lex:?}");
    assert!(lex[0].dense_score.is_none(), "{lex:?}");
    let hyb = c
        .search_mode(&name, "SSL_CTX_set_options", 3, v1::SearchMode::Hybrid)
        .await
        .expect("hybrid search");
    assert_eq!(hyb.len(), 3, "{hyb:?}");
    assert_eq!(hyb[0].id, "e");
    assert!(
        hyb[0].fused_score.is_some() && hyb[0].dense_score.is_some(),
        "{hyb:?}"
    );

    // Search parameters: exact is brute force (and says so); one that does not apply to
    // the collection's index (ef_search on a flat one) is INVALID_ARGUMENT naming hnsw.
    let exact = c
        .search_params(
            &name,
            "sorting a list in python",
            2,
            v1::SearchParams {
                exact: true,
                ..Default::default()
            },
        )
        .await
        .expect("exact search");
    assert_eq!(exact[0].id, "d", "{exact:?}");
    let err = c
        .search_params(
            &name,
            "sorting a list in python",
            2,
            v1::SearchParams {
                ef_search: Some(64),
                ..Default::default()
            },
        )
        .await
        .expect_err("ef_search on a flat collection");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(
        err.message().contains("ef_search applies to hnsw"),
        "{err:?}"
    );

    // Memory: Remember returns an id, and recalling the same text returns it first.
    let ns = format!("rs-agent-{nanos}");
    let fact = "the user prefers dark mode in every editor";
    let m = c.remember(&ns, fact).await.expect("remember");
    assert!(!m.id.is_empty());
    assert!(!m.deduplicated);
    let other = c
        .remember(&ns, "the deploy window is friday at noon")
        .await
        .expect("remember");
    assert_ne!(other.id, m.id);
    let mems = c.recall(&ns, fact, 5).await.expect("recall");
    assert!(!mems.is_empty());
    assert_eq!(mems[0].id, m.id, "{mems:?}");
    assert_eq!(mems[0].text, fact);
    assert!(
        mems.windows(2).all(|w| w[0].score >= w[1].score),
        "{mems:?}"
    );
}

/// The API key travels as `authorization: Bearer <key>` on every call: a server with keys
/// refuses calls without one (or with a wrong one) and serves calls with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_sent_as_bearer() {
    if std::env::var("RAGPLANE_ADDR").is_ok_and(|a| !a.is_empty()) {
        eprintln!("SKIPPED api_key_is_sent_as_bearer: RAGPLANE_ADDR is set, and this test needs a server it starts with a known key");
        return;
    }
    let root = repo_root();
    let python = venv_python(&root);
    if !python.exists() {
        eprintln!(
            "SKIPPED api_key_is_sent_as_bearer: no Python virtualenv at {} (run `make install` first)",
            python.display()
        );
        return;
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let key = format!("rs-test-key-{nanos}");
    let (_server, port) = start_server(&python, &root, &[format!("bootstrap_admin_key={key}")]);
    let addr = format!("http://127.0.0.1:{port}");
    let connect = |api_key: Option<String>| {
        let addr = addr.clone();
        async move {
            let opts = Options {
                api_key,
                ..Default::default()
            };
            Client::connect(addr, opts).await.expect("connect")
        }
    };

    for (what, k) in [
        ("no key", None),
        ("a wrong key", Some(format!("not-{key}"))),
    ] {
        let err = connect(k).await.embed(["hello"]).await.expect_err(what);
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{what}: {err}");
    }
    let emb = connect(Some(key))
        .await
        .embed(["hello"])
        .await
        .expect("embed with the key");
    assert_eq!(emb.vectors.len(), 1);
}
