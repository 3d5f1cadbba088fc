package backend

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/pool"
	"github.com/lockpool/lockpool/proxy/startupparam"
)

// CheckStartup applies pairs with set_config on sc inside a transaction that
// it rolls back, after RESET ALL so that values that combine with the
// current one (DateStyle) combine with the defaults, not with what the last
// client left on the connection. An error means sc is unusable.
func CheckStartup(ctx context.Context, sc *pool.Conn, pairs []startupparam.Param) (*startupparam.Checked, *pgerr.Error, error) {
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
		q.WriteString("pg_catalog.set_config(" + SQLLiteral(p.Name) + ", " + SQLLiteral(p.Value) + ", true)")
	}
	q.WriteString("; ROLLBACK")
	if _, err := sc.Net.Write(wire.AppendQuery(nil, q.String())); err != nil {
		return nil, nil, err
	}
	st := StateOf(sc)
	e := &startupparam.Checked{}
	var verdict *pgerr.Error
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
			DataRowColumns(body, func(i int, v []byte, null bool) {
				if i == len(e.Values) && !null {
					e.Values = append(e.Values, string(v))
				}
			})
		case 'S':
			if k, rest, ok := wire.CString(body); ok {
				v, _, _ := wire.CString(rest)
				st.Params[Lower(string(k))] = string(v)
			}
		case 'Z':
			if len(body) > 0 {
				status = body[0]
			}
		}
	}
	if err := ReadUntilReady(sc, read); err != nil {
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
		if err := ReadUntilReady(sc, read); err != nil {
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
