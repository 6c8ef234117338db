package ragplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// roundRobin is gRPC's round_robin load-balancing policy: one connection per address, each
// call on the next READY one, so a server that is down is skipped until it is back.
const roundRobin = `{"loadBalancingConfig":[{"round_robin":{}}]}`

// DialCluster creates a client for several servers of one cluster (ragplane servers that
// share a PostgreSQL store, `--set store=postgresql://...`), each "host:port". Calls are
// spread over them with gRPC's round_robin policy: a connection to every server, each call
// on the next ready one, a server that goes away skipped until it is back. Options apply to
// every server (with TLS each is verified against its own host name).
//
// Any server answers any call, but each applies the others' writes a moment later; to
// read a write on whichever server answers, pass the write's consistency token to the read
// (WithConsistencyToken, Client.LastConsistencyToken). Like grpc.NewClient it does not wait
// for the servers: the first call connects.
func DialCluster(addrs []string, opts Options) (*Client, error) {
	if len(addrs) == 0 {
		return nil, errors.New("ragplane: DialCluster needs at least one address")
	}
	var state resolver.State
	for _, a := range addrs {
		if _, _, err := net.SplitHostPort(a); err != nil {
			return nil, fmt.Errorf("ragplane: server address %q is not host:port: %w", a, err)
		}
		// ServerName: the authority (and TLS name) of this address, not the cluster's.
		state.Addresses = append(state.Addresses, resolver.Address{Addr: a, ServerName: a})
	}
	// A resolver of this connection only (grpc.WithResolvers), with the fixed address list.
	r := manual.NewBuilderWithScheme("ragplane-cluster")
	r.InitialState(state)
	return dial(r.Scheme()+":///"+strings.Join(addrs, ","), opts,
		grpc.WithResolvers(r), grpc.WithDefaultServiceConfig(roundRobin))
}

type tokenKey struct{}

// WithConsistencyToken returns a context whose reads wait for a write: every request sent
// with it that has a consistency_token field (Search, Get, DescribeCollection,
// ListCollections, Recall, ListMemories) carries token unless it sets its own, and the
// server that answers does so once it has applied that write (with a PostgreSQL store; it
// waits up to its consistency_wait_ms, then answers Unavailable). It works for the typed
// methods (c.Search, c.Recall, ...) and the generated stubs alike. token comes from a
// write's reply (its ConsistencyToken field) or Client.LastConsistencyToken; "" reads
// without waiting. The embedded store is always current and ignores it.
func WithConsistencyToken(ctx context.Context, token string) context.Context {
	return context.WithValue(ctx, tokenKey{}, token)
}

// LastConsistencyToken is the furthest consistency token any reply to this client carried
// ("" with the embedded store, or before any call): a read passed it (WithConsistencyToken)
// sees every write this client made, on whichever server of the cluster answers. It is
// how to get the token of the typed methods that return a count (Upsert).
func (c *Client) LastConsistencyToken() string { return c.tokens.last() }

// tokens stamps requests with the context's token and keeps the furthest one of the replies.
type tokens struct {
	mu  sync.Mutex
	max string
}

func (t *tokens) last() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.max
}

func (t *tokens) saw(token string) {
	if token == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.max = newer(t.max, token)
}

func (t *tokens) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if token, _ := ctx.Value(tokenKey{}).(string); token != "" {
		if m, ok := req.(proto.Message); ok {
			if fd := tokenField(m); fd != nil && m.ProtoReflect().Get(fd).String() == "" {
				m = proto.Clone(m) // the caller's request stays as it was
				m.ProtoReflect().Set(fd, protoreflect.ValueOfString(token))
				req = m
			}
		}
	}
	err := invoker(ctx, method, req, reply, cc, opts...)
	if m, ok := reply.(proto.Message); ok && err == nil {
		if fd := tokenField(m); fd != nil {
			t.saw(m.ProtoReflect().Get(fd).String())
		}
	}
	return err
}

// tokenField is the message's string field consistency_token, or nil.
func tokenField(m proto.Message) protoreflect.FieldDescriptor {
	fd := m.ProtoReflect().Descriptor().Fields().ByName("consistency_token")
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.IsList() {
		return nil
	}
	return fd
}

// newer is the token of the later position of a and b (tokens are "<store>.<position>"),
// or b when they do not compare (another store, or not a token).
func newer(a, b string) string {
	pa, na, okA := cutLast(a)
	pb, nb, okB := cutLast(b)
	if okA && okB && pa == pb {
		x, errA := strconv.ParseUint(na, 10, 64)
		y, errB := strconv.ParseUint(nb, 10, 64)
		if errA == nil && errB == nil && x > y {
			return a
		}
	}
	if b == "" {
		return a
	}
	return b
}

func cutLast(token string) (prefix, pos string, ok bool) {
	i := strings.LastIndexByte(token, '.')
	if i < 0 {
		return "", "", false
	}
	return token[:i], token[i+1:], true
}
