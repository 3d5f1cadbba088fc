package backend

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/pool"
)

// Sync makes the server connection's parameters match the client's
// before the client's first statement on it. It returns ParameterStatus
// messages the client must see (values the server spelled differently).
func Sync(sc *pool.Conn, st *State, p *ClientParams, relay Relay) ([]byte, error) {
	fp := p.Fingerprint()
	if st.Synced == fp {
		return nil, nil
	}
	var sets, setKeys, resets []string
	for k, want := range p.Values() {
		cur, ok := st.Params[k]
		if !ok || cur != want {
			sets = append(sets, "pg_catalog.set_config("+SQLLiteral(k)+", "+SQLLiteral(want)+", false)")
			setKeys = append(setKeys, k)
		}
	}
	for k, cur := range st.Params {
		if _, mine := p.Values()[k]; mine {
			continue
		}
		if def, ok := st.Defaults[k]; ok && def == cur {
			continue
		}
		resets = append(resets, k)
	}
	if len(sets) == 0 && len(resets) == 0 {
		st.Synced = fp
		return nil, nil
	}
	var q strings.Builder
	if len(sets) > 0 {
		q.WriteString("SELECT ")
		q.WriteString(strings.Join(sets, ", "))
		q.WriteString(";")
	}
	for _, k := range resets {
		if !ValidParamName(k) {
			continue
		}
		q.WriteString("RESET ")
		q.WriteString(QuoteGUC(k))
		q.WriteString(";")
	}
	_ = sc.Net.SetDeadline(time.Now().Add(10 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	if _, err := sc.Net.Write(wire.AppendQuery(nil, q.String())); err != nil {
		return nil, err
	}
	var perr *pgerr.Error
	var ps []byte
	err := ReadUntilReady(sc, relay.wrap(func(typ byte, body []byte) {
		switch typ {
		case 'E':
			if perr == nil {
				e := pgerr.FromBody(body)
				perr = &pgerr.Error{Code: e.Code, Message: "lockpool: cannot apply connection parameters: " + e.Message, Hint: "Check the parameters in the connection string."}
			}
		case 'D':
			// set_config returns each value as the server spells it: that is
			// the client's value from now on.
			DataRowColumns(body, func(i int, v []byte, null bool) {
				if i >= len(setKeys) || null {
					return
				}
				k, val := setKeys[i], string(v)
				st.Params[k] = val
				if p.Values()[k] != val {
					p.Set(k, val)
					if canon, ok := ReportedNames[k]; ok {
						ps = wire.AppendParameterStatus(ps, canon, val)
					}
				}
			})
		case 'S':
			k, rest, ok := wire.CString(body)
			if !ok {
				return
			}
			v, _, _ := wire.CString(rest)
			st.Params[Lower(string(k))] = string(v)
		}
	}))
	if err != nil {
		return nil, err
	}
	if perr != nil {
		return nil, perr
	}
	for _, k := range resets {
		if def, ok := st.Defaults[k]; ok {
			st.Params[k] = def
		} else {
			delete(st.Params, k)
		}
	}
	st.Synced = p.Fingerprint()
	return ps, nil
}

// ReadBack makes the client's parameters what its session holds
// once a transaction that may have changed them is over, whatever it did:
// committed, rolled back to a savepoint or as a whole, failed, RESET ALL.
// The server connection applied PostgreSQL's rules, so the values it holds
// are the client's. It reads every setting that may differ from the
// connection's defaults: those this transaction named (names), those the
// client holds, those the connection was known to hold, and the client's
// startup settings. After a DISCARD ALL that ran (discarded) the client's
// startup settings get their startup values back, as a RESET does on
// PostgreSQL, where they are the reset values. The connection's known state
// (st.Params) becomes exact, so nothing of this client reaches the next
// one. The client is sent a ParameterStatus for each reported parameter
// whose value differs from what it was last told. Runs on the relay with
// the session's connection to itself, at a safe point.
func ReadBack(sc *pool.Conn, st *State, p *ClientParams, names []string, discarded bool, relay Relay) ([]byte, error) {
	if st == nil {
		return nil, nil
	}
	_ = sc.Net.SetDeadline(time.Now().Add(5 * time.Second))
	defer sc.Net.SetDeadline(time.Time{})
	var read []string
	seen := map[string]bool{}
	add := func(n string) {
		if n != "" && !seen[n] && ValidParamName(n) {
			seen[n] = true
			read = append(read, n)
		}
	}
	for _, n := range names {
		add(n)
	}
	for n := range p.Values() {
		add(n)
	}
	for n := range p.startup {
		add(n)
	}
	for n, v := range st.Params {
		if def, ok := st.Defaults[n]; !ok || def != v {
			add(n)
		}
	}
	if len(read) == 0 {
		return nil, nil
	}
	sort.Strings(read)
	var q strings.Builder
	q.WriteString("SELECT ")
	for i, n := range read {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("pg_catalog.current_setting(" + SQLLiteral(n) + ", true)")
	}
	if _, err := sc.Net.Write(wire.AppendQuery(nil, q.String())); err != nil {
		return nil, err
	}
	held := make(map[string]string, len(read))
	var perr error
	err := ReadUntilReady(sc, relay.wrap(func(typ byte, body []byte) {
		switch typ {
		case 'E':
			perr = fmt.Errorf("%w: %s", ErrRefused, pgerr.FromBody(body).Message)
		case 'D':
			DataRowColumns(body, func(i int, v []byte, null bool) {
				if i < len(read) && !null {
					held[read[i]] = string(v)
				}
			})
		}
	}))
	if err != nil {
		return nil, err
	}
	if perr != nil {
		return nil, perr
	}
	told := p.Values() // what the client was told: its values, and the defaults it saw at login
	vals := make(map[string]string, len(held))
	for _, n := range read {
		delete(st.Params, n)
		if v, ok := held[n]; ok {
			st.Params[n] = v
			vals[n] = v
		}
	}
	if discarded {
		for k, v := range p.startup {
			vals[k] = v
		}
	}
	p.Replace(vals)
	st.Synced = ""
	if _, err := Sync(sc, st, p, relay); err != nil {
		return nil, err
	}
	var ps []byte
	now := p.Values()
	for k, canon := range ReportedNames {
		was, ok := told[k]
		if !ok {
			was, ok = st.Defaults[k]
		}
		v, has := now[k]
		if !has {
			v, has = st.Defaults[k]
		}
		if has && (!ok || was != v) {
			ps = wire.AppendParameterStatus(ps, canon, v)
		}
	}
	return ps, nil
}
