package txcmd

// Command is what the first statement of a query does to the transaction
// block, as far as lockpool needs to know.
type Command uint8

// The commands Of tells apart.
const (
	None   Command = iota
	Begin          // BEGIN, START TRANSACTION
	Exit           // ROLLBACK, ABORT (not ROLLBACK TO, ROLLBACK PREPARED)
	Commit         // COMMIT or END (not COMMIT PREPARED): the exit a client means to commit
)

// Of classifies the first statement of sql by its leading words.
func Of(sql []byte) Command {
	w, rest := NextWord(sql)
	switch {
	case WordIs(w, "begin"):
		return Begin
	case WordIs(w, "start"):
		if w2, _ := NextWord(rest); WordIs(w2, "transaction") {
			return Begin
		}
	case WordIs(w, "commit"), WordIs(w, "end"):
		if w2, _ := NextWord(rest); WordIs(w2, "prepared") {
			return None
		}
		return Commit
	case WordIs(w, "rollback"), WordIs(w, "abort"):
		w2, rest2 := NextWord(rest)
		if WordIs(w2, "to") || WordIs(w2, "prepared") {
			return None
		}
		if WordIs(w2, "work") || WordIs(w2, "transaction") {
			if w3, _ := NextWord(rest2); WordIs(w3, "to") {
				return None
			}
		}
		return Exit
	}
	return None
}

// NextWord skips blanks, comments and opening parentheses and returns the
// next run of letters and underscores and what follows it. The word is
// empty when something else comes first, and word and rest are nil when
// nothing does or a comment is unterminated.
func NextWord(b []byte) (word, rest []byte) {
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

// WordIs compares an ASCII word with a lower-case keyword, ignoring case.
func WordIs(w []byte, kw string) bool {
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
