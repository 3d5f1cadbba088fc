package config

import (
	"slices"
	"testing"
)

// TestAdminUsersList: admin_users takes a YAML list as well as a
// comma-separated string.
func TestAdminUsersList(t *testing.T) {
	const base = "users: [{name: ops, password: pw}, {name: alice, password: pw}]\napplications: [{name: api, user: ops}]\n"
	for _, tc := range []struct {
		name, in string
		want     []string
		err      string
	}{
		{name: "string", in: "admin_users: ops, alice\n", want: []string{"ops", "alice"}},
		{name: "flow list", in: "admin_users: [ops, alice]\n", want: []string{"ops", "alice"}},
		{name: "block list", in: "admin_users:\n  - ops\n  - ${ADMIN}\n", want: []string{"ops", "alice"}},
		{name: "empty list", in: "admin_users: []\n", want: nil},
		{name: "unknown user in list", in: "admin_users: [ops, bob]\n",
			err: `a.yaml:3: admin_users: user "bob" is not defined under users (admin console users log in with a configured password)`},
		{name: "item not a name", in: "admin_users:\n  - ops\n  - {name: alice}\n",
			err: "a.yaml:5: admin_users[1] must be a name, not a mapping"},
		{name: "comma in item", in: "admin_users: [\"ops,alice\"]\n",
			err: `a.yaml:3: admin_users[0]: "ops,alice" contains a comma; write one name per item`},
		{name: "mapping", in: "admin_users: {ops: 1}\n",
			err: "a.yaml:3: admin_users must be a single value, not a mapping"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := func(k string) (string, bool) { return "alice", k == "ADMIN" }
			c, err := Parse([]byte(base+tc.in), "a.yaml", env)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error = %v, want %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.AdminUserList(); !slices.Equal(got, tc.want) {
				t.Fatalf("AdminUserList = %q, want %q", got, tc.want)
			}
			for _, u := range tc.want {
				if !c.IsAdmin(u) {
					t.Errorf("IsAdmin(%q) = false", u)
				}
			}
		})
	}
}
