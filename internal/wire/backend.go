package wire

import (
	"encoding/binary"
	"iter"
)

// ParseReadyForQuery parses a ReadyForQuery body: the transaction status,
// 'I' idle, 'T' in a transaction block or 'E' in a failed one.
func ParseReadyForQuery(body []byte) (status byte, err error) {
	if len(body) != 1 {
		return 0, malformed("ReadyForQuery", "body is not one byte")
	}
	switch body[0] {
	case 'I', 'T', 'E':
		return body[0], nil
	}
	return 0, malformed("ReadyForQuery", "unknown transaction status")
}

// ParseParameterStatus parses a ParameterStatus body.
func ParseParameterStatus(body []byte) (name, value []byte, err error) {
	name, rest, ok := CString(body)
	if !ok {
		return nil, nil, malformed("ParameterStatus", "missing NUL after the name")
	}
	value, rest, ok = CString(rest)
	if !ok {
		return nil, nil, malformed("ParameterStatus", "missing NUL after the value")
	}
	if len(rest) > 0 {
		return nil, nil, malformed("ParameterStatus", "data after the value")
	}
	return name, value, nil
}

// ParseCommandComplete parses a CommandComplete body: its tag ("SELECT 1").
func ParseCommandComplete(body []byte) (tag []byte, err error) {
	tag, rest, ok := CString(body)
	if !ok {
		return nil, malformed("CommandComplete", "missing NUL after the tag")
	}
	if len(rest) > 0 {
		return nil, malformed("CommandComplete", "data after the tag")
	}
	return tag, nil
}

// Fields is a view of the fields of an ErrorResponse or NoticeResponse
// body: one-byte codes ('S', 'V', 'C', 'M', 'D', 'H', ...) with string
// values. (pgerr.FromBody decodes one into an error value.)
type Fields struct{ raw []byte }

// ParseFields parses an ErrorResponse or NoticeResponse body.
func ParseFields(body []byte) (Fields, error) {
	b := body
	for {
		if len(b) == 0 {
			return Fields{}, malformed("ErrorResponse", "missing terminator")
		}
		if b[0] == 0 {
			break
		}
		_, rest, ok := CString(b[1:])
		if !ok {
			return Fields{}, malformed("ErrorResponse", "missing NUL after a field")
		}
		b = rest
	}
	if len(b) != 1 {
		return Fields{}, malformed("ErrorResponse", "data after the terminator")
	}
	return Fields{raw: body}, nil
}

// All yields each field's code and value in order.
func (f Fields) All() iter.Seq2[byte, []byte] {
	return func(yield func(byte, []byte) bool) {
		b := f.raw
		for len(b) > 0 && b[0] != 0 {
			v, rest, ok := CString(b[1:])
			if !ok || !yield(b[0], v) {
				return
			}
			b = rest
		}
	}
}

// Get returns the value of the first field with code, or nil.
func (f Fields) Get(code byte) []byte {
	for c, v := range f.All() {
		if c == code {
			return v
		}
	}
	return nil
}

// DataRow is a view of a DataRow body.
type DataRow struct {
	n   int
	raw []byte // the columns, after the count
}

// ParseDataRow parses a DataRow body, checking every column length.
func ParseDataRow(body []byte) (DataRow, error) {
	if len(body) < 2 {
		return DataRow{}, malformed("DataRow", "missing column count")
	}
	n := int(binary.BigEndian.Uint16(body))
	b := body[2:]
	for range n {
		if len(b) < 4 {
			return DataRow{}, malformed("DataRow", "truncated column length")
		}
		l := int32(binary.BigEndian.Uint32(b))
		b = b[4:]
		if l == -1 {
			continue
		}
		if l < 0 || int64(len(b)) < int64(l) {
			return DataRow{}, malformed("DataRow", "truncated column value")
		}
		b = b[l:]
	}
	if len(b) > 0 {
		return DataRow{}, malformed("DataRow", "data after the last column")
	}
	return DataRow{n: n, raw: body[2:]}, nil
}

// Len is the number of columns.
func (d DataRow) Len() int { return d.n }

// All yields each column's index and value; a NULL column's value is nil,
// an empty one's is not.
func (d DataRow) All() iter.Seq2[int, []byte] {
	return func(yield func(int, []byte) bool) {
		b := d.raw
		for i := 0; i < d.n && len(b) >= 4; i++ {
			l := int32(binary.BigEndian.Uint32(b))
			b = b[4:]
			var v []byte
			if l >= 0 {
				if int64(len(b)) < int64(l) {
					return
				}
				v, b = b[:l:l], b[l:]
			}
			if !yield(i, v) {
				return
			}
		}
	}
}

// Col returns column i (nil for NULL); ok is false when i is out of range.
func (d DataRow) Col(i int) (v []byte, ok bool) {
	for j, c := range d.All() {
		if j == i {
			return c, true
		}
	}
	return nil, false
}
