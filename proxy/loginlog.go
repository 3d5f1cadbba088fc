package proxy

import (
	"errors"
	"sync"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// Failed logins are logged at INFO, at most loginLogBurst lines per
// loginLogWindow; the lines left out are counted in the next line's
// "suppressed" attribute, so a password-guessing client cannot flood the
// log.
const (
	loginLogBurst  = 20
	loginLogWindow = 10 * time.Second
)

// loginLimiter is the rate limit of the failed-login lines.
type loginLimiter struct {
	mu         sync.Mutex
	start      time.Time // of the current window
	n          int       // lines logged in it
	suppressed int       // lines left out since the last one logged
}

// allow reports whether a line may be logged at now and, if so, how many
// were left out before it.
func (l *loginLimiter) allow(now time.Time) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.start) >= loginLogWindow {
		l.start, l.n = now, 0
	}
	if l.n >= loginLogBurst {
		l.suppressed++
		return false, 0
	}
	l.n++
	suppressed, l.suppressed = l.suppressed, 0
	return true, suppressed
}

// logLoginFailure logs a login lockpool refused: the user, the database,
// the client's address and the reason (the SQLSTATE and message the client
// got, which never contain a password). A client that went away during its
// login (psql asking for a password closes its first connection) is logged
// at DEBUG only.
func (s *Server) logLoginFailure(client, user, database string, err error) {
	var pe *pgerr.Error
	if !errors.As(err, &pe) {
		s.log.Debug("login failed", "client", client, "user", user, "database", database, "err", err)
		return
	}
	ok, suppressed := s.loginLog.allow(time.Now())
	if !ok {
		return
	}
	attrs := []any{"user", user, "database", database, "client", client, "sqlstate", pe.Code, "reason", pe.Message}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed)
	}
	s.log.Info("login failed", attrs...)
}
