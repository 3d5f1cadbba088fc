package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/pool"
	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/session"
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
//
// wait gives the context of a wait for the server (made when needed), and
// offload runs what may wait for a server (the check, or another login's
// check of the same set) where waiting is allowed (loginCtx.offload).
func (s *Server) checkStartupParams(wait *lazyContext, ss *session.Session, seq []startupparam.Param, offload func(func())) ([]byte, error) {
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
	key.WriteString(ss.App().User)
	key.WriteByte(0)
	key.WriteString(ss.Database())
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
		var verdict *pgerr.Error
		var err error
		ctx := wait.get()
		offload(func() {
			if owner {
				checked, v, cerr := s.runStartupCheck(ctx, ss.App().Name, ss.Database(), pairs)
				s.startupChecks.Finish(key.String(), ch, checked, v, cerr)
			} else {
				select {
				case <-ch.Done():
				case <-ctx.Done():
				}
			}
		})
		select {
		case <-ch.Done():
			e, verdict, err = ch.Result()
		default:
			err = ctx.Err()
		}
		switch {
		case err != nil:
			if startupparam.LazilyCheckable(seq) {
				s.log.Debug("startup parameters not checked: no server connection; the first statement applies them", "app", ss.App().Name, "err", err)
				return nil, nil
			}
			return nil, startupCheckError(err, ss.App().Name)
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
	ss.SetStartupValues(seq, values)
	return e.Notices, nil
}

// startupCheckError is what a client gets when its settings needed a check
// and no server connection could be had for it.
func startupCheckError(err error, app string) error {
	var pge *pgconn.PgError
	switch {
	case errors.Is(err, pool.ErrWaitTimeout):
		return &pgerr.Error{Code: "53300", Message: fmt.Sprintf("lockpool: no server connection free for application %q to check the connection parameters", app),
			Hint: "Retry in a moment."}
	case errors.As(err, &pge):
		return &pgerr.Error{Code: pge.Code, Message: "lockpool: cannot check the connection parameters: " + pge.Message,
			Hint: "The PostgreSQL server refused lockpool's login."}
	}
	return &pgerr.Error{Code: "08006", Message: "lockpool: cannot reach PostgreSQL to check the connection parameters",
		Detail: err.Error(),
		Hint:   "Check that PostgreSQL is running and reachable from lockpool. Without it only well-known parameters (application_name, client_encoding, DateStyle, TimeZone, search_path, ...) are accepted at login."}
}

// runStartupCheck checks pairs on a pooled server connection of app. A
// connection that fails mid-check is destroyed and the check retried once on
// another (an idle connection may have died unnoticed). It returns the
// server's answer, or the client's FATAL when the server refused a setting,
// or an error when no connection could do the check.
func (s *Server) runStartupCheck(ctx context.Context, app, database string, pairs []startupparam.Param) (*startupparam.Checked, *pgerr.Error, error) {
	var err error
	for attempt := 0; attempt < 2 && ctx.Err() == nil; attempt++ {
		var sc *pool.Conn
		sc, err = s.pool.Acquire(ctx, app, database)
		if err != nil {
			return nil, nil, err
		}
		var e *startupparam.Checked
		var verdict *pgerr.Error
		e, verdict, err = backend.CheckStartup(ctx, sc, pairs)
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
