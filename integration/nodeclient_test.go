package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// nodeCommand runs node on script, a file in integration/node, with env
// added to this process's environment. Without node or the node-postgres
// module (npm ci --prefix integration/node) it skips the test, or fails it
// under CI.
func nodeCommand(ctx context.Context, t *testing.T, script string, env ...string) *exec.Cmd {
	t.Helper()
	dir, err := filepath.Abs("node")
	if err != nil {
		t.Fatal(err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		skipOrFail(t, "node is not installed")
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "pg", "package.json")); err != nil {
		skipOrFail(t, "integration/node/node_modules/pg is missing (run: npm ci --prefix integration/node)")
	}
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	return cmd
}
