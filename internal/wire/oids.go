package wire

// Type OIDs of PostgreSQL's built-in types, as RowDescription and
// ParameterDescription carry them, for the rows lockpool makes itself.
const (
	OIDBool        = 16
	OIDInt8        = 20
	OIDInt2        = 21
	OIDInt4        = 23
	OIDText        = 25
	OIDFloat4      = 700
	OIDFloat8      = 701
	OIDUnknown     = 705
	OIDVarchar     = 1043
	OIDTimestamptz = 1184
	OIDNumeric     = 1700
	OIDVoid        = 2278 // a function returning void (pg_advisory_lock)
)
