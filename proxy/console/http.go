package console

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
)

// handleViews serves every admin view but SHOW LOCKS (which is
// /debug/locks) as JSON under /debug/<name> (SHOW LISTENERS as
// /debug/listen), behind admin_token like the rest of /debug.
func handleViews(mux *http.ServeMux, src Source) {
	for _, v := range views(src) {
		if v.name == "LOCKS" {
			continue
		}
		path := "/debug/" + strings.ToLower(v.name)
		if v.name == "LISTENERS" {
			path = "/debug/listen"
		}
		mux.HandleFunc(path, guard(src, func(w http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), queryTimeout)
			defer cancel()
			rows, err := v.rows(ctx)
			w.Header().Set("Content-Type", "application/json")
			if err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_ = json.NewEncoder(w).Encode(map[string]string{"error": err.Error()})
				return
			}
			enc := json.NewEncoder(w)
			enc.SetIndent("", "  ")
			_ = enc.Encode(rows)
		}))
	}
}
