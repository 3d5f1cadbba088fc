package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lockpool/lockpool/pool"
	"github.com/lockpool/lockpool/proxy/startupparam"
)

// checkStartupParams has PostgreSQL check the settings a client asked for at
// login, as it would at its own login: the first one it refuses is returned
// as a FATAL with PostgreSQL's SQLSTATE and message. Accepted values take the
// server's spelling (iso -> "ISO, MDY"). It returns NoticeResponse messages
// to send at login.
//
// A set already checked for the application's server user and database needs
// no server. Otherwise the settings are applied on one of the application's
// pooled server connections inside a transaction that is rolled back. When
// no server connection can be had, a set of only well-known parameters is
// accepted unchecked (the first statement applies and so checks it); any
// other set is refused with 08006 (53300 when the pool stayed full).
func (s *Server) checkStartupParams(ctx context.Context, ss *session, seq []startupparam.Param) ([]byte, error) {
	var idx []int
	for i, p := range seq {
		if startupparam.NeedsCheck(p) {
			idx = append(idx, i)
		}
	}
	if len(idx) == 0 {
		return nil, nil
	}
	var key strings.Builder
	key.WriteString(ss.app.cfg.User)
	key.WriteByte(0)
	key.WriteString(ss.database)
	key.WriteByte(0)
	pairs := make([]startupparam.Param, len(idx))
	for j, i := range idx {
		pairs[j] = seq[i]
		key.WriteString(seq[i].Name)
		key.WriteByte(0)
		key.WriteString(seq[i].Value)
		key.WriteByte(0)
	}
	e, ch, owner := s.startupChecks.Begin(key.String())
	if ch != nil {
		var verdict *pgError
		var err error
		if owner {
			checked, v, cerr := s.runStartupCheck(ctx, ss.app.cfg.Name, ss.database, pairs)
			s.startupChecks.Finish(key.String(), ch, checked, v, cerr)
		} else {
			select {
			case <-ch.Done():
			case <-ctx.Done():
			}
		}
		select {
		case <-ch.Done():
			e, verdict, err = ch.Result()
		default:
			err = ctx.Err()
		}
		switch {
		case err != nil:
			if startupparam.LazilyCheckable(seq) {
				s.log.Debug("startup parameters not checked: no server connection; the first statement applies them", "app", ss.app.cfg.Name, "err", err)
				return nil, nil
			}
			return nil, startupCheckError(err, ss.app.cfg.Name)
		case verdict != nil:
			v := *verdict // shared with the other logins that waited for this check
			return nil, &v
		}
	}
	values := make([]string, len(seq))
	for i, p := range seq {
		values[i] = p.Value
	}
	for j, i := range idx {
		values[i] = e.Values[j]
	}
	ss.setStartupValues(seq, values)
	return e.Notices, nil
}

// startupCheckError is what a client gets when its settings needed a check
// and no server connection could be had for it.
func startupCheckError(err error, app string) error {
	var pge *pgconn.PgError
	switch {
	case errors.Is(err, pool.ErrWaitTimeout):
		return &pgError{Code: "53300", Message: fmt.Sprintf("lockpool: no server connection free for application %q to check the connection parameters", app),
			Hint: "Retry in a moment."}
	case errors.As(err, &pge):
		return &pgError{Code: pge.Code, Message: "lockpool: cannot check the connection parameters: " + pge.Message,
			Hint: "The PostgreSQL server refused lockpool's login."}
	}
	return &pgError{Code: "08006", Message: "lockpool: cannot reach PostgreSQL to check the connection parameters",
		Detail: err.Error(),
		Hint:   "Check that PostgreSQL is running and reachable from lockpool. Without it only well-known parameters (application_name, client_encoding, DateStyle, TimeZone, search_path, ...) are accepted at login."}
}

// setStartupValues makes the session's parameters (and what RESET ALL
// returns to) the settings of seq applied in order, so a later setting of a
// parameter wins; values, when not nil, are the server's spelling of each.
func (ss *session) setStartupValues(seq []startupparam.Param, values []string) {
	var eff map[string]string // nil: none
	for i, p := range seq {
		v := p.Value
		if values != nil {
			v = values[i]
		}
		if eff == nil {
			eff = make(map[string]string, len(seq))
		}
		eff[startupparam.CanonicalName(p.Name)] = v
	}
	ss.params.setStartup(eff)
}

// runStartupCheck checks pairs on a pooled server connection of app. A
// connection that fails mid-check is destroyed and the check retried once on
// another (an idle connection may have died unnoticed). It returns the
// server's answer, or the client's FATAL when the server refused a setting,
// or an error when no connection could do the check.
func (s *Server) runStartupCheck(ctx context.Context, app, database string, pairs []startupparam.Param) (*startupparam.Checked, *pgError, error) {
	var err error
	for attempt := 0; attempt < 2 && ctx.Err() == nil; attempt++ {
		var sc *pool.Conn
		sc, err = s.pool.Acquire(ctx, app, database)
		if err != nil {
			return nil, nil, err
		}
		var e *startupparam.Checked
		var verdict *pgError
		e, verdict, err = checkOnConn(ctx, sc, pairs)
		if err != nil {
			sc.Broken = true
			s.pool.Destroy(sc)
			continue
		}
		s.pool.Release(sc)
		return e, verdict, nil
	}
	if err == nil {
		err = ctx.Err()
	}
	return nil, nil, err
}

// checkOnConn applies pairs with set_config on sc inside a transaction that
// it rolls back, after RESET ALL so that values that combine with the
// current one (DateStyle) combine with the defaults, not with what the last
// client left on the connection. An error means sc is unusable.
func checkOnConn(ctx context.Context, sc *pool.Conn, pairs []startupparam.Param) (*startupparam.Checked, *pgError, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(10 * time.Second)
	}
	_ = sc.Net.SetDeadline(dl)
	defer sc.Net.SetDeadline(time.Time{})
	var q strings.Builder
	q.WriteString("BEGIN; RESET ALL; SELECT ")
	for i, p := range pairs {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("pg_catalog.set_config(" + sqlLiteral(p.Name) + ", " + sqlLiteral(p.Value) + ", true)")
	}
	q.WriteString("; ROLLBACK")
	if _, err := sc.Net.Write(wire.AppendQuery(nil, q.String())); err != nil {
		return nil, nil, err
	}
	st := stateOf(sc)
	e := &startupparam.Checked{}
	var verdict *pgError
	var broken error
	var status byte
	read := func(typ byte, body []byte) {
		switch typ {
		case 'E':
			e := pgerr.FromBody(body)
			if sev := e.Severity; sev == "FATAL" || sev == "PANIC" {
				broken = fmt.Errorf("server connection ended: %s", e.Message)
			} else if verdict == nil {
				verdict = e.Fatal()
			}
		case 'N':
			e.Notices = wire.AppendFrame(e.Notices, 'N', body)
		case 'D':
			dataRowColumns(body, func(i int, v []byte, null bool) {
				if i == len(e.Values) && !null {
					e.Values = append(e.Values, string(v))
				}
			})
		case 'S':
			if k, rest, ok := wire.CString(body); ok {
				v, _, _ := wire.CString(rest)
				st.params[lower(string(k))] = string(v)
			}
		case 'Z':
			if len(body) > 0 {
				status = body[0]
			}
		}
	}
	if err := readUntilReady(sc, read); err != nil {
		return nil, nil, err
	}
	if broken != nil {
		return nil, nil, broken
	}
	if status == 'E' {
		// The error aborted the transaction before the ROLLBACK ran.
		if _, err := sc.Net.Write(wire.AppendQuery(nil, "ROLLBACK")); err != nil {
			return nil, nil, err
		}
		if err := readUntilReady(sc, read); err != nil {
			return nil, nil, err
		}
	}
	if status != 'I' {
		return nil, nil, fmt.Errorf("server connection in transaction state %q after the parameter check", status)
	}
	if verdict != nil {
		return nil, verdict, nil
	}
	if len(e.Values) != len(pairs) {
		return nil, nil, fmt.Errorf("parameter check returned %d of %d values", len(e.Values), len(pairs))
	}
	return e, nil, nil
}
