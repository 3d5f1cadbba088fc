package txcmd

import "testing"

func TestOf(t *testing.T) {
	tests := []struct {
		sql  string
		want Command
	}{
		{"BEGIN", Begin},
		{"  begin isolation level serializable", Begin},
		{"/* c */ -- x\nStart Transaction", Begin},
		{"START", None},
		{"COMMIT", Commit},
		{"end", Commit},
		{"COMMIT PREPARED 'x'", None},
		{"ROLLBACK", Exit},
		{"abort", Exit},
		{"ROLLBACK TO SAVEPOINT a", None},
		{"ROLLBACK WORK TO a", None},
		{"ROLLBACK TRANSACTION", Exit},
		{"ROLLBACK PREPARED 'x'", None},
		{"SELECT 1", None},
		{"beginning", None},
		{"/* unterminated", None},
		{"", None},
	}
	for _, tt := range tests {
		if got := Of([]byte(tt.sql)); got != tt.want {
			t.Errorf("Of(%q) = %d, want %d", tt.sql, got, tt.want)
		}
	}
}

// FuzzTxCommand: the leading-word scanner never panics, and a statement's
// class does not change when blanks and a comment are put in front of it.
func FuzzTxCommand(f *testing.F) {
	for _, s := range []string{"BEGIN", "rollback to a", "/* x */ COMMIT", "start transaction", "-- c\nend", "/*/**/*/abort"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, sql string) {
		c := Of([]byte(sql))
		if c2 := Of([]byte(" \n/* lead */ " + sql)); c2 != c {
			t.Fatalf("Of(%q) = %d, with a leading comment %d", sql, c, c2)
		}
	})
}
