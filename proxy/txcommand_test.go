package proxy

import "testing"

func TestTxCommandOf(t *testing.T) {
	tests := []struct {
		sql  string
		want txCommand
	}{
		{"BEGIN", txBegin},
		{"  begin isolation level serializable", txBegin},
		{"/* c */ -- x\nStart Transaction", txBegin},
		{"START", txNone},
		{"COMMIT", txCommit},
		{"end", txCommit},
		{"COMMIT PREPARED 'x'", txNone},
		{"ROLLBACK", txExit},
		{"abort", txExit},
		{"ROLLBACK TO SAVEPOINT a", txNone},
		{"ROLLBACK WORK TO a", txNone},
		{"ROLLBACK TRANSACTION", txExit},
		{"ROLLBACK PREPARED 'x'", txNone},
		{"SELECT 1", txNone},
		{"beginning", txNone},
		{"/* unterminated", txNone},
		{"", txNone},
	}
	for _, tt := range tests {
		if got := txCommandOf([]byte(tt.sql)); got != tt.want {
			t.Errorf("txCommandOf(%q) = %d, want %d", tt.sql, got, tt.want)
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
		c := txCommandOf([]byte(sql))
		_ = changesSchema([]byte(sql))
		if c2 := txCommandOf([]byte(" \n/* lead */ " + sql)); c2 != c {
			t.Fatalf("txCommandOf(%q) = %d, with a leading comment %d", sql, c, c2)
		}
	})
}
