//! A typed client for ragplane, the retrieval data plane: text embeddings, durable vector
//! collections, filtered search and agent memory over gRPC.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ragplane_client::{Client, Options, item};
//!
//! let client = Client::connect("http://127.0.0.1:50051", Options::default()).await?;
//! let emb = client.embed(["hello world"]).await?;
//! println!("{} dims from {}", emb.dim, emb.embedder);
//!
//! client.create_collection("docs").await?;
//! client.upsert("docs", vec![item("1", "SQLite is the source of truth")]).await?;
//! for hit in client.search("docs", "where is data kept?", 5).await? {
//!     println!("{} {:.3}", hit.id, hit.score);
//! }
//! # Ok(()) }
//! ```
//!
//! The wrapper covers the common calls; every RPC of the API is reachable through the
//! generated stubs in [`v1`] (see [`Client::embed_service`] and its siblings), which share
//! the client's channel and API key.
//!
//! Several servers of one cluster (sharing a PostgreSQL store): [`Client::connect_cluster`]
//! sends the calls to them in turn, as gRPC's `round_robin` policy does (a server whose
//! connection just failed is skipped for about a second), and a write's `consistency_token`
//! passed to a read ([`Client::last_consistency_token`], the `consistency_token` field of
//! the `*_with` requests) makes whichever server answers see that write.

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tonic::body::Body;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

/// The generated `ragplane.v1` messages and client stubs (from `protos/ragplane/v1`).
pub mod v1 {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("ragplane.v1");
}

use v1::admin_service_client::AdminServiceClient;
use v1::embed_service_client::EmbedServiceClient;
use v1::index_service_client::IndexServiceClient;
use v1::memory_service_client::MemoryServiceClient;
use v1::search_service_client::SearchServiceClient;

/// Errors from [`Client::connect`] and [`Client::connect_cluster`]; calls themselves fail
/// with a [`tonic::Status`] whose code says what to change (`INVALID_ARGUMENT`,
/// `NOT_FOUND`, `UNAUTHENTICATED`, ...).
#[derive(Debug)]
pub enum Error {
    /// The address or TLS settings are invalid, or the server could not be reached.
    Transport(tonic::transport::Error),
    /// The API key contains characters that cannot be sent as gRPC metadata.
    InvalidApiKey,
    /// [`Client::connect_cluster`] was given no server address.
    NoServers,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Transport(e) => write!(f, "ragplane: cannot connect: {e}"),
            Error::InvalidApiKey => write!(f, "ragplane: API key is not valid ASCII metadata"),
            Error::NoServers => write!(f, "ragplane: connect_cluster needs a server address"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Transport(e) => Some(e),
            Error::InvalidApiKey | Error::NoServers => None,
        }
    }
}

impl From<tonic::transport::Error> for Error {
    fn from(e: tonic::transport::Error) -> Self {
        Error::Transport(e)
    }
}

/// How to connect. `Options::default()` is plaintext, no key, a 10 s connect timeout.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Sent on every call as `authorization: Bearer <key>`.
    pub api_key: Option<String>,
    /// Fails `connect` when the server is not reachable in time (default 10 s).
    pub connect_timeout: Option<Duration>,
    /// Per-call deadline applied to every RPC (default none).
    pub timeout: Option<Duration>,
    /// TLS settings; requires the `tls` feature and an `https://` address.
    #[cfg(feature = "tls")]
    pub tls: Option<tonic::transport::ClientTlsConfig>,
}

/// Adds the API key to every request.
#[derive(Clone, Debug)]
pub struct Auth(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Auth {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

type Svc = InterceptedService<RoundRobin, Auth>;

/// How long a server whose connection failed is left out of the rotation.
const SKIP_FAILED: Duration = Duration::from_secs(1);

/// The service under a [`Client`]'s stubs: the channel of [`Client::connect`], or the
/// strict rotation of [`Client::connect_cluster`] over one channel per server, which leaves
/// out for about a second a server whose call failed at the transport level (gRPC's
/// `round_robin` policy). Clones share the rotation.
#[derive(Clone, Debug)]
pub struct RoundRobin(Route);

#[derive(Clone, Debug)]
enum Route {
    One(Channel),
    Rotate(Arc<Rotation>),
}

#[derive(Debug)]
struct Rotation {
    servers: Vec<Channel>,
    /// The number of the next call.
    next: AtomicUsize,
    marks: Marks,
}

/// When each server is back in the rotation, in milliseconds since `epoch` (0: never left it).
#[derive(Debug)]
struct Marks {
    epoch: Instant,
    until_ms: Vec<AtomicU64>,
}

impl Marks {
    fn new(n: usize) -> Self {
        Marks {
            epoch: Instant::now(),
            until_ms: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn is_down(&self, i: usize, now_ms: u64) -> bool {
        self.until_ms[i].load(Ordering::Relaxed) > now_ms
    }

    fn mark_down(&self, i: usize, now_ms: u64) {
        let until = now_ms.saturating_add(SKIP_FAILED.as_millis() as u64);
        self.until_ms[i].store(until, Ordering::Relaxed);
    }
}

/// The server of call number `n` among `len`: the `n % up`-th of the `up` servers not
/// down, so that consecutive calls go to each of those in turn; when every one is down,
/// the `n % len`-th.
fn pick(n: usize, len: usize, down: impl Fn(usize) -> bool) -> usize {
    let up = (0..len).filter(|&i| !down(i)).count();
    if up == 0 {
        return n % len;
    }
    // A server may go down or come back between the two passes: then any one will do.
    (0..len)
        .filter(|&i| !down(i))
        .nth(n % up)
        .unwrap_or(n % len)
}

/// Whether the call failed on its deadline ([`Options::timeout`]) rather than on the
/// connection: a slow answer says nothing about the server's connection.
fn timed_out(e: &tonic::transport::Error) -> bool {
    let mut err: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(x) = err {
        if x.is::<tonic::TimeoutExpired>() {
            return true;
        }
        err = x.source();
    }
    false
}

impl RoundRobin {
    fn one(channel: Channel) -> Self {
        RoundRobin(Route::One(channel))
    }

    fn rotate(servers: Vec<Channel>) -> Self {
        let n = servers.len();
        RoundRobin(Route::Rotate(Arc::new(Rotation {
            servers,
            // A random first server, as gRPC's round_robin does, so that many clients
            // started together do not all begin with the same one.
            next: AtomicUsize::new(
                std::collections::hash_map::RandomState::new().hash_one(0) as usize
            ),
            marks: Marks::new(n),
        })))
    }
}

impl Service<http::Request<Body>> for RoundRobin {
    type Response = http::Response<Body>;
    type Error = tonic::transport::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        match &mut self.0 {
            Route::One(ch) => ch.poll_ready(cx),
            // The server's channel is made ready in the call's future.
            Route::Rotate(_) => Poll::Ready(Ok(())),
        }
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let rot = match &mut self.0 {
            Route::One(ch) => return Box::pin(ch.call(req)),
            Route::Rotate(rot) => rot.clone(),
        };
        let n = rot.next.fetch_add(1, Ordering::Relaxed);
        let now = rot.marks.now_ms();
        let i = pick(n, rot.servers.len(), |i| rot.marks.is_down(i, now));
        let mut ch = rot.servers[i].clone();
        Box::pin(async move {
            let res = match std::future::poll_fn(|cx| ch.poll_ready(cx)).await {
                Ok(()) => ch.call(req).await,
                Err(e) => Err(e),
            };
            // The connection could not be made or was lost (a status from the server is an
            // Ok response): leave the server out for a while. The call is not retried, as
            // the request may have been sent.
            if let Err(e) = &res {
                if !timed_out(e) {
                    rot.marks.mark_down(i, rot.marks.now_ms());
                }
            }
            res
        })
    }
}

/// The embedding of a batch of texts, one vector per text in request order.
#[derive(Clone, Debug, PartialEq)]
pub struct Embeddings {
    pub vectors: Vec<Vec<f32>>,
    pub dim: usize,
    pub model: String,
    /// name@version of the embedder that produced these vectors.
    pub embedder: String,
}

/// An item with an id and text (embedded server-side) and no metadata.
pub fn item(id: impl Into<String>, text: impl Into<String>) -> v1::Item {
    v1::Item {
        id: id.into(),
        text: text.into(),
        ..Default::default()
    }
}

/// A ragplane client. Cheap to clone: clones share one HTTP/2 channel (one per server with
/// [`Client::connect_cluster`], and its rotation) and the last consistency token.
#[derive(Clone, Debug)]
pub struct Client {
    channel: RoundRobin,
    auth: Auth,
    token: Arc<Mutex<String>>,
}

fn endpoint(addr: String, opts: &Options) -> Result<Endpoint, Error> {
    let mut ep = Endpoint::from_shared(addr)?
        .connect_timeout(opts.connect_timeout.unwrap_or(Duration::from_secs(10)));
    if let Some(t) = opts.timeout {
        ep = ep.timeout(t);
    }
    #[cfg(feature = "tls")]
    if let Some(tls) = &opts.tls {
        ep = ep.tls_config(tls.clone())?;
    }
    Ok(ep)
}

fn auth(opts: &Options) -> Result<Auth, Error> {
    Ok(match &opts.api_key {
        Some(k) => Auth(Some(
            format!("Bearer {k}")
                .parse()
                .map_err(|_| Error::InvalidApiKey)?,
        )),
        None => Auth(None),
    })
}

/// The token of the later position of `a` and `b` (tokens are `<store>.<position>`), or
/// `b` when they do not compare (another store, or not a token).
fn newer(a: &str, b: &str) -> String {
    let pos = |t: &str| {
        t.rsplit_once('.')
            .map(|(p, n)| (p.to_owned(), n.parse::<u64>()))
    };
    if let (Some((pa, Ok(x))), Some((pb, Ok(y)))) = (pos(a), pos(b)) {
        if pa == pb && x > y {
            return a.to_owned();
        }
    }
    if b.is_empty() { a } else { b }.to_owned()
}

impl Client {
    /// Connects to `addr` (`http://host:port`, or `https://` with the `tls` feature).
    pub async fn connect(addr: impl Into<String>, opts: Options) -> Result<Self, Error> {
        let ep = endpoint(addr.into(), &opts)?;
        Ok(Client {
            channel: RoundRobin::one(ep.connect().await?),
            auth: auth(&opts)?,
            token: Arc::default(),
        })
    }

    /// A client for several servers of one cluster (ragplane servers sharing a PostgreSQL
    /// store), each `http://host:port` (or `https://` with the `tls` feature); `opts`
    /// apply to every one. The calls go to the servers in turn, as with gRPC's
    /// `round_robin` policy: a connection per server, and each call (of this client and its
    /// clones, typed methods and stubs alike) on the next server of the list, starting at a
    /// random one. A call that fails at the transport level (the server could not be
    /// reached or the connection was lost; not a status the server returned, nor a
    /// [`Options::timeout`]) leaves its server out of the rotation for about a second, then
    /// the server is tried again; when every server is left out, the calls go to them in
    /// turn anyway. That call is not retried on another server (the request may have been
    /// sent): it returns its error, `UNAVAILABLE` for a server that cannot be reached.
    ///
    /// It does not wait for the servers (a server's first call connects) and must be
    /// called within a Tokio runtime; it fails with [`Error::NoServers`] on an empty list.
    /// Any server answers any call but applies the others' writes a moment later: pass a
    /// write's token to a read to see the write wherever it lands
    /// ([`Client::last_consistency_token`]).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// use ragplane_client::{item, v1, Client, Options};
    ///
    /// let addrs = ["http://10.0.0.1:50051", "http://10.0.0.2:50051"];
    /// let c = Client::connect_cluster(addrs, Options::default())?;
    /// c.upsert("docs", vec![item("1", "PostgreSQL is the source of truth")]).await?;
    /// let r = c
    ///     .search_with(v1::SearchRequest {
    ///         collection: "docs".into(),
    ///         query: Some(v1::search_request::Query::Text("where is data kept?".into())),
    ///         top_k: 5,
    ///         include_text: true,
    ///         consistency_token: c.last_consistency_token(), // sees item 1 on either server
    ///         ..Default::default()
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn connect_cluster<I, S>(addrs: I, opts: Options) -> Result<Self, Error>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let servers = addrs
            .into_iter()
            .map(|a| Ok(endpoint(a.into(), &opts)?.connect_lazy()))
            .collect::<Result<Vec<_>, Error>>()?;
        if servers.is_empty() {
            return Err(Error::NoServers);
        }
        Ok(Client {
            channel: RoundRobin::rotate(servers),
            auth: auth(&opts)?,
            token: Arc::default(),
        })
    }

    /// The furthest `consistency_token` of the replies this client's methods received (the
    /// generated stubs' replies are not seen; read theirs from the reply). Empty with the
    /// embedded store or before a write. Set it as a read request's `consistency_token`
    /// (`search_with`, `recall_with`, or a stub's request) to read every write this client
    /// made, on whichever server answers.
    pub fn last_consistency_token(&self) -> String {
        self.token.lock().unwrap().clone()
    }

    fn saw(&self, token: &str) {
        if !token.is_empty() {
            let mut t = self.token.lock().unwrap();
            *t = newer(&t, token);
        }
    }

    pub fn embed_service(&self) -> EmbedServiceClient<Svc> {
        EmbedServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }
    pub fn index_service(&self) -> IndexServiceClient<Svc> {
        IndexServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }
    pub fn search_service(&self) -> SearchServiceClient<Svc> {
        SearchServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }
    pub fn memory_service(&self) -> MemoryServiceClient<Svc> {
        MemoryServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }
    pub fn admin_service(&self) -> AdminServiceClient<Svc> {
        AdminServiceClient::with_interceptor(self.channel.clone(), self.auth.clone())
    }

    /// Embeds `texts` (L2-normalised, truncated to the model's limit) with the serving
    /// embedder of the `embeddings` use case.
    pub async fn embed<I, S>(&self, texts: I) -> Result<Embeddings, Status>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let req = v1::EmbedRequest {
            texts: texts.into_iter().map(Into::into).collect(),
            ..Default::default()
        };
        let r = self.embed_service().embed(req).await?.into_inner();
        Ok(Embeddings {
            vectors: r.vectors.into_iter().map(|v| v.values).collect(),
            dim: usize::try_from(r.dim).unwrap_or(0),
            model: r.model,
            embedder: r.embedder,
        })
    }

    /// Creates a collection with the server's defaults: cosine, flat, the embedder's
    /// dimension. Use [`Client::create_collection_with`] for anything else.
    pub async fn create_collection(&self, name: &str) -> Result<v1::CollectionInfo, Status> {
        self.create_collection_with(v1::CreateCollectionRequest {
            name: name.to_owned(),
            ..Default::default()
        })
        .await
    }

    /// [`Client::create_collection`] that, when the name is taken (`AlreadyExists`),
    /// returns that collection as `describe_collection` does: a program that creates its
    /// collection can run again (Python's `create_collection(exist_ok=True)`).
    pub async fn get_or_create_collection(&self, name: &str) -> Result<v1::CollectionInfo, Status> {
        match self.create_collection(name).await {
            Err(e) if e.code() == tonic::Code::AlreadyExists => {
                self.describe_collection(name, "").await
            }
            other => other,
        }
    }

    pub async fn create_collection_with(
        &self,
        req: v1::CreateCollectionRequest,
    ) -> Result<v1::CollectionInfo, Status> {
        let info = self
            .index_service()
            .create_collection(req)
            .await?
            .into_inner();
        self.saw(&info.consistency_token);
        Ok(info)
    }

    /// Inserts or replaces `items` by id; returns how many were written. Items without a
    /// vector are embedded server-side. Acknowledged only once committed.
    /// Its consistency token is then [`Client::last_consistency_token`]; or use
    /// [`Client::upsert_with`], whose reply carries it.
    pub async fn upsert(&self, collection: &str, items: Vec<v1::Item>) -> Result<i64, Status> {
        let req = v1::UpsertRequest {
            collection: collection.to_owned(),
            items,
        };
        Ok(self.upsert_with(req).await?.upserted)
    }

    /// [`Client::upsert`] returning the whole reply (chunks, truncated, consistency_token).
    pub async fn upsert_with(&self, req: v1::UpsertRequest) -> Result<v1::UpsertResponse, Status> {
        let r = self.index_service().upsert(req).await?.into_inner();
        self.saw(&r.consistency_token);
        Ok(r)
    }

    /// The collection's count, settings and the position this server has applied
    /// (`consistency_token`). `consistency_token` (empty: do not wait) is a write's token:
    /// the server answers once it has applied that write.
    pub async fn describe_collection(
        &self,
        name: &str,
        consistency_token: &str,
    ) -> Result<v1::CollectionInfo, Status> {
        let req = v1::DescribeCollectionRequest {
            name: name.to_owned(),
            consistency_token: consistency_token.to_owned(),
        };
        let info = self
            .index_service()
            .describe_collection(req)
            .await?
            .into_inner();
        self.saw(&info.consistency_token);
        Ok(info)
    }

    /// The `top_k` nearest items to `text`, best first, with their text. Use
    /// [`Client::search_with`] for filters, vector queries or metadata.
    pub async fn search(
        &self,
        collection: &str,
        text: &str,
        top_k: i32,
    ) -> Result<Vec<v1::Hit>, Status> {
        let req = v1::SearchRequest {
            collection: collection.to_owned(),
            query: Some(v1::search_request::Query::Text(text.to_owned())),
            top_k,
            include_text: true,
            ..Default::default()
        };
        Ok(self.search_with(req).await?.hits)
    }

    /// [`Client::search`] ranked by `mode`: [`v1::SearchMode::Lexical`] ranks by BM25 over
    /// the item text (identifiers, error codes, rare names), [`v1::SearchMode::Hybrid`] fuses
    /// the dense and lexical rankings by reciprocal rank fusion (k = 60). Each hit carries the
    /// scores its mode computed (`dense_score`, `lexical_score`, `fused_score`, `None` where
    /// not computed). Set `fusion` through [`Client::search_with`] for weighted fusion.
    pub async fn search_mode(
        &self,
        collection: &str,
        text: &str,
        top_k: i32,
        mode: v1::SearchMode,
    ) -> Result<Vec<v1::Hit>, Status> {
        let req = v1::SearchRequest {
            collection: collection.to_owned(),
            query: Some(v1::search_request::Query::Text(text.to_owned())),
            top_k,
            include_text: true,
            mode: mode as i32,
            ..Default::default()
        };
        Ok(self.search_with(req).await?.hits)
    }

    /// [`Client::search`] with this request's search parameters (dense mode): `ef_search`
    /// (HNSW), `nprobe` (IVF_PQ), `exact` (brute force over the live items) and
    /// `oversampling` (quantized and IVF_PQ collections rescore `top_k` x oversampling
    /// candidates). `None` fields take the collection's defaults; one that does not apply
    /// to its index is refused with `Code::InvalidArgument`.
    ///
    /// ```no_run
    /// # async fn f(client: ragplane_client::Client) -> Result<(), tonic::Status> {
    /// use ragplane_client::v1;
    /// let params = v1::SearchParams { ef_search: Some(256), ..Default::default() };
    /// let hits = client.search_params("docs", "sorting a list", 10, params).await?;
    /// # Ok(()) }
    /// ```
    pub async fn search_params(
        &self,
        collection: &str,
        text: &str,
        top_k: i32,
        params: v1::SearchParams,
    ) -> Result<Vec<v1::Hit>, Status> {
        let req = v1::SearchRequest {
            collection: collection.to_owned(),
            query: Some(v1::search_request::Query::Text(text.to_owned())),
            top_k,
            include_text: true,
            params: Some(params),
            ..Default::default()
        };
        Ok(self.search_with(req).await?.hits)
    }

    pub async fn search_with(&self, req: v1::SearchRequest) -> Result<v1::SearchResponse, Status> {
        Ok(self.search_service().search(req).await?.into_inner())
    }

    /// Stores a memory in `namespace`; a near-identical one is updated instead
    /// (`deduplicated`). Use [`Client::remember_with`] for metadata, importance or a TTL.
    pub async fn remember(
        &self,
        namespace: &str,
        text: &str,
    ) -> Result<v1::RememberResponse, Status> {
        self.remember_with(v1::RememberRequest {
            namespace: namespace.to_owned(),
            text: text.to_owned(),
            ..Default::default()
        })
        .await
    }

    pub async fn remember_with(
        &self,
        req: v1::RememberRequest,
    ) -> Result<v1::RememberResponse, Status> {
        let r = self.memory_service().remember(req).await?.into_inner();
        self.saw(&r.consistency_token);
        Ok(r)
    }

    /// The `top_k` memories of `namespace` best matching `query`, by a score combining
    /// relevance, recency and importance (each memory carries its parts).
    pub async fn recall(
        &self,
        namespace: &str,
        query: &str,
        top_k: i32,
    ) -> Result<Vec<v1::Memory>, Status> {
        let req = v1::RecallRequest {
            namespace: namespace.to_owned(),
            query: query.to_owned(),
            top_k,
            ..Default::default()
        };
        Ok(self.recall_with(req).await?.memories)
    }

    /// [`Client::recall`] with a full request: filter, mode, fusion, `consistency_token`.
    pub async fn recall_with(&self, req: v1::RecallRequest) -> Result<v1::RecallResponse, Status> {
        Ok(self.memory_service().recall(req).await?.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::{newer, pick, Marks, SKIP_FAILED};

    fn picks(from: usize, calls: usize, down: &[bool]) -> Vec<usize> {
        (from..from + calls)
            .map(|n| pick(n, down.len(), |i| down[i]))
            .collect()
    }

    #[test]
    fn pick_rotates_strictly() {
        assert_eq!(picks(0, 7, &[false; 3]), [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(picks(5, 4, &[false; 2]), [1, 0, 1, 0]);
        assert_eq!(picks(usize::MAX - 1, 1, &[false; 1]), [0]);
    }

    #[test]
    fn pick_skips_servers_that_are_down() {
        // The others still alternate: no server gets two turns in a row.
        assert_eq!(picks(0, 6, &[false, true, false]), [0, 2, 0, 2, 0, 2]);
        assert_eq!(picks(3, 3, &[true, false]), [1, 1, 1]);
    }

    #[test]
    fn pick_rotates_over_all_when_all_are_down() {
        assert_eq!(picks(0, 4, &[true, true]), [0, 1, 0, 1]);
    }

    #[test]
    fn a_server_marked_down_is_back_after_the_skip() {
        let m = Marks::new(2);
        let skip = SKIP_FAILED.as_millis() as u64;
        assert!(!m.is_down(0, 0) && !m.is_down(1, 0));
        m.mark_down(1, 500);
        assert!(!m.is_down(0, 500));
        assert!(m.is_down(1, 500));
        assert!(m.is_down(1, 500 + skip - 1));
        assert!(!m.is_down(1, 500 + skip));
        m.mark_down(1, u64::MAX); // no overflow
        assert!(m.is_down(1, u64::MAX - 1));
    }

    #[test]
    fn newer_keeps_the_furthest_token() {
        assert_eq!(newer("", "ab.7"), "ab.7");
        assert_eq!(newer("ab.7", ""), "ab.7");
        assert_eq!(newer("ab.10", "ab.9"), "ab.10"); // by position, not as strings
        assert_eq!(newer("ab.9", "ab.10"), "ab.10");
        assert_eq!(newer("ab.9", "cd.1"), "cd.1"); // another store: the latest one
    }
}
