package rewrite

import "testing"

// TestBackendPIDFinding checks Findings.BackendPID: a call of
// pg_backend_pid anywhere in the text, and nothing else.
func TestBackendPIDFinding(t *testing.T) {
	cases := []struct {
		sql  string
		want bool
	}{
		{"SELECT pg_backend_pid()", true},
		{"select PG_BACKEND_PID() AS me", true},
		{"SELECT pg_catalog.pg_backend_pid()", true},
		{`SELECT "pg_backend_pid"()`, true},
		{"SELECT * FROM pg_stat_activity WHERE pid = pg_backend_pid ( )", true},
		{"SELECT 1; SELECT pg_backend_pid /* c */ ()", true},
		{"DO $$ BEGIN PERFORM pg_backend_pid(); END $$", true},
		{"SELECT myschema.pg_backend_pid()", false},
		{"SELECT 'pg_backend_pid()'", false},
		{"SELECT 1 -- pg_backend_pid()", false},
		{"SELECT pid FROM pg_stat_activity", false},
	}
	for _, c := range cases {
		f := Analyze(c.sql)
		if f.BackendPID != c.want {
			t.Errorf("%q: BackendPID = %v, want %v", c.sql, f.BackendPID, c.want)
		}
		if c.want && !MayHit(c.sql) {
			t.Errorf("%q: MayHit = false with a pg_backend_pid call", c.sql)
		}
	}
}
