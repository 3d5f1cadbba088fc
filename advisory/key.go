package advisory

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Mode is an advisory lock's mode.
type Mode uint8

// The two advisory lock modes.
const (
	Exclusive Mode = iota
	Shared
)

// String returns "exclusive" or "shared".
func (m Mode) String() string {
	if m == Shared {
		return "shared"
	}
	return "exclusive"
}

// lockName is PostgreSQL's name of the lock mode, as in its WARNING.
func (m Mode) lockName() string {
	if m == Shared {
		return "ShareLock"
	}
	return "ExclusiveLock"
}

// conflicts reports whether a hold in mode a by one session conflicts with
// a request in mode b by another.
func conflicts(a, b Mode) bool { return a == Exclusive || b == Exclusive }

// Key is an advisory lock key: one bigint, or two integers (a separate key
// space in PostgreSQL, as pg_locks' objsubid 1 and 2 tell).
type Key struct {
	Two  bool
	A, B int64 // one key: A; two keys: A and B (each an int4 value)
}

// OneKey returns the key of pg_advisory_lock(bigint).
func OneKey(k int64) Key { return Key{A: k} }

// TwoKeys returns the key of pg_advisory_lock(int, int).
func TwoKeys(a, b int32) Key { return Key{Two: true, A: int64(a), B: int64(b)} }

// String is "42" for one key and "1,2" for two.
func (k Key) String() string {
	if k.Two {
		return strconv.FormatInt(k.A, 10) + "," + strconv.FormatInt(k.B, 10)
	}
	return strconv.FormatInt(k.A, 10)
}

// MarshalJSON writes [42] for one key and [1,2] for two.
func (k Key) MarshalJSON() ([]byte, error) {
	if k.Two {
		return json.Marshal([]int64{k.A, k.B})
	}
	return json.Marshal([]int64{k.A})
}

// args renders the key as SQL arguments of the advisory functions.
func (k Key) args() string {
	if k.Two {
		return strconv.FormatInt(k.A, 10) + "::pg_catalog.int4, " + strconv.FormatInt(k.B, 10) + "::pg_catalog.int4"
	}
	return strconv.FormatInt(k.A, 10) + "::pg_catalog.int8"
}

// ClassObj returns the key as pg_locks shows it: classid, objid and
// objsubid (1 for one key, 2 for two).
func (k Key) ClassObj() (classid, objid uint32, objsubid int) {
	if k.Two {
		return uint32(int32(k.A)), uint32(int32(k.B)), 2
	}
	return uint32(uint64(k.A) >> 32), uint32(uint64(k.A)), 1
}

// LiteralKey returns the key for key arguments that are all plain decimal
// integer literals (an optional minus sign and digits) in range: one bigint,
// or two integers. Anything else is for PostgreSQL to evaluate
// (Session.EvalKeys).
func LiteralKey(exprs []string) (Key, bool) {
	parse := func(s string, bits int) (int64, bool) {
		s = strings.TrimSpace(s)
		if s == "" {
			return 0, false
		}
		d := s
		if d[0] == '-' {
			d = strings.TrimSpace(d[1:])
		}
		if d == "" {
			return 0, false
		}
		for i := 0; i < len(d); i++ {
			if d[i] < '0' || d[i] > '9' {
				return 0, false
			}
		}
		if s[0] == '-' {
			d = "-" + d
		}
		v, err := strconv.ParseInt(d, 10, bits)
		return v, err == nil
	}
	switch len(exprs) {
	case 1:
		// An int4 literal and an int8 literal both mean the bigint key.
		if v, ok := parse(exprs[0], 64); ok {
			return OneKey(v), true
		}
	case 2:
		a, ok1 := parse(exprs[0], 32)
		b, ok2 := parse(exprs[1], 32)
		if ok1 && ok2 {
			return TwoKeys(int32(a), int32(b)), true
		}
	}
	return Key{}, false
}

// ParamKey returns the key for key arguments that are each exactly one
// parameter ($n) whose value PostgreSQL would read as the integer it plainly
// is: a non-NULL int8, int4 or int2 (text digits, or binary of that size)
// where the advisory function's argument type is expected. Anything else is
// for PostgreSQL to evaluate (Session.EvalKeys).
func ParamKey(exprs []string, p Params) (Key, bool) {
	var v [2]int64
	if len(exprs) < 1 || len(exprs) > 2 {
		return Key{}, false
	}
	bits := 64
	if len(exprs) == 2 {
		bits = 32
	}
	for i, e := range exprs {
		e = strings.TrimSpace(e)
		if len(e) < 2 || e[0] != '$' {
			return Key{}, false
		}
		n, err := strconv.Atoi(e[1:])
		if err != nil || n < 1 || n > len(p.Values) || n > len(p.OIDs) || p.Values[n-1] == nil {
			return Key{}, false
		}
		val, oid := p.Values[n-1], p.OIDs[n-1]
		format := int16(0)
		if n-1 < len(p.Formats) {
			format = p.Formats[n-1]
		}
		size := map[uint32]int{20: 8, 23: 4, 21: 2}[oid]
		if size == 0 || size == 8 && bits == 32 {
			return Key{}, false
		}
		if format == 1 {
			if len(val) != size {
				return Key{}, false
			}
			var x uint64
			for _, b := range val {
				x = x<<8 | uint64(b)
			}
			switch size {
			case 8:
				v[i] = int64(x)
			case 4:
				v[i] = int64(int32(uint32(x)))
			case 2:
				v[i] = int64(int16(uint16(x)))
			}
			continue
		}
		x, err := strconv.ParseInt(string(val), 10, size*8)
		if err != nil {
			return Key{}, false
		}
		v[i] = x
	}
	if len(exprs) == 2 {
		return TwoKeys(int32(v[0]), int32(v[1])), true
	}
	return OneKey(v[0]), true
}
