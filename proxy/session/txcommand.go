package session

import (
	"unsafe"

	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/proxy/txcmd"
	"github.com/lockpool/lockpool/rewrite"
)

// changesSchema is rewrite.ChangesSchema on a message body (it aliases
// the body, and keeps nothing).
func changesSchema(sql []byte) bool {
	return rewrite.ChangesSchema(unsafe.String(unsafe.SliceData(sql), len(sql)))
}

// inLocalFailedTx answers a client whose transaction block failed before
// it reached a server (localTx 'E'), as PostgreSQL answers in a failed
// transaction: every statement but one that ends the block gets 25P02;
// ROLLBACK ends it, and so does COMMIT, which then reports ROLLBACK.
func (s *Session) inLocalFailedTx(typ byte, n int) error {
	switch typ {
	case 'X':
		return errSessionEnd
	case 'Q':
		if n <= s.r.Size() {
			body, err := s.r.Peek(n)
			if err != nil {
				return err
			}
			if len(body) == 0 || body[len(body)-1] != 0 {
				_ = s.discard(n)
				return wire.ProtocolErrorf("invalid Query message")
			}
			sql := body[:len(body)-1]
			if c := txcmd.Of(sql); c == txcmd.Exit || c == txcmd.Commit {
				if rewrite.CountStatements(string(sql)) > 1 {
					// ROLLBACK; and more: the server runs it all.
					s.localTx = 0
					return s.onQuery(n)
				}
				_ = s.discard(n)
				s.localTx = 0
				s.pushLocal(wire.AppendReadyForQuery(wire.AppendCommandComplete(nil, "ROLLBACK"), 'I'), nil)
				return nil
			}
		}
		if err := s.discard(n); err != nil {
			return err
		}
		s.pushLocal(wire.AppendReadyForQuery(appendError(nil, 'E', errAborted()), 'E'), nil)
		return nil
	case 'P':
		body, err := s.body(n)
		if err != nil {
			return err
		}
		_, rest, ok := wire.CString(body)
		query, _, ok2 := wire.CString(rest)
		if !ok || !ok2 {
			return wire.ProtocolErrorf("invalid Parse message")
		}
		c := txcmd.Of(query)
		if c == txcmd.Exit || c == txcmd.Commit {
			s.localExit = true
			s.pushLocal(msgParseComplete, nil)
			return nil
		}
	case 'B', 'D', 'E':
		if err := s.discard(n); err != nil {
			return err
		}
		if s.localExit {
			switch typ {
			case 'B':
				s.pushLocal(msgBindComplete, nil)
			case 'D':
				s.pushLocal(msgNoData, nil)
			case 'E':
				s.localExit = false
				s.localTx = 0
				s.pushLocal(wire.AppendCommandComplete(nil, "ROLLBACK"), nil)
			}
			return nil
		}
	case 'C':
		if err := s.discard(n); err != nil {
			return err
		}
		s.pushLocal(msgCloseComplete, nil)
		return nil
	case 'S':
		if err := s.discard(n); err != nil {
			return err
		}
		s.pos.skipping = false
		s.pushLocal(wire.AppendReadyForQuery(nil, s.status()), nil)
		return nil
	case 'H', 'd', 'c', 'f':
		return s.discard(n)
	case 'F':
		if err := s.discard(n); err != nil {
			return err
		}
		s.pushLocal(wire.AppendReadyForQuery(appendError(nil, 'E', errAborted()), 'E'), nil)
		return nil
	default:
		return wire.ProtocolErrorf("invalid frontend message type %d", typ)
	}
	// An extended-protocol message that does not end the block.
	s.pos.skipping = true
	s.pushLocal(appendError(nil, 'E', errAborted()), nil)
	return nil
}
