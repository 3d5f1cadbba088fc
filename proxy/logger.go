package proxy

import (
	"fmt"
	"io"
	"log/slog"
)

// NewLogger returns the logger lockpool writes to w: format "json" writes
// one JSON object per line (keys time, level, msg, then the line's
// attributes); any other format writes logfmt (key=value) lines. Lines less
// severe than level are dropped; a *slog.LevelVar lets a reload change it.
func NewLogger(w io.Writer, format string, level slog.Leveler) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// ParseLevel converts a log_level value (debug, info, warn, error).
func ParseLevel(s string) (slog.Level, error) {
	switch s {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown log level %q (debug, info, warn or error)", s)
}
