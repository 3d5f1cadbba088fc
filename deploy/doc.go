// Package deploy holds no code: it owns the deployment files and the tests
// that check them. docker/config.yaml is the container image's
// configuration (every value from the environment, defaults in the
// Dockerfile); kubernetes/ is a Deployment, Service, ConfigMap,
// PodDisruptionBudget and an example Secret, decoded strictly with the
// k8s.io/api types by the tests; systemd/lockpool.service runs lockpool
// under systemd with reload, and systemd/lockpool@.service in two slots
// for restarts that refuse no one (handover_socket, Type=notify); prometheus/alerts.yml (with alerts_test.yml,
// run by promtool in .ci/run) and grafana/lockpool.json cover the
// metrics docs/metrics.md documents.
package deploy
