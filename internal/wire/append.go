package wire

import "encoding/binary"

// Text is a string or a byte slice: appenders take names, SQL and tags as
// either, so views' fields and Go strings both go in without conversion.
type Text interface{ ~string | ~[]byte }

// AppendHeader appends a message header with a placeholder length and
// returns the offset of the message, for FinishMsg.
func AppendHeader(dst []byte, typ byte) ([]byte, int) {
	start := len(dst)
	return append(dst, typ, 0, 0, 0, 0), start
}

// FinishMsg patches the length word of the message that starts at start.
func FinishMsg(dst []byte, start int) []byte {
	binary.BigEndian.PutUint32(dst[start+1:], uint32(len(dst)-start-1))
	return dst
}

// AppendFrame appends one whole message from its type and body.
func AppendFrame(dst []byte, typ byte, body []byte) []byte {
	dst = append(dst, typ)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(body)+4))
	return append(dst, body...)
}

// AppendEmpty appends a message with no body: ParseComplete '1',
// BindComplete '2', CloseComplete '3', NoData 'n', EmptyQueryResponse 'I',
// Sync 'S', Flush 'H', Terminate 'X', CopyDone 'c'.
func AppendEmpty(dst []byte, typ byte) []byte { return append(dst, typ, 0, 0, 0, 4) }

// AppendSync appends Sync.
func AppendSync(dst []byte) []byte { return AppendEmpty(dst, 'S') }

// AppendFlush appends Flush.
func AppendFlush(dst []byte) []byte { return AppendEmpty(dst, 'H') }

// AppendCString appends s and its terminating NUL. s must hold no NUL.
func AppendCString[T Text](dst []byte, s T) []byte {
	dst = append(dst, s...)
	return append(dst, 0)
}

// AppendQuery appends a simple Query.
func AppendQuery[T Text](dst []byte, sql T) []byte {
	dst, start := AppendHeader(dst, 'Q')
	dst = AppendCString(dst, sql)
	return FinishMsg(dst, start)
}

// AppendParse appends a Parse of statement name with the given parameter
// type OIDs (nil: none declared).
func AppendParse[N, Q Text](dst []byte, name N, sql Q, paramOIDs []uint32) []byte {
	dst, start := AppendHeader(dst, 'P')
	dst = AppendCString(dst, name)
	dst = AppendCString(dst, sql)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(paramOIDs)))
	for _, oid := range paramOIDs {
		dst = binary.BigEndian.AppendUint32(dst, oid)
	}
	return FinishMsg(dst, start)
}

// AppendParseOIDs appends a Parse whose parameter types come from a view
// (Parse.ParamOIDs): the way to send a client's Parse under another name.
func AppendParseOIDs[N, Q Text](dst []byte, name N, sql Q, oids OIDs) []byte {
	dst, start := AppendHeader(dst, 'P')
	dst = AppendCString(dst, name)
	dst = AppendCString(dst, sql)
	dst = binary.BigEndian.AppendUint16(dst, uint16(oids.Len()))
	dst = append(dst, oids.raw...)
	return FinishMsg(dst, start)
}

// AppendBind appends a Bind of portal to statement stmt; tail is the rest
// of the body (parameter formats, parameters, result formats) as in
// Bind.Tail or from BindArgs.AppendTail.
func AppendBind[P, S Text](dst []byte, portal P, stmt S, tail []byte) []byte {
	dst, start := AppendHeader(dst, 'B')
	dst = AppendCString(dst, portal)
	dst = AppendCString(dst, stmt)
	dst = append(dst, tail...)
	return FinishMsg(dst, start)
}

// noArgs is the Bind tail of no parameters and no result formats.
var noArgs = [6]byte{}

// AppendBindExecute appends a Bind of the unnamed portal to statement stmt
// with no parameters (text results), then an Execute of it for all rows.
func AppendBindExecute[S Text](dst []byte, stmt S) []byte {
	dst = AppendBind(dst, "", stmt, noArgs[:])
	return AppendExecute(dst, "", 0)
}

// AppendDescribe appends a Describe of a statement (kind 'S') or a portal
// ('P').
func AppendDescribe[N Text](dst []byte, kind byte, name N) []byte {
	dst, start := AppendHeader(dst, 'D')
	dst = append(dst, kind)
	dst = AppendCString(dst, name)
	return FinishMsg(dst, start)
}

// AppendClose appends a Close of a statement (kind 'S') or a portal ('P').
func AppendClose[N Text](dst []byte, kind byte, name N) []byte {
	dst, start := AppendHeader(dst, 'C')
	dst = append(dst, kind)
	dst = AppendCString(dst, name)
	return FinishMsg(dst, start)
}

// AppendExecute appends an Execute of portal; maxRows 0 means all rows.
func AppendExecute[P Text](dst []byte, portal P, maxRows uint32) []byte {
	dst, start := AppendHeader(dst, 'E')
	dst = AppendCString(dst, portal)
	dst = binary.BigEndian.AppendUint32(dst, maxRows)
	return FinishMsg(dst, start)
}

// AppendReadyForQuery appends ReadyForQuery with a transaction status:
// 'I' idle, 'T' in a transaction block, 'E' in a failed one.
func AppendReadyForQuery(dst []byte, status byte) []byte {
	return append(dst, 'Z', 0, 0, 0, 5, status)
}

// AppendParameterStatus appends ParameterStatus.
func AppendParameterStatus[N, V Text](dst []byte, name N, value V) []byte {
	dst, start := AppendHeader(dst, 'S')
	dst = AppendCString(dst, name)
	dst = AppendCString(dst, value)
	return FinishMsg(dst, start)
}

// AppendCommandComplete appends CommandComplete with a tag ("SELECT 1").
func AppendCommandComplete[T Text](dst []byte, tag T) []byte {
	dst, start := AppendHeader(dst, 'C')
	dst = AppendCString(dst, tag)
	return FinishMsg(dst, start)
}

// AppendParameterDescription appends ParameterDescription.
func AppendParameterDescription(dst []byte, oids []uint32) []byte {
	dst, start := AppendHeader(dst, 't')
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(oids)))
	for _, oid := range oids {
		dst = binary.BigEndian.AppendUint32(dst, oid)
	}
	return FinishMsg(dst, start)
}

// Field is one column of a RowDescription.
type Field struct {
	Name     string
	TableOID uint32 // 0: not a table column
	Column   int16  // attribute number, 0: not a table column
	TypeOID  uint32
	TypeSize int16 // negative: variable width
	TypeMod  int32 // -1: none
	Format   int16 // 0 text, 1 binary
}

// AppendRowDescription appends RowDescription of fields.
func AppendRowDescription(dst []byte, fields ...Field) []byte {
	dst, start := AppendHeader(dst, 'T')
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(fields)))
	for i := range fields {
		f := &fields[i]
		dst = AppendCString(dst, f.Name)
		dst = binary.BigEndian.AppendUint32(dst, f.TableOID)
		dst = binary.BigEndian.AppendUint16(dst, uint16(f.Column))
		dst = binary.BigEndian.AppendUint32(dst, f.TypeOID)
		dst = binary.BigEndian.AppendUint16(dst, uint16(f.TypeSize))
		dst = binary.BigEndian.AppendUint32(dst, uint32(f.TypeMod))
		dst = binary.BigEndian.AppendUint16(dst, uint16(f.Format))
	}
	return FinishMsg(dst, start)
}

// AppendDataRow appends a DataRow of cols (a nil column is NULL).
func AppendDataRow(dst []byte, cols ...[]byte) []byte {
	dst, start := StartDataRow(dst, len(cols))
	for _, c := range cols {
		dst = AppendColumn(dst, c)
	}
	return FinishMsg(dst, start)
}

// StartDataRow starts a DataRow of ncols columns, to be appended with
// AppendColumn, AppendNull or StartColumn/FinishColumn and finished with
// FinishMsg(dst, start).
func StartDataRow(dst []byte, ncols int) (_ []byte, start int) {
	dst, start = AppendHeader(dst, 'D')
	return binary.BigEndian.AppendUint16(dst, uint16(ncols)), start
}

// AppendColumn appends one DataRow column; nil is NULL.
func AppendColumn(dst []byte, v []byte) []byte {
	if v == nil {
		return AppendNull(dst)
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(v)))
	return append(dst, v...)
}

// AppendNull appends a NULL DataRow column.
func AppendNull(dst []byte) []byte { return append(dst, 0xff, 0xff, 0xff, 0xff) }

// StartColumn starts a DataRow column whose value the caller appends in
// place (strconv.AppendInt, say); FinishColumn(dst, at) then sets its length.
func StartColumn(dst []byte) (_ []byte, at int) {
	return append(dst, 0, 0, 0, 0), len(dst)
}

// FinishColumn patches the length of the column started at at.
func FinishColumn(dst []byte, at int) []byte {
	binary.BigEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	return dst
}
