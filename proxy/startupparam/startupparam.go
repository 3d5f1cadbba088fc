package startupparam

import (
	"bytes"

	"github.com/lockpool/lockpool/internal/pgerr"
)

// Param is one setting a client asked for at login ("name=value" in the
// startup packet or a switch of its options parameter), spelled as the
// client spelled it: PostgreSQL's error messages quote it that way.
type Param struct {
	Name, Value string
}

// CanonicalName is the key a parameter has among a session's values: lower
// case (PostgreSQL compares parameter names case-insensitively), old
// aliases replaced by the parameter PostgreSQL still accepts them for
// (guc.c map_old_guc_names).
func CanonicalName(name string) string {
	n := lower(name)
	switch n {
	case "sort_mem":
		return "work_mem"
	case "vacuum_mem":
		return "maintenance_work_mem"
	}
	return n
}

// wellKnown reports whether the canonical name n is one of the standard
// parameters that clients and drivers send at login. When PostgreSQL cannot
// be asked at login, a login that sets only these is accepted and its
// values are checked when the first statement applies them (an invalid
// value then fails that statement).
func wellKnown(n string) bool {
	switch n {
	case "application_name",
		"client_encoding",
		"datestyle",
		"timezone",
		"search_path",
		"extra_float_digits",
		"intervalstyle",
		"standard_conforming_strings",
		"statement_timeout",
		"lock_timeout",
		"idle_in_transaction_session_timeout",
		"default_transaction_isolation":
		return true
	}
	return false
}

// unsupported reports whether the canonical name n cannot be set at login
// through lockpool: it changes who the session is, and a pooled server
// connection must not.
func unsupported(n string) bool {
	return n == "role" || n == "session_authorization"
}

// CheckUnsupported refuses the parameters lockpool cannot carry (role,
// session_authorization) with a 0A000 error naming the first one.
func CheckUnsupported(seq []Param) error {
	for _, p := range seq {
		if n := CanonicalName(p.Name); unsupported(n) {
			return &pgerr.Error{Code: "0A000", Message: "lockpool: parameter " + quoteForMsg(n) + " cannot be set at connection start through lockpool",
				Hint: "Remove it from the connection parameters; run SET " + n + " in the session instead (the session is then pinned)."}
		}
	}
	return nil
}

func quoteForMsg(s string) string { return `"` + s + `"` }

// NeedsCheck reports whether PostgreSQL has to see a setting to know
// whether it accepts it and how it spells the value. application_name never
// fails, and PostgreSQL keeps a short printable ASCII one as it is: it is
// the setting that most often differs between the clients of one
// application, so leaving it out keeps their sets alike.
func NeedsCheck(p Param) bool {
	if CanonicalName(p.Name) != "application_name" || len(p.Value) >= 64 {
		return true
	}
	for i := 0; i < len(p.Value); i++ {
		if c := p.Value[i]; c < 32 || c > 126 {
			return true
		}
	}
	return false
}

// LazilyCheckable reports whether every setting is a well-known parameter
// (application_name, client_encoding, DateStyle, TimeZone, search_path,
// extra_float_digits, IntervalStyle, standard_conforming_strings, the
// timeouts, default_transaction_isolation), so that a login with them may
// be accepted unchecked when no server connection can check them: the
// first statement applies them, and fails if a value is invalid.
func LazilyCheckable(seq []Param) bool {
	for _, p := range seq {
		if !wellKnown(CanonicalName(p.Name)) {
			return false
		}
	}
	return true
}

// ParseBool is PostgreSQL's parse_bool: a case-insensitive prefix of true,
// false, yes, no (at least "on"/"of" for on and off), or 1 and 0.
func ParseBool(v string) (val, ok bool) {
	lv := lower(v)
	prefixOf := func(word string, min int) bool {
		return len(lv) >= min && len(lv) <= len(word) && word[:len(lv)] == lv
	}
	switch {
	case lv == "":
		return false, false
	case prefixOf("true", 1), prefixOf("yes", 1), prefixOf("on", 2), lv == "1":
		return true, true
	case prefixOf("false", 1), prefixOf("no", 1), prefixOf("off", 2), lv == "0":
		return false, true
	}
	return false, false
}

// lower returns s in lower case (s itself when it has no ASCII capital).
func lower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			return string(bytes.ToLower([]byte(s)))
		}
	}
	return s
}
