package session

import (
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/pool"

	"github.com/lockpool/lockpool/proxy/backend"
	"github.com/lockpool/lockpool/proxy/startupparam"
	"github.com/lockpool/lockpool/rewrite"
)

// parseOptions reads the startup options parameter as a PostgreSQL backend
// does and returns every setting the client asked for at login in the order
// PostgreSQL applies them: the switches of options first, then the explicit
// startup parameters in packet order, so that an explicit parameter wins
// over the same one in options. The session's parameters become those
// values, unchecked (checkStartupParams has the server check them).
//
// optErr is PostgreSQL's error for a bad switch or argument in options. It
// stands only once the settings (then just those PostgreSQL applied before
// it) passed the server's check, as on PostgreSQL, which applies each switch
// as it reads it. err is lockpool's own refusal, reported at once.
func (s *Session) ParseOptions(opts string, explicit []startupparam.Param) (settings []startupparam.Param, optErr, err error) {
	settings, optErr = startupparam.ParseOptions(opts)
	if optErr == nil {
		settings = append(settings, explicit...)
	}
	if err := startupparam.CheckUnsupported(settings); err != nil {
		return nil, nil, err
	}
	s.SetStartupValues(settings, nil)
	return settings, optErr, nil
}

// appendStartupParams appends the ParameterStatus set a client gets at
// login: the server's values, overridden by the client's own.
func (s *Session) AppendStartupParams(buf []byte, srv map[string]string) []byte {
	vals := s.params.Values()
	var lk [64]byte
	for k, v := range srv {
		if cv, ok := vals[string(appendLower(lk[:0], k))]; ok { // the lookup copies nothing
			v = cv
		}
		buf = wire.AppendParameterStatus(buf, k, v)
	}
	for k, v := range vals {
		if canon, ok := backend.ReportedNames[k]; ok && !serverReports(srv, canon, k) {
			buf = wire.AppendParameterStatus(buf, canon, v)
		}
	}
	return buf
}

// appendLower appends k in lower case (ASCII, as backend.Lower) to b.
func appendLower(b []byte, k string) []byte {
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

// serverReports reports whether srv has the parameter lower (spelled canon
// by PostgreSQL, which is how a server reports it; any spelling counts).
// A login asks it for each of the client's few reported parameters: no map
// of the server's names is built for that.
func serverReports(srv map[string]string, canon, lower string) bool {
	if _, ok := srv[canon]; ok {
		return true
	}
	for k := range srv {
		if backend.Lower(k) == lower {
			return true
		}
	}
	return false
}

// insertBeforeReady puts messages into the client's output before the
// ReadyForQuery that ends it, or after everything when it does not end with
// one.
func (s *Session) insertBeforeReady(msgs []byte) {
	if len(msgs) == 0 {
		return
	}
	if n := len(s.cout); n >= 6 && s.cout[n-6] == 'Z' {
		rfq := append([]byte(nil), s.cout[n-6:]...)
		s.cout = append(append(s.cout[:n-6], msgs...), rfq...)
		return
	}
	s.cout = append(s.cout, msgs...)
}

// trackSets notes statements that may change the session's settings, so
// the relay reads them back once the statement's transaction is over.
// SET LOCAL ends with its transaction.
func (s *Session) trackSets(f *rewrite.Findings) {
	if len(f.Sets) == 0 && !hasSetConfig(f) {
		return
	}
	for _, c := range f.Sets {
		if c.Local {
			continue
		}
		s.setsPending = true
		if c.Name != "" {
			x := s.more()
			x.setNames = append(x.setNames, c.Name)
		}
	}
	for _, c := range f.State {
		switch {
		case c.Kind == rewrite.SetConfig:
			s.setsPending = true
			if c.Name != "" {
				x := s.more()
				x.setNames = append(x.setNames, c.Name)
			}
		case c.Kind == rewrite.Discard && c.Name == "all":
			// DISCARD ALL is RESET ALL and DEALLOCATE ALL too.
			s.setsPending, s.dropPrepared = true, true
		case c.Kind == rewrite.Deallocate && c.Name == "*":
			s.setsPending, s.dropPrepared = true, true
		}
	}
}

func hasSetConfig(f *rewrite.Findings) bool {
	for _, c := range f.State {
		if c.Kind == rewrite.SetConfig || c.Kind == rewrite.Discard || c.Kind == rewrite.Deallocate {
			return true
		}
	}
	return false
}

// setStartupValues makes the session's parameters (and what RESET ALL
// returns to) the settings of seq applied in order, so a later setting of a
// parameter wins; values, when not nil, are the server's spelling of each.
func (ss *Session) SetStartupValues(seq []startupparam.Param, values []string) {
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
	ss.params.SetStartup(eff)
}

// syncParams makes the server connection's parameters match the client's
// before the client's first statement on it (backend.Sync). It returns
// ParameterStatus messages the client must see.
func (s *Session) syncParams(sc *pool.Conn, st *backend.State) ([]byte, error) {
	if st.Synced == s.params.Fingerprint() {
		return nil, nil // the usual case: checked without making a Relay
	}
	return backend.Sync(sc, st, &s.params, s.relayNotifications)
}

// readBackSettings makes the client's parameters what its session holds
// once a transaction that may have changed them is over (backend.ReadBack),
// and tells the client of the reported ones that changed.
func (s *Session) readBackSettings(sc *pool.Conn, st *backend.State, names []string) error {
	if st == nil {
		return nil
	}
	discarded := s.discarded
	s.discarded = false
	ps, err := backend.ReadBack(sc, st, &s.params, names, discarded, s.relayNotifications)
	if err != nil {
		return err
	}
	s.insertBeforeReady(ps)
	return nil
}
