// Package ragplane is a typed client for ragplane, the retrieval data plane: text
// embeddings, durable vector collections, filtered search and agent memory over gRPC.
//
//	c, err := ragplane.Dial("127.0.0.1:50051", ragplane.Options{})
//	if err != nil { ... }
//	defer c.Close()
//	emb, err := c.Embed(ctx, []string{"hello world"})
//
// The methods cover the common calls; every RPC of the API is reachable through the
// generated stubs in the exported fields (c.IndexService, c.SearchService, c.AdminService, ...), which share the
// client's connection and API key. Errors are gRPC status errors whose code says what to
// change (status.Code(err): InvalidArgument, NotFound, Unauthenticated, ...).
//
// For several servers of one cluster (a shared PostgreSQL store), DialCluster balances the
// calls round robin, and WithConsistencyToken / Client.LastConsistencyToken let a read see a
// write on whichever server answers.
package ragplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	pb "github.com/ragplane/ragplane/clients/go/ragplanev1"
)

// Options say how to connect. The zero value is plaintext with no API key, which the
// server accepts only when it runs without keys on loopback.
type Options struct {
	// APIKey is sent on every call as `authorization: Bearer <key>`.
	APIKey string
	// TLS enables TLS with this configuration (an empty &tls.Config{} verifies the server
	// against the system roots). Nil means plaintext.
	TLS *tls.Config
	// AllowPlaintextKey sends APIKey over a plaintext connection, e.g. to a loopback port
	// or through a TLS-terminating sidecar. Without it, Dial refuses a key without TLS so
	// that a secret is never sent in clear by accident.
	AllowPlaintextKey bool
	// DialOptions are appended to the client's own (interceptors, message sizes, ...).
	DialOptions []grpc.DialOption
}

// Client is a ragplane connection. It is safe for concurrent use; Close it when done.
type Client struct {
	conn   *grpc.ClientConn
	tokens tokens

	EmbedService  pb.EmbedServiceClient
	IndexService  pb.IndexServiceClient
	SearchService pb.SearchServiceClient
	MemoryService pb.MemoryServiceClient
	AdminService  pb.AdminServiceClient
}

// Dial creates a client for addr ("host:port", or any gRPC target such as "dns:///host:443").
// Like grpc.NewClient it does not wait for the server: the first call connects. For several
// servers of one cluster, see DialCluster.
func Dial(addr string, opts Options) (*Client, error) {
	return dial(addr, opts)
}

// dial makes the connection with the client's options (TLS, key, the consistency-token
// interceptor), then extra (DialCluster's resolver and policy), then opts.DialOptions.
func dial(target string, opts Options, extra ...grpc.DialOption) (*Client, error) {
	c := &Client{}
	dial := []grpc.DialOption{grpc.WithChainUnaryInterceptor(c.tokens.intercept)}
	if opts.TLS != nil {
		dial = append(dial, grpc.WithTransportCredentials(credentials.NewTLS(opts.TLS)))
	} else {
		dial = append(dial, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	if opts.APIKey != "" {
		if opts.TLS == nil && !opts.AllowPlaintextKey {
			return nil, errors.New("ragplane: an API key needs Options.TLS (or Options.AllowPlaintextKey)")
		}
		dial = append(dial, grpc.WithPerRPCCredentials(bearer{key: opts.APIKey, secure: opts.TLS != nil}))
	}
	dial = append(dial, extra...)
	dial = append(dial, opts.DialOptions...)
	conn, err := grpc.NewClient(target, dial...)
	if err != nil {
		return nil, fmt.Errorf("ragplane: dial %s: %w", target, err)
	}
	c.conn = conn
	c.EmbedService = pb.NewEmbedServiceClient(conn)
	c.IndexService = pb.NewIndexServiceClient(conn)
	c.SearchService = pb.NewSearchServiceClient(conn)
	c.MemoryService = pb.NewMemoryServiceClient(conn)
	c.AdminService = pb.NewAdminServiceClient(conn)
	return c, nil
}

// Conn is the underlying connection, for other services on the same server (health).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

// Close closes the connection; calls in flight fail.
func (c *Client) Close() error { return c.conn.Close() }

// bearer sends the API key as per-RPC metadata.
type bearer struct {
	key    string
	secure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.key}, nil
}

func (b bearer) RequireTransportSecurity() bool { return b.secure }

// Embeddings are the vectors of a batch of texts, one per text in request order.
type Embeddings struct {
	Vectors [][]float32
	Dim     int
	Model   string
	// Embedder is name@version of the embedder that produced the vectors.
	Embedder string
	// TokenCounts are tokens per text after truncation, special tokens included.
	TokenCounts []int32
}

// Embed embeds texts (L2-normalised, truncated to the model's limit) with the serving
// embedder of the "embeddings" use case. Use c.EmbedService.Embed for the other options.
func (c *Client) Embed(ctx context.Context, texts []string) (*Embeddings, error) {
	r, err := c.EmbedService.Embed(ctx, &pb.EmbedRequest{Texts: texts})
	if err != nil {
		return nil, err
	}
	out := &Embeddings{Dim: int(r.GetDim()), Model: r.GetModel(), Embedder: r.GetEmbedder(), TokenCounts: r.GetTokenCounts()}
	out.Vectors = make([][]float32, len(r.GetVectors()))
	for i, v := range r.GetVectors() {
		out.Vectors[i] = v.GetValues()
	}
	return out, nil
}

// CreateCollection creates a collection with the server's defaults: cosine, flat, the
// embedder's dimension. Use c.IndexService.CreateCollection for other metrics, index types or dims.
func (c *Client) CreateCollection(ctx context.Context, name string) (*pb.CollectionInfo, error) {
	return c.IndexService.CreateCollection(ctx, &pb.CreateCollectionRequest{Name: name})
}

// GetOrCreateCollection is CreateCollection that, when the name is taken (ALREADY_EXISTS),
// returns that collection as DescribeCollection does: a program that creates its
// collection can run again (Python's create_collection(exist_ok=True)).
func (c *Client) GetOrCreateCollection(ctx context.Context, name string) (*pb.CollectionInfo, error) {
	info, err := c.CreateCollection(ctx, name)
	if status.Code(err) != codes.AlreadyExists {
		return info, err
	}
	return c.IndexService.DescribeCollection(ctx, &pb.DescribeCollectionRequest{Name: name})
}

// Item builds an item whose text the server embeds. metadata may be nil; its values must be
// JSON-like (nil, bool, numbers, string, []any, map[string]any).
func Item(id, text string, metadata map[string]any) (*pb.Item, error) {
	it := &pb.Item{Id: id, Text: text}
	if metadata != nil {
		s, err := structpb.NewStruct(metadata)
		if err != nil {
			return nil, fmt.Errorf("ragplane: metadata of item %q: %w", id, err)
		}
		it.Metadata = s
	}
	return it, nil
}

// Upsert inserts or replaces items by id and returns how many were written. Items without a
// vector are embedded server-side. It returns only once the write is committed.
func (c *Client) Upsert(ctx context.Context, collection string, items ...*pb.Item) (int64, error) {
	r, err := c.IndexService.Upsert(ctx, &pb.UpsertRequest{Collection: collection, Items: items})
	if err != nil {
		return 0, err
	}
	return r.GetUpserted(), nil
}

// Search returns the topK items nearest to text, best first (higher score is better for
// every metric), with their text. Use c.SearchService.Search for filters, vector queries and
// metadata; its response also says whether the result is exhaustive.
func (c *Client) Search(ctx context.Context, collection, text string, topK int) ([]*pb.Hit, error) {
	r, err := c.SearchService.Search(ctx, &pb.SearchRequest{
		Collection:  collection,
		Query:       &pb.SearchRequest_Text{Text: text},
		TopK:        int32(topK),
		IncludeText: true,
	})
	if err != nil {
		return nil, err
	}
	return r.GetHits(), nil
}

// SearchWithMode is Search ranked by mode: pb.SearchMode_SEARCH_MODE_LEXICAL ranks by BM25
// over the item text (identifiers, error codes, rare names), pb.SearchMode_SEARCH_MODE_HYBRID
// fuses the dense and lexical rankings by reciprocal rank fusion (k = 60), and
// pb.SearchMode_SEARCH_MODE_DENSE is Search. Each hit carries the scores its mode computed
// (GetDenseScore, GetLexicalScore, GetFusedScore; HasDenseScore etc. say which). Set
// SearchRequest.Fusion through c.SearchService.Search for weighted fusion or another k.
func (c *Client) SearchWithMode(ctx context.Context, collection, text string, topK int, mode pb.SearchMode) ([]*pb.Hit, error) {
	r, err := c.SearchService.Search(ctx, &pb.SearchRequest{
		Collection:  collection,
		Query:       &pb.SearchRequest_Text{Text: text},
		TopK:        int32(topK),
		IncludeText: true,
		Mode:        mode,
	})
	if err != nil {
		return nil, err
	}
	return r.GetHits(), nil
}

// SearchWithParams is Search with this request's search parameters (dense mode): EfSearch
// (HNSW), Nprobe (IVF_PQ), Exact (brute force over the live items) and Oversampling
// (quantized and IVF_PQ collections rescore topK x oversampling candidates). Unset fields
// take the collection's defaults; one that does not apply to its index is refused with
// codes.InvalidArgument. The optional fields are pointers: proto.Int32(256),
// proto.Float32(4).
func (c *Client) SearchWithParams(ctx context.Context, collection, text string, topK int, params *pb.SearchParams) ([]*pb.Hit, error) {
	r, err := c.SearchService.Search(ctx, &pb.SearchRequest{
		Collection:  collection,
		Query:       &pb.SearchRequest_Text{Text: text},
		TopK:        int32(topK),
		IncludeText: true,
		Params:      params,
	})
	if err != nil {
		return nil, err
	}
	return r.GetHits(), nil
}

// Remember stores a memory in namespace and returns its id; when a near-identical memory
// exists, that one is updated and Deduplicated is true. Use c.MemoryService.Remember for
// metadata, importance and a TTL.
func (c *Client) Remember(ctx context.Context, namespace, text string) (*pb.RememberResponse, error) {
	return c.MemoryService.Remember(ctx, &pb.RememberRequest{Namespace: namespace, Text: text})
}

// Recall returns the topK memories of namespace best matching query, by a score that
// combines relevance, recency and importance (each memory carries the parts).
func (c *Client) Recall(ctx context.Context, namespace, query string, topK int) ([]*pb.Memory, error) {
	r, err := c.MemoryService.Recall(ctx, &pb.RecallRequest{Namespace: namespace, Query: query, TopK: int32(topK)})
	if err != nil {
		return nil, err
	}
	return r.GetMemories(), nil
}

// RecallWithMode is Recall with candidates found and relevance scored by mode (see
// SearchWithMode); each memory's parts then carry its dense, lexical and fused scores.
func (c *Client) RecallWithMode(ctx context.Context, namespace, query string, topK int, mode pb.SearchMode) ([]*pb.Memory, error) {
	r, err := c.MemoryService.Recall(ctx, &pb.RecallRequest{Namespace: namespace, Query: query, TopK: int32(topK), Mode: mode})
	if err != nil {
		return nil, err
	}
	return r.GetMemories(), nil
}
