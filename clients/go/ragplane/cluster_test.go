package ragplane_test

// The client against a cluster: one PostgreSQL and two ragplane servers on it (issue 26),
// started by scripts/cluster_for_tests.py from the virtualenv, or the one described by
// $RAGPLANE_CLUSTER (that script's JSON line; scripts/test_clients.sh starts one for all
// three clients). Skipped without the virtualenv or without PostgreSQL, with the reason.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ragplane/ragplane/clients/go/ragplane"
	pb "github.com/ragplane/ragplane/clients/go/ragplanev1"
)

type clusterInfo struct {
	Skip    string `json:"skip"`
	Servers []struct {
		Addr    string `json:"addr"`
		Metrics string `json:"metrics"`
	} `json:"servers"`
}

func (c clusterInfo) addrs() []string {
	var out []string
	for _, s := range c.Servers {
		out = append(out, s.Addr)
	}
	return out
}

// The cluster the tests share: started by the first test that needs it, stopped by
// TestMain once every test has run.
var shared struct {
	sync.Mutex
	info  clusterInfo
	err   error // why it could not start: the tests fail with it
	ready bool
	stop  func()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.stop != nil {
		shared.stop()
	}
	os.Exit(code)
}

// startCluster returns the cluster of $RAGPLANE_CLUSTER or the shared one, starting it
// on first use (closing the script's stdin tears it down).
func startCluster(t *testing.T) clusterInfo {
	t.Helper()
	if js := os.Getenv("RAGPLANE_CLUSTER"); js != "" {
		var info clusterInfo
		if err := json.Unmarshal([]byte(js), &info); err != nil {
			t.Fatalf("RAGPLANE_CLUSTER: %v", err)
		}
		return info
	}
	root, python := venvPython(t)
	shared.Lock()
	defer shared.Unlock()
	if !shared.ready {
		shared.ready = true
		shared.info, shared.stop, shared.err = runCluster(root, python)
	}
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	if shared.info.Skip != "" {
		t.Skip(shared.info.Skip)
	}
	return shared.info
}

func runCluster(root, python string) (info clusterInfo, stop func(), err error) {
	cmd := exec.Command(python, filepath.Join(root, "scripts", "cluster_for_tests.py"), "--servers", "2")
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return info, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return info, nil, err
	}
	if err := cmd.Start(); err != nil {
		return info, nil, fmt.Errorf("start scripts/cluster_for_tests.py: %w", err)
	}
	stop = func() {
		stdin.Close()
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadBytes('\n')
	if err != nil {
		stop()
		return info, nil, fmt.Errorf("scripts/cluster_for_tests.py printed no cluster (%v); see its stderr above", err)
	}
	if err := json.Unmarshal(line, &info); err != nil {
		stop()
		return info, nil, fmt.Errorf("scripts/cluster_for_tests.py: %v: %s", err, line)
	}
	return info, stop, nil
}

// served is how many calls of method a server has answered, from its /metrics.
func served(t *testing.T, metricsURL, method string) float64 {
	t.Helper()
	resp, err := http.Get(metricsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^ragplane_requests_total\{[^}]*method="[^"]*` + method + `"[^}]*\} (\S+)$`)
	var n float64
	for _, m := range re.FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.ParseFloat(m[1], 64)
		n += v
	}
	return n
}

// DialCluster spreads calls over both servers (round_robin): each answers a share.
func TestClusterSpreadsCallsOverServers(t *testing.T) {
	cl := startCluster(t)
	c, err := ragplane.DialCluster(cl.addrs(), ragplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	before := []float64{served(t, cl.Servers[0].Metrics, "ListCollections"), served(t, cl.Servers[1].Metrics, "ListCollections")}
	// The policy uses a server once its connection is up, so the first calls may all go to
	// the faster one: call in rounds until each has answered a few (with round_robin, the
	// first round or two), and fail if one never does.
	var got [2]float64
	for calls := 0; calls < 200 && (got[0] < 3 || got[1] < 3); calls += 10 {
		for i := 0; i < 10; i++ {
			if _, err := c.IndexService.ListCollections(ctx, &pb.ListCollectionsRequest{}); err != nil {
				t.Fatalf("ListCollections: %v", err)
			}
		}
		for i := range got {
			got[i] = served(t, cl.Servers[i].Metrics, "ListCollections") - before[i]
		}
	}
	if got[0] < 3 || got[1] < 3 {
		t.Fatalf("calls answered per server: %v; want both to answer (round_robin)", got)
	}
}

// A write through the cluster client, then reads with its token, on whichever server
// answers, and on each server alone.
func TestClusterReadsAWriteWithItsToken(t *testing.T) {
	cl := startCluster(t)
	addrs := cl.addrs()
	both, err := ragplane.DialCluster(addrs, ragplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer both.Close()
	var single []*ragplane.Client
	for _, a := range addrs {
		c, err := ragplane.Dial(a, ragplane.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		single = append(single, c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// A write checks its collection against the answering server's own copy and carries
	// no token: the collection is created on one server and read with the create's token
	// on the other before writes go through the cluster client.
	name := fmt.Sprintf("go_cluster_%d", time.Now().UnixNano())
	info, err := single[0].CreateCollection(ctx, name)
	if err != nil || info.GetConsistencyToken() == "" {
		t.Fatalf("CreateCollection: %v (token %q)", err, info.GetConsistencyToken())
	}
	if _, err := single[1].IndexService.DescribeCollection(ctx, &pb.DescribeCollectionRequest{
		Name: name, ConsistencyToken: info.GetConsistencyToken()}); err != nil {
		t.Fatalf("DescribeCollection on the other server with the create's token: %v", err)
	}
	a, _ := ragplane.Item("a", "the cat sat on the mat", nil)
	b, _ := ragplane.Item("b", "stock markets fell sharply today", nil)
	if n, err := both.Upsert(ctx, name, a, b); err != nil || n != 2 {
		t.Fatalf("Upsert: %d, %v", n, err)
	}
	token := both.LastConsistencyToken()
	if token == "" || token == info.GetConsistencyToken() {
		t.Fatalf("LastConsistencyToken after Upsert: %q (CreateCollection's was %q)", token, info.GetConsistencyToken())
	}
	if single[0].LastConsistencyToken() != info.GetConsistencyToken() {
		t.Fatalf("LastConsistencyToken after CreateCollection: %q, want %q", single[0].LastConsistencyToken(), info.GetConsistencyToken())
	}
	read := ragplane.WithConsistencyToken(ctx, token)
	for _, c := range []*ragplane.Client{single[0], single[1], both, both} {
		hits, err := c.Search(read, name, "the cat sat on the mat", 1)
		if err != nil || len(hits) != 1 || hits[0].GetId() != "a" {
			t.Fatalf("Search with the token: %v, %v", hits, err)
		}
		d, err := c.IndexService.DescribeCollection(read, &pb.DescribeCollectionRequest{Name: name})
		if err != nil || d.GetCount() != 2 {
			t.Fatalf("DescribeCollection with the token: %v, %v", d, err)
		}
		// The field set on the request itself, without the context.
		g, err := c.IndexService.Get(ctx, &pb.GetRequest{Collection: name, Ids: []string{"a", "b"}, ConsistencyToken: token})
		if err != nil || len(g.GetItems()) != 2 {
			t.Fatalf("Get with the token: %v, %v", g, err)
		}
	}

	ns := fmt.Sprintf("go-cluster-%d", time.Now().UnixNano())
	m, err := single[1].Remember(ctx, ns, "the user prefers dark mode")
	if err != nil || m.GetConsistencyToken() == "" {
		t.Fatalf("Remember: %v, %v", m, err)
	}
	read = ragplane.WithConsistencyToken(ctx, m.GetConsistencyToken())
	for _, c := range []*ragplane.Client{single[0], both, both} {
		mems, err := c.Recall(read, ns, "dark mode", 5)
		if err != nil || len(mems) != 1 || mems[0].GetId() != m.GetId() {
			t.Fatalf("Recall with the token: %v, %v", mems, err)
		}
	}
}

// The token reaches the server on every read: one this cluster never gave is refused
// (InvalidArgument), through the typed methods and the stubs, on both servers; a token
// set on the request itself wins over the context's.
func TestClusterSendsTheTokenOnEveryRead(t *testing.T) {
	cl := startCluster(t)
	c, err := ragplane.DialCluster(cl.addrs(), ragplane.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	name := fmt.Sprintf("go_token_%d", time.Now().UnixNano())
	if _, err := c.CreateCollection(ctx, name); err != nil {
		t.Fatal(err)
	}
	good := c.LastConsistencyToken()
	bad := ragplane.WithConsistencyToken(ctx, "elsewhere.1")
	reads := map[string]func() error{
		"Search": func() error { _, err := c.Search(bad, name, "x", 1); return err },
		"Recall": func() error { _, err := c.Recall(bad, "ns", "x", 1); return err },
		"Get": func() error {
			_, err := c.IndexService.Get(bad, &pb.GetRequest{Collection: name, Ids: []string{"a"}})
			return err
		},
		"DescribeCollection": func() error {
			_, err := c.IndexService.DescribeCollection(bad, &pb.DescribeCollectionRequest{Name: name})
			return err
		},
		"ListCollections": func() error {
			_, err := c.IndexService.ListCollections(bad, &pb.ListCollectionsRequest{})
			return err
		},
		"ListMemories": func() error {
			_, err := c.MemoryService.ListMemories(bad, &pb.ListMemoriesRequest{Namespace: "ns"})
			return err
		},
	}
	for round := 0; round < 2; round++ { // round robin: each read on both servers
		for what, read := range reads {
			if err := read(); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "consistency_token") {
				t.Errorf("%s with a foreign token: want InvalidArgument about consistency_token, got %v", what, err)
			}
		}
	}
	req := &pb.DescribeCollectionRequest{Name: name, ConsistencyToken: good}
	if _, err := c.IndexService.DescribeCollection(bad, req); err != nil {
		t.Fatalf("DescribeCollection with its own token: %v", err)
	}
	if req.GetConsistencyToken() != good {
		t.Fatalf("the request was changed: %v", req)
	}
}
