package lease

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lockpool/lockpool/internal/pgtest"
)

// TestTokenCarriesTimeline: a token is the server's WAL timeline (1 on a
// fresh cluster) above bit 40 and the sequence below it.
func TestTokenCarriesTimeline(t *testing.T) {
	c := pgtest.Require(t)
	s, _ := newStore(t, c, "lp_token", "tok")
	ctx := ctxT(t, time.Minute)
	a := s.NewSession(appDB, 1)
	t1 := mustAcquire(t, a, "t1", 5*time.Second, 0)
	t2 := mustAcquire(t, a, "t2", 5*time.Second, 0)
	if TokenTimeline(t1) != 1 || TokenTimeline(t2) != 1 || t2 <= t1 {
		t.Fatalf("tokens %#x, %#x: want timeline 1 and increasing", t1, t2)
	}
	su := connect(t, c.SuperuserDSN(appDB))
	var last, seqmax int64
	if err := su.QueryRow(ctx, `SELECT last_value, (SELECT seqmax FROM pg_sequence WHERE seqrelid = 'lp_token.lease_token_seq'::regclass)
FROM lp_token.lease_token_seq`).Scan(&last, &seqmax); err != nil {
		t.Fatal(err)
	}
	if t2&TokenSeqMax != last || seqmax != TokenSeqMax {
		t.Fatalf("token %#x: sequence part %d, sequence last_value %d, seqmax %d", t2, t2&TokenSeqMax, last, seqmax)
	}
	// The sequence never reaches into the timeline bits: at its cap an
	// acquire fails (2200H) instead of granting a token of the next
	// timeline's range.
	if _, err := su.Exec(ctx, fmt.Sprintf("SELECT setval('lp_token.lease_token_seq', %d)", int64(TokenSeqMax))); err != nil {
		t.Fatal(err)
	}
	_, _, err := a.Acquire(ctx, "t3", 5*time.Second, 0)
	if code := errCode(err); code != "2200H" {
		t.Fatalf("acquire with the sequence at its cap: %v (code %q), want 2200H", err, code)
	}
}

// TestMigrationCapsOldSequence: a lease schema made before tokens carried
// the timeline (an uncapped sequence, small tokens in the table) is
// migrated by capping the sequence; the rows stay, and every new token is
// above the old ones.
func TestMigrationCapsOldSequence(t *testing.T) {
	c := pgtest.Require(t)
	ctx := ctxT(t, time.Minute)
	const schema = "lp_oldseq"
	dropSchema(t, c, appDB, schema)
	n := newNames(schema)
	old := []string{
		n.schemaDDL(),
		"CREATE SEQUENCE " + n.seq + " AS bigint NO CYCLE", // as before
		n.tableDDL(),
		"SELECT setval('" + schema + ".lease_token_seq', 500)",
		"INSERT INTO " + n.table + " (name, holder, token, taken_at, renewed_at, expires_at) VALUES ('old', 'gone:1:x', 500, now(), now(), now() - interval '1 second'), ('live', 'other:1:x', 499, now(), now(), now() + interval '1 hour')",
		"ALTER SCHEMA " + n.qschema + " OWNER TO " + appUser,
		"ALTER SEQUENCE " + n.seq + " OWNER TO " + appUser,
		"ALTER TABLE " + n.table + " OWNER TO " + appUser,
	}
	old = append(old, n.fenceDDL()...)
	for _, q := range old {
		if err := c.Exec(ctx, appDB, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s, _ := newStore(t, c, schema, "mig")
	a := s.NewSession(appDB, 1)
	tok := mustAcquire(t, a, "old", 5*time.Second, 0)
	// (The INSERT's VALUES draws a value too, before ON CONFLICT takes
	// the row over with another.)
	if tok <= 500 || TokenTimeline(tok) != 1 || tok&TokenSeqMax <= 500 {
		t.Fatalf("takeover of an old row: token %#x, want timeline 1 and the sequence part above 500", tok)
	}
	rows, err := a.List(ctx)
	if err != nil || len(rows) != 2 || rows[0].Name != "live" || rows[0].Token != 499 {
		t.Fatalf("List = %+v, %v: the old live row must stay as it was", rows, err)
	}
	var seqmax int64
	su := connect(t, c.SuperuserDSN(appDB))
	if err := su.QueryRow(ctx, "SELECT seqmax FROM pg_sequence WHERE seqrelid = '"+schema+".lease_token_seq'::regclass").Scan(&seqmax); err != nil {
		t.Fatal(err)
	}
	if seqmax != TokenSeqMax {
		t.Fatalf("seqmax = %d after the migration, want %d", seqmax, int64(TokenSeqMax))
	}
}

func errCode(err error) string {
	var le *Error
	if errors.As(err, &le) {
		return le.Code
	}
	return pgCode(err)
}
