package ragplane_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log"
	"os"

	"google.golang.org/protobuf/types/known/structpb"

	"github.com/ragplane/ragplane/clients/go/ragplane"
	pb "github.com/ragplane/ragplane/clients/go/ragplanev1"
)

// Compiled (not run: it needs a server) so that the README's calls stay valid.
func Example() {
	ctx := context.Background()
	c, err := ragplane.Dial("127.0.0.1:50051", ragplane.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	if _, err := c.CreateCollection(ctx, "docs"); err != nil {
		log.Fatal(err)
	}
	item, err := ragplane.Item("1", "SQLite is the source of truth", map[string]any{"year": 2024})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Upsert(ctx, "docs", item); err != nil {
		log.Fatal(err)
	}
	hits, err := c.Search(ctx, "docs", "where is data kept?", 5)
	if err != nil {
		log.Fatal(err)
	}
	for _, h := range hits {
		fmt.Println(h.GetId(), h.GetScore(), h.GetText())
	}

	// A filtered search through the generated stub.
	year := &pb.Condition{Field: "year", Op: pb.FilterOp_FILTER_OP_GTE, Value: structpb.NewNumberValue(2020)}
	r, err := c.SearchService.Search(ctx, &pb.SearchRequest{
		Collection: "docs", Query: &pb.SearchRequest_Text{Text: "where is data kept?"},
		TopK: 5, IncludeText: true, Filter: &pb.Filter{Must: []*pb.Condition{year}},
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.GetReturnedK(), r.GetExhaustive())

	m, err := c.Remember(ctx, "agent-42", "the user prefers dark mode")
	if err != nil {
		log.Fatal(err)
	}
	mems, err := c.Recall(ctx, "agent-42", "which theme does the user like?", 5)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(m.GetId(), len(mems))
}

func ExampleDial_tls() {
	c, err := ragplane.Dial("ragplane.internal:443", ragplane.Options{
		APIKey: os.Getenv("RAGPLANE_API_KEY"),
		TLS:    &tls.Config{}, // system roots; set RootCAs / Certificates for a private CA or mTLS
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
}

// Several servers of one cluster (a shared PostgreSQL store), round robin; a read passed a
// write's token sees the write on whichever server answers.
func ExampleDialCluster() {
	ctx := context.Background()
	c, err := ragplane.DialCluster([]string{"10.0.0.1:50051", "10.0.0.2:50051"}, ragplane.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	item, err := ragplane.Item("1", "PostgreSQL is the source of truth", nil)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := c.Upsert(ctx, "docs", item); err != nil {
		log.Fatal(err)
	}
	read := ragplane.WithConsistencyToken(ctx, c.LastConsistencyToken())
	hits, err := c.Search(read, "docs", "where is data kept?", 5) // sees item 1, on either server
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(hits))

	// The generated stubs: the token is on every write reply and every read request.
	r, err := c.MemoryService.Remember(ctx, &pb.RememberRequest{Namespace: "agent-42", Text: "prefers dark mode"})
	if err != nil {
		log.Fatal(err)
	}
	mems, err := c.MemoryService.Recall(ctx, &pb.RecallRequest{Namespace: "agent-42", Query: "theme", TopK: 5,
		ConsistencyToken: r.GetConsistencyToken()})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(len(mems.GetMemories()))
}
