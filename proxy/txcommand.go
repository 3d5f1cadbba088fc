package proxy

import (
	"unsafe"

	"github.com/lockpool/lockpool/internal/wire"
	"github.com/lockpool/lockpool/rewrite"
)

// txCommand is what the first statement of a query does to the transaction
// block, as far as lockpool needs to know.
type txCommand uint8

const (
	txNone   txCommand = iota
	txBegin            // BEGIN, START TRANSACTION
	txExit             // COMMIT, END, ROLLBACK, ABORT (not ROLLBACK TO / PREPARE TRANSACTION)
	txCommit           // COMMIT or END: the exit a client means to commit
)

// txCommandOf classifies the first statement of sql by its leading words.
func txCommandOf(sql []byte) txCommand {
	w, rest := nextWord(sql)
	switch {
	case wordIs(w, "begin"):
		return txBegin
	case wordIs(w, "start"):
		if w2, _ := nextWord(rest); wordIs(w2, "transaction") {
			return txBegin
		}
	case wordIs(w, "commit"), wordIs(w, "end"):
		if w2, _ := nextWord(rest); wordIs(w2, "prepared") {
			return txNone
		}
		return txCommit
	case wordIs(w, "rollback"), wordIs(w, "abort"):
		w2, rest2 := nextWord(rest)
		if wordIs(w2, "to") || wordIs(w2, "prepared") {
			return txNone
		}
		if wordIs(w2, "work") || wordIs(w2, "transaction") {
			if w3, _ := nextWord(rest2); wordIs(w3, "to") {
				return txNone
			}
		}
		return txExit
	}
	return txNone
}

// changesSchema is rewrite.ChangesSchema on a message body (it aliases
// the body, and keeps nothing).
func changesSchema(sql []byte) bool {
	return rewrite.ChangesSchema(unsafe.String(unsafe.SliceData(sql), len(sql)))
}

// nextWord skips blanks, comments and opening parentheses and returns the
// next run of letters and what follows it.
func nextWord(b []byte) (word, rest []byte) {
	i := 0
	for i < len(b) {
		switch c := b[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '(':
			i++
		case c == '-' && i+1 < len(b) && b[i+1] == '-':
			for i < len(b) && b[i] != '\n' {
				i++
			}
		case c == '/' && i+1 < len(b) && b[i+1] == '*':
			depth := 0
			for i+1 < len(b) {
				if b[i] == '/' && b[i+1] == '*' {
					depth++
					i += 2
				} else if b[i] == '*' && b[i+1] == '/' {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
			if depth > 0 {
				return nil, nil
			}
		default:
			j := i
			for j < len(b) && (b[j]|0x20 >= 'a' && b[j]|0x20 <= 'z' || b[j] == '_') {
				j++
			}
			return b[i:j], b[j:]
		}
	}
	return nil, nil
}

// wordIs compares an ASCII word with a lower-case keyword, ignoring case.
func wordIs(w []byte, kw string) bool {
	if len(w) != len(kw) {
		return false
	}
	for i := range w {
		if w[i]|0x20 != kw[i] {
			return false
		}
	}
	return true
}

// inLocalFailedTx answers a client whose transaction block failed before
// it reached a server (localTx 'E'), as PostgreSQL answers in a failed
// transaction: every statement but one that ends the block gets 25P02;
// ROLLBACK ends it, and so does COMMIT, which then reports ROLLBACK.
func (s *session) inLocalFailedTx(typ byte, n int) error {
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
			if c := txCommandOf(sql); c == txExit || c == txCommit {
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
		c := txCommandOf(query)
		if c == txExit || c == txCommit {
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
		s.skipping = false
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
	s.skipping = true
	s.pushLocal(appendError(nil, 'E', errAborted()), nil)
	return nil
}
