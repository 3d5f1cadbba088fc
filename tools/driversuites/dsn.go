package main

import (
	"fmt"
	"net"
	"net/url"
	"strings"
)

// target is a connection target: the five settings the suites take.
type target struct {
	host, port, user, password, database string
}

// parseDSN reads a postgres:// (or postgresql://) URL or libpq key=value
// pairs (values may be single-quoted, with \' and \\ escapes). Settings
// other than host, port, user, password and dbname are ignored; host and
// port default to 127.0.0.1 and 5432, the database to the user.
func parseDSN(s string) (target, error) {
	t := target{host: "127.0.0.1", port: "5432"}
	var kv map[string]string
	if strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://") {
		u, err := url.Parse(s)
		if err != nil {
			return t, err
		}
		kv = map[string]string{"host": u.Hostname(), "port": u.Port(), "dbname": strings.TrimPrefix(u.Path, "/")}
		if u.User != nil {
			kv["user"] = u.User.Username()
			kv["password"], _ = u.User.Password()
		}
	} else {
		var err error
		if kv, err = parseKeyValues(s); err != nil {
			return t, err
		}
	}
	for k, p := range map[string]*string{"host": &t.host, "port": &t.port, "user": &t.user, "password": &t.password, "dbname": &t.database} {
		if v := kv[k]; v != "" {
			*p = v
		}
	}
	if t.user == "" {
		return t, fmt.Errorf("no user")
	}
	if t.database == "" {
		t.database = t.user
	}
	return t, nil
}

// parseKeyValues splits libpq's key=value form.
func parseKeyValues(s string) (map[string]string, error) {
	kv := map[string]string{}
	for {
		s = strings.TrimLeft(s, " \t\n")
		if s == "" {
			return kv, nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 {
			return nil, fmt.Errorf("expected key=value at %q", s)
		}
		key := strings.TrimSpace(s[:eq])
		s = strings.TrimLeft(s[eq+1:], " \t\n")
		var val strings.Builder
		if strings.HasPrefix(s, "'") {
			i, closed := 1, false
			for ; i < len(s); i++ {
				if s[i] == '\\' && i+1 < len(s) {
					i++
					val.WriteByte(s[i])
				} else if s[i] == '\'' {
					closed = true
					break
				} else {
					val.WriteByte(s[i])
				}
			}
			if !closed {
				return nil, fmt.Errorf("unterminated quoted value of %s", key)
			}
			s = s[i+1:]
		} else {
			end := strings.IndexAny(s, " \t\n")
			if end < 0 {
				end = len(s)
			}
			val.WriteString(s[:end])
			s = s[end:]
		}
		kv[key] = val.String()
	}
}

// libpqEnv is the target as libpq's environment variables, without TLS.
func (t target) libpqEnv() []string {
	return []string{"PGHOST=" + t.host, "PGPORT=" + t.port, "PGUSER=" + t.user, "PGPASSWORD=" + t.password,
		"PGDATABASE=" + t.database, "PGSSLMODE=disable"}
}

// url is the target as a postgres:// URL with sslmode=disable.
func (t target) url() string {
	u := url.URL{Scheme: "postgres", User: url.UserPassword(t.user, t.password), Host: net.JoinHostPort(t.host, t.port),
		Path: "/" + t.database, RawQuery: "sslmode=disable"}
	return u.String()
}
