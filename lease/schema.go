package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// FenceSQLState is the SQLSTATE lease_fence raises when the token does not
// hold the lease (a lockpool-specific code; PostgreSQL allows any five
// uppercase letters or digits).
const FenceSQLState = "LP001"

// MigrationLockKey is the pg_advisory_xact_lock key the migration runs under
// ('lockpool' in ASCII).
const MigrationLockKey int64 = 0x6c6f636b706f6f6c

// fenceVersion is stored as the fence function's comment; a different comment
// makes the migration replace the function.
const fenceVersion = "lockpool lease_fence v1"

// Token layout: a token is timeline × 2^TokenTimelineShift + nextval(seq),
// where timeline is the WAL timeline the server writes on when the token is
// granted. A promotion always starts a higher timeline, so every token a
// promoted standby grants is above every token its old primary granted,
// also those whose commits never reached the standby. The sequence is
// capped at TokenSeqMax so that its values never reach into the timeline
// bits; the timeline part leaves 63-40 = 23 bits (timelines up to
// 2^23-1; beyond that the multiplication fails with 22003 instead of
// wrapping).
const (
	TokenTimelineShift = 40
	TokenSeqMax        = 1<<TokenTimelineShift - 1
)

// TokenTimeline returns the WAL timeline part of a token (0 for tokens
// granted before tokens carried one).
func TokenTimeline(token int64) int64 { return token >> TokenTimelineShift }

// names holds the quoted, schema-qualified object names for one schema.
type names struct {
	schema    string // raw schema name
	qschema   string // quoted schema
	table     string // "schema"."leases"
	seq       string // "schema"."lease_token_seq"
	seqLit    string // the sequence name as a SQL string literal for nextval
	token     string // SQL expression of a new token
	fence     string // "schema"."lease_fence"
	fenceSig  string // "schema"."lease_fence"(text,bigint)
	channel   string // NOTIFY channel name (raw)
	qchannel  string // quoted channel identifier for LISTEN
	acquire   string
	renew     string
	renewMany string
	release   string
	list      string
	peek      string
	gc        string
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

func newNames(schema string) *names {
	n := &names{schema: schema}
	n.qschema = pgx.Identifier{schema}.Sanitize()
	n.table = pgx.Identifier{schema, "leases"}.Sanitize()
	n.seq = pgx.Identifier{schema, "lease_token_seq"}.Sanitize()
	n.seqLit = quoteLiteral(n.seq)
	n.fence = pgx.Identifier{schema, "lease_fence"}.Sanitize()
	n.fenceSig = n.fence + "(text,bigint)"
	n.channel = schema + "_lease_released"
	n.qchannel = pgx.Identifier{n.channel}.Sanitize()

	// A new token: the server's current WAL insert timeline (the first 8
	// hex digits of the name of the WAL file the current insert position
	// is in) in the upper bits, the sequence in the lower 40. The timeline
	// is read in the statement that grants the token and is right at once
	// after a promotion (pg_control_checkpoint().timeline_id is not: it
	// lags until the first checkpoint on the new timeline ends).
	// pg_current_wal_lsn() fails on a standby (the statement is refused
	// there anyway). The multiplication is checked: a timeline beyond
	// 2^23-1 fails with 22003 rather than wrapping.
	n.token = fmt.Sprintf(`(('x' || substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8))::bit(32)::bigint * %d + nextval(%s::regclass))`,
		int64(1)<<TokenTimelineShift, n.seqLit)

	// Acquire: one statement. The token is drawn inside DO UPDATE, under the
	// row lock, so it grows in grant order; the VALUES token is only used
	// for a name's first row. When the lease is held by someone else the
	// second branch reports how long the holder has left (server clock).
	// The new expiry uses clock_timestamp() so a takeover that waited behind
	// a lease_fence still gets its whole ttl.
	//
	// A re-acquire keeps the token only when the row still holds the token
	// the session believes it holds ($4; NULL when it believes it holds
	// none). A live row of the session's holder with another token is one
	// the session gave up or never heard of: a release or a takeover whose
	// commit a promoted standby never saw, or a grant whose reply was lost.
	// Handing that token out again would hand out a token below ones
	// already granted (the takeover's), so the session gets a new one.
	n.acquire = fmt.Sprintf(`WITH ins AS (
  INSERT INTO %[1]s AS l (name, holder, token, taken_at, renewed_at, expires_at)
  VALUES ($1, $2, %[2]s, now(), now(), clock_timestamp() + $3::float8 * interval '1 second')
  ON CONFLICT (name) DO UPDATE SET
    holder = excluded.holder,
    token = CASE WHEN %[3]s THEN l.token ELSE %[2]s END,
    taken_at = CASE WHEN %[3]s THEN l.taken_at ELSE clock_timestamp() END,
    renewed_at = clock_timestamp(),
    expires_at = clock_timestamp() + $3::float8 * interval '1 second',
    transitions = l.transitions + CASE WHEN %[3]s THEN 0 ELSE 1 END
  WHERE l.expires_at <= now() OR l.holder = excluded.holder
  RETURNING l.token
)
SELECT true, token, NULL::float8 FROM ins
UNION ALL
SELECT false, NULL::bigint, extract(epoch FROM c.expires_at) - extract(epoch FROM now())
  FROM %[1]s c WHERE c.name = $1 AND NOT EXISTS (SELECT 1 FROM ins)`, n.table, n.token,
		`l.holder = excluded.holder AND l.token = $4::bigint AND l.expires_at > now()`)

	// Renewals compare with clock_timestamp(), not now(): a renewal whose
	// transaction began before a release and waited for its row lock must
	// see the release (READ COMMITTED re-checks the row), or it would bring
	// a released lease back to life.
	n.renew = fmt.Sprintf(`UPDATE %s SET renewed_at = now(), expires_at = now() + $4::float8 * interval '1 second'
WHERE name = $1 AND holder = $2 AND token = $3 AND expires_at > clock_timestamp()`, n.table)

	n.renewMany = fmt.Sprintf(`UPDATE %s AS l SET renewed_at = now(), expires_at = now() + v.ttl * interval '1 second'
FROM unnest($1::text[], $2::text[], $3::bigint[], $4::float8[]) AS v(name, holder, token, ttl)
WHERE l.name = v.name AND l.holder = v.holder AND l.token = v.token AND l.expires_at > clock_timestamp()
RETURNING l.name, l.token`, n.table)

	// Release marks the row free (see the package doc: rows are kept so that
	// tokens grow in grant order) and notifies waiters in the same statement.
	n.release = fmt.Sprintf(`UPDATE %s SET expires_at = now(), renewed_at = now()
WHERE name = $1 AND holder = $2 AND token = $3 AND expires_at > now()
RETURNING (SELECT count(*) FROM pg_notify($4, name))`, n.table)

	n.list = fmt.Sprintf(`SELECT name, holder, token, taken_at, expires_at FROM %s
WHERE expires_at > now() ORDER BY name`, n.table)

	// peek reads the row without locking (used when a renewal is blocked by a
	// lease_fence of the holder's own transaction).
	n.peek = fmt.Sprintf(`SELECT expires_at > now() FROM %s WHERE name = $1 AND holder = $2 AND token = $3`, n.table)

	n.gc = fmt.Sprintf(`DELETE FROM %[1]s WHERE name IN (
  SELECT name FROM %[1]s WHERE expires_at < now() - interval '1 hour'
  ORDER BY name LIMIT 1000 FOR UPDATE SKIP LOCKED)
AND expires_at < now() - interval '1 hour'`, n.table)
	return n
}

func (n *names) schemaDDL() string {
	return "CREATE SCHEMA IF NOT EXISTS " + n.qschema
}

func (n *names) seqDDL() string {
	return fmt.Sprintf("CREATE SEQUENCE IF NOT EXISTS %s AS bigint MAXVALUE %d NO CYCLE", n.seq, int64(TokenSeqMax))
}

// seqCapDDL caps a sequence made before tokens carried the timeline.
func (n *names) seqCapDDL() string {
	return fmt.Sprintf("ALTER SEQUENCE %s MAXVALUE %d", n.seq, int64(TokenSeqMax))
}

func (n *names) tableDDL() string {
	return "CREATE TABLE IF NOT EXISTS " + n.table + ` (
  name        text        PRIMARY KEY,
  holder      text        NOT NULL,
  token       bigint      NOT NULL,
  taken_at    timestamptz NOT NULL,
  renewed_at  timestamptz NOT NULL,
  expires_at  timestamptz NOT NULL,
  transitions bigint      NOT NULL DEFAULT 1
)`
}

func (n *names) fenceDDL() []string {
	body := fmt.Sprintf(`CREATE OR REPLACE FUNCTION %[1]s(p_name text, p_token bigint) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $lockpool$
DECLARE
  v_token bigint;
BEGIN
  SELECT l.token INTO v_token FROM %[2]s l
   WHERE l.name = p_name AND l.token = p_token AND l.expires_at > clock_timestamp()
   FOR SHARE;
  IF NOT FOUND THEN
    RAISE EXCEPTION USING
      ERRCODE = '%[3]s',
      MESSAGE = format('lockpool: lease "%%s" is not held by token %%s', p_name, coalesce(p_token::text, 'NULL')),
      HINT = 'The lease expired or was taken over by another holder; abort this transaction and acquire the lease again.';
  END IF;
  RETURN v_token;
END
$lockpool$`, n.fence, n.table, FenceSQLState)
	return []string{body, "COMMENT ON FUNCTION " + n.fenceSig + " IS " + quoteLiteral(fenceVersion)}
}

// MigrationSQL returns the one-time SQL an administrator can run to create
// the lease schema (the same statements lockpool runs at first use).
func MigrationSQL(schema string) string {
	if schema == "" {
		schema = DefaultSchema
	}
	n := newNames(schema)
	var b strings.Builder
	b.WriteString("BEGIN;\n")
	fmt.Fprintf(&b, "SELECT pg_advisory_xact_lock(%d);\n", MigrationLockKey)
	b.WriteString(n.schemaDDL() + ";\n")
	b.WriteString(n.seqDDL() + ";\n")
	b.WriteString(n.seqCapDDL() + ";\n")
	b.WriteString(n.tableDDL() + ";\n")
	for _, s := range n.fenceDDL() {
		b.WriteString(s + ";\n")
	}
	b.WriteString("COMMIT;\n")
	return b.String()
}

// GrantSQL returns the privileges a role that did not create the schema needs
// so that lockpool, logged in as that role, can use the lease table.
func GrantSQL(schema, role string) string {
	if schema == "" {
		schema = DefaultSchema
	}
	n := newNames(schema)
	r := pgx.Identifier{role}.Sanitize()
	return fmt.Sprintf("GRANT USAGE ON SCHEMA %[1]s TO %[4]s;\nGRANT SELECT, INSERT, UPDATE, DELETE ON %[2]s TO %[4]s;\nGRANT USAGE, SELECT ON SEQUENCE %[3]s TO %[4]s;\n",
		n.qschema, n.table, n.seq, r)
}

type schemaState struct {
	hasSchema, hasSeq, hasTable, hasFence bool
	seqCapped                             bool // the sequence's MAXVALUE is TokenSeqMax
	fenceComment                          string
}

func (st schemaState) complete() bool {
	return st.hasSchema && st.hasSeq && st.seqCapped && st.hasTable && st.hasFence && st.fenceComment == fenceVersion
}

func (n *names) inspect(ctx context.Context, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) (schemaState, error) {
	var st schemaState
	err := q.QueryRow(ctx, `SELECT to_regnamespace($1) IS NOT NULL, to_regclass($2) IS NOT NULL, to_regclass($3) IS NOT NULL,
  to_regprocedure($4) IS NOT NULL, coalesce(obj_description(to_regprocedure($4)::oid, 'pg_proc'), ''),
  coalesce((SELECT seqmax = $5 FROM pg_catalog.pg_sequence WHERE seqrelid = to_regclass($2)), false)`,
		n.qschema, n.seq, n.table, n.fenceSig, int64(TokenSeqMax)).Scan(&st.hasSchema, &st.hasSeq, &st.hasTable, &st.hasFence, &st.fenceComment, &st.seqCapped)
	return st, err
}

// migrate creates whatever is missing. Statements whose object exists are not
// run at all: CREATE … IF NOT EXISTS still checks the CREATE privilege, and a
// role that uses a schema an administrator created has none.
func (s *Store) migrate(ctx context.Context, c *pgx.Conn, database string) error {
	n := s.names
	st, err := n.inspect(ctx, c)
	if pgCode(err) == "42501" {
		// PostgreSQL 15 raises instead of returning NULL when the schema
		// exists but this role has no USAGE on it.
		return s.grantError(ctx, c, database)
	}
	if err != nil {
		return s.wrapPg(err, "inspecting the lease schema")
	}
	if !st.complete() {
		err = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			// The session's lock_timeout (300ms) is for lease calls: another
			// instance's migration, on a loaded server, may hold the
			// migration lock and the catalog locks longer. Wait as long as a
			// statement may run.
			if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", statementTimeout.Milliseconds())); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", MigrationLockKey); err != nil {
				return err
			}
			st, err := n.inspect(ctx, tx)
			if err != nil {
				return err
			}
			var stmts []string
			if !st.hasSchema {
				stmts = append(stmts, n.schemaDDL())
			}
			if !st.hasSeq {
				stmts = append(stmts, n.seqDDL())
			} else if !st.seqCapped {
				// A sequence from before tokens carried the timeline:
				// cap it, so that it never reaches into the timeline bits.
				stmts = append(stmts, n.seqCapDDL())
			}
			if !st.hasTable {
				stmts = append(stmts, n.tableDDL())
			}
			if !st.hasFence || st.fenceComment != fenceVersion {
				stmts = append(stmts, n.fenceDDL()...)
			}
			for _, q := range stmts {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			var pe *pgconn.PgError
			if errors.As(err, &pe) && pe.Code == "42501" {
				if st.hasSchema && st.hasSeq && st.hasTable && st.hasFence {
					// Only the fence function is outdated or the sequence
					// uncapped, and we may not change them: keep working
					// with what is there.
					if !st.seqCapped {
						s.log.Warn("lockpool: the lease token sequence has no MAXVALUE and this role cannot set it; an administrator can run "+n.seqCapDDL(),
							"database", database, "schema", n.schema, "err", pe.Message)
					}
					if st.fenceComment != fenceVersion {
						s.log.Warn("lockpool: lease_fence is outdated and this role cannot replace it",
							"database", database, "schema", n.schema, "err", pe.Message)
					}
				} else {
					var role string
					_ = c.QueryRow(ctx, "SELECT current_user").Scan(&role)
					return &Error{
						Code: "42501",
						Message: fmt.Sprintf("lockpool: role %q cannot create the lease schema %q in database %q (%s); an administrator can run this once:\n%s%s",
							role, n.schema, database, pe.Message, MigrationSQL(n.schema), GrantSQL(n.schema, role)),
						Hint: "Run the SQL above as the database owner or a superuser, or let lockpool log in as a role with CREATE on the database.",
						Err:  err,
					}
				}
			} else {
				return s.wrapPg(err, "creating the lease schema")
			}
		}
	}
	// The role must be able to use what is there (the schema may belong to
	// another role).
	var okSchema, okSel, okIns, okUpd, okDel, okSeq bool
	err = c.QueryRow(ctx, `SELECT has_schema_privilege($1, 'USAGE'),
  has_table_privilege($2, 'SELECT'), has_table_privilege($2, 'INSERT'), has_table_privilege($2, 'UPDATE'),
  has_table_privilege($2, 'DELETE'), has_sequence_privilege($3, 'USAGE')`, n.schema, n.table, n.seq).
		Scan(&okSchema, &okSel, &okIns, &okUpd, &okDel, &okSeq)
	if err != nil && pgCode(err) != "42501" {
		return s.wrapPg(err, "checking lease table privileges")
	}
	if err != nil || !(okSchema && okSel && okIns && okUpd && okDel && okSeq) {
		return s.grantError(ctx, c, database)
	}
	return nil
}

func (s *Store) grantError(ctx context.Context, c *pgx.Conn, database string) error {
	n := s.names
	var role string
	_ = c.QueryRow(ctx, "SELECT current_user").Scan(&role)
	return &Error{
		Code: "42501",
		Message: fmt.Sprintf("lockpool: role %q may not use the lease table %s in database %q; an administrator can run this once:\n%s",
			role, n.table, database, GrantSQL(n.schema, role)),
		Hint: "The lease schema was created by another role; grant this role access to it.",
	}
}
