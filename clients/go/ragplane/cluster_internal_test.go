package ragplane

import "testing"

func TestNewerKeepsTheFurthestToken(t *testing.T) {
	for _, c := range []struct{ a, b, want string }{
		{"", "ab.7", "ab.7"},
		{"ab.7", "", "ab.7"},
		{"ab.10", "ab.9", "ab.10"}, // by position, not as strings
		{"ab.9", "ab.10", "ab.10"},
		{"ab.9", "cd.1", "cd.1"}, // another store: the latest one
	} {
		if got := newer(c.a, c.b); got != c.want {
			t.Errorf("newer(%q, %q) = %q, want %q", c.a, c.b, got, c.want)
		}
	}
}

func TestDialClusterChecksAddresses(t *testing.T) {
	if _, err := DialCluster(nil, Options{}); err == nil {
		t.Error("DialCluster with no address")
	}
	if _, err := DialCluster([]string{"127.0.0.1"}, Options{}); err == nil {
		t.Error("DialCluster with an address without a port")
	}
	if _, err := DialCluster([]string{"127.0.0.1:1", "127.0.0.1:2"}, Options{APIKey: "k"}); err == nil {
		t.Error("DialCluster sent an API key without TLS or AllowPlaintextKey")
	}
}
