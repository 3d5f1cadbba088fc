package backend

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/pool"
)

// probeSQL asks the server whether this backend still holds anything that
// must keep the session pinned.
const probeSQL = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid() AND granted)," +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_listening_channels())," +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_class WHERE relnamespace = pg_catalog.pg_my_temp_schema())," +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_cursors WHERE is_holdable)," +
	" EXISTS (SELECT 1 FROM pg_catalog.pg_prepared_statements WHERE from_sql)," +
	" current_user <> session_user"

// ProbeReasons name what each column of probeSQL found, as the pinned
// sessions metric and the log show it.
var ProbeReasons = [...]string{"advisory_lock", "listen", "temp_table", "cursor", "prepare", "role"}

// Probe runs probeSQL on sc, which nobody else uses meanwhile. relay
// (nil: none) gets the messages of no exchange that arrive meanwhile
// (the session's notifications).
func Probe(sc *pool.Conn, relay Relay) (held bool, reason string, err error) {
	_ = sc.Net.SetDeadline(time.Now().Add(5 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	if _, err := sc.Net.Write(wire.AppendQuery(nil, probeSQL)); err != nil {
		return false, "", err
	}
	var row []byte
	var perr error
	read := func(typ byte, body []byte) {
		switch typ {
		case 'D':
			row = append(row[:0], body...)
		case 'E':
			perr = fmt.Errorf("%w: probe failed: %s", ErrRefused, pgerr.FromBody(body).Message)
		}
	}
	read = relay.wrap(read)
	err = ReadUntilReady(sc, read)
	if err != nil {
		return false, "", err
	}
	if perr != nil {
		return false, "", perr
	}
	if len(row) < 2 {
		return false, "", errors.New("probe returned no row")
	}
	DataRowColumns(row, func(i int, v []byte, null bool) {
		if i < len(ProbeReasons) && !null && len(v) > 0 && v[0] == 't' && !held {
			held, reason = true, ProbeReasons[i]
		}
	})
	return held, reason, nil
}

// Reset cleans a server connection whose session ended while it was
// pinned (or in session mode), so the next client finds nothing of it:
// DISCARD ALL, then the probe. It reports whether the connection may be
// reused.
func Reset(sc *pool.Conn) bool {
	_ = sc.Net.SetDeadline(time.Now().Add(5 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	if _, err := sc.Net.Write(wire.AppendQuery(nil, "DISCARD ALL")); err != nil {
		return false
	}
	failed := false
	if err := ReadUntilReady(sc, func(typ byte, body []byte) {
		if typ == 'E' {
			failed = true
		}
	}); err != nil || failed {
		return false
	}
	st := StateOf(sc)
	// DISCARD ALL dropped every prepared statement and reset every setting.
	st.Prepared = nil
	for k := range st.Params {
		delete(st.Params, k)
	}
	for k, v := range st.Defaults {
		st.Params[k] = v
	}
	st.Synced = ""
	held, _, err := Probe(sc, nil)
	return err == nil && !held
}

// ReadTimeouts asks sc, idle inside a client's transaction block, for
// lock_timeout and statement_timeout as they are in force there (SET LOCAL
// included). An error other than ErrRefused leaves sc out of step.
func ReadTimeouts(sc *pool.Conn) ([2]string, error) {
	var v [2]string
	_ = sc.Net.SetDeadline(time.Now().Add(5 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	if _, err := sc.Net.Write(wire.AppendQuery(nil, "SELECT pg_catalog.current_setting('lock_timeout'), pg_catalog.current_setting('statement_timeout')")); err != nil {
		return v, err
	}
	rows := 0
	var refused error
	err := ReadUntilReady(sc, func(typ byte, body []byte) {
		switch typ {
		case 'D':
			rows++
			DataRowColumns(body, func(i int, b []byte, null bool) {
				if i < 2 && !null {
					v[i] = string(b)
				}
			})
		case 'E':
			refused = fmt.Errorf("%w: %s", ErrRefused, pgerr.FromBody(body).Message)
		}
	})
	switch {
	case err != nil:
		return v, err
	case refused != nil:
		return v, refused // the client's transaction failed with it
	case rows != 1:
		return v, fmt.Errorf("%w: %d for lock_timeout and statement_timeout", errUnexpectedRows, rows)
	}
	return v, nil
}

// errUnexpectedRows is a reply of the wrong shape to one of lockpool's own
// statements.
var errUnexpectedRows = errors.New("unexpected number of rows")

// GUCDuration parses a time setting as PostgreSQL shows or accepts it
// ("0", "250", "250ms", "1s", "2min", "1h", "1d"; no unit: milliseconds).
func GUCDuration(v string) time.Duration {
	v = strings.TrimSpace(strings.Trim(strings.TrimSpace(v), "'"))
	i := 0
	for i < len(v) && (v[i] >= '0' && v[i] <= '9' || v[i] == '.') {
		i++
	}
	n, err := strconv.ParseFloat(v[:i], 64)
	if err != nil || n <= 0 {
		return 0
	}
	unit := time.Millisecond
	switch strings.TrimSpace(v[i:]) {
	case "us":
		unit = time.Microsecond
	case "s":
		unit = time.Second
	case "min":
		unit = time.Minute
	case "h":
		unit = time.Hour
	case "d":
		unit = 24 * time.Hour
	}
	return time.Duration(n * float64(unit))
}
