package backend

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/pool"
)

// State is lockpool's bookkeeping for one server connection, kept in
// pool.Conn.Aux: its parameter values and its prepared statements.
type State struct {
	Defaults map[string]string // lower-case name -> value at login (reported parameters)
	Params   map[string]string // lower-case name -> current value, when known
	Synced   string            // fingerprint of the client parameters it matches
	Prepared map[string]uint64 // server statement name -> last use tick
	Stale    map[string]bool   // server statements to close before reuse: reported stale, or maybe left by a failed batch
	Descs    map[string]uint64 // server statement -> hash of its RowDescription, when seen
	Tick     uint64
}

// StateOf returns sc's State, made at the first call.
func StateOf(sc *pool.Conn) *State {
	if st, ok := sc.Aux.(*State); ok {
		return st
	}
	st := &State{Defaults: make(map[string]string, len(sc.StartupParams)), Params: make(map[string]string, len(sc.StartupParams))}
	for k, v := range sc.StartupParams {
		lk := Lower(k)
		st.Defaults[lk] = v
		st.Params[lk] = v
	}
	sc.Aux = st
	return st
}

// ErrRefused marks the failure of one of lockpool's own exchanges with a
// server connection (probe, read-back) that the server answered with an
// ErrorResponse and completed with ReadyForQuery: the connection is still
// in step with its replies. Any other failure of such an exchange leaves
// replies unread, and the connection must not be reused.
var ErrRefused = errors.New("the server refused lockpool's statement")

// IsConnError reports whether err means the connection is gone (EOF) or
// timed out.
func IsConnError(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne)
}

// ReadUntilReady reads server messages up to and including ReadyForQuery,
// passing each to fn (body valid only during the call).
func ReadUntilReady(sc *pool.Conn, fn func(typ byte, body []byte)) error {
	for {
		typ, n, err := wire.ReadHeader(sc.Reader)
		if err != nil {
			return err
		}
		var body []byte
		if n <= sc.Reader.Size() {
			body, err = sc.Reader.Peek(n)
		} else {
			body = make([]byte, n)
			_, err = io.ReadFull(sc.Reader, body)
			n = 0
		}
		if err != nil {
			return err
		}
		fn(typ, body)
		if n > 0 {
			_, _ = sc.Reader.Discard(n)
		}
		if typ == 'Z' {
			return nil
		}
	}
}

func EndsConnection(body []byte) bool {
	sev := pgerr.FromBody(body).Severity
	return sev == pgerr.SeverityFatal || sev == "PANIC"
}

// Lower returns s in lower case, without copying when it is already.
func Lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			return string(bytes.ToLower([]byte(s)))
		}
	}
	return s
}

// DataRowColumns calls fn for each column of a DataRow body, in order, with
// null set for SQL NULL. A malformed row calls fn for nothing.
func DataRowColumns(body []byte, fn func(i int, v []byte, null bool)) {
	row, err := wire.ParseDataRow(body)
	if err != nil {
		return
	}
	for i, v := range row.All() {
		fn(i, v, v == nil)
	}
}

// LoginError turns a failure to reach the server at login into what
// the client sees (app: the application whose pool it was).
func LoginError(err error, database, app string) error {
	var pge *pgconn.PgError
	if errors.As(err, &pge) {
		msg := pge.Message
		if !strings.HasPrefix(msg, "lockpool:") {
			msg = "lockpool: " + msg
		}
		hint := pge.Hint
		switch pge.Code {
		case "3D000":
			msg = fmt.Sprintf("lockpool: database %q does not exist", database)
			hint = "Check the database name in the connection string."
		case "28P01", "28000":
			hint = "lockpool could not log in to PostgreSQL with the password configured for this user; check users[].password."
		case "57P01", "57P02", "57P03":
			hint = "PostgreSQL ended lockpool's login to it (shutting down, restarting, or the backend was terminated); retry in a moment."
		case "53300":
			hint = "PostgreSQL has no connection slot free for lockpool (its max_connections); lower server.max_connections or raise PostgreSQL's."
		}
		if hint == "" {
			hint = fmt.Sprintf("PostgreSQL answered lockpool's login to it with this error (SQLSTATE %s).", pge.Code)
		}
		return &pgerr.Error{Code: pge.Code, Message: msg, Hint: hint}
	}
	if errors.Is(err, pool.ErrWaitTimeout) {
		return &pgerr.Error{Code: "53300", Message: fmt.Sprintf("lockpool: no server connection free for application %q to read server parameters", app), Hint: "Retry in a moment."}
	}
	return &pgerr.Error{Code: "08006", Message: "lockpool: cannot connect to the PostgreSQL server", Hint: "Check that PostgreSQL is running and reachable from lockpool.", Detail: err.Error()}
}
