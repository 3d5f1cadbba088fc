package backend

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/lockpool/lockpool/internal/pgerr"
	"github.com/lockpool/lockpool/internal/wire"
)

var stmtSeed = maphash.MakeSeed()

// ServerStmtName names the server statement of a Parse body (query and
// parameter types) in a statement epoch: DDL and stale-plan errors start a
// new epoch, so a statement parsed after them is prepared afresh.
func ServerStmtName(parseRest []byte, epoch uint64) string {
	h := maphash.Bytes(stmtSeed, parseRest) ^ epoch*0x9e3779b97f4a7c15
	var b [8]byte
	for i := range b {
		b[i] = byte(h >> (56 - 8*i))
	}
	return "lp_" + hex.EncodeToString(b[:])
}

// StmtCatalog is what a Server knows about server statements across
// sessions: the current epoch, and which statements PostgreSQL accepted
// for a database and user (their Parse cannot fail, so a client's Parse
// of them may be answered before a server connection is attached).
type StmtCatalog struct {
	epoch atomic.Uint64
	mu    sync.Mutex
	valid map[string]struct{} // database, user, server statement name
}

const stmtCatalogMax = 20000

func catalogKey(database, user, srvName string) string {
	return database + "\x00" + user + "\x00" + srvName
}

// Known reports whether PostgreSQL accepted srvName for database and user.
func (c *StmtCatalog) Known(database, user, srvName string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.valid[catalogKey(database, user, srvName)]
	return ok
}

// Accepted records that PostgreSQL accepted srvName.
func (c *StmtCatalog) Accepted(database, user, srvName string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.valid == nil || len(c.valid) >= stmtCatalogMax {
		c.valid = make(map[string]struct{})
	}
	c.valid[catalogKey(database, user, srvName)] = struct{}{}
}

// Retire starts a new epoch: statements parsed from now on get new server
// names, and nothing parsed before is known valid any more.
func (c *StmtCatalog) Retire() {
	c.epoch.Add(1)
	c.mu.Lock()
	c.valid = nil
	c.mu.Unlock()
}

// Epoch is the current statement epoch (ServerStmtName).
func (c *StmtCatalog) Epoch() uint64 { return c.epoch.Load() }

// ResultNoData is ResultTypeHash of NoData.
const ResultNoData = 2

// descSeed hashes RowDescriptions (ResultTypeHash): the hashes are kept
// in each connection's State and compared across sessions.
var descSeed = maphash.MakeSeed()

// ResultTypeHash hashes what a statement returns as PostgreSQL compares it
// for "cached plan must not change result type": the columns' names, types,
// sizes and modifiers, not the table they come from (which may differ
// between clients with different search_paths and is no change).
func ResultTypeHash(typ byte, body []byte) uint64 {
	if typ == 'n' || len(body) < 2 {
		return ResultNoData
	}
	var h maphash.Hash
	h.SetSeed(descSeed)
	n := int(binary.BigEndian.Uint16(body))
	p := body[2:]
	for i := 0; i < n; i++ {
		name, rest, ok := wire.CString(p)
		if !ok || len(rest) < 18 {
			break
		}
		_, _ = h.Write(name)
		_, _ = h.Write(rest[6:16]) // type OID, size, modifier (skipping table OID and column number)
		p = rest[18:]
	}
	return h.Sum64() | 1
}

// DroppedAll reports whether a CommandComplete body is that of DEALLOCATE
// ALL or DISCARD ALL: the server forgot every prepared statement.
func DroppedAll(body []byte) bool {
	return bytes.Equal(body, []byte("DEALLOCATE ALL\x00")) || bytes.Equal(body, []byte("DISCARD ALL\x00"))
}

// IsStalePlan reports whether an ErrorResponse says a prepared statement no
// longer matches its tables (PostgreSQL keeps failing it until it is
// prepared again).
func IsStalePlan(body []byte) bool {
	e := pgerr.FromBody(body)
	return e.Code == pgerr.FeatureNotSupported && strings.Contains(e.Message, "cached plan must not change result type")
}
