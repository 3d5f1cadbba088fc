package auth

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/bidi"
	"golang.org/x/text/unicode/norm"
)

// saslPrep normalizes a password like PostgreSQL's pg_saslprep (RFC 4013
// SASLprep / RFC 3454 stringprep) as used by scram_build_secret and libpq:
// pure-ASCII and invalid UTF-8 passwords are used as they are; otherwise the
// password is mapped (non-ASCII spaces to ' ', B.1 characters removed),
// NFKC-normalized, and if the result contains prohibited or unassigned code
// points or violates the bidi rules, the raw password is used instead.
//
// Deviation: "unassigned" is judged with Go's Unicode tables rather than
// Unicode 3.2, so a password with characters assigned after Unicode 3.2
// may be normalized where PostgreSQL would use it raw. This only matters
// when such a password also contains characters that NFKC changes.
func saslPrep(password string) string {
	ascii := true
	for i := 0; i < len(password); i++ {
		if password[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii || !utf8.ValidString(password) {
		return password
	}

	var b strings.Builder
	for _, r := range password {
		switch {
		case isNonASCIISpace(r):
			b.WriteByte(' ')
		case isMappedToNothing(r):
		default:
			b.WriteRune(r)
		}
	}
	out := norm.NFKC.String(b.String())
	if out == "" {
		return password
	}

	hasRandAL, hasL := false, false
	for _, r := range out {
		if isProhibited(r) || !isAssigned(r) {
			return password
		}
		switch bidiClass(r) {
		case bidi.R, bidi.AL:
			hasRandAL = true
		case bidi.L:
			hasL = true
		}
	}
	if hasRandAL {
		first, _ := utf8.DecodeRuneInString(out)
		last, _ := utf8.DecodeLastRuneInString(out)
		if hasL || !isRandAL(first) || !isRandAL(last) {
			return password
		}
	}
	return out
}

func bidiClass(r rune) bidi.Class {
	p, _ := bidi.LookupRune(r)
	return p.Class()
}

func isRandAL(r rune) bool {
	c := bidiClass(r)
	return c == bidi.R || c == bidi.AL
}

// isNonASCIISpace is RFC 3454 table C.1.2.
func isNonASCIISpace(r rune) bool {
	switch r {
	case 0x00A0, 0x1680, 0x202F, 0x205F, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200B
}

// isMappedToNothing is RFC 3454 table B.1.
func isMappedToNothing(r rune) bool {
	switch r {
	case 0x00AD, 0x034F, 0x1806, 0x180B, 0x180C, 0x180D, 0x200B, 0x200C, 0x200D, 0x2060, 0xFEFF:
		return true
	}
	return r >= 0xFE00 && r <= 0xFE0F
}

// isProhibited is RFC 4013 section 2.3: tables C.1.2, C.2.1, C.2.2, C.3,
// C.4, C.5, C.6, C.7, C.8 and C.9.
func isProhibited(r rune) bool {
	if isNonASCIISpace(r) {
		return true
	}
	switch {
	case r <= 0x1F, r == 0x7F: // C.2.1
		return true
	case r >= 0x80 && r <= 0x9F, r == 0x06DD, r == 0x070F, r == 0x180E,
		r == 0x200C, r == 0x200D, r == 0x2028, r == 0x2029,
		r >= 0x2060 && r <= 0x2063, r >= 0x206A && r <= 0x206F,
		r == 0xFEFF, r >= 0xFFF9 && r <= 0xFFFC, r >= 0x1D173 && r <= 0x1D17A: // C.2.2
		return true
	case r >= 0xE000 && r <= 0xF8FF, r >= 0xF0000 && r <= 0xFFFFD, r >= 0x100000 && r <= 0x10FFFD: // C.3
		return true
	case r >= 0xFDD0 && r <= 0xFDEF, r&0xFFFE == 0xFFFE: // C.4
		return true
	case r >= 0xD800 && r <= 0xDFFF: // C.5
		return true
	case r >= 0xFFF9 && r <= 0xFFFD: // C.6
		return true
	case r >= 0x2FF0 && r <= 0x2FFB: // C.7
		return true
	case r == 0x0340, r == 0x0341, r == 0x200E, r == 0x200F, r >= 0x202A && r <= 0x202E: // C.8
		return true
	case r == 0xE0001, r >= 0xE0020 && r <= 0xE007F: // C.9
		return true
	}
	return false
}

func isAssigned(r rune) bool {
	return unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z,
		unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs)
}
