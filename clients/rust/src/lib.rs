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
//! balances the calls over them, and a write's `consistency_token` passed to a read
//! ([`Client::last_consistency_token`], the `consistency_token` field of the `*_with`
//! requests) makes whichever server answers see that write.

use std::sync::{Arc, Mutex};
use std::time::Duration;

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

/// Errors from [`Client::connect`]; calls themselves fail with a [`tonic::Status`] whose
/// code says what to change (`INVALID_ARGUMENT`, `NOT_FOUND`, `UNAUTHENTICATED`, ...).
#[derive(Debug)]
pub enum Error {
    /// The address or TLS settings are invalid, or the server could not be reached.
    Transport(tonic::transport::Error),
    /// The API key contains characters that cannot be sent as gRPC metadata.
    InvalidApiKey,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Transport(e) => write!(f, "ragplane: cannot connect: {e}"),
            Error::InvalidApiKey => write!(f, "ragplane: API key is not valid ASCII metadata"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Transport(e) => Some(e),
            Error::InvalidApiKey => None,
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

type Svc = InterceptedService<Channel, Auth>;

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
/// [`Client::connect_cluster`]) and the last consistency token.
#[derive(Clone, Debug)]
pub struct Client {
    channel: Channel,
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
            channel: ep.connect().await?,
            auth: auth(&opts)?,
            token: Arc::default(),
        })
    }

    /// A client for several servers of one cluster (ragplane servers sharing a PostgreSQL
    /// store), each `http://host:port` (or `https://` with the `tls` feature); `opts`
    /// apply to every one. Calls are balanced over them by tonic's
    /// [`Channel::balance_list`]: a connection per server, each call on one of the
    /// connected servers picked at random (tower's power-of-two-choices balancer; tonic's
    /// connections report no load, so it is an even random spread rather than a strict
    /// rotation), a server that cannot be reached left out.
    ///
    /// It does not wait for the servers (the first call connects) and must be called
    /// within a Tokio runtime. Any server answers any call but applies the others' writes a
    /// moment later: pass a write's token to a read to see the write wherever it lands
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
        let eps = addrs
            .into_iter()
            .map(|a| endpoint(a.into(), &opts))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Client {
            channel: Channel::balance_list(eps.into_iter()),
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
    use super::newer;

    #[test]
    fn newer_keeps_the_furthest_token() {
        assert_eq!(newer("", "ab.7"), "ab.7");
        assert_eq!(newer("ab.7", ""), "ab.7");
        assert_eq!(newer("ab.10", "ab.9"), "ab.10"); // by position, not as strings
        assert_eq!(newer("ab.9", "ab.10"), "ab.10");
        assert_eq!(newer("ab.9", "cd.1"), "cd.1"); // another store: the latest one
    }
}
