package local

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"strconv"
	"time"

	"github.com/lockpool/lockpool/internal/wire"
)

// column is one result column of an answered statement.
type column struct {
	name string
	oid  uint32
	size int16
}

func formatFor(formats []int16, i int) int16 {
	switch len(formats) {
	case 0:
		return 0
	case 1:
		return formats[0]
	}
	if i < len(formats) {
		return formats[i]
	}
	return 0
}

func appendRowDescription(buf []byte, cols []column, formats []int16) []byte {
	buf, start := wire.AppendHeader(buf, 'T')
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(cols)))
	for i, c := range cols {
		buf = wire.AppendCString(buf, c.name)
		buf = binary.BigEndian.AppendUint32(buf, 0)
		buf = binary.BigEndian.AppendUint16(buf, 0)
		buf = binary.BigEndian.AppendUint32(buf, c.oid)
		buf = binary.BigEndian.AppendUint16(buf, uint16(c.size))
		buf = binary.BigEndian.AppendUint32(buf, 0xffffffff)
		buf = binary.BigEndian.AppendUint16(buf, uint16(formatFor(formats, i)))
	}
	return wire.FinishMsg(buf, start)
}

// pgEpoch is the zero of PostgreSQL's binary timestamps.
func pgEpoch() time.Time { return time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC) }

func appendDataRow(buf []byte, cols []column, row []any, formats []int16) []byte {
	buf, start := wire.AppendHeader(buf, 'D')
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(cols)))
	for i, v := range row {
		if v == nil {
			buf = binary.BigEndian.AppendUint32(buf, 0xffffffff)
			continue
		}
		bin := formatFor(formats, i) == 1
		var val []byte
		switch x := v.(type) {
		case string:
			val = []byte(x)
		case int64:
			if bin {
				val = binary.BigEndian.AppendUint64(nil, uint64(x))
			} else {
				val = strconv.AppendInt(nil, x, 10)
			}
		case bool:
			val = boolValue(bin, x)
		case time.Time:
			if bin {
				val = binary.BigEndian.AppendUint64(nil, uint64(x.Sub(pgEpoch()).Microseconds()))
			} else {
				val = []byte(x.UTC().Format("2006-01-02 15:04:05.999999") + "+00")
			}
		}
		buf = binary.BigEndian.AppendUint32(buf, uint32(len(val)))
		buf = append(buf, val...)
	}
	return wire.FinishMsg(buf, start)
}

// boolValue is a boolean column value as PostgreSQL sends it: one byte in
// binary format, t or f in text.
func boolValue(bin, v bool) []byte {
	switch {
	case bin && v:
		return []byte{1}
	case bin:
		return []byte{0}
	case v:
		return []byte{'t'}
	}
	return []byte{'f'}
}

// declaredTypes are the parameter types a Parse declares (rest: its query
// and types as on the wire; nil for a simple Query).
func declaredTypes(rest []byte) []uint32 {
	_, tail, ok := wire.CString(rest)
	if !ok || len(tail) < 2 {
		return nil
	}
	n := int(binary.BigEndian.Uint16(tail))
	tail = tail[2:]
	out := make([]uint32, 0, n)
	for i := 0; i < n && len(tail) >= 4; i++ {
		out = append(out, binary.BigEndian.Uint32(tail))
		tail = tail[4:]
	}
	return out
}

// decodeParam decodes one lease-call parameter.
func decodeParam(v []byte, format int16, oid uint32) (any, error) {
	if format == 0 {
		return string(v), nil
	}
	switch oid {
	case wire.OIDText, wire.OIDVarchar, wire.OIDUnknown:
		return string(v), nil
	case wire.OIDInt2:
		if len(v) == 2 {
			return float64(int16(binary.BigEndian.Uint16(v))), nil
		}
	case wire.OIDInt4:
		if len(v) == 4 {
			return float64(int32(binary.BigEndian.Uint32(v))), nil
		}
	case wire.OIDInt8:
		if len(v) == 8 {
			return float64(int64(binary.BigEndian.Uint64(v))), nil
		}
	case wire.OIDFloat4:
		if len(v) == 4 {
			return float64(math.Float32frombits(binary.BigEndian.Uint32(v))), nil
		}
	case wire.OIDFloat8:
		if len(v) == 8 {
			return math.Float64frombits(binary.BigEndian.Uint64(v)), nil
		}
	case wire.OIDNumeric:
		return decodeNumeric(v)
	}
	return nil, fmt.Errorf("unsupported binary parameter of type %d", oid)
}

// decodeNumeric decodes PostgreSQL's binary numeric.
func decodeNumeric(v []byte) (any, error) {
	if len(v) < 8 {
		return nil, errors.New("short numeric")
	}
	ndigits := int(binary.BigEndian.Uint16(v))
	weight := int(int16(binary.BigEndian.Uint16(v[2:])))
	sign := binary.BigEndian.Uint16(v[4:])
	if sign == 0xC000 {
		return nil, errors.New("NaN")
	}
	if len(v) < 8+2*ndigits {
		return nil, errors.New("short numeric")
	}
	r := new(big.Float)
	base := big.NewFloat(10000)
	for i := 0; i < ndigits; i++ {
		d := binary.BigEndian.Uint16(v[8+2*i:])
		r.Mul(r, base)
		r.Add(r, big.NewFloat(float64(d)))
	}
	exp := weight - (ndigits - 1)
	f, _ := r.Float64()
	f *= math.Pow(10000, float64(exp))
	if sign == 0x4000 {
		f = -f
	}
	return f, nil
}
