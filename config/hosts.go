package config

import (
	"net"
	"strconv"
	"strings"
)

// validateHosts checks server.hosts: every entry host:port (a socket
// directory as /dir:port), no entry twice, and not both hosts and host/port
// written. Host and Port become the first entry's.
func (p *parser) validateHosts(c *Config) {
	srv := p.sections["server"]
	if srv == nil {
		srv = &section{where: "server"}
	}
	s := &c.Server
	if s.HostList == "" {
		return
	}
	line := srv.lineOf("hosts")
	if srv.has("host") || srv.has("port") {
		p.errorf(line, "server.hosts and server.host/server.port are both set; list every host under hosts (host:port) and remove host and port")
		return
	}
	var hosts []HostAddr
	seen := map[HostAddr]bool{}
	for _, f := range strings.Split(s.HostList, ",") {
		f = strings.TrimSpace(f)
		h, err := parseHostAddr(f, s.Port)
		if err != "" {
			p.errorf(line, "server.hosts: %q: %s", f, err)
			continue
		}
		if seen[h] {
			p.errorf(line, "server.hosts: %s is listed twice", h)
			continue
		}
		seen[h] = true
		hosts = append(hosts, h)
	}
	if len(hosts) > 0 {
		s.Host, s.Port = hosts[0].Host, hosts[0].Port
	}
}

// parseHostAddr reads host:port ([v6]:port, /socket/dir:port); a missing
// port is defPort. It returns a reason when f is not one.
func parseHostAddr(f string, defPort int) (HostAddr, string) {
	if f == "" {
		return HostAddr{}, "an empty entry; write host:port"
	}
	if strings.HasPrefix(f, "/") {
		dir, port, ok := strings.Cut(f, ":")
		if !ok {
			return HostAddr{Host: dir, Port: defPort}, ""
		}
		n, err := strconv.Atoi(port)
		if err != nil || n < 1 || n > 65535 {
			return HostAddr{}, "the port must be a number from 1 to 65535"
		}
		return HostAddr{Host: dir, Port: n}, ""
	}
	host, port, err := net.SplitHostPort(f)
	if err != nil {
		if strings.Contains(err.Error(), "missing port") {
			return HostAddr{Host: strings.Trim(f, "[]"), Port: defPort}, ""
		}
		return HostAddr{}, "not host:port (" + err.Error() + ")"
	}
	n, perr := strconv.Atoi(port)
	if host == "" || perr != nil || n < 1 || n > 65535 {
		return HostAddr{}, "not host:port with a port from 1 to 65535"
	}
	return HostAddr{Host: host, Port: n}, ""
}
