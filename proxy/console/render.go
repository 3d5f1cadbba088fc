package console

import (
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/lockpool/lockpool/internal/wire"
)

// consoleFields returns the RowDescription of a view's row type: a column
// per field, named by its json tag, typed by its Go type (strings and
// lists text, integers int8, floats float8, bools bool, times
// timestamptz).
func consoleFields(t reflect.Type) ([]wire.Field, []int) {
	var fields []wire.Field
	var index []int
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		oid, size := uint32(wire.OIDText), int16(-1)
		switch {
		case ft == reflect.TypeFor[time.Time]():
			oid, size = wire.OIDTimestamptz, 8
		case ft.Kind() == reflect.Bool:
			oid, size = wire.OIDBool, 1
		case ft.Kind() >= reflect.Int && ft.Kind() <= reflect.Uint64:
			oid, size = wire.OIDInt8, 8
		case ft.Kind() == reflect.Float64 || ft.Kind() == reflect.Float32:
			oid, size = wire.OIDFloat8, 8
		}
		fields = append(fields, wire.Field{Name: name, TypeOID: oid, TypeSize: size, TypeMod: -1})
		index = append(index, i)
	}
	return fields, index
}

// appendRows appends the RowDescription and a DataRow per element of rows
// (a slice of a view's row type) and returns how many rows it wrote.
func appendRows(buf []byte, rows any) ([]byte, int) {
	v := reflect.ValueOf(rows)
	fields, index := consoleFields(v.Type().Elem())
	buf = wire.AppendRowDescription(buf, fields...)
	var cell []byte
	for i := 0; i < v.Len(); i++ {
		row := v.Index(i)
		var start int
		buf, start = wire.StartDataRow(buf, len(index))
		for _, fi := range index {
			var null bool
			cell, null = appendCell(cell[:0], row.Field(fi))
			if null {
				buf = wire.AppendNull(buf)
			} else {
				buf = wire.AppendColumn(buf, cell)
			}
		}
		buf = wire.FinishMsg(buf, start)
	}
	return buf, v.Len()
}

// appendCell appends v in PostgreSQL's text format; null reports NULL (a
// nil pointer or a zero time).
func appendCell(dst []byte, v reflect.Value) (_ []byte, null bool) {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return dst, true
		}
		v = v.Elem()
	}
	if v.Type() == reflect.TypeFor[time.Time]() {
		t := v.Interface().(time.Time)
		if t.IsZero() {
			return dst, true
		}
		return t.UTC().AppendFormat(dst, "2006-01-02 15:04:05.999999-07"), false
	}
	switch v.Kind() {
	case reflect.String:
		return append(dst, v.String()...), false
	case reflect.Bool:
		if v.Bool() {
			return append(dst, 't'), false
		}
		return append(dst, 'f'), false
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.AppendInt(dst, v.Int(), 10), false
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.AppendUint(dst, v.Uint(), 10), false
	case reflect.Float32, reflect.Float64:
		return strconv.AppendFloat(dst, v.Float(), 'f', -1, 64), false
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			if i > 0 {
				dst = append(dst, ", "...)
			}
			dst, _ = appendCell(dst, v.Index(i))
		}
		return dst, false
	}
	return dst, true
}
