// Package promreg registers Prometheus collectors for packages that may be
// set up more than once on one registry (a restarted store, tests): the
// collector already registered under a name is reused.
package promreg

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on r, or returns the collector already registered
// under its name; without a registerer c stays unregistered.
func Register[T prometheus.Collector](r prometheus.Registerer, c T) (T, error) {
	if r == nil {
		return c, nil
	}
	if err := r.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing, nil
			}
		}
		return c, err
	}
	return c, nil
}
