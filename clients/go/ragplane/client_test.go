package ragplane_test

// A smoke test against a live ragplane server: embed, create a collection, upsert, search,
// remember and recall, asserting real results.
//
// The server is `python -m ragplane.server.cli serve` from the repository's virtualenv ($VENV,
// default <repo>/.venv) on port 0 with the deterministic fake embedder and a fresh data
// directory, or the server at $RAGPLANE_ADDR (host:port) when that is set, with
// $RAGPLANE_API_KEY if the server needs one. Without either the test is skipped.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ragplane/ragplane/clients/go/ragplane"
	pb "github.com/ragplane/ragplane/clients/go/ragplanev1"
)

// startServer runs the Python server on port 0 (with extra `--set` settings) and returns
// its address; it is stopped when the test ends.
func startServer(t *testing.T, settings ...string) string {
	t.Helper()
	if addr := os.Getenv("RAGPLANE_ADDR"); addr != "" {
		return addr
	}
	root, python := venvPython(t)

	dir := t.TempDir()
	portFile := filepath.Join(dir, "port")
	logPath := filepath.Join(dir, "server.log")
	log, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-m", "ragplane.server.cli", "serve", "--port", "0", "--embedder", "fake",
		"--data-dir", filepath.Join(dir, "data"), "--set", "port_file=" + portFile, "--set", "koder_toml="}
	for _, kv := range settings {
		args = append(args, "--set", kv)
	}
	cmd := exec.Command(python, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1")
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatalf("start the ragplane server: %v", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		log.Close()
	})
	serverLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }

	deadline := time.After(90 * time.Second)
	for {
		if b, err := os.ReadFile(portFile); err == nil {
			if port, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && port > 0 {
				return fmt.Sprintf("127.0.0.1:%d", port)
			}
		}
		select {
		case err := <-exited:
			exited <- err // for Cleanup
			t.Fatalf("ragplane server exited (%v); its log:\n%s", err, serverLog())
		case <-deadline:
			t.Fatalf("ragplane server did not write its port in 90s; its log:\n%s", serverLog())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// venvPython is the repository root and the virtualenv's python ($VENV, default .venv);
// it skips the test when there is none.
func venvPython(t *testing.T) (root, python string) {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	venv := os.Getenv("VENV")
	if venv == "" {
		venv = ".venv"
	}
	if !filepath.IsAbs(venv) {
		venv = filepath.Join(root, venv)
	}
	python = filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(python); err != nil {
		t.Skipf("no Python virtualenv at %s to run the ragplane server (run `make install` first, or set RAGPLANE_ADDR=host:port)", python)
	}
	return root, python
}

func TestSmokeAgainstLiveServer(t *testing.T) {
	addr := startServer(t)
	key := os.Getenv("RAGPLANE_API_KEY")
	c, err := ragplane.Dial(addr, ragplane.Options{APIKey: key, AllowPlaintextKey: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Embed: one normalised vector per text, of the advertised dimension.
	emb, err := c.Embed(ctx, []string{"the cat sat on the mat", "stock markets fell sharply today"})
	if err != nil {
		t.Fatalf("Embed: %v", err)
	}
	if emb.Dim <= 0 || len(emb.Vectors) != 2 || emb.Embedder == "" {
		t.Fatalf("Embed: dim %d, %d vectors, embedder %q", emb.Dim, len(emb.Vectors), emb.Embedder)
	}
	for i, v := range emb.Vectors {
		var sq float64
		for _, x := range v {
			sq += float64(x) * float64(x)
		}
		if len(v) != emb.Dim || math.Abs(math.Sqrt(sq)-1) > 1e-3 {
			t.Fatalf("vector %d: len %d (dim %d), norm %.5f", i, len(v), emb.Dim, math.Sqrt(sq))
		}
	}

	// A fresh collection takes the embedder's dimension and identity.
	name := fmt.Sprintf("go_smoke_%d", time.Now().UnixNano())
	info, err := c.CreateCollection(ctx, name)
	if err != nil {
		t.Fatalf("CreateCollection: %v", err)
	}
	if info.GetName() != name || int(info.GetDim()) != emb.Dim || info.GetEmbedder() != emb.Embedder {
		t.Fatalf("CreateCollection: %v (want dim %d, embedder %s)", info, emb.Dim, emb.Embedder)
	}
	if _, err := c.CreateCollection(ctx, name); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("CreateCollection again: %v (want ALREADY_EXISTS)", err)
	}
	again, err := c.GetOrCreateCollection(ctx, name) // a second run of a quick start
	if err != nil || again.GetName() != name || again.GetDim() != info.GetDim() {
		t.Fatalf("GetOrCreateCollection of an existing one: %v, %v", again, err)
	}

	docs := [][2]string{
		{"a", "the cat sat on the mat"},
		{"b", "dogs chase cats in the park"},
		{"c", "python list and dictionaries"},
		{"d", "sorting a list in python"},
	}
	var items []*pb.Item
	for _, d := range docs {
		it, err := ragplane.Item(d[0], d[1], map[string]any{"len": len(d[1])})
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, it)
	}
	n, err := c.Upsert(ctx, name, items...)
	if err != nil || n != 4 {
		t.Fatalf("Upsert: %d, %v", n, err)
	}

	// Searching an item's own text finds it first (cosine ~1); scores never increase.
	hits, err := c.Search(ctx, name, "sorting a list in python", 3)
	if err != nil {
		t.Fatalf("Search: %v", err)
	}
	if len(hits) != 3 || hits[0].GetId() != "d" || hits[0].GetText() != "sorting a list in python" || hits[0].GetScore() < 0.99 {
		t.Fatalf("Search: %v", hits)
	}
	ids := []string{}
	for i, h := range hits {
		ids = append(ids, h.GetId())
		if i > 0 && h.GetScore() > hits[i-1].GetScore() {
			t.Fatalf("Search: scores not ordered: %v", hits)
		}
	}
	if !slices.Contains(ids, "c") {
		t.Fatalf("Search: the other python text should rank: %v", ids)
	}

	// Lexical: an identifier no embedding carries finds its item by BM25, which reports a
	// lexical score only; hybrid puts it first too and reports all three scores.
	ident, err := ragplane.Item("e", "call SSL_CTX_set_options before the handshake", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Upsert(ctx, name, ident); err != nil {
		t.Fatalf("Upsert: %v", err)
	}
	lex, err := c.SearchWithMode(ctx, name, "SSL_CTX_set_options", 3, pb.SearchMode_SEARCH_MODE_LEXICAL)
	if err != nil {
		t.Fatalf("SearchWithMode lexical: %v", err)
	}
	if len(lex) != 1 || lex[0].GetId() != "e" || lex[0].GetLexicalScore() <= 0 || lex[0].DenseScore != nil {
		t.Fatalf("SearchWithMode lexical: want only e with a lexical score, got %v", lex)
	}
	hyb, err := c.SearchWithMode(ctx, name, "SSL_CTX_set_options", 3, pb.SearchMode_SEARCH_MODE_HYBRID)
	if err != nil {
		t.Fatalf("SearchWithMode hybrid: %v", err)
	}
	if len(hyb) != 3 || hyb[0].GetId() != "e" || hyb[0].FusedScore == nil || hyb[0].DenseScore == nil || hyb[0].LexicalScore == nil {
		t.Fatalf("SearchWithMode hybrid: want e first with three scores, got %v", hyb)
	}

	// Memory: Remember returns an id, and recalling the same text returns it first.
	ns := fmt.Sprintf("go-agent-%d", time.Now().UnixNano())
	fact := "the user prefers dark mode in every editor"
	m, err := c.Remember(ctx, ns, fact)
	if err != nil {
		t.Fatalf("Remember: %v", err)
	}
	if m.GetId() == "" || m.GetDeduplicated() {
		t.Fatalf("Remember: %v", m)
	}
	other, err := c.Remember(ctx, ns, "the deploy window is friday at noon")
	if err != nil || other.GetId() == m.GetId() {
		t.Fatalf("Remember (second): %v, %v", other, err)
	}
	mems, err := c.Recall(ctx, ns, fact, 5)
	if err != nil {
		t.Fatalf("Recall: %v", err)
	}
	if len(mems) == 0 || mems[0].GetId() != m.GetId() || mems[0].GetText() != fact {
		t.Fatalf("Recall: want %s first, got %v", m.GetId(), mems)
	}
	for i := 1; i < len(mems); i++ {
		if mems[i].GetScore() > mems[i-1].GetScore() {
			t.Fatalf("Recall: scores not ordered: %v", mems)
		}
	}
	lexMems, err := c.RecallWithMode(ctx, ns, "friday deploy", 5, pb.SearchMode_SEARCH_MODE_LEXICAL)
	if err != nil {
		t.Fatalf("RecallWithMode: %v", err)
	}
	if len(lexMems) != 1 || lexMems[0].GetId() != other.GetId() || lexMems[0].GetParts().GetLexical() <= 0 {
		t.Fatalf("RecallWithMode lexical: want only %s, got %v", other.GetId(), lexMems)
	}
}

// The API key travels as `authorization: Bearer <key>` on every call: a server with keys
// refuses calls without one (or with a wrong one) and serves calls with it.
func TestAPIKeyIsSentAsBearer(t *testing.T) {
	if os.Getenv("RAGPLANE_ADDR") != "" {
		t.Skip("RAGPLANE_ADDR is set: this test needs a server it starts with a known key")
	}
	key := fmt.Sprintf("go-test-key-%d", time.Now().UnixNano())
	addr := startServer(t, "bootstrap_admin_key="+key)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	for name, opts := range map[string]ragplane.Options{
		"no key":    {},
		"wrong key": {APIKey: "not-" + key, AllowPlaintextKey: true},
	} {
		c, err := ragplane.Dial(addr, opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Embed(ctx, []string{"hello"}); status.Code(err) != codes.Unauthenticated {
			t.Errorf("Embed with %s: want Unauthenticated, got %v", name, err)
		}
		c.Close()
	}
	c, err := ragplane.Dial(addr, ragplane.Options{APIKey: key, AllowPlaintextKey: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if emb, err := c.Embed(ctx, []string{"hello"}); err != nil || len(emb.Vectors) != 1 {
		t.Fatalf("Embed with the key: %v, %v", emb, err)
	}
}

func TestDialRefusesAKeyInClear(t *testing.T) {
	if _, err := ragplane.Dial("127.0.0.1:1", ragplane.Options{APIKey: "k"}); err == nil {
		t.Fatal("Dial sent an API key without TLS or AllowPlaintextKey")
	}
}

// Options.TLS: the client verifies the server's certificate and sends the key over TLS
// (without AllowPlaintextKey); a plaintext client cannot talk to a TLS server.
func TestTLSWithKey(t *testing.T) {
	if os.Getenv("RAGPLANE_ADDR") != "" {
		t.Skip("RAGPLANE_ADDR is set: this test needs a TLS server it starts with its own certificate")
	}
	dir := t.TempDir()
	certPEM, keyPEM := selfSignedCert(t)
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	key := fmt.Sprintf("go-tls-key-%d", time.Now().UnixNano())
	addr := startServer(t, "tls_cert="+certFile, "tls_key="+keyFile, "bootstrap_admin_key="+key)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certPEM)
	c, err := ragplane.Dial(addr, ragplane.Options{APIKey: key, TLS: &tls.Config{RootCAs: roots}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if emb, err := c.Embed(ctx, []string{"hello"}); err != nil || len(emb.Vectors) != 1 {
		t.Fatalf("Embed over TLS: %v, %v", emb, err)
	}

	plain, err := ragplane.Dial(addr, ragplane.Options{APIKey: key, AllowPlaintextKey: true})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Embed(ctx, []string{"hello"}); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext Embed against a TLS server: want Unavailable, got %v", err)
	}
}

// selfSignedCert returns a PEM certificate for 127.0.0.1 and its PEM private key.
func selfSignedCert(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ragplane test"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// SearchWithParams sends the request's search parameters: exact is brute force (the
// result says so), and a parameter that does not apply to the index is InvalidArgument.
func TestSearchWithParams(t *testing.T) {
	addr := startServer(t)
	c, err := ragplane.Dial(addr, ragplane.Options{APIKey: os.Getenv("RAGPLANE_API_KEY"), AllowPlaintextKey: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	name := fmt.Sprintf("go_params_%d", time.Now().UnixNano())
	if _, err := c.IndexService.CreateCollection(ctx, &pb.CreateCollectionRequest{
		Name: name, IndexType: pb.IndexType_INDEX_TYPE_HNSW,
		Params: &pb.IndexParams{Quantization: pb.Quantization_QUANTIZATION_INT8},
	}); err != nil {
		t.Fatalf("CreateCollection: %v", err)
	}
	var items []*pb.Item
	for i, text := range []string{"the cat sat on the mat", "sorting a list in python", "stock markets fell"} {
		it, err := ragplane.Item(strconv.Itoa(i), text, nil)
		if err != nil {
			t.Fatal(err)
		}
		items = append(items, it)
	}
	if _, err := c.Upsert(ctx, name, items...); err != nil {
		t.Fatalf("Upsert: %v", err)
	}
	exact, err := c.SearchWithParams(ctx, name, "sorting a list in python", 2, &pb.SearchParams{Exact: true})
	if err != nil || len(exact) != 2 || exact[0].GetId() != "1" {
		t.Fatalf("SearchWithParams exact: %v, %v", exact, err)
	}
	ef := int32(64)
	over := float32(2)
	tuned, err := c.SearchWithParams(ctx, name, "sorting a list in python", 2, &pb.SearchParams{EfSearch: &ef, Oversampling: &over})
	if err != nil || len(tuned) != 2 || tuned[0].GetId() != "1" {
		t.Fatalf("SearchWithParams ef_search: %v, %v", tuned, err)
	}
	probe := int32(4)
	_, err = c.SearchWithParams(ctx, name, "x", 2, &pb.SearchParams{Nprobe: &probe})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "nprobe applies to ivf_pq") {
		t.Fatalf("nprobe on hnsw: %v (want INVALID_ARGUMENT naming ivf_pq)", err)
	}
}
