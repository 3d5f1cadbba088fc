package rewrite

import (
	"reflect"
	"testing"
)

func TestHoldRecognition(t *testing.T) {
	tests := []struct {
		name string
		sql  string
		want *AdvisoryCall // nil: not answerable as a whole call
	}{
		{"try one key", "SELECT pg_try_advisory_lock(42)", &AdvisoryCall{Func: TryAdvisoryLock, Args: []string{"42"}}},
		{"lock negative", "select PG_ADVISORY_LOCK(-1);", &AdvisoryCall{Func: AdvisoryLock, Args: []string{"-1"}}},
		{"two keys", "SELECT pg_advisory_lock_shared(1, 2)", &AdvisoryCall{Func: AdvisoryLockShared, Args: []string{"1", "2"}}},
		{"qualified", "SELECT pg_catalog.pg_advisory_unlock($1)", &AdvisoryCall{Func: AdvisoryUnlock, Args: []string{"$1"}, MaxParam: 1}},
		{"quoted name", `SELECT "pg_try_advisory_lock_shared"($2, $1)`, &AdvisoryCall{Func: TryAdvisoryLockShared, Args: []string{"$2", "$1"}, MaxParam: 2}},
		{"expression key", "SELECT pg_try_advisory_lock(hashtext($1))", &AdvisoryCall{Func: TryAdvisoryLock, Args: []string{"hashtext($1)"}, MaxParam: 1}},
		{"two-arg expression", "SELECT pg_advisory_lock(hashtextextended($1, 0))", &AdvisoryCall{Func: AdvisoryLock, Args: []string{"hashtextextended($1, 0)"}, MaxParam: 1}},
		{"array index", "SELECT pg_advisory_lock((ARRAY[1,2])[1], 3)", &AdvisoryCall{Func: AdvisoryLock, Args: []string{"(ARRAY[1,2])[1]", "3"}}},
		{"alias", "SELECT pg_try_advisory_lock(7) AS got", &AdvisoryCall{Func: TryAdvisoryLock, Args: []string{"7"}, Alias: "got"}},
		{"bare alias", `SELECT pg_try_advisory_lock(7) "Got"`, &AdvisoryCall{Func: TryAdvisoryLock, Args: []string{"7"}, Alias: "Got"}},
		{"cast", "SELECT pg_try_advisory_lock(7)::int", &AdvisoryCall{Func: TryAdvisoryLock, Args: []string{"7"}, Cast: "int"}},
		{"cast and alias", "SELECT pg_try_advisory_lock(7)::pg_catalog.bool ok", &AdvisoryCall{Func: TryAdvisoryLock, Args: []string{"7"}, Cast: "pg_catalog.bool", Alias: "ok"}},
		{"cast two words", "SELECT pg_try_advisory_lock(7)::double precision AS d", &AdvisoryCall{Func: TryAdvisoryLock, Args: []string{"7"}, Cast: "double precision", Alias: "d"}},
		{"unlock all", "SELECT pg_advisory_unlock_all()", &AdvisoryCall{Func: AdvisoryUnlockAll}},
		{"unlock all with argument", "SELECT pg_advisory_unlock_all(1)", nil},
		{"three keys", "SELECT pg_advisory_lock(1, 2, 3)", nil},
		{"no key", "SELECT pg_advisory_lock()", nil},
		{"empty argument", "SELECT pg_advisory_lock(1,)", nil},
		{"xact lock", "SELECT pg_advisory_xact_lock(1)", nil},
		{"two calls", "SELECT pg_advisory_lock(1), pg_advisory_lock(2)", nil},
		{"nested call", "SELECT pg_advisory_lock(pg_advisory_unlock(1)::int)", nil},
		{"in a larger query", "SELECT pg_try_advisory_lock(id) FROM jobs", nil},
		{"where clause", "SELECT 1 WHERE pg_try_advisory_lock(1)", nil},
		{"two statements", "SELECT pg_advisory_lock(1); SELECT 1", nil},
		{"do block", "DO $$BEGIN PERFORM pg_advisory_lock(1); END$$", nil},
		{"other schema", "SELECT myschema.pg_advisory_lock(1)", nil},
		{"with set", "SET x = 1; SELECT pg_advisory_lock(1)", nil},
		{"select star from", "SELECT * FROM pg_advisory_lock(1)", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := Analyze(tt.sql)
			if !reflect.DeepEqual(f.Hold, tt.want) {
				t.Fatalf("Hold = %+v, want %+v", f.Hold, tt.want)
			}
		})
	}
}
