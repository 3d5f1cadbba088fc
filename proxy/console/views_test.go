package console

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestServerRowColumns: SHOW SERVERS names the backend's pid remote_pid,
// as PgBouncer does.
func TestServerRowColumns(t *testing.T) {
	b, err := json.Marshal(ServerRow{RemotePID: 4242})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"remote_pid":4242`) || strings.Contains(string(b), "backend_pid") {
		t.Fatalf("ServerRow = %s, want a remote_pid column and no backend_pid", b)
	}
}
